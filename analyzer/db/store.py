"""Opening a tokentrace database and writing canonical rows into it.

Readers that build spans in Python (the timeline CSV, the SDK's in-memory spans, small
files) produce :class:`SpanRow` / :class:`EventRow` / :class:`LinkRow` and call
:func:`insert_rows`. Bulk readers may insert Arrow batches of the same schema directly.
"""

from __future__ import annotations

import json
import math
import os
import time
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import duckdb

from analyzer.db.dbfile import check_database_path
from analyzer.db.ownership import check_writable, write_marker
from analyzer.db.schema import DEDICATED_COLUMNS, arrow_schema, create_tables
from analyzer.errors import DatabaseFileError, TokentraceError, duckdb_message

__all__ = [
    "DEFAULT_DB",
    "AttributeMaps",
    "EventRow",
    "LinkRow",
    "SettingError",
    "SpanRow",
    "apply_settings",
    "clock_domain_of",
    "connect",
    "default_db_path",
    "insert_rows",
    "next_load_id",
    "record_load",
    "split_attributes",
]

DEFAULT_DB = "tokentrace.duckdb"
INT64_MIN, INT64_MAX = -(2**63), 2**63 - 1


def default_db_path() -> str:
    """``$TOKENTRACE_DB`` when set, else ``tokentrace.duckdb`` in the current directory."""
    return os.environ.get("TOKENTRACE_DB") or DEFAULT_DB


MEMORY_LIMIT_ENV = "TOKENTRACE_MEMORY_LIMIT"


class SettingError(TokentraceError, ValueError):
    """A DuckDB setting from the environment that DuckDB refuses: one line naming the variable."""


def apply_settings(con: duckdb.DuckDBPyConnection) -> duckdb.DuckDBPyConnection:
    """DuckDB settings every tokentrace connection takes from the environment:
    ``$TOKENTRACE_MEMORY_LIMIT`` (e.g. ``8GB``) as ``memory_limit`` (DuckDB's default is 80 %
    of RAM; beyond the limit it spills to its temp directory). A value DuckDB refuses is a
    :class:`SettingError` naming the variable. DuckDB's progress bar is turned off: it is
    printed on stdout, where a verb's csv or json goes (a query over ~2 s put it mid-file)."""
    con.execute("SET enable_progress_bar = false")
    limit = os.environ.get(MEMORY_LIMIT_ENV)
    if limit:
        try:
            con.execute("SET memory_limit = $m", {"m": limit})
        except duckdb.Error as exc:
            raise SettingError(f"${MEMORY_LIMIT_ENV}={limit!r}: {duckdb_message(exc)}") from None
    return con


def connect(path: str | Path | None = None, read_only: bool = False) -> duckdb.DuckDBPyConnection:
    """Open (or create) a tokentrace database and make sure the canonical tables exist.

    ``path`` None or ``":memory:"`` gives an in-memory database. A file path is checked first
    (:func:`analyzer.db.dbfile.check_database_path`): a path that exists and is not a DuckDB
    database, an empty file, a missing folder, or (``read_only``) a missing file raises
    :class:`~analyzer.db.dbfile.DatabaseFileError` with one line, and the file is not touched.
    For writing, an existing database must be one tokentrace created
    (:func:`analyzer.db.ownership.check_writable`, checked read-only before it is opened for
    writing); the marker table saying so is written on every write connection.
    """
    target = ":memory:" if path is None else str(path)
    if target != ":memory:":
        if read_only:
            check_database_path(target, for_write=False)
        else:
            check_writable(target)
    existed = target == ":memory:" or Path(target).exists()
    try:
        con = duckdb.connect(target, read_only=read_only)
    except duckdb.Error as exc:  # e.g. the file is locked by another process
        raise DatabaseFileError(f"{target}: cannot open the database: {str(exc).splitlines()[0]}") from None
    try:
        apply_settings(con)
    except SettingError:
        con.close()
        if not existed:  # the file DuckDB just created holds nothing
            for leftover in (Path(target), Path(target + ".wal")):
                leftover.unlink(missing_ok=True)
        raise
    if not read_only:
        create_tables(con)
        write_marker(con)
    return con


@dataclass
class AttributeMaps:
    """Attributes split by value type, as stored in the ``*_str/_int/_double/_bool/_json`` maps."""

    str_: dict[str, str] = field(default_factory=dict)
    int_: dict[str, int] = field(default_factory=dict)
    double: dict[str, float] = field(default_factory=dict)
    bool_: dict[str, bool] = field(default_factory=dict)
    json_: dict[str, str] = field(default_factory=dict)

    def columns(self, prefix: str) -> dict[str, list[tuple[str, Any]]]:
        return {
            f"{prefix}_str": list(self.str_.items()),
            f"{prefix}_int": list(self.int_.items()),
            f"{prefix}_double": list(self.double.items()),
            f"{prefix}_bool": list(self.bool_.items()),
            f"{prefix}_json": list(self.json_.items()),
        }


def _json_value(value: Any) -> Any:
    if isinstance(value, bytes):
        import base64

        return {"bytes_base64": base64.b64encode(value).decode("ascii")}
    if isinstance(value, Mapping):
        return {str(k): _json_value(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_json_value(v) for v in value]
    if isinstance(value, float) and not math.isfinite(value):
        return repr(value)  # JSON has no NaN/Infinity: kept as a string
    return value


def split_attributes(attributes: Mapping[str, Any] | None) -> AttributeMaps:
    """Split Python attribute values into the typed maps.

    bool -> bool map (checked before int), int -> int map (must fit int64), float -> double
    map, str -> str map; lists, tuples, dicts and bytes -> JSON text in the json map.
    """
    maps = AttributeMaps()
    if not attributes:
        return maps
    for key, value in attributes.items():
        if value is None:
            continue
        if isinstance(value, bool):
            maps.bool_[key] = value
        elif isinstance(value, int):
            if not INT64_MIN <= value <= INT64_MAX:
                raise ValueError(f"attribute {key!r}: integer {value} does not fit int64")
            maps.int_[key] = value
        elif isinstance(value, float):
            maps.double[key] = value
        elif isinstance(value, str):
            maps.str_[key] = value
        else:
            maps.json_[key] = json.dumps(_json_value(value), separators=(",", ":"))
    return maps


def clock_domain_of(resource: Mapping[str, Any]) -> str | None:
    """The clock domain a resource names: ``service.name|service.instance.id|host.name``.

    Missing parts are left empty; a resource with none of the three gives None.
    """
    parts = [resource.get("service.name"), resource.get("service.instance.id"), resource.get("host.name")]
    if all(p is None for p in parts):
        return None
    return "|".join("" if p is None else str(p) for p in parts)


@dataclass
class SpanRow:
    trace_id: str
    span_id: str
    name: str
    start_ns: int
    end_ns: int
    kind: str = "INTERNAL"
    parent_span_id: str | None = None
    status_code: str = "UNSET"
    status_message: str | None = None
    attributes: Mapping[str, Any] = field(default_factory=dict)
    resource: Mapping[str, Any] = field(default_factory=dict)
    scope_name: str | None = None
    scope_version: str | None = None
    trace_state: str | None = None
    flags: int | None = None
    dropped_attributes_count: int = 0
    dropped_events_count: int = 0
    dropped_links_count: int = 0

    def as_record(self, load_id: int | None) -> dict[str, Any]:
        rec: dict[str, Any] = {
            "trace_id": self.trace_id,
            "span_id": self.span_id,
            "parent_span_id": self.parent_span_id,
            "trace_state": self.trace_state,
            "flags": self.flags,
            "name": self.name,
            "kind": self.kind,
            "start_ns": self.start_ns,
            "end_ns": self.end_ns,
            "status_code": self.status_code,
            "status_message": self.status_message,
            "service_name": self.resource.get("service.name"),
            "service_instance_id": self.resource.get("service.instance.id"),
            "host_name": self.resource.get("host.name"),
            "clock_domain": clock_domain_of(self.resource),
            "scope_name": self.scope_name,
            "scope_version": self.scope_version,
            "scope_attributes_json": None,
            "dropped_attributes_count": self.dropped_attributes_count,
            "dropped_events_count": self.dropped_events_count,
            "dropped_links_count": self.dropped_links_count,
            "load_id": load_id,
        }
        rec.update(split_attributes(self.attributes).columns("attr"))
        rec.update(split_attributes(self.resource).columns("resource"))
        return rec


@dataclass
class EventRow:
    trace_id: str
    span_id: str
    event_index: int
    time_ns: int
    name: str
    attributes: Mapping[str, Any] = field(default_factory=dict)
    dropped_attributes_count: int = 0

    def as_record(self) -> dict[str, Any]:
        rec: dict[str, Any] = {
            "trace_id": self.trace_id,
            "span_id": self.span_id,
            "event_index": self.event_index,
            "time_ns": self.time_ns,
            "name": self.name,
            "dropped_attributes_count": self.dropped_attributes_count,
        }
        rec.update(split_attributes(self.attributes).columns("attr"))
        return rec


@dataclass
class LinkRow:
    trace_id: str
    span_id: str
    link_index: int
    linked_trace_id: str
    linked_span_id: str
    trace_state: str | None = None
    flags: int | None = None
    attributes: Mapping[str, Any] = field(default_factory=dict)
    dropped_attributes_count: int = 0

    def as_record(self) -> dict[str, Any]:
        rec: dict[str, Any] = {
            "trace_id": self.trace_id,
            "span_id": self.span_id,
            "link_index": self.link_index,
            "linked_trace_id": self.linked_trace_id,
            "linked_span_id": self.linked_span_id,
            "trace_state": self.trace_state,
            "flags": self.flags,
            "dropped_attributes_count": self.dropped_attributes_count,
        }
        rec.update(split_attributes(self.attributes).columns("attr"))
        return rec


def _insert(con: duckdb.DuckDBPyConnection, table: str, records: list[dict[str, Any]]) -> None:
    if not records:
        return
    import pyarrow as pa  # here, not at import: the query verbs never need it (start-up cost)

    schema = arrow_schema(con, table)
    dedicated = {c.name for c in DEDICATED_COLUMNS.get(table, ())}
    schema = pa.schema([f for f in schema if f.name not in dedicated])  # generated from the maps
    batch = pa.Table.from_pylist(records, schema=schema)
    con.register("_tokentrace_rows", batch)
    try:
        con.execute(f"INSERT INTO {table} BY NAME SELECT * FROM _tokentrace_rows")
    finally:
        con.unregister("_tokentrace_rows")


def next_load_id(con: duckdb.DuckDBPyConnection) -> int:
    """A fresh id for the ``loads`` table (1 + the largest so far)."""
    # fetchall, not fetchone: DuckDB 2.0 leaves a half-read result open after fetchone, which
    # blocks later create_function calls on the same connection.
    return int(con.execute("SELECT coalesce(max(load_id), 0) + 1 FROM loads").fetchall()[0][0])


def insert_rows(
    con: duckdb.DuckDBPyConnection,
    spans: Sequence[SpanRow],
    events: Iterable[EventRow] = (),
    links: Iterable[LinkRow] = (),
    load_id: int | None = None,
) -> None:
    """Insert Python-built rows into ``spans``, ``span_events`` and ``span_links``.

    No deduplication here: readers that can see duplicates count them before inserting.
    """
    _insert(con, "spans", [s.as_record(load_id) for s in spans])
    _insert(con, "span_events", [e.as_record() for e in events])
    _insert(con, "span_links", [link.as_record() for link in links])


def record_load(
    con: duckdb.DuckDBPyConnection,
    load_id: int,
    file: str,
    format: str,
    *,
    records_read: int,
    spans_read: int,
    spans_loaded: int,
    duplicates_identical: int = 0,
    duplicates_conflicting: int = 0,
    rejected_by_reason: Mapping[str, int] | None = None,
    incomplete_last_line: bool = False,
) -> None:
    """Add one row to ``loads``: what a reader read, kept, deduplicated and rejected."""
    reasons = dict(rejected_by_reason or {})
    con.execute(
        "INSERT INTO loads VALUES ($load_id, $file, $format, $loaded_at_ns, $records_read, $spans_read,"
        " $spans_loaded, $dup_identical, $dup_conflicting, $rejected, $incomplete,"
        " MAP($reason_keys::VARCHAR[], $reason_counts::BIGINT[]))",
        {
            "load_id": load_id,
            "file": file,
            "format": format,
            "loaded_at_ns": time.time_ns(),
            "records_read": records_read,
            "spans_read": spans_read,
            "spans_loaded": spans_loaded,
            "dup_identical": duplicates_identical,
            "dup_conflicting": duplicates_conflicting,
            "rejected": sum(reasons.values()),
            "incomplete": incomplete_last_line,
            "reason_keys": list(reasons.keys()),
            "reason_counts": list(reasons.values()),
        },
    )
