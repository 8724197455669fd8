"""The canonical span model: DuckDB tables every input format is loaded into.

One direction of data flow (docs/architecture.md): readers (``analyzer.formats``) turn each
input shape into rows of these tables; adapter views (``queries/views/``) give the rows
meaning; metric queries (``queries/*.sql``) compute figures. See docs/tables.md for every
column, its unit and how OTLP values map onto it.

Conventions
- Ids are lowercase hex strings: trace_id 32 digits, span_id 16 digits. Jaeger's 64-bit
  trace ids are left-padded with zeros to 32 digits (as Jaeger does converting to OTLP).
- Times are BIGINT nanoseconds since the Unix epoch (``*_ns``). TIMESTAMP_NS appears only in
  views: Spark cannot read DuckDB's nanosecond Parquet timestamps.
- Attributes are stored in typed maps, one per OTLP value type, so SQL reads them without
  JSON functions: ``attr_int['gen_ai.usage.output_tokens']``. Arrays and kvlists are plain
  JSON text in ``attr_json`` (``["stop"]``); bytes values are ``{"bytes_base64": "..."}``
  in ``attr_json``. A key appears in exactly one map.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import duckdb

if TYPE_CHECKING:  # pyarrow is imported where a schema is built, not by every verb
    import pyarrow as pa

__all__ = [
    "ATTRIBUTE_MAP_COLUMNS",
    "SPAN_KINDS",
    "STATUS_CODES",
    "TABLE_DDL",
    "arrow_schema",
    "create_tables",
]

SPAN_KINDS: tuple[str, ...] = ("UNSPECIFIED", "INTERNAL", "SERVER", "CLIENT", "PRODUCER", "CONSUMER")
STATUS_CODES: tuple[str, ...] = ("UNSET", "OK", "ERROR")


def _attr_cols(prefix: str) -> str:
    return (
        f"    {prefix}_str MAP(VARCHAR, VARCHAR),\n"
        f"    {prefix}_int MAP(VARCHAR, BIGINT),\n"
        f"    {prefix}_double MAP(VARCHAR, DOUBLE),\n"
        f"    {prefix}_bool MAP(VARCHAR, BOOLEAN),\n"
        f"    {prefix}_json MAP(VARCHAR, VARCHAR)"
    )


ATTRIBUTE_MAP_COLUMNS: tuple[str, ...] = ("str", "int", "double", "bool", "json")

TABLE_DDL: dict[str, str] = {
    "spans": f"""
CREATE TABLE IF NOT EXISTS spans (
    trace_id VARCHAR NOT NULL,
    span_id VARCHAR NOT NULL,
    parent_span_id VARCHAR,
    trace_state VARCHAR,
    flags BIGINT,
    name VARCHAR NOT NULL,
    kind VARCHAR NOT NULL,
    start_ns BIGINT NOT NULL,
    end_ns BIGINT NOT NULL,
    status_code VARCHAR NOT NULL,
    status_message VARCHAR,
    service_name VARCHAR,
    service_instance_id VARCHAR,
    host_name VARCHAR,
    clock_domain VARCHAR,
    scope_name VARCHAR,
    scope_version VARCHAR,
{_attr_cols('attr')},
{_attr_cols('resource')},
    scope_attributes_json VARCHAR,
    dropped_attributes_count BIGINT NOT NULL DEFAULT 0,
    dropped_events_count BIGINT NOT NULL DEFAULT 0,
    dropped_links_count BIGINT NOT NULL DEFAULT 0,
    load_id BIGINT
)""",
    "span_events": f"""
CREATE TABLE IF NOT EXISTS span_events (
    trace_id VARCHAR NOT NULL,
    span_id VARCHAR NOT NULL,
    event_index INTEGER NOT NULL,
    time_ns BIGINT NOT NULL,
    name VARCHAR NOT NULL,
{_attr_cols('attr')},
    dropped_attributes_count BIGINT NOT NULL DEFAULT 0
)""",
    "span_links": f"""
CREATE TABLE IF NOT EXISTS span_links (
    trace_id VARCHAR NOT NULL,
    span_id VARCHAR NOT NULL,
    link_index INTEGER NOT NULL,
    linked_trace_id VARCHAR NOT NULL,
    linked_span_id VARCHAR NOT NULL,
    trace_state VARCHAR,
    flags BIGINT,
{_attr_cols('attr')},
    dropped_attributes_count BIGINT NOT NULL DEFAULT 0
)""",
    "loads": """
CREATE TABLE IF NOT EXISTS loads (
    load_id BIGINT NOT NULL,
    file VARCHAR NOT NULL,
    format VARCHAR NOT NULL,
    loaded_at_ns BIGINT NOT NULL,
    records_read BIGINT NOT NULL,
    spans_read BIGINT NOT NULL,
    spans_loaded BIGINT NOT NULL,
    duplicates_identical BIGINT NOT NULL,
    duplicates_conflicting BIGINT NOT NULL,
    rejected BIGINT NOT NULL,
    incomplete_last_line BOOLEAN NOT NULL,
    rejected_by_reason MAP(VARCHAR, BIGINT)
)""",
    "rejects": """
CREATE TABLE IF NOT EXISTS rejects (
    load_id BIGINT NOT NULL,
    file VARCHAR NOT NULL,
    line BIGINT,
    record_index BIGINT,
    trace_id VARCHAR,
    span_id VARCHAR,
    reason VARCHAR NOT NULL,
    raw VARCHAR
)""",
}


def create_tables(con: duckdb.DuckDBPyConnection) -> None:
    """Create the canonical tables (idempotent)."""
    for ddl in TABLE_DDL.values():
        con.execute(ddl)


def arrow_schema(con: duckdb.DuckDBPyConnection, table: str) -> "pa.Schema":
    """The Arrow schema of one canonical table, as DuckDB exports it (for readers that
    build Arrow batches before inserting)."""
    create_tables(con)
    return con.sql(f"SELECT * FROM {_table_name(table)} LIMIT 0").to_arrow_table().schema


def _table_name(table: str) -> str:
    if table not in TABLE_DDL:
        raise ValueError(f"unknown table {table!r}: expected one of {', '.join(TABLE_DDL)}")
    return table
