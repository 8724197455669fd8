"""Bulk path for OTLP/JSON lines files: DuckDB ``read_json`` with explicit schemas, checked in
SQL, inserted straight into the canonical tables.

This is an accelerator, not a second definition of the format: it handles the common shape
(camelCase keys, hex ids, every record a TracesData) and gives up on anything else. It
rolls back and returns None — the caller then re-reads the file with the Python reader in
:mod:`otlp_json`, which finds the line, field and reason — when the JSON does not parse,
a value does not cast, a record is not a plain TracesData, any check in
:mod:`otlp_json_sql` fails, two spans share a key with different content, or the file
changed while it was read. So both paths produce the same rows (but for the known
difference in docs/loading.md: non-string JSON where a string is expected, numeric span
ids), and every error message comes from one place. Arrays, kvlists and bytes values are
converted by the same Python function the reader uses (a DuckDB UDF), so ``attr_json``
text is identical too.

How (one transaction per attempt; each step is one scan of the file):

1. Direct: insert ``spans`` straight from ``read_json`` (no staging copy; the checks run
   inside the inserting scan: ``error()`` aborts it), counting records (non-blank lines)
   and spans with links on the side (``tt_bulk_count``, a Python UDF called once per record
   and per span with links). Then look for repeated keys
   ``(trace_id, span_id)`` among the new rows and against the stored ones (a hash of the
   new keys: the only state that grows with the file, tens of bytes per span). None: insert
   ``span_events`` and, when there are links, ``span_links`` the same way, and commit.
2. Staged, when a key repeats (exporter retries, a file loaded twice): roll back; one scan
   stages spans with their raw events and links (temp tables, DuckDB memory, spillable) and
   :func:`stage.commit_stage` sorts identical from conflicting duplicates; conflicts need
   line numbers, so they go to the Python reader.
"""

from __future__ import annotations

import itertools
import json
import os
import threading
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import duckdb

from analyzer.formats import stage
from analyzer.formats.canonical import EVENT_COLUMNS, LINK_COLUMNS, SPAN_COLUMNS
from analyzer.formats.otlp_json import scope_attributes_json
from analyzer.formats.otlp_json_sql import (
    EVENT_SCHEMA,
    LINK_SCHEMA,
    SPAN_SCHEMA,
    STAGE_SCHEMA,
    event_select,
    link_select,
    read_json_sql,
    span_select,
    spans_with,
)
from analyzer.formats.values import BadRecord, any_value_to_plain, json_text

__all__ = ["BulkResult", "drop_temp", "load_json_lines", "register_udfs"]

ProgressFn = Callable[[int], None]  # bytes of the file accounted for since the last call

# Share of the file's bytes reported after each step (progress bar), from measured step times.
_SPANS, _EVENTS = 0.5, 0.4


@dataclass
class BulkResult:
    """What the bulk path loaded from one file. Counts are records (lines) and spans."""

    records_read: int
    spans_read: int
    spans_loaded: int
    duplicates_identical: int
    staged: bool  # True when duplicates sent it through the staging tables


def _plain_json(array_value: str | None, kvlist_value: str | None, bytes_value: str | None) -> str:
    if array_value is not None:
        value = {"arrayValue": json.loads(array_value)}
    elif kvlist_value is not None:
        value = {"kvlistValue": json.loads(kvlist_value)}
    else:
        value = {"bytesValue": bytes_value}
    try:
        return json_text(any_value_to_plain(value))
    except BadRecord as e:
        raise ValueError(str(e)) from None


def _scope_json(attrs_json: str | None) -> str | None:
    try:
        return scope_attributes_json(json.loads(attrs_json)) if attrs_json is not None else None
    except BadRecord as e:
        raise ValueError(str(e)) from None


# Side channel of the inserting scan: ``tt_bulk_count(token, channel)`` counts the rows it
# sees in _COUNTS[(token, channel)] (token: one per attempt) and returns 1. It runs once per
# record and once per span with links: a few thousand calls per GB. A temp sequence
# (``nextval``) did the same but made DuckDB run the whole inserting pipeline on one thread
# (measured, 1e5 spans, 2 cores: 0.60 s wall / 0.64 s CPU against 0.38 / 0.63 without it).
# Not an Arrow UDF: the first call of one imports pandas (0.24 s).
_COUNTS: dict[tuple[int, int], int] = {}
_COUNTS_LOCK = threading.Lock()
_TOKENS = itertools.count(1)
RECORDS, LINKS = 0, 1  # channels


def _count(token: int, channel: int) -> int:
    with _COUNTS_LOCK:
        _COUNTS[(token, channel)] = _COUNTS.get((token, channel), 0) + 1
    return 1


def register_udfs(con: duckdb.DuckDBPyConnection) -> None:
    """Register ``tt_plain_json``, ``tt_scope_json`` and ``tt_bulk_count`` (idempotent). Call outside a transaction."""
    con.execute("SELECT 1").fetchall()  # finish any pending result: create_function refuses to run otherwise
    for name, fn, args, ret, kw in (
        ("tt_plain_json", _plain_json, ["VARCHAR", "VARCHAR", "VARCHAR"], "VARCHAR", {"null_handling": "special", "side_effects": False}),
        ("tt_scope_json", _scope_json, ["VARCHAR"], "VARCHAR", {"null_handling": "special", "side_effects": False}),
        ("tt_bulk_count", _count, ["BIGINT", "INTEGER"], "BIGINT", {"side_effects": True}),
    ):  # fmt: skip
        try:
            con.create_function(name, fn, args, ret, **kw)  # type: ignore[arg-type]  # type names as DuckDB spells them
        except (duckdb.Error, RuntimeError) as e:
            if "already" not in str(e):
                raise


def _file_state(path: Path) -> tuple[int, int, int]:
    st = os.stat(path)
    return st.st_ino, st.st_size, st.st_mtime_ns


_REPEATS = "repeats"  # a key repeats within the file or matches a stored span: use the staging tables


def load_json_lines(
    con: duckdb.DuckDBPyConnection, path: Path, compression: str, load_id: int,
    record: Callable[[BulkResult], None], progress: ProgressFn | None = None,
) -> BulkResult | None:  # fmt: skip
    """Load one OTLP/JSON lines file (``compression``: none, gzip or zstd) under ``load_id``.

    Call it outside a transaction: it opens its own (one per attempt) and calls ``record``
    with the result inside it, just before COMMIT (the caller's ``loads`` row). Returns the
    result, or None — rolled back, nothing written — when the Python reader must read the
    file instead. ``progress`` receives byte counts that add up to the file size on success
    and back to zero on None.
    """
    register_udfs(con)
    size = os.path.getsize(path)
    done = 0

    def advance(share: float | None) -> None:
        """Report progress up to ``share`` of the file (None: all of it); a negative share rewinds."""
        nonlocal done
        target = size if share is None else max(0, min(size, int(size * share)))
        if progress is not None and target != done:
            progress(target - done)
        done = target

    src = lambda schema: read_json_sql(str(path), compression, schema)  # noqa: E731 - a one-line reader, named for the calls below
    before = _file_state(path)
    for attempt in (_direct, _staged):
        con.execute("BEGIN TRANSACTION")
        try:
            try:
                result = attempt(con, src, load_id, advance)
            except (duckdb.Error, ValueError):  # a check or cast failed, or the JSON does not parse
                result = None
            if result is _REPEATS:
                con.execute("ROLLBACK")
                advance(0)
                continue
            if result is None or _file_state(path) != before:  # a file still being written: read it once, in Python
                con.execute("ROLLBACK")
                advance(0)
                return None
            record(result)
            con.execute("COMMIT")
        except BaseException:
            con.execute("ROLLBACK")
            advance(0)
            raise
        finally:
            drop_temp(con)
        advance(None)
        return result
    return None


def _sequences(con: duckdb.DuckDBPyConnection) -> None:
    for seq in _SEQUENCES:
        con.execute(f"CREATE OR REPLACE TEMP SEQUENCE {seq}")


def _new_token() -> int:
    """A fresh ``tt_bulk_count`` token for one attempt (its counts start at 0)."""
    return next(_TOKENS)


def _counted(token: int, channel: int) -> int:
    """How many rows ``tt_bulk_count(token, channel)`` saw (and forget them)."""
    with _COUNTS_LOCK:
        return _COUNTS.pop((token, channel), 0)


def _forget(token: int) -> None:
    with _COUNTS_LOCK:
        for key in [k for k in _COUNTS if k[0] == token]:
            del _COUNTS[key]


def _direct(con: duckdb.DuckDBPyConnection, src: Callable[[str], str], load_id: int, advance: Callable[[float | None], None]):
    """Spans, events and links straight into the canonical tables; _REPEATS when a key repeats."""
    token = _new_token()
    try:
        before = con.execute("SELECT coalesce(max(rowid), -1) FROM spans").fetchall()[0][0]
        cols = ", ".join(SPAN_COLUMNS)
        spans = con.execute(f"INSERT INTO spans ({cols}, load_id) SELECT {cols}, $load_id FROM ({span_select(src(SPAN_SCHEMA), token=token)})",
                            {"load_id": load_id}).fetchall()[0][0]  # fmt: skip
        records, links = _counted(token, RECORDS), _counted(token, LINKS)
    finally:
        _forget(token)
    if _repeats(con, before, spans):
        return _REPEATS
    advance(_SPANS)
    cols = ", ".join(EVENT_COLUMNS)
    con.execute(f"INSERT INTO span_events ({cols}) SELECT {cols} FROM ({event_select(spans_with(src(EVENT_SCHEMA), 'events'))})")
    advance(_SPANS + _EVENTS)
    if links:
        cols = ", ".join(LINK_COLUMNS)
        con.execute(f"INSERT INTO span_links ({cols}) SELECT {cols} FROM ({link_select(spans_with(src(LINK_SCHEMA), 'links'))})")
    return BulkResult(records, spans, spans, 0, staged=False)


def _repeats(con: duckdb.DuckDBPyConnection, before: int, spans: int) -> bool:
    """True when a just-inserted span (rowid > ``before``) shares its key with another span:
    one of this file, or one stored before (a hash of the new keys: memory grows with the file's
    key set). Also True if the rowids do not single out the new rows (then the staged path decides)."""
    new = f"(SELECT trace_id, span_id FROM spans WHERE rowid > {int(before)})"
    n, distinct = con.execute(f"SELECT count(*), count(DISTINCT (trace_id, span_id)) FROM {new}").fetchall()[0]
    if n != spans or distinct != n:
        return True
    if before < 0:
        return False
    old = f"(SELECT trace_id, span_id FROM spans WHERE rowid <= {int(before)})"
    return bool(con.execute(f"SELECT count(*) FROM {new} n JOIN {old} o USING (trace_id, span_id)").fetchall()[0][0])


def _staged(con: duckdb.DuckDBPyConnection, src: Callable[[str], str], load_id: int, advance: Callable[[float | None], None]):
    """Spans with raw events and links into temp staging tables, then :func:`stage.commit_stage`
    (identical duplicates counted, not inserted). None on conflicting duplicates."""
    _sequences(con)
    token = _new_token()
    extra = {"events": "sp.events", "links": "sp.links", "_ord": "nextval('_fj_ord') - 1", "_line": "NULL::BIGINT"}
    try:
        con.execute(f"CREATE OR REPLACE TEMP TABLE _fj_stage_spans AS {span_select(src(STAGE_SCHEMA), extra, token=token)}")
        records = _counted(token, RECORDS)
    finally:
        _forget(token)
    advance(_SPANS)
    con.execute(f"CREATE OR REPLACE TEMP TABLE _fj_stage_events AS {event_select('_fj_stage_spans', keep='_ord')}")
    con.execute(f"CREATE OR REPLACE TEMP TABLE _fj_stage_links AS {link_select('_fj_stage_spans', keep='_ord')}")
    stage.adopt_stage(con, "_fj_stage_")
    result = stage.commit_stage(con, load_id, insert_if_conflicts=False)
    if result is None:  # conflicting duplicates: the Python reader reports them with their lines
        return None
    spans = stage.staged_counts(con)[0]
    return BulkResult(records, spans, result.spans_loaded, result.duplicates_identical, staged=True)


_SEQUENCES = ("_fj_ord",)


def drop_temp(con: duckdb.DuckDBPyConnection) -> None:
    """Drop what :func:`load_json_lines` leaves behind (temp tables, sequences, staging tables)."""
    for table in ("_fj_stage_spans", "_fj_stage_events", "_fj_stage_links"):
        con.execute(f"DROP TABLE IF EXISTS temp.{table}")
    for seq in _SEQUENCES:
        con.execute(f"DROP SEQUENCE IF EXISTS temp.{seq}")
    stage.drop_stage(con)
