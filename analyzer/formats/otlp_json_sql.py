"""SQL text for the OTLP/JSON lines bulk reader (:mod:`analyzer.formats.otlp_json_duckdb`).

Builders only, no execution. Every expression mirrors the Python reader
(:mod:`analyzer.formats.otlp_json` and :mod:`analyzer.formats.values`) for the values it
accepts; where the Python reader would reject a value, or where the SQL cannot be sure to
give the same row (snake_case keys, base64 ids, a value of no or several kinds, a repeated
attribute key, an integer written as ``"5.5"``), the expression calls ``error()``. The
statement then fails and the caller hands the whole file to the Python reader, which names
the line and reason. So the checks run inside the one scan that builds the rows.

Times are int64 nanoseconds (``*_ns``); counts are plain integers.
"""

from __future__ import annotations

__all__ = [
    "EVENT_SCHEMA",
    "LINK_SCHEMA",
    "SPAN_SCHEMA",
    "STAGE_SCHEMA",
    "event_select",
    "link_select",
    "read_json_sql",
    "span_select",
    "spans_with",
]

# Scalars that may arrive as JSON strings or numbers are read as VARCHAR and checked here
# (DuckDB's own casts are laxer than the Python reader: "5.5" -> 6, true -> 1.0).
# boolValue as VARCHAR too: JSON true reads 'true' (so does the string "true", which slips
# through; reading it as JSON type would tell them apart but costs ~50% more parse time).
_VALUE = ("STRUCT(stringValue VARCHAR, intValue VARCHAR, doubleValue VARCHAR, boolValue VARCHAR, arrayValue JSON,"
          " kvlistValue JSON, bytesValue VARCHAR)")  # fmt: skip
_ATTRS = f"STRUCT(key VARCHAR, value {_VALUE})[]"
# snake_case spellings of optional fields: present -> the Python reader reads the file.
_SPAN_SNAKE = "parent_span_id JSON, trace_state JSON, dropped_attributes_count JSON, dropped_events_count JSON, dropped_links_count JSON"
_SPAN_FIELDS = (
    "traceId VARCHAR, spanId VARCHAR, parentSpanId VARCHAR, traceState VARCHAR, flags VARCHAR, name VARCHAR, kind VARCHAR,"
    f" startTimeUnixNano VARCHAR, endTimeUnixNano VARCHAR, attributes {_ATTRS}, droppedAttributesCount VARCHAR,"
    f" droppedEventsCount VARCHAR, droppedLinksCount VARCHAR, status STRUCT(message VARCHAR, code VARCHAR), {_SPAN_SNAKE}"
)
_EVENT = f"STRUCT(timeUnixNano VARCHAR, name VARCHAR, attributes {_ATTRS}, droppedAttributesCount VARCHAR, dropped_attributes_count JSON)"
_LINK = (f"STRUCT(traceId VARCHAR, spanId VARCHAR, traceState VARCHAR, attributes {_ATTRS}, droppedAttributesCount VARCHAR,"
         " flags VARCHAR, trace_state JSON, dropped_attributes_count JSON)")  # fmt: skip
_SCOPE = "scope STRUCT(name VARCHAR, version VARCHAR, attributes JSON), instrumentationLibrary JSON"


def _traces(spans: str, resource: bool = True, scope: bool = True) -> str:
    res = f"resource STRUCT(attributes {_ATTRS}), " if resource else ""
    sc = f"{_SCOPE}, " if scope else ""
    return f"STRUCT({res}scopeSpans STRUCT({sc}spans STRUCT({spans})[])[])[]"


#: Everything a ``spans`` row needs; of the links only whether there are any.
SPAN_SCHEMA = _traces(f"{_SPAN_FIELDS}, links STRUCT(spanId VARCHAR)[]")
EVENT_SCHEMA = _traces(f"traceId VARCHAR, spanId VARCHAR, events {_EVENT}[]", resource=False, scope=False)
LINK_SCHEMA = _traces(f"traceId VARCHAR, spanId VARCHAR, links {_LINK}[]", resource=False, scope=False)
#: Spans with their raw events and links, for the staged (deduplicating) path.
STAGE_SCHEMA = _traces(f"{_SPAN_FIELDS}, events {_EVENT}[], links {_LINK}[]")

_KINDS = "['UNSPECIFIED', 'INTERNAL', 'SERVER', 'CLIENT', 'PRODUCER', 'CONSUMER']"
_CODES = "['UNSET', 'OK', 'ERROR']"
_MAP_KINDS = ("str", "int", "double", "bool", "json")


def read_json_sql(path: str, compression: str, schema: str) -> str:
    """``read_json`` over one OTLP/JSON lines file with an explicit schema (one TracesData per line)."""
    quoted = path.replace("'", "''")
    return (f"read_json('{quoted}', format = 'newline_delimited', records = true, sample_size = 1,"
            f" compression = '{compression}', columns = {{resourceSpans: '{schema}'}})")  # fmt: skip


def _fail(what: str) -> str:
    return f"error('tokentrace bulk check failed: {what}')"


def _int64(expr: str) -> str:
    """``expr`` (VARCHAR) as BIGINT when it is exactly the canonical decimal text of one, else
    NULL. Stricter than the Python reader ("007", "-0", " 5" go to it) and than DuckDB's cast
    ("5.5" -> 6, "1e3", "+5", "5_000", "0x10"): a round trip, cheaper than a regexp."""
    return f"(CASE WHEN TRY_CAST({expr} AS BIGINT)::VARCHAR = {expr} THEN TRY_CAST({expr} AS BIGINT) END)"


def _uint(expr: str) -> str:
    """A non-negative integer given as a JSON number or digit string; missing is 0 (``parse_uint``)."""
    return f"(CASE WHEN {expr} IS NULL THEN 0 WHEN {_int64(expr)} >= 0 THEN {_int64(expr)} ELSE {_fail('count')} END)"


def _time(expr: str) -> str:
    """A positive int64 nanosecond time; anything else (missing, 0, "1.5e18") fails."""
    return f"(CASE WHEN {_int64(expr)} > 0 THEN {_int64(expr)} ELSE {_fail('time')} END)"


def _hex_id(expr: str, digits: int) -> str:
    """Lowercase hex of the right length, not all zeros; else fail (base64 ids go to Python)."""
    return (f"(CASE WHEN regexp_full_match(lower({expr}), '[0-9a-f]{{{digits}}}') AND lower({expr}) <> repeat('0', {digits})"
            f" THEN lower({expr}) ELSE {_fail('id')} END)")  # fmt: skip


def _enum(expr: str, names: str, prefix: str) -> str:
    """An enum given as an integer or a (prefixed) name -> its name; unknown fails (``parse_enum``)."""
    u = f"upper({expr})"
    up = f"(CASE WHEN starts_with({u}, '{prefix}') THEN {u}[{len(prefix) + 1}:] ELSE {u} END)"
    return (f"(CASE WHEN {expr} IS NULL THEN {names}[1]"
            f" WHEN regexp_full_match({expr}, '[0-9]+') AND TRY_CAST({expr} AS INTEGER) < len({names}) THEN {names}[TRY_CAST({expr} AS INTEGER) + 1]"
            f" WHEN list_contains({names}, {up}) THEN {up} ELSE {_fail('enum')} END)")  # fmt: skip


def _absent(*exprs: str) -> str:
    """Fail unless every expression is NULL (snake_case spellings the bulk reader does not read)."""
    return f"(CASE WHEN {' AND '.join(f'{e} IS NULL' for e in exprs)} THEN true ELSE {_fail('snake_case key')} END)"


def _maps(attrs: str, prefix: str) -> str:
    """The five typed map columns ``<prefix>_str`` ... of an OTLP attribute list, with each
    value checked as the Python reader checks it (``split_any_values``)."""
    # No coalesce(attrs, []) here: after an UNNEST the list shares its parent's child vector,
    # and coalescing it copied that whole vector per chunk (the costliest step, measured).
    # A NULL list gives a NULL map, coalesced to an empty one instead.
    a = attrs
    one = ("coalesce(map_from_entries(list_transform(list_filter({a}, lambda x: {cond}), lambda x: {{'k': x.key, 'v': {v}}})),"
           " MAP {{}})::MAP(VARCHAR, {t}) AS {col}")
    i, d, b = "x.value.intValue", "x.value.doubleValue", "x.value.boolValue"
    int_v = f"coalesce({_int64(i)}, {_fail('intValue')})"
    dbl_ok = f"regexp_full_match({d}, '-?[0-9]+(\\.[0-9]+)?([eE][-+]?[0-9]+)?|-?Infinity|NaN')"
    dbl_v = f"CASE WHEN {dbl_ok} THEN {d}::DOUBLE ELSE {_fail('doubleValue')} END"
    bool_v = f"CASE {b} WHEN 'true' THEN true WHEN 'false' THEN false ELSE {_fail('boolValue')} END"
    json_kind = "(x.value.arrayValue IS NOT NULL OR x.value.kvlistValue IS NOT NULL OR x.value.bytesValue IS NOT NULL)"
    json_v = "tt_plain_json(x.value.arrayValue::VARCHAR, x.value.kvlistValue::VARCHAR, x.value.bytesValue)"
    parts = [
        one.format(a=a, cond="x.value.stringValue IS NOT NULL", v="x.value.stringValue", t="VARCHAR", col=f"{prefix}_str"),
        one.format(a=a, cond=f"{i} IS NOT NULL", v=int_v, t="BIGINT", col=f"{prefix}_int"),
        one.format(a=a, cond=f"{d} IS NOT NULL", v=dbl_v, t="DOUBLE", col=f"{prefix}_double"),
        one.format(a=a, cond=f"{b} IS NOT NULL", v=bool_v, t="BOOLEAN", col=f"{prefix}_bool"),
        one.format(a=a, cond=json_kind, v=json_v, t="VARCHAR", col=f"{prefix}_json"),
    ]
    return ", ".join(parts) + f", coalesce(len({a}), 0) AS {prefix}_n"


def _maps_ok(prefix: str) -> str:
    """True when the five maps hold every attribute exactly once: as many entries as given
    (a value of no kind lands in no map) and no key in two maps (a repeated key of another
    kind, or a value of several kinds). A key repeated within one kind already fails in
    ``map_from_entries``. The pairwise key test runs only where both maps have entries."""
    cols = [f"{prefix}_{k}" for k in _MAP_KINDS]
    card = " + ".join(f"cardinality({c})" for c in cols)
    cross = [f"(cardinality({a}) = 0 OR cardinality({b}) = 0 OR len(list_filter(map_keys({b}), lambda k: map_contains({a}, k))) = 0)"
             for n, a in enumerate(cols) for b in cols[n + 1:]]  # fmt: skip
    return f"(({card}) = {prefix}_n AND {' AND '.join(cross)})"


def _checked(ok: str, value: str, what: str) -> str:
    return f"CASE WHEN {ok} THEN {value} ELSE {_fail(what)} END"


_CLOCK = ("CASE WHEN resource_str['service.name'] IS NULL AND resource_str['service.instance.id'] IS NULL"
          " AND resource_str['host.name'] IS NULL THEN NULL ELSE coalesce(resource_str['service.name'], '') || '|'"
          " || coalesce(resource_str['service.instance.id'], '') || '|' || coalesce(resource_str['host.name'], '') END")  # fmt: skip


def span_select(src: str, extra: dict[str, str] | None = None, token: int = 0) -> str:
    """SELECT of the ``spans`` columns (``canonical.SPAN_COLUMNS`` names), checked, from
    ``read_json`` with :data:`SPAN_SCHEMA` (or :data:`STAGE_SCHEMA`). ``extra`` adds
    columns (name -> expression over ``sp``, the raw span struct), e.g. ``{"events": "sp.events"}``.

    Side channels (the ``tt_bulk_count`` UDF, counting under ``token``): channel 0 sees each
    record (non-blank line) once, channel 1 each span with links. A record or
    resource/scope entry that is not the plain TracesData shape (null, no resourceSpans or
    scopeSpans — e.g. logs, api_v3, OTLP < 0.15) fails, as does a null span.
    """
    extra = extra or {}
    extra_inner = "".join(f", {expr} AS {name}" for name, expr in extra.items())
    extra_outer = "".join(f", {name}" for name in extra)
    # rec and links_seen must stay read by an output column (here: through span_ok into
    # trace_id): DuckDB drops a side-effect UDF whose column nothing reads (measured, DuckDB
    # 2.0: count(*) over this SELECT called tt_bulk_count 0 times), and a LIMIT above it
    # still calls it for rows never returned. Only a full INSERT / CREATE AS counts exactly.
    span_ok = " AND ".join([
        "rec IS NOT NULL", "shape_ok", "NOT sp_null", "end_ns >= start_ns", "resource_ok", "snake_ok", _maps_ok("attr"),
        "(parent_raw IS NULL OR regexp_full_match(parent_raw, '[0-9a-f]{16}'))", "(links_seen IS NULL OR links_seen > 0)",
    ])  # fmt: skip
    # Shape checks sit at the level they test (record, resource, scope), as columns the final
    # check reads, so a null list fails where it is instead of being padded: coalescing a
    # list this size copied all of it.
    return f"""
    WITH r AS NOT MATERIALIZED (
           SELECT tt_bulk_count({int(token)}, 0) AS rec, resourceSpans AS rsl, {_checked('resourceSpans IS NOT NULL', 'true', 'record shape')} AS rec_ok
           FROM {src}),
         rs AS NOT MATERIALIZED (SELECT rec, rec_ok, unnest(rsl) AS rs FROM r),
         rsm AS NOT MATERIALIZED (
           SELECT rec, {_checked('rec_ok AND rs IS NOT NULL AND rs.scopeSpans IS NOT NULL', 'true', 'resource shape')} AS rs_ok,
                  {_maps('rs.resource.attributes', 'resource')}, rs.scopeSpans AS scope_spans FROM rs),
         rsc AS NOT MATERIALIZED (
           SELECT * EXCLUDE (resource_n), {_checked(_maps_ok('resource'), 'true', 'resource attributes')} AS resource_ok,
                  resource_str['service.name'] AS service_name, resource_str['service.instance.id'] AS service_instance_id,
                  resource_str['host.name'] AS host_name, {_CLOCK} AS clock_domain FROM rsm),
         ss AS NOT MATERIALIZED (SELECT * EXCLUDE (scope_spans), unnest(scope_spans) AS ss FROM rsc),
         ssc AS NOT MATERIALIZED (  -- per scope, before the spans are unnested: the Python UDF runs once per scope
           SELECT * EXCLUDE (rs_ok), {_checked('rs_ok AND ss IS NOT NULL', 'true', 'scope shape')} AS shape_ok,
                  NULLIF(ss.scope.name, '') AS scope_name, NULLIF(ss.scope.version, '') AS scope_version,
                  CASE WHEN ss.scope.attributes IS NOT NULL THEN tt_scope_json(ss.scope.attributes::VARCHAR) END AS scope_attributes_json,
                  ss.instrumentationLibrary AS il FROM ss),
         sp AS NOT MATERIALIZED (SELECT * EXCLUDE (ss), unnest(ss.spans) AS sp FROM ssc),
         flat AS NOT MATERIALIZED (
           SELECT rec, shape_ok, sp IS NULL AS sp_null, {_hex_id('sp.traceId', 32)} AS trace_id, {_hex_id('sp.spanId', 16)} AS span_id,
                  lower(NULLIF(sp.parentSpanId, '')) AS parent_raw,
                  NULLIF(sp.traceState, '') AS trace_state, NULLIF({_uint('sp.flags')}, 0) AS flags,
                  coalesce(sp.name, '') AS name, {_enum('sp.kind', _KINDS, 'SPAN_KIND_')} AS kind,
                  {_time('sp.startTimeUnixNano')} AS start_ns, {_time('sp.endTimeUnixNano')} AS end_ns,
                  {_enum('sp.status.code', _CODES, 'STATUS_CODE_')} AS status_code, NULLIF(sp.status.message, '') AS status_message,
                  service_name, service_instance_id, host_name, clock_domain, scope_name, scope_version,
                  {_maps('sp.attributes', 'attr')},
                  resource_str, resource_int, resource_double, resource_bool, resource_json, resource_ok, scope_attributes_json,
                  {_uint('sp.droppedAttributesCount')} AS dropped_attributes_count,
                  {_uint('sp.droppedEventsCount')} AS dropped_events_count,
                  {_uint('sp.droppedLinksCount')} AS dropped_links_count,
                  CASE WHEN len(sp.links) > 0 THEN tt_bulk_count({int(token)}, 1) END AS links_seen,
                  {_absent('il', 'sp.parent_span_id', 'sp.trace_state', 'sp.dropped_attributes_count',
                           'sp.dropped_events_count', 'sp.dropped_links_count')} AS snake_ok{extra_inner}
           FROM sp)
    SELECT {_checked(span_ok, 'trace_id', 'span')} AS trace_id,
           span_id, CASE WHEN parent_raw = '0000000000000000' THEN NULL ELSE parent_raw END AS parent_span_id,
           trace_state, flags, name, kind, start_ns, end_ns, status_code, status_message,
           service_name, service_instance_id, host_name, clock_domain, scope_name, scope_version,
           attr_str, attr_int, attr_double, attr_bool, attr_json,
           resource_str, resource_int, resource_double, resource_bool, resource_json, scope_attributes_json,
           dropped_attributes_count, dropped_events_count, dropped_links_count{extra_outer}
    FROM flat"""


def _spans_of(src: str, columns: str) -> str:
    return f"""(SELECT {columns} FROM (SELECT unnest(ss.spans) AS sp FROM
                 (SELECT unnest(rs.scopeSpans) AS ss FROM (SELECT unnest(resourceSpans) AS rs FROM {src}))))"""


def event_select(rows: str, keep: str = "") -> str:
    """SELECT of the ``span_events`` columns, checked, from ``rows``: a relation with
    ``trace_id``, ``span_id`` (already lowercase) and ``events`` (the raw list). ``keep``
    names further columns of ``rows`` to carry (e.g. ``_ord``)."""
    k = f"{keep}, " if keep else ""
    return f"""
    WITH ev AS NOT MATERIALIZED (SELECT {k}trace_id, span_id, unnest(events) AS e, unnest(range(len(events))) AS i FROM {rows} WHERE len(events) > 0),
         flat AS NOT MATERIALIZED (SELECT {k}trace_id, span_id, i::INTEGER AS event_index, {_time('e.timeUnixNano')} AS time_ns,
                         coalesce(e.name, '') AS name, {_maps('e.attributes', 'attr')},
                         {_uint('e.droppedAttributesCount')} AS dropped_attributes_count,
                         {_absent('e.dropped_attributes_count')} AS snake_ok
                  FROM ev)
    SELECT {k}{_checked(f"snake_ok AND {_maps_ok('attr')}", 'trace_id', 'event')} AS trace_id, span_id, event_index,
           time_ns, name, attr_str, attr_int, attr_double, attr_bool, attr_json, dropped_attributes_count
    FROM flat"""


def link_select(rows: str, keep: str = "") -> str:
    """SELECT of the ``span_links`` columns, checked, from ``rows`` with ``trace_id``,
    ``span_id`` and ``links`` (the raw list); ``keep`` as in :func:`event_select`."""
    k = f"{keep}, " if keep else ""
    return f"""
    WITH ln AS NOT MATERIALIZED (SELECT {k}trace_id, span_id, unnest(links) AS l, unnest(range(len(links))) AS i FROM {rows} WHERE len(links) > 0),
         flat AS NOT MATERIALIZED (SELECT {k}trace_id, span_id, i::INTEGER AS link_index, {_hex_id('l.traceId', 32)} AS linked_trace_id,
                         {_hex_id('l.spanId', 16)} AS linked_span_id, NULLIF(l.traceState, '') AS trace_state,
                         NULLIF({_uint('l.flags')}, 0) AS flags, {_maps('l.attributes', 'attr')},
                         {_uint('l.droppedAttributesCount')} AS dropped_attributes_count,
                         {_absent('l.trace_state', 'l.dropped_attributes_count')} AS snake_ok
                  FROM ln)
    SELECT {k}{_checked(f"snake_ok AND {_maps_ok('attr')}", 'trace_id', 'link')} AS trace_id, span_id, link_index,
           linked_trace_id, linked_span_id, trace_state, flags, attr_str, attr_int, attr_double, attr_bool, attr_json,
           dropped_attributes_count
    FROM flat"""


def spans_with(src: str, column: str) -> str:
    """``(trace_id, span_id, <column>)`` per span straight from ``read_json`` (:data:`EVENT_SCHEMA`
    or :data:`LINK_SCHEMA`), ids lowercased: the ``rows`` of :func:`event_select` / :func:`link_select`."""
    return _spans_of(src, f"lower(sp.traceId) AS trace_id, lower(sp.spanId) AS span_id, sp.{column} AS {column}")
