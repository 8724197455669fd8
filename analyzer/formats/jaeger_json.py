"""Reader for Jaeger JSON: the query API ``/api/traces`` / UI "Download" (``{"data": [...]}``),
a single UI trace object (``{traceID, spans, processes}``) and a bare array of spans with
their ``process`` embedded.

Mapping follows Jaeger's own Jaeger-to-OTLP translator: times in microseconds become ns;
``startTime + duration`` is the end; the first CHILD_OF reference within the same trace is
the parent, every other reference a link with ``opentracing.ref_type``; the tags
``span.kind``, ``otel.scope.name/version``, ``otel.status_code/description``, ``error``
(bool) and ``w3c.tracestate`` become fields, not attributes; logs become events named by
their ``event`` field; a process becomes the resource (``service.name`` first).
"""

from __future__ import annotations

from typing import Any

from analyzer.db.store import clock_domain_of
from analyzer.formats.canonical import Reject, RowSink, raw_json
from analyzer.formats.values import INT64_MAX, BadRecord, json_text, parse_id

__all__ = ["is_jaeger_document", "read_jaeger_document"]

_KINDS = {"client": "CLIENT", "server": "SERVER", "producer": "PRODUCER", "consumer": "CONSUMER", "internal": "INTERNAL"}
_SPECIAL = ("span.kind", "otel.scope.name", "otel.library.name", "otel.scope.version", "otel.library.version",
            "otel.status_code", "otel.status_description", "w3c.tracestate")  # fmt: skip


def is_jaeger_document(doc: Any) -> bool:
    """True for the three Jaeger JSON shapes."""
    if isinstance(doc, dict):
        return isinstance(doc.get("data"), list) or ("traceID" in doc and "spans" in doc)
    if isinstance(doc, list):
        return bool(doc) and isinstance(doc[0], dict) and "traceID" in doc[0]
    return False


def _int(v: Any, what: str) -> int:
    if isinstance(v, bool):
        raise BadRecord("invalid_time", f"{what} {v!r} is not an integer")
    if isinstance(v, int):
        return v
    if isinstance(v, str) and v.strip().lstrip("-").isdigit():
        return int(v)
    if isinstance(v, float) and v.is_integer():
        return int(v)
    raise BadRecord("invalid_time", f"{what} {v!r} is not an integer")


def _tag_value(tag: dict) -> tuple[int, Any]:
    """(map index: 0 str, 1 int, 2 double, 3 bool, 4 json; value) of one Jaeger tag."""
    key, typ, v = tag.get("key"), str(tag.get("type", "string")).lower(), tag.get("value")
    if not isinstance(key, str):
        raise BadRecord("invalid_attribute", f"tag {tag!r} has no string key")
    try:
        if typ == "string":
            return 0, v if isinstance(v, str) else json_text(v)
        if typ == "bool":
            if isinstance(v, bool):
                return 3, v
            if isinstance(v, str) and v.lower() in ("true", "false"):
                return 3, v.lower() == "true"
        elif typ == "int64":
            n = int(v) if isinstance(v, (int, str)) and not isinstance(v, bool) else None
            if n is not None and -(2**63) <= n <= INT64_MAX:
                return 1, n
        elif typ == "float64":
            if isinstance(v, (int, float, str)) and not isinstance(v, bool):
                return 2, float(v)
        elif typ == "binary":
            if isinstance(v, str):
                return 4, json_text({"bytes_base64": v})
    except ValueError:
        pass
    raise BadRecord("invalid_attribute", f"tag {key!r}: {v!r} is not a valid {typ}")


def _tags(tags: Any) -> dict[str, tuple[int, Any]]:
    out: dict[str, tuple[int, Any]] = {}
    for tag in tags or []:
        if not isinstance(tag, dict):
            raise BadRecord("invalid_attribute", f"tag {tag!r} is not an object")
        out[tag["key"] if isinstance(tag.get("key"), str) else ""] = _tag_value(tag)
    return out


def _maps(tags: dict[str, tuple[int, Any]]) -> tuple[list, list, list, list, list]:
    maps: tuple[list, list, list, list, list] = ([], [], [], [], [])
    for k, (i, v) in tags.items():
        maps[i].append((k, v))
    return maps


def _text(value: Any, field: str) -> str:
    """A string field of a Jaeger record ('' when absent); anything else rejects the span."""
    if value is None:
        return ""
    if not isinstance(value, str):
        raise BadRecord("invalid_record", f"{field} must be a string, got {type(value).__name__}")
    return value


def _resource(process: Any) -> tuple:
    if not isinstance(process, dict):
        raise BadRecord("invalid_record", "span has no process")
    tags = {"service.name": (0, _text(process.get("serviceName"), "process.serviceName"))}
    for k, v in _tags(process.get("tags")).items():
        tags.setdefault(k, v)
    strs = {k: v for k, (i, v) in tags.items() if i == 0}
    plain: dict[str, Any] = {k: strs[k] for k in ("service.name", "service.instance.id", "host.name") if k in strs}
    return (strs.get("service.name"), strs.get("service.instance.id"), strs.get("host.name"), clock_domain_of(plain), *_maps(tags))


def _span(sp: dict, process: Any, ordinal: int) -> tuple[tuple, list, list]:
    trace_id = parse_id(sp.get("traceID"), 16, "trace_id", pad=True)
    span_id = parse_id(sp.get("spanID"), 8, "span_id", pad=True)
    if sp.get("startTime") is None:
        raise BadRecord("missing_start_time")
    if sp.get("duration") is None:
        raise BadRecord("missing_end_time", "no duration")
    start_us, dur_us = _int(sp["startTime"], "startTime"), _int(sp["duration"], "duration")
    if start_us <= 0:
        raise BadRecord("missing_start_time" if start_us == 0 else "invalid_time", f"startTime {start_us}")
    if dur_us < 0:
        raise BadRecord("end_before_start", f"duration {dur_us} us")
    start, end = start_us * 1000, (start_us + dur_us) * 1000
    if end > INT64_MAX:
        raise BadRecord("invalid_time", "end time does not fit int64 nanoseconds")
    tags = _tags(sp.get("tags"))
    # Only string-typed tags carry these OTLP fields; a mistyped one stays an ordinary attribute.
    special = {k: tags.pop(k)[1] for k in _SPECIAL if k in tags and tags[k][0] == 0}
    kind = _KINDS.get(str(special.get("span.kind", "")).lower(), "UNSPECIFIED")
    status, message = "UNSET", special.get("otel.status_description")
    code = str(special.get("otel.status_code", "")).upper()
    if code in ("OK", "ERROR"):
        status = code
    if "error" in tags and tags["error"][0] == 3:
        if tags.pop("error")[1] and status == "UNSET":
            status = "ERROR"
    parent, links = sp.get("parentSpanID") or None, list[tuple[Any, ...]]()
    refs = sp.get("references") or []
    parent_ref = None
    for i, ref in enumerate(refs):
        if str(ref.get("refType", "")).upper() == "CHILD_OF" and parse_id(ref.get("traceID"), 16, "trace_id", pad=True) == trace_id:
            parent_ref = i
            break
    if parent_ref is not None:
        parent = refs[parent_ref].get("spanID")
    if parent is None or parent == "":
        parent = None
    else:  # a non-string (False, 0, ...) is an invalid id, never "no parent"
        try:
            parent = parse_id(parent, 8, "parent_span_id", pad=True)
        except BadRecord as e:
            if e.reason.startswith("invalid"):
                raise
            parent = None
    for i, ref in enumerate(refs):
        if i == parent_ref:
            continue
        try:
            lt = parse_id(ref.get("traceID"), 16, "trace_id", pad=True)
            ls = parse_id(ref.get("spanID"), 8, "span_id", pad=True)
        except BadRecord as e:
            raise BadRecord("invalid_link_id", f"reference {i}: {e}") from None
        ref_type = "follows_from" if str(ref.get("refType", "")).upper() == "FOLLOWS_FROM" else "child_of"
        links.append((ordinal, trace_id, span_id, len(links), lt, ls, None, None,
                      [("opentracing.ref_type", ref_type)], [], [], [], [], 0))
    events = []
    for i, log in enumerate(sp.get("logs") or []):
        if log.get("timestamp") is None:
            raise BadRecord("invalid_event_time", f"log {i} has no timestamp")
        t = _int(log["timestamp"], "log timestamp") * 1000
        if t > INT64_MAX:
            raise BadRecord("invalid_event_time", f"log {i}: timestamp does not fit int64 nanoseconds")
        if t <= 0:
            raise BadRecord("invalid_event_time", f"log {i}: timestamp {t}")
        fields = _tags(log.get("fields"))
        name = ""
        if "event" in fields and fields["event"][0] == 0:
            name = fields.pop("event")[1]
        events.append((ordinal, trace_id, span_id, i, t, name, *_maps(fields), 0))
    scope_name = special.get("otel.scope.name", special.get("otel.library.name"))
    scope_version = special.get("otel.scope.version", special.get("otel.library.version"))
    flags = sp.get("flags")
    res = _resource(process)
    row = (
        trace_id, span_id, parent, special.get("w3c.tracestate") or None,
        flags if isinstance(flags, int) and not isinstance(flags, bool) and 0 < flags <= INT64_MAX else None,
        _text(sp.get("operationName"), "operationName"), kind, start, end, status, message or None,
        *res[:4], scope_name or None, scope_version or None, *_maps(tags), *res[4:], None, 0, 0, 0,
    )  # fmt: skip
    return row, events, links


def _add_spans(spans: Any, processes: dict, sink: RowSink, line: int | None) -> None:
    for sp in spans or []:
        sink.spans_read += 1
        ordinal = sink.spans_read - 1
        try:
            if not isinstance(sp, dict):
                raise BadRecord("invalid_record", "span is not an object")
            process = sp.get("process") or processes.get(sp.get("processID"))
            row, events, links = _span(sp, process, ordinal)
        except (AttributeError, TypeError, KeyError, ValueError) as err:  # a field of the wrong JSON type
            e = err if isinstance(err, BadRecord) else BadRecord("invalid_record", f"{type(err).__name__}: {err}")
            tid, sid = (sp.get("traceID"), sp.get("spanID")) if isinstance(sp, dict) else (None, None)
            sink.reject(Reject(line, ordinal, e.reason, raw_json(sp), tid if isinstance(tid, str) else None,
                               sid if isinstance(sid, str) else None, e.detail))
            continue
        except BadRecord as e:
            tid, sid = (sp.get("traceID"), sp.get("spanID")) if isinstance(sp, dict) else (None, None)
            sink.reject(Reject(line, ordinal, e.reason, raw_json(sp), tid if isinstance(tid, str) else None,
                               sid if isinstance(sid, str) else None, e.detail))
            continue
        sink.spans.append((*row, ordinal, line))
        sink.events.extend(events)
        sink.links.extend(links)
        sink.maybe_flush()


def read_jaeger_document(doc: Any, sink: RowSink) -> str:
    """Add a parsed Jaeger JSON document to ``sink``; returns its shape (the ``loads.format``):
    ``jaeger_api_traces``, ``jaeger_trace`` or ``jaeger_spans``. Each trace is one record."""
    if isinstance(doc, dict) and isinstance(doc.get("data"), list):
        traces, shape = doc["data"], "jaeger_api_traces"
    elif isinstance(doc, dict):
        traces, shape = [doc], "jaeger_trace"
    elif doc and all(isinstance(t, dict) and "spans" in t for t in doc):
        traces, shape = doc, "jaeger_api_traces"
    else:
        sink.records_read += 1
        _add_spans(doc, {}, sink, 1)
        return "jaeger_spans"
    for trace in traces:
        sink.records_read += 1
        if not isinstance(trace, dict) or not isinstance(trace.get("spans", []), list):
            sink.reject(Reject(1, sink.records_read - 1, "invalid_record", raw_json(trace), detail="not a Jaeger trace"))
            continue
        processes = trace.get("processes") or {}
        _add_spans(trace.get("spans"), processes if isinstance(processes, dict) else {}, sink, 1)
    return shape
