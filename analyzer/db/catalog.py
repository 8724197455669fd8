"""What each public table and view means: one line per table or view, and one line per
column with its unit where it has one. The one source of these meanings: ``tokentrace
tables`` prints them beside the types of DuckDB's live catalog, and tests/test_cli_tables.py
checks that every column of every public object has a meaning here and that no meaning
names a column that does not exist. docs/tables.md and docs/metrics.md explain them at
length.

Public objects: the five tables every input is loaded into (this module; defined in
analyzer/db/schema.py), the marker table of analyzer/db/ownership.py, and the views people
query with ``tokentrace sql`` (analyzer/db/catalog_views.py; defined in queries/views/). The
adapters' own views (``tt_*``, ``vllm_*``, ...) and the runner's helpers are internal and
not described.
Plain ASCII text: it is printed as it is on any terminal.
"""

from __future__ import annotations

from typing import NamedTuple

from analyzer.db.catalog_views import VIEWS
from analyzer.db.schema import DEDICATED_COLUMNS

__all__ = ["CATALOG", "Entry", "TABLES", "attribute_maps", "dedicated_columns"]


class Entry(NamedTuple):
    """One public table or view: ``kind`` (``table`` or ``view``), a one-line ``meaning``,
    and a one-line meaning per column (in the object's column order)."""

    kind: str
    meaning: str
    columns: dict[str, str]


def dedicated_columns(table: str) -> dict[str, str]:
    """The dedicated columns of ``table`` (analyzer.db.schema.DEDICATED_COLUMNS), each the
    copy of one attribute a scan reads without decoding a map."""
    return {c.name: f"{c.map_column}['{c.key}'], typed; NULL: key absent"
            for c in DEDICATED_COLUMNS.get(table, ())}


def attribute_maps(prefix: str, of: str) -> dict[str, str]:
    """The five typed attribute maps ``<prefix>_str`` ... ``<prefix>_json`` of ``of``."""
    return {
        f"{prefix}_str": f"{of} with string values: {prefix}_str['gen_ai.request.model']",
        f"{prefix}_int": f"{of} with integer (int64) values: {prefix}_int['gen_ai.usage.output_tokens']",
        f"{prefix}_double": f"{of} with double values (NaN and Infinity kept)",
        f"{prefix}_bool": f"{of} with boolean values",
        f"{prefix}_json": f"{of} with array, kvlist, bytes or empty values, as compact JSON text",
    }


_SPANS = {
    "trace_id": "trace id: 32 lowercase hex digits (Jaeger's 64-bit ids left-padded with zeros)",
    "span_id": "span id: 16 lowercase hex digits; (trace_id, span_id) is unique",
    "parent_span_id": "the parent span's id; NULL for a root span",
    "trace_state": "W3C tracestate; NULL when empty",
    "flags": "OTLP span flags (W3C trace flags in bits 0-7, parent-is-remote in 8-9); NULL when 0",
    "name": "span name ('' when absent): gateway, prefill, decode, engine_step, llm_request, ...",
    "kind": "UNSPECIFIED, INTERNAL, SERVER, CLIENT, PRODUCER or CONSUMER",
    "start_ns": "span start, ns since epoch (> 0)",
    "end_ns": "span end, ns since epoch (>= start_ns)",
    "status_code": "UNSET, OK or ERROR",
    "status_message": "status description; NULL when empty",
    "service_name": "resource attribute service.name",
    "service_instance_id": "resource attribute service.instance.id",
    "host_name": "resource attribute host.name",
    "clock_domain": "service.name|service.instance.id|host.name: spans sharing it share a clock",
    "scope_name": "instrumentation scope name ('tokentrace' for tokentrace's own spans)",
    "scope_version": "instrumentation scope version",
    **attribute_maps("attr", "span attributes"),
    **attribute_maps("resource", "resource attributes"),
    "scope_attributes_json": "instrumentation scope attributes as one JSON object; NULL when none",
    "dropped_attributes_count": "span attributes the SDK dropped (0 when absent)",
    "dropped_events_count": "span events the SDK dropped; > 0 on a span with chunk events: f/e unknown",
    "dropped_links_count": "span links the SDK dropped (0 when absent)",
    "load_id": "the loads.load_id of the load that inserted the row",
    **dedicated_columns("spans"),
}

_SPAN_EVENTS = {
    "trace_id": "trace of the span the event belongs to",
    "span_id": "the span the event belongs to (join spans on trace_id, span_id)",
    "event_index": "0-based position in the span's event list",
    "time_ns": "event time, ns since epoch",
    "name": "event name ('' when absent): tokentrace.chunk, ...; Jaeger logs: their event field",
    **attribute_maps("attr", "event attributes"),
    "dropped_attributes_count": "event attributes the SDK dropped (0 when absent)",
    **dedicated_columns("span_events"),
}

_SPAN_LINKS = {
    "trace_id": "trace of the linking span",
    "span_id": "the linking span (join spans on trace_id, span_id)",
    "link_index": "0-based position in the span's link list",
    "linked_trace_id": "trace id of the linked span context",
    "linked_span_id": "span id of the linked span context",
    "trace_state": "the linked context's W3C tracestate; NULL when empty",
    "flags": "the linked context's flags; NULL when 0 or absent",
    **attribute_maps("attr", "link attributes"),
    "attr_str": "link attributes with string values (Jaeger references: opentracing.ref_type)",
    "dropped_attributes_count": "link attributes the SDK dropped (0 when absent)",
}

_LOADS = {
    "load_id": "one id per tokentrace load call (all its files)",
    "file": "input path as given (<stdin> for -)",
    "format": "shape read: otlp_json_lines, otlp_json, otlp_proto, jaeger_trace, parquet, ...",
    "loaded_at_ns": "wall clock of the load, ns since epoch",
    "records_read": "top-level records: JSON lines, documents, protobuf messages, Jaeger traces, rows",
    "spans_read": "spans found inside readable records",
    "spans_loaded": "spans inserted into spans",
    "duplicates_identical": "spans already loaded (file or database) with identical content: retries",
    "duplicates_conflicting": "same (trace_id, span_id), other content: rejected as conflicting_duplicate",
    "rejected": "records and spans rejected: the sum of rejected_by_reason",
    "incomplete_last_line": "the file ended in a partial line (still being written)",
    "rejected_by_reason": "reason code -> count (codes in docs/loading.md)",
}

_REJECTS = {
    "load_id": "the load that read it (loads.load_id)",
    "file": "input path as given (<stdin> for -)",
    "line": "1-based line where the record starts; protobuf: message number; Parquet: NULL",
    "record_index": "0-based index in the file of the span (span-level reject) or of the record",
    "trace_id": "trace id as given in the input, when readable",
    "span_id": "span id as given in the input, when readable",
    "reason": "reason code: invalid_json, invalid_time, conflicting_duplicate, ... (docs/loading.md)",
    "raw": "the record: the line's text, the span as JSON, or the canonical row as JSON",
}

#: The canonical tables (analyzer/db/schema.py), in the order `tokentrace tables` lists them.
TABLES: dict[str, Entry] = {
    "spans": Entry("table", "one row per span of every loaded file (OTLP, Jaeger, Parquet): what every view reads",
                   _SPANS),
    "span_events": Entry("table", "one row per span event (a tokentrace.chunk event per streamed output chunk)",
                         _SPAN_EVENTS),
    "span_links": Entry("table", "one row per span link (Jaeger: every reference but the parent)", _SPAN_LINKS),
    "loads": Entry("table", "one row per input file per tokentrace load: read, loaded, duplicate, rejected",
                   _LOADS),
    "rejects": Entry("table", "every record or span a load rejected, raw, with its reason code", _REJECTS),
    "tokentrace_schema": Entry(
        "table", "one row: the file is a tokentrace database (analyzer/db/ownership.py), and its layout",
        {"schema_version": "the layout of the five tables (1 today); a newer one is not written into",
         "created_by": "the tokentrace that marked the file (e.g. tokentrace 0.1.0)"}),
}

#: Every public table and view: the tables, then the views (analyzer/db/catalog_views.py).
CATALOG: dict[str, Entry] = {
    **TABLES,
    **{name: Entry("view", meaning, columns) for name, (meaning, columns) in VIEWS.items()},
}
