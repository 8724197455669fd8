"""Reader for OTLP/JSON: TracesData as JSON lines (the Collector's file exporter), a single
(pretty-printed) document, and either wrapped as Jaeger api_v3 returns it (``{"result": ...}``).

The OTLP/protobuf reader converts its messages to the same dict shape and reuses
:func:`add_traces_data`, so both formats share one mapping onto the canonical rows.
"""

from __future__ import annotations

from typing import Any, BinaryIO

from analyzer.db.schema import SPAN_KINDS, STATUS_CODES
from analyzer.db.store import clock_domain_of
from analyzer.formats.canonical import Reject, RowSink, raw_json
from analyzer.formats.values import (
    BadRecord,
    any_value_to_plain,
    json_text,
    parse_enum,
    parse_id,
    parse_time_ns,
    parse_uint,
    split_any_values,
)

__all__ = ["add_traces_data", "is_traces_document", "loads_json", "scope_attributes_json", "read_json_document", "read_json_lines"]

try:  # orjson is optional: about 3x faster than the standard library here
    from orjson import loads as loads_json
except ImportError:  # pragma: no cover - exercised only without orjson
    from json import loads as loads_json  # type: ignore[assignment]  # the standard library's loads in orjson's place

_NOT_TRACES = ("resourceLogs", "resource_logs", "resourceMetrics", "resource_metrics", "resourceProfiles")


def _g(d: dict, camel: str, snake: str) -> Any:
    v = d.get(camel)
    return d.get(snake) if v is None else v


def _list(d: dict, camel: str, snake: str, what: str) -> list:
    v = _g(d, camel, snake)
    if v is None:
        return []
    if not isinstance(v, list):
        raise BadRecord("invalid_record", f"{what} is not a list")
    return v


def _resource_columns(resource: Any) -> tuple:
    """(service_name, service_instance_id, host_name, clock_domain, 5 resource maps)."""
    if resource is None:
        resource = {}
    if not isinstance(resource, dict):
        raise BadRecord("invalid_record", "resource is not an object")
    maps = split_any_values(resource.get("attributes"))
    strs = dict(maps[0])
    sn, si, hn = strs.get("service.name"), strs.get("service.instance.id"), strs.get("host.name")
    return (sn, si, hn, clock_domain_of({k: strs[k] for k in ("service.name", "service.instance.id", "host.name") if k in strs}), *maps)


def _optional_text(value: Any, what: str) -> str | None:
    """An optional string field: None when absent or empty; any other type rejects the span."""
    return _text(value, what) or None


def _scope_columns(scope: Any) -> tuple:
    """(scope_name, scope_version, scope_attributes_json)."""
    if not scope:
        return None, None, None
    if not isinstance(scope, dict):
        raise BadRecord("invalid_record", "scope is not an object")
    return (_optional_text(scope.get("name"), "scope.name"), _optional_text(scope.get("version"), "scope.version"),
            scope_attributes_json(scope.get("attributes")))


def scope_attributes_json(attrs: Any) -> str | None:
    """Scope attributes as one JSON object of plain values (``scope_attributes_json``), None when empty."""
    if not attrs:
        return None
    if not isinstance(attrs, list):
        raise BadRecord("invalid_attribute", "scope attributes is not a list")
    out: dict[str, Any] = {}
    for kv in attrs:
        key = kv.get("key") if isinstance(kv, dict) else None
        if not isinstance(key, str):
            raise BadRecord("invalid_attribute", f"scope attribute {kv!r} has no string key")
        out[key] = any_value_to_plain(kv.get("value") or {}, key)
    return json_text(out)


def _text(value: Any, what: str) -> str:
    if value is None:
        return ""
    if not isinstance(value, str):
        raise BadRecord("invalid_field", f"{what} {value!r} is not a string")
    return value


def _span_rows(sp: dict, res: tuple, scope: tuple, ordinal: int, line: int | None) -> tuple[tuple, list, list]:
    trace_id = parse_id(_g(sp, "traceId", "trace_id"), 16, "trace_id")
    span_id = parse_id(_g(sp, "spanId", "span_id"), 8, "span_id")
    parent = _g(sp, "parentSpanId", "parent_span_id")
    if parent:
        try:
            parent = parse_id(parent, 8, "parent_span_id")
        except BadRecord as e:
            if e.reason.startswith("invalid"):
                raise
            parent = None
    else:
        parent = None
    start = parse_time_ns(_g(sp, "startTimeUnixNano", "start_time_unix_nano"), "start_time")
    end = parse_time_ns(_g(sp, "endTimeUnixNano", "end_time_unix_nano"), "end_time")
    if end < start:
        raise BadRecord("end_before_start", f"end {end} < start {start}")
    status = sp.get("status") or {}
    if not isinstance(status, dict):
        raise BadRecord("invalid_field", f"status {status!r} is not an object")
    code = parse_enum(status.get("code"), STATUS_CODES, "STATUS_CODE_", "status.code")
    flags = parse_uint(sp.get("flags"), "flags") or None
    attrs = split_any_values(sp.get("attributes"))
    events = []
    for idx, ev in enumerate(_list(sp, "events", "events", "events")):
        t = _g(ev, "timeUnixNano", "time_unix_nano")
        try:
            t = parse_time_ns(t, "event_time")
        except BadRecord as e:
            raise BadRecord("invalid_event_time", f"event {idx}: {e}") from None
        events.append((
            ordinal, trace_id, span_id, idx, t, _text(ev.get("name"), "event name"),
            *split_any_values(ev.get("attributes")),
            parse_uint(_g(ev, "droppedAttributesCount", "dropped_attributes_count"), "droppedAttributesCount"),
        ))  # fmt: skip
    links = []
    for idx, ln in enumerate(_list(sp, "links", "links", "links")):
        try:
            lt = parse_id(_g(ln, "traceId", "trace_id"), 16, "trace_id")
            ls = parse_id(_g(ln, "spanId", "span_id"), 8, "span_id")
        except BadRecord as e:
            raise BadRecord("invalid_link_id", f"link {idx}: {e}") from None
        links.append((
            ordinal, trace_id, span_id, idx, lt, ls, _optional_text(_g(ln, "traceState", "trace_state"), "link.traceState"),
            parse_uint(ln.get("flags"), "link flags") or None,
            *split_any_values(ln.get("attributes")),
            parse_uint(_g(ln, "droppedAttributesCount", "dropped_attributes_count"), "droppedAttributesCount"),
        ))  # fmt: skip
    row = (
        trace_id, span_id, parent, _optional_text(_g(sp, "traceState", "trace_state"), "traceState"), flags,
        _text(sp.get("name"), "name"), parse_enum(sp.get("kind"), SPAN_KINDS, "SPAN_KIND_", "kind"),
        start, end, code, _optional_text(status.get("message"), "status.message"),
        res[0], res[1], res[2], res[3], scope[0], scope[1], *attrs, res[4], res[5], res[6], res[7], res[8], scope[2],
        parse_uint(_g(sp, "droppedAttributesCount", "dropped_attributes_count"), "droppedAttributesCount"),
        parse_uint(_g(sp, "droppedEventsCount", "dropped_events_count"), "droppedEventsCount"),
        parse_uint(_g(sp, "droppedLinksCount", "dropped_links_count"), "droppedLinksCount"),
        ordinal, line,
    )  # fmt: skip
    return row, events, links


def _span_reject(sink: RowSink, sp: Any, line: int | None, e: BadRecord) -> None:
    tid = sid = None
    if isinstance(sp, dict):
        tid, sid = _g(sp, "traceId", "trace_id"), _g(sp, "spanId", "span_id")
    sink.reject(Reject(line, sink.spans_read - 1, e.reason, raw_json(sp),
                       tid if isinstance(tid, str) else None, sid if isinstance(sid, str) else None, e.detail))


def is_traces_document(doc: Any) -> bool:
    """True for an OTLP traces document (TracesData, optionally api_v3-wrapped)."""
    if isinstance(doc, dict) and isinstance(doc.get("result"), dict):
        doc = doc["result"]
    return isinstance(doc, dict) and ("resourceSpans" in doc or "resource_spans" in doc)


def add_traces_data(doc: Any, sink: RowSink, line: int | None) -> None:
    """Add one TracesData / ExportTraceServiceRequest (already parsed) to ``sink``.

    Counts one record; each span is counted read and either staged or rejected. A document
    that is not a traces document is rejected whole (``not_traces`` / ``invalid_record``).
    """
    sink.records_read += 1
    if isinstance(doc, dict) and "result" in doc and isinstance(doc["result"], dict):
        doc = doc["result"]  # Jaeger api_v3
    if not isinstance(doc, dict):
        sink.reject(Reject(line, sink.records_read - 1, "invalid_record", raw_json(doc), detail="not a JSON object"))
        return
    if not is_traces_document(doc):
        detail = "an OTLP logs/metrics document" if any(k in doc for k in _NOT_TRACES) else "no resourceSpans"
        sink.reject(Reject(line, sink.records_read - 1, "not_traces", raw_json(doc), detail=detail))
        return
    try:
        resource_spans = _list(doc, "resourceSpans", "resource_spans", "resourceSpans")
        for rs in resource_spans:
            res = _resource_columns(rs.get("resource"))
            scope_spans = _g(rs, "scopeSpans", "scope_spans")
            if scope_spans is None:
                scope_spans = rs.get("instrumentationLibrarySpans") or []  # OTLP < 0.15
            for ss in scope_spans:
                scope = _scope_columns(ss.get("scope") or ss.get("instrumentationLibrary"))
                for sp in _list(ss, "spans", "spans", "spans"):
                    sink.spans_read += 1
                    try:
                        if not isinstance(sp, dict):
                            raise BadRecord("invalid_record", "span is not an object")
                        row, events, links = _span_rows(sp, res, scope, sink.spans_read - 1, line)
                    except BadRecord as e:
                        _span_reject(sink, sp, line, e)
                        continue
                    except (AttributeError, TypeError, KeyError, ValueError) as e:  # a field of the wrong JSON type
                        _span_reject(sink, sp, line, BadRecord("invalid_record", f"{type(e).__name__}: {e}"))
                        continue
                    sink.spans.append(row)
                    if events:
                        sink.events.extend(events)
                    if links:
                        sink.links.extend(links)
    except (BadRecord, AttributeError, TypeError, KeyError) as e:  # structure around the spans
        reason = e.reason if isinstance(e, BadRecord) else "invalid_record"
        sink.reject(Reject(line, sink.records_read - 1, reason, raw_json(doc), detail=str(e)))


def read_json_lines(stream: BinaryIO, sink: RowSink) -> None:
    """Read OTLP/JSON lines: one TracesData per line; blank lines are skipped.

    A last line without a newline that does not parse is counted as ``incomplete_last_line``
    (a file still being written), in strict mode too.
    """
    lineno = 0
    for raw in stream:
        lineno += 1
        sink.progress(len(raw))
        if not raw.strip():
            continue
        try:
            doc = loads_json(raw)
        except ValueError as e:
            if not raw.endswith(b"\n"):
                sink.records_read += 1
                sink.reject(Reject(lineno, sink.records_read - 1, "incomplete_last_line", raw.decode("utf-8", "replace")))
                continue
            sink.records_read += 1
            sink.reject(Reject(lineno, sink.records_read - 1, "invalid_json",
                               raw.decode("utf-8", "replace").rstrip("\n"), detail=str(e).split("\n")[0][:200]))
            continue
        add_traces_data(doc, sink, lineno)
        sink.maybe_flush()


def read_json_document(doc: Any, sink: RowSink) -> None:
    """Read one parsed OTLP/JSON document (plain or api_v3-wrapped) starting at line 1."""
    add_traces_data(doc, sink, 1)
