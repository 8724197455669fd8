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
- Dedicated columns (:data:`DEDICATED_COLUMNS`): the attributes the metric views read on every
  decode span and chunk event, each also in a typed column of its own (``attr_tokentrace_step``
  = ``attr_int['tokentrace.step']``). In a database they are VIRTUAL generated columns (no
  load cost, never out of step with the maps); the Parquet dump stores them, so a scan of a
  dump reads one BIGINT column instead of decoding a map per row.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, NamedTuple

import duckdb

if TYPE_CHECKING:  # pyarrow is imported where a schema is built, not by every verb
    import pyarrow as pa

__all__ = [
    "ATTRIBUTE_MAP_COLUMNS",
    "DEDICATED_COLUMNS",
    "DUMP_FORMAT",
    "FORMAT_KEY",
    "DedicatedColumn",
    "dedicated_select",
    "missing_dedicated",
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


class DedicatedColumn(NamedTuple):
    """One attribute kept in a typed column of its own, beside its map (docs/tables.md)."""

    name: str  # the column: attr_ + the key with '.' written '_'
    sql_type: str  # BIGINT, BOOLEAN or VARCHAR
    map_column: str  # the map that holds the key too: attr_int, attr_bool, attr_str, attr_json
    key: str  # the attribute key

    @property
    def from_map(self) -> str:
        """The SQL that reads the value from its map (DuckDB and Spark alike)."""
        return f"{self.map_column}['{self.key}']"


def _dedicated(sql_type: str, map_column: str, *keys: str) -> tuple[DedicatedColumn, ...]:
    return tuple(DedicatedColumn("attr_" + k.replace(".", "_"), sql_type, map_column, k) for k in keys)


#: Per table, the attributes also kept in typed columns of their own (appended after the
#: table's other columns, in this order). Chosen for the rows there are many of: a decode span per
#: token (step, KV bytes), an engine step span per step (step, batch), a chunk event per
#: visible chunk (index, tokens, visible); and the request figures every metric reads.
DEDICATED_COLUMNS: dict[str, tuple[DedicatedColumn, ...]] = {
    "spans": (
        *_dedicated("BIGINT", "attr_int",
                    "tokentrace.step", "tokentrace.engine.step", "tokentrace.decode.tokens",
                    "tokentrace.spec.draft_tokens", "tokentrace.kv.bytes",
                    "tokentrace.kv.physical_bytes", "tokentrace.batch.size", "tokentrace.batch.tokens",
                    "tokentrace.batch.prefill_tokens", "gen_ai.usage.input_tokens",
                    "gen_ai.usage.output_tokens", "tokentrace.generated_tokens"),
        *_dedicated("VARCHAR", "attr_str", "gen_ai.response.id", "tokentrace.client_request_id"),
        *_dedicated("VARCHAR", "attr_json", "gen_ai.response.finish_reasons"),
    ),
    "span_events": (
        *_dedicated("BIGINT", "attr_int", "tokentrace.chunk.index", "tokentrace.chunk.tokens"),
        *_dedicated("BOOLEAN", "attr_bool", "tokentrace.chunk.visible"),
    ),
    "span_links": (),
}


#: The Parquet dump's layout version (docs/parquet.md), written in every file's key-value
#: metadata under FORMAT_KEY: 2 = the dedicated columns. A file without the key is format 1
#: (written before 2026-12: maps only); readers compute the dedicated columns from its maps.
FORMAT_KEY = "tokentrace.format"
DUMP_FORMAT = 2


def dedicated_select(table: str, prefix: str = "") -> str:
    """``attr_int['tokentrace.step'] AS attr_tokentrace_step, ...``: the dedicated columns of
    ``table`` computed from its maps (``prefix``: a table alias with its dot); ``''`` when
    the table has none (for writers of files that are not tokentrace's export)."""
    return ", ".join(f"{prefix}{c.from_map} AS {c.name}" for c in DEDICATED_COLUMNS.get(table, ()))


def _dedicated_ddl(table: str) -> str:
    return "".join(f",\n    {c.name} {c.sql_type} GENERATED ALWAYS AS ({c.from_map}) VIRTUAL"
                   for c in DEDICATED_COLUMNS.get(table, ()))

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
    load_id BIGINT{_dedicated_ddl('spans')}
)""",
    "span_events": f"""
CREATE TABLE IF NOT EXISTS span_events (
    trace_id VARCHAR NOT NULL,
    span_id VARCHAR NOT NULL,
    event_index INTEGER NOT NULL,
    time_ns BIGINT NOT NULL,
    name VARCHAR NOT NULL,
{_attr_cols('attr')},
    dropped_attributes_count BIGINT NOT NULL DEFAULT 0{_dedicated_ddl('span_events')}
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
    """Create the canonical tables (idempotent). A span table of a database written before
    its dedicated columns existed is rebuilt with them (once: DuckDB cannot add a generated
    column to a table), its rows copied over unchanged."""
    for ddl in TABLE_DDL.values():
        con.execute(ddl)
    for table, columns in DEDICATED_COLUMNS.items():
        have = {r[0] for r in con.execute(
            "SELECT column_name FROM duckdb_columns() WHERE table_name = $t AND schema_name = current_schema()"
            " AND database_name = current_database()", {"t": table}).fetchall()}
        if columns and missing_dedicated(table, have):
            _rebuild(con, table, sorted(have))


def _rebuild(con: duckdb.DuckDBPyConnection, table: str, stored: list[str]) -> None:
    """``table`` recreated from TABLE_DDL with the rows of its older self (``stored``: its
    columns), in one transaction."""
    old = f"tt_before_dedicated_{table}"
    cols = ", ".join(stored)
    con.execute("BEGIN TRANSACTION")
    try:
        con.execute(f"ALTER TABLE {table} RENAME TO {old}")
        con.execute(TABLE_DDL[table])
        con.execute(f"INSERT INTO {table} ({cols}) SELECT {cols} FROM {old}")
        con.execute(f"DROP TABLE {old}")
        con.execute("COMMIT")
    except BaseException:
        con.execute("ROLLBACK")
        raise


def missing_dedicated(table: str, have: set[str] | frozenset[str]) -> list[DedicatedColumn]:
    """The dedicated columns of ``table`` not among the column names ``have`` (a database
    or a dump written before they existed: readers compute them from the maps)."""
    return [c for c in DEDICATED_COLUMNS.get(table, ()) if c.name not in have]


def arrow_schema(con: duckdb.DuckDBPyConnection, table: str) -> pa.Schema:
    """The Arrow schema of one canonical table, as DuckDB exports it (for readers that
    build Arrow batches before inserting)."""
    create_tables(con)
    return con.sql(f"SELECT * FROM {_table_name(table)} LIMIT 0").to_arrow_table().schema


def _table_name(table: str) -> str:
    if table not in TABLE_DDL:
        raise ValueError(f"unknown table {table!r}: expected one of {', '.join(TABLE_DDL)}")
    return table
