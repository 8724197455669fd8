"""Derived tables in the database: the request and gap tables, computed once per load.

``tokentrace load`` (a write verb) ends by calling :func:`build_derived`: every view of
``queries/views/`` is created in the schema :data:`~analyzer.db.views.DERIVED_SCHEMA` of the
database file, and the views the query runner keeps (the adapters' request spans and sorted
chunk table, ``request_facts``, ``request_metrics``, ``request_keys`` and the gap rows
``request_gap_rows``, written one request-key range at a time) are stored there as tables,
with the fingerprint of the data they were computed from (row counts of ``spans``,
``span_events``, ``span_links``, ``loads``, the last load id, the view files' text) in
``tokentrace_derived.tt_view_state``.

A read verb opens the file read-only: when the fingerprint of what it sees equals the one
stored, :func:`analyzer.db.views.install_views` puts the derived schema on the search path
and derives nothing (the file stays byte-identical); otherwise (rows added by another
writer, another tokentrace's views) it derives on the connection as before, and
:func:`analyzer.db.views.derived_status` says ``stale``. docs/tables.md, "Derived tables".

Example::

    con = connect("traces.duckdb")
    load_paths(con, ["spans.jsonl"])
    report = build_derived(con)
    print(report.seconds, report.rows["request_gap_rows"])
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field
from importlib.metadata import PackageNotFoundError, version

import duckdb

from analyzer.db import views as queries  # the view machinery (analyzer/db/views/)
from analyzer.db.views.state import data_fingerprint, quoted

__all__ = ["DerivedReport", "build_derived", "drop_derived", "is_current"]


@dataclass
class DerivedReport:
    """What :func:`build_derived` wrote: seconds taken and rows per kept table; ``skipped``
    when the stored tables already described this data (no span, event or link added)."""

    seconds: float
    rows: dict[str, int] = field(default_factory=dict)
    skipped: bool = False


def _tokentrace_version() -> str:
    try:
        return version("tokentrace")
    except PackageNotFoundError:  # a checkout on the path, not installed
        return "unknown"


def _stored(con: duckdb.DuckDBPyConnection) -> str | None:
    found = con.execute(
        "SELECT count(*) FROM duckdb_tables() WHERE database_name = current_database() AND schema_name = $s"
        " AND table_name = $t", {"s": queries.DERIVED_SCHEMA, "t": queries.STATE_TABLE}).fetchall()[0][0]
    if not found:
        return None
    rows = con.execute(f"SELECT fingerprint FROM {queries.DERIVED_SCHEMA}.{queries.STATE_TABLE}").fetchall()
    return rows[0][0] if rows else None


def _same_spans(stored: str, current: str) -> bool:
    """The two fingerprints differ in the loads table only (a load that added no span, event
    or link: every record was a duplicate, or the file was empty) and the views are the same."""
    def parts(fp: str) -> tuple[list[str], str]:
        counts, _, digest = fp.partition("|")
        return counts.strip("[]").split(", "), digest

    (a, da), (b, db) = parts(stored), parts(current)
    return da == db and len(a) == len(b) >= 3 and a[:3] == b[:3]


def is_current(con: duckdb.DuckDBPyConnection) -> bool:
    """True when this (writable) connection's database holds derived tables of its data."""
    base, views = queries.view_files()
    fingerprint, _ = data_fingerprint(con, base, views)
    return _stored(con) == fingerprint


def drop_derived(con: duckdb.DuckDBPyConnection) -> None:
    """Remove the derived tables (read verbs then derive on their own connection)."""
    con.execute(f"DROP SCHEMA IF EXISTS {queries.DERIVED_SCHEMA} CASCADE")


def build_derived(
    con: duckdb.DuckDBPyConnection, *, force: bool = False, on_start: Callable[[], None] | None = None
) -> DerivedReport:
    """(Re)write the derived schema of ``con``'s database (a writable connection to a
    tokentrace database file) from its canonical tables; returns what it wrote.

    Skipped when the stored tables already describe the data, or differ only in ``loads``
    (a load that inserted nothing: loads only append, so the spans are the rows derived
    before); ``force`` rebuilds anyway. ``on_start`` is called when a build really starts.
    An interrupted build leaves no state row, so read verbs derive on their own until the
    next build."""
    started = time.perf_counter()
    base, views = queries.view_files()
    fingerprint, events = data_fingerprint(con, base, views)
    stored = _stored(con)
    schema = queries.DERIVED_SCHEMA
    if not force and stored is not None and (stored == fingerprint or _same_spans(stored, fingerprint)):
        if stored != fingerprint:
            con.execute(f"UPDATE {schema}.{queries.STATE_TABLE} SET fingerprint = $f", {"f": fingerprint})
        return DerivedReport(time.perf_counter() - started, skipped=True)
    if on_start is not None:
        on_start()
    queries.forget_connection_views(con)  # this connection's own kept tables: the derived ones replace them
    catalog, before = con.execute("SELECT current_database(), current_schema()").fetchall()[0]
    path_before = con.execute("SELECT current_setting('search_path')").fetchall()[0][0]
    drop_derived(con)
    con.execute(f"CREATE SCHEMA {schema}")
    con.execute(f"USE {quoted(catalog)}.{schema}")
    try:
        queries.install_views(con, persist=True)
        kept = [*queries.kept_views(base), *queries.kept_views(base, chunks=True), *queries.MATERIALIZED_VIEWS]
        queries.materialize_views(con, " ".join(kept), persist_events=events)
        rows = {
            r[0][len(queries.CACHE_PREFIX):]: int(r[1])
            for r in con.execute(
                "SELECT table_name, estimated_size FROM duckdb_tables() WHERE database_name = current_database()"
                " AND schema_name = $s AND starts_with(table_name, $p)", {"s": schema, "p": queries.CACHE_PREFIX},
            ).fetchall()
        }
        seconds = time.perf_counter() - started
        # written last: a build cut short leaves no state, and so is never read
        con.execute(f"CREATE TABLE {queries.STATE_TABLE} (fingerprint VARCHAR, span_events BIGINT, built_at_ns BIGINT,"
                    " build_seconds DOUBLE, tokentrace_version VARCHAR)")
        con.execute(f"INSERT INTO {queries.STATE_TABLE} VALUES ($f, $e, $t, $s, $v)",
                    {"f": fingerprint, "e": events, "t": time.time_ns(), "s": seconds, "v": _tokentrace_version()})
    finally:
        con.execute(f"USE {quoted(catalog)}.{quoted(before)}")
        if path_before:
            con.execute("SET search_path = $p", {"p": path_before})
        else:
            con.execute("RESET search_path")
    return DerivedReport(seconds, rows)
