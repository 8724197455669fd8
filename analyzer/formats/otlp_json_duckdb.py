"""Bulk path for OTLP/JSON lines files: DuckDB ``read_json`` with an explicit schema, flattened
and validated in SQL, straight into the staging tables.

This is an accelerator, not a second definition of the format: it handles the common shape
(camelCase keys, hex ids, every record a TracesData) and gives up on anything else. It
returns False — and the caller re-reads the file with the Python reader in
:mod:`otlp_json`, which finds the line, field and reason — when the JSON does not parse,
a value does not cast, a record is not a plain TracesData, any check below fails, or any
span would be rejected. So both paths produce the same rows, and every error message
comes from one place. Arrays, kvlists and bytes values are converted by the same Python
function the reader uses (a DuckDB UDF), so ``attr_json`` text is identical too.
"""

from __future__ import annotations

import json
from pathlib import Path

import duckdb

from analyzer.formats import stage
from analyzer.formats.otlp_json import scope_attributes_json
from analyzer.formats.values import BadRecord, any_value_to_plain, json_text

__all__ = ["drop_flat", "move_to_stage", "stage_json_lines"]

_VALUE = ("STRUCT(stringValue VARCHAR, intValue VARCHAR, doubleValue DOUBLE, boolValue BOOLEAN,"
          " arrayValue JSON, kvlistValue JSON, bytesValue VARCHAR)")  # fmt: skip
_ATTRS = f"STRUCT(key VARCHAR, value {_VALUE})[]"
_SPAN = (
    f"STRUCT(traceId VARCHAR, spanId VARCHAR, parentSpanId VARCHAR, traceState VARCHAR, flags BIGINT, name VARCHAR,"
    f" kind VARCHAR, startTimeUnixNano VARCHAR, endTimeUnixNano VARCHAR, attributes {_ATTRS}, droppedAttributesCount BIGINT,"
    f" events STRUCT(timeUnixNano VARCHAR, name VARCHAR, attributes {_ATTRS}, droppedAttributesCount BIGINT)[],"
    f" droppedEventsCount BIGINT, links STRUCT(traceId VARCHAR, spanId VARCHAR, traceState VARCHAR, attributes {_ATTRS},"
    f" droppedAttributesCount BIGINT, flags BIGINT)[], droppedLinksCount BIGINT, status STRUCT(message VARCHAR, code VARCHAR))"
)
_SCHEMA = (f"STRUCT(resource STRUCT(attributes {_ATTRS}), scopeSpans STRUCT(scope STRUCT(name VARCHAR, version VARCHAR,"
           f" attributes JSON), spans {_SPAN}[])[])[]")  # fmt: skip

_KINDS = "['UNSPECIFIED', 'INTERNAL', 'SERVER', 'CLIENT', 'PRODUCER', 'CONSUMER']"
_CODES = "['UNSET', 'OK', 'ERROR']"


def _enum(expr: str, names: str, prefix: str) -> str:
    """SQL: an enum given as an integer or a (prefixed) name -> its name, else NULL."""
    return (f"(CASE WHEN {expr} IS NULL THEN {names}[1]"
            f" WHEN regexp_full_match({expr}, '[0-9]+') THEN {names}[TRY_CAST({expr} AS INTEGER) + 1]"
            f" WHEN list_contains({names}, upper(replace(upper({expr}), '{prefix}', ''))) THEN upper(replace(upper({expr}), '{prefix}', ''))"
            f" END)")  # fmt: skip


def _maps(attrs: str, prefix: str = "attr") -> str:
    """SQL: the five typed map columns (``<prefix>_str`` ...) of an OTLP attribute list."""
    a = f"coalesce({attrs}, [])"
    kind_json = "(x.value.arrayValue IS NOT NULL OR x.value.kvlistValue IS NOT NULL OR x.value.bytesValue IS NOT NULL)"
    one = "map_from_entries(list_transform(list_filter({a}, lambda x: {cond}), lambda x: {{'k': x.key, 'v': {v}}}))::MAP(VARCHAR, {t}) AS {col}"
    parts = [
        one.format(a=a, cond="x.value.stringValue IS NOT NULL", v="x.value.stringValue", t="VARCHAR", col=f"{prefix}_str"),
        one.format(a=a, cond="x.value.intValue IS NOT NULL", v="x.value.intValue::BIGINT", t="BIGINT", col=f"{prefix}_int"),
        one.format(a=a, cond="x.value.doubleValue IS NOT NULL", v="x.value.doubleValue", t="DOUBLE", col=f"{prefix}_double"),
        one.format(a=a, cond="x.value.boolValue IS NOT NULL", v="x.value.boolValue", t="BOOLEAN", col=f"{prefix}_bool"),
        one.format(a=a, cond=kind_json, t="VARCHAR", col=f"{prefix}_json",
                   v="tt_plain_json(x.value.arrayValue::VARCHAR, x.value.kvlistValue::VARCHAR, x.value.bytesValue)"),
    ]
    return ", ".join(parts)


def _attr_counts(attrs: str, prefix: str) -> str:
    """SQL: ``<prefix>_n`` (attributes given) and ``<prefix>_keys`` (distinct keys), checked
    later against the maps' sizes: a value of no or several known kinds, or a repeated key,
    makes them differ (and sends the file to the Python reader)."""
    a = f"coalesce({attrs}, [])"
    return f"len({a}) AS {prefix}_n, len(list_distinct(list_transform({a}, lambda x: x.key))) AS {prefix}_keys"


def _attrs_ok(prefix: str) -> str:
    """SQL over materialized columns: the five maps hold every attribute exactly once."""
    card = " + ".join(f"cardinality({prefix}_{k})" for k in ("str", "int", "double", "bool", "json"))
    return f"({card}) = {prefix}_n AND {prefix}_keys = {prefix}_n"


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


def _register_udfs(con: duckdb.DuckDBPyConnection) -> None:
    con.execute("SELECT 1").fetchall()  # finish any pending result: create_function refuses to run otherwise
    for name, fn, args in (("tt_plain_json", _plain_json, ["VARCHAR", "VARCHAR", "VARCHAR"]), ("tt_scope_json", _scope_json, ["VARCHAR"])):
        try:
            con.create_function(name, fn, args, "VARCHAR", null_handling="special", side_effects=False)
        except (duckdb.Error, RuntimeError) as e:
            if "already" not in str(e):
                raise


_HEX_ID = "(regexp_full_match({0}, '[0-9a-f]{{{1}}}') AND {0} <> repeat('0', {1}))"


_CLOCK = ("CASE WHEN resource_str['service.name'] IS NULL AND resource_str['service.instance.id'] IS NULL"
          " AND resource_str['host.name'] IS NULL THEN NULL ELSE coalesce(resource_str['service.name'], '') || '|'"
          " || coalesce(resource_str['service.instance.id'], '') || '|' || coalesce(resource_str['host.name'], '') END")  # fmt: skip


def _flatten_sql(path: str, compression: str) -> str:
    """SQL creating ``_fj_stage_spans``: one row per span, the staging columns plus raw
    events/links and the figures the checks need. Nothing is validated here (``_SPAN_CHECKS``)."""
    src = (f"read_json('{path.replace(chr(39), chr(39) * 2)}', format = 'newline_delimited', records = true, sample_size = 1,"
           f" compression = '{compression}', columns = {{resourceSpans: '{_SCHEMA}'}})")  # fmt: skip
    # A NULL list becomes [NULL] so a record without resourceSpans/scopeSpans/spans yields a
    # row that fails the checks (and sends the file to the Python reader) instead of vanishing.
    return f"""
    CREATE OR REPLACE TEMP TABLE _fj_stage_spans AS
    WITH rs AS (SELECT unnest(coalesce(resourceSpans, [NULL])) AS rs FROM {src}),
         rsm AS (SELECT {_maps('rs.resource.attributes', 'resource')}, {_attr_counts('rs.resource.attributes', 'resource')},
                        rs.scopeSpans AS scope_spans FROM rs),
         rsc AS (SELECT *, resource_str['service.name'] AS service_name, resource_str['service.instance.id'] AS service_instance_id,
                        resource_str['host.name'] AS host_name, {_CLOCK} AS clock_domain FROM rsm),
         ss AS (SELECT * EXCLUDE (scope_spans), unnest(coalesce(scope_spans, [NULL])) AS ss FROM rsc),
         spans AS (SELECT * EXCLUDE (ss), ss.scope AS scope, unnest(coalesce(ss.spans, [NULL])) AS sp FROM ss)
    SELECT
           lower(sp.traceId) AS trace_id, lower(sp.spanId) AS span_id, lower(NULLIF(sp.parentSpanId, '')) AS parent_raw,
           CASE WHEN parent_raw = '0000000000000000' THEN NULL ELSE parent_raw END AS parent_span_id,
           NULLIF(sp.traceState, '') AS trace_state, sp.flags AS flags_raw, NULLIF(sp.flags, 0) AS flags, coalesce(sp.name, '') AS name,
           {_enum("sp.kind", _KINDS, "SPAN_KIND_")} AS kind,
           TRY_CAST(sp.startTimeUnixNano AS BIGINT) AS start_ns, TRY_CAST(sp.endTimeUnixNano AS BIGINT) AS end_ns,
           {_enum("sp.status.code", _CODES, "STATUS_CODE_")} AS status_code,
           NULLIF(sp.status.message, '') AS status_message,
           {_maps('sp.attributes')}, {_attr_counts('sp.attributes', 'attr')},
           resource_str, resource_int, resource_double, resource_bool, resource_json, resource_n, resource_keys,
           service_name, service_instance_id, host_name, clock_domain,
           NULLIF(scope.name, '') AS scope_name, NULLIF(scope.version, '') AS scope_version,
           CASE WHEN scope.attributes IS NOT NULL THEN tt_scope_json(scope.attributes::VARCHAR) END AS scope_attributes_json,
           coalesce(sp.droppedAttributesCount, 0) AS dropped_attributes_count,
           coalesce(sp.droppedEventsCount, 0) AS dropped_events_count,
           coalesce(sp.droppedLinksCount, 0) AS dropped_links_count,
           sp.events AS events, sp.links AS links, nextval('_fj_ord') - 1 AS _ord, NULL::BIGINT AS _line
    FROM spans"""


_SPAN_CHECKS = " AND ".join([
    _HEX_ID.format("trace_id", 32), _HEX_ID.format("span_id", 16),
    "(parent_raw IS NULL OR regexp_full_match(parent_raw, '[0-9a-f]{16}'))",
    "start_ns > 0", "end_ns >= start_ns", "kind IS NOT NULL", "status_code IS NOT NULL",
    "coalesce(flags_raw, 0) >= 0", "dropped_attributes_count >= 0", "dropped_events_count >= 0", "dropped_links_count >= 0",
    _attrs_ok("attr"), _attrs_ok("resource"),
])  # fmt: skip

def _count_bad(con: duckdb.DuckDBPyConnection, table: str, checks: str) -> int:
    return con.execute(f"SELECT count(*) FROM {table} WHERE NOT coalesce({checks}, false)").fetchone()[0]


def _stage_from_flat(con: duckdb.DuckDBPyConnection) -> int | None:
    """Check ``_fj_stage_spans`` and build the events and links staging tables from it: the
    number of spans, or None when any row fails a check."""
    n_spans = con.execute("SELECT count(*) FROM _fj_stage_spans").fetchone()[0]
    if not n_spans or _count_bad(con, "_fj_stage_spans", _SPAN_CHECKS):
        return None
    con.execute(f"""CREATE OR REPLACE TEMP TABLE _fj_stage_events AS
        SELECT _ord, trace_id, span_id, i::INTEGER AS event_index, TRY_CAST(e.timeUnixNano AS BIGINT) AS time_ns,
               coalesce(e.name, '') AS name, {_maps('e.attributes')}, {_attr_counts('e.attributes', 'attr')},
               coalesce(e.droppedAttributesCount, 0) AS dropped_attributes_count
        FROM (SELECT _ord, trace_id, span_id, unnest(events) AS e, unnest(range(len(events))) AS i
              FROM _fj_stage_spans WHERE len(events) > 0)""")
    if _count_bad(con, "_fj_stage_events", f"time_ns > 0 AND dropped_attributes_count >= 0 AND {_attrs_ok('attr')}"):
        return None
    con.execute(f"""CREATE OR REPLACE TEMP TABLE _fj_stage_links AS
        SELECT _ord, trace_id, span_id, i::INTEGER AS link_index, lower(l.traceId) AS linked_trace_id,
               lower(l.spanId) AS linked_span_id, NULLIF(l.traceState, '') AS trace_state, l.flags AS flags,
               {_maps('l.attributes')}, {_attr_counts('l.attributes', 'attr')},
               coalesce(l.droppedAttributesCount, 0) AS dropped_attributes_count
        FROM (SELECT _ord, trace_id, span_id, unnest(links) AS l, unnest(range(len(links))) AS i
              FROM _fj_stage_spans WHERE len(links) > 0)""")
    link_checks = (f"{_HEX_ID.format('linked_trace_id', 32)} AND {_HEX_ID.format('linked_span_id', 16)}"
                   f" AND coalesce(flags, 0) >= 0 AND dropped_attributes_count >= 0 AND {_attrs_ok('attr')}")  # fmt: skip
    if _count_bad(con, "_fj_stage_links", link_checks):
        return None
    con.execute("UPDATE _fj_stage_links SET flags = NULL WHERE flags = 0")
    return int(n_spans)


def stage_json_lines(con: duckdb.DuckDBPyConnection, path: Path, compression: str) -> tuple[int, int] | None:
    """Flatten and check an OTLP/JSON lines file into the temp tables ``_fj_stage_*``.

    Returns (records, spans) read, or None when the Python reader must read the file (nothing
    is then left behind). Call it outside a transaction: a parse or cast error inside one
    would abort it. :func:`move_to_stage` then moves the rows into the staging tables.
    """
    _register_udfs(con)
    try:
        con.execute("CREATE OR REPLACE TEMP SEQUENCE _fj_ord")
        con.execute(_flatten_sql(str(path), compression))
        n_spans = _stage_from_flat(con)
        counts = None if n_spans is None else (_count_records(path), n_spans)
    except (duckdb.Error, ValueError):
        counts = None
    finally:
        con.execute("DROP SEQUENCE IF EXISTS _fj_ord")
    if counts is None:
        drop_flat(con)
    return counts


def _count_records(path: Path) -> int:
    """Non-blank lines (what read_json reads as records), counted by streaming the file."""
    import gzip

    with open(path, "rb") as fh:
        magic = fh.read(4)
    if magic[:2] == b"\x1f\x8b":
        stream = gzip.open(path, "rb")
    elif magic == b"\x28\xb5\x2f\xfd":
        import zstandard

        stream = zstandard.ZstdDecompressor().stream_reader(open(path, "rb"), read_across_frames=True)  # noqa: SIM115
        import io

        stream = io.BufferedReader(stream, buffer_size=1 << 20)
    else:
        stream = open(path, "rb", buffering=1 << 20)  # noqa: SIM115
    with stream:
        return sum(1 for line in stream if line.strip())


def move_to_stage(con: duckdb.DuckDBPyConnection) -> None:
    """Make the rows :func:`stage_json_lines` prepared the staging tables (a rename, no copy)."""
    stage.adopt_stage(con, "_fj_stage_")


def drop_flat(con: duckdb.DuckDBPyConnection) -> None:
    for table in ("spans", "events", "links"):
        con.execute(f"DROP TABLE IF EXISTS _fj_stage_{table}")
