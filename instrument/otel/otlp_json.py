"""A span exporter writing OTLP/JSON lines: one ``ExportTraceServiceRequest`` per line.

Valid OTLP/JSON (opentelemetry-proto's JSON encoding rules), which protobuf's plain
``MessageToJson`` is not: trace and span ids are lowercase hex strings (not base64), enums
are integers, field names are lowerCamelCase, 64-bit integers are decimal strings. The
format matches the OpenTelemetry Collector's file exporter.

:func:`spans_to_otlp_json` builds the JSON object straight from the SDK's spans, field by
field as the SDK's OTLP encoder fills the protobuf message (and as ``MessageToDict`` then
prints it: default values omitted). Going through the protobuf message and
``MessageToDict`` costs ~200 µs per span on this machine, paid by the export thread while it
holds the GIL between the engine's steps; the direct build costs ~10 µs
(tests/test_otlp_json_encoder.py checks both give the same object for every span shape the
instrument writes; :func:`spans_to_otlp_json_via_protobuf` is the reference).

The exporter writes an export batch as several lines (:func:`encode_lines`): slices of at
most 64 spans or 256 span events, each one ``json.dumps`` call of well under a millisecond.
One call for a whole 512-span batch held the GIL for 5-10 ms at a time, stalling the engine
thread mid-step (docs/design/otlp-json-slices.md).
"""

from __future__ import annotations

import base64
import json
import threading
import uuid
from collections.abc import Mapping, Sequence
from collections.abc import Sequence as SequenceABC
from pathlib import Path
from typing import IO, Any

from google.protobuf.json_format import MessageToDict
from opentelemetry.exporter.otlp.proto.common.trace_encoder import encode_spans
from opentelemetry.sdk.trace import ReadableSpan
from opentelemetry.sdk.trace.export import SpanExporter, SpanExportResult
from opentelemetry.trace import SpanKind

__all__ = ["OTLPJsonLinesSpanExporter", "encode_lines", "slice_spans", "spans_to_otlp_json",
           "spans_to_otlp_json_via_protobuf", "otlp_json_ids_to_base64"]

_ID_KEYS = frozenset({"traceId", "spanId", "parentSpanId"})


def _ids_base64_to_hex(node: Any) -> Any:
    if isinstance(node, dict):
        return {
            key: base64.b64decode(value).hex() if key in _ID_KEYS and isinstance(value, str) else _ids_base64_to_hex(value)
            for key, value in node.items()
        }
    if isinstance(node, list):
        return [_ids_base64_to_hex(item) for item in node]
    return node


def otlp_json_ids_to_base64(node: Any) -> Any:
    """The inverse id mapping (hex -> base64), for feeding OTLP/JSON to protobuf's json_format."""
    if isinstance(node, dict):
        return {
            key: base64.b64encode(bytes.fromhex(value)).decode() if key in _ID_KEYS and isinstance(value, str) else otlp_json_ids_to_base64(value)
            for key, value in node.items()
        }
    if isinstance(node, list):
        return [otlp_json_ids_to_base64(item) for item in node]
    return node


def spans_to_otlp_json_via_protobuf(spans: Sequence[ReadableSpan]) -> dict[str, Any]:
    """The reference: the SDK's OTLP protobuf message printed by ``MessageToDict`` (slow)."""
    message = encode_spans(spans)
    as_dict = MessageToDict(message, use_integers_for_enums=True, preserving_proto_field_name=False)
    return _ids_base64_to_hex(as_dict)


def _value(value: Any) -> dict[str, Any]:
    """An OTLP/JSON ``AnyValue`` (``MessageToDict``'s rendering of the SDK's ``_encode_value``)."""
    if isinstance(value, bool):
        return {"boolValue": value}
    if isinstance(value, str):
        return {"stringValue": value}
    if isinstance(value, int):
        return {"intValue": str(value)}
    if isinstance(value, float):
        if value != value or value in (float("inf"), float("-inf")):
            return {"doubleValue": "NaN" if value != value else ("Infinity" if value > 0 else "-Infinity")}
        return {"doubleValue": value}
    if value is None:
        return {}
    if isinstance(value, bytes):
        return {"bytesValue": base64.b64encode(value).decode()}
    if isinstance(value, Mapping):
        return {"kvlistValue": {"values": [{"key": str(k), "value": _value(v)} for k, v in value.items()]}
                if value else {}}
    if isinstance(value, SequenceABC):
        return {"arrayValue": {"values": [_value(v) for v in value]} if value else {}}
    raise TypeError(f"invalid attribute value type {type(value).__name__}")


def _attributes(attributes: Any) -> list[dict[str, Any]]:
    return [{"key": key, "value": _value(value)} for key, value in attributes.items()] if attributes else []


_KIND = {SpanKind.INTERNAL: 1, SpanKind.SERVER: 2, SpanKind.CLIENT: 3, SpanKind.PRODUCER: 4, SpanKind.CONSUMER: 5}


def _flags(parent: Any) -> int:
    return 0x300 if parent is not None and parent.is_remote else 0x100


def _span(span: ReadableSpan) -> dict[str, Any]:
    context = span.get_span_context()
    assert context is not None, "a finished span has its context"
    out: dict[str, Any] = {"traceId": f"{context.trace_id:032x}", "spanId": f"{context.span_id:016x}"}
    state = context.trace_state
    if state:
        out["traceState"] = ",".join(f"{k}={v}" for k, v in state.items())
    parent = span.parent
    if parent:
        out["parentSpanId"] = f"{parent.span_id:016x}"
    if span.name:
        out["name"] = span.name
    out["kind"] = _KIND[span.kind]
    if span.start_time:
        out["startTimeUnixNano"] = str(span.start_time)
    if span.end_time:
        out["endTimeUnixNano"] = str(span.end_time)
    attributes = span.attributes
    if attributes:
        out["attributes"] = _attributes(attributes)
    if span.dropped_attributes:
        out["droppedAttributesCount"] = span.dropped_attributes
    events = span.events
    if events:
        encoded = []
        for event in events:
            item: dict[str, Any] = {}
            if event.timestamp:
                item["timeUnixNano"] = str(event.timestamp)
            if event.name:
                item["name"] = event.name
            if event.attributes:
                item["attributes"] = _attributes(event.attributes)
            if event.dropped_attributes:
                item["droppedAttributesCount"] = event.dropped_attributes
            encoded.append(item)
        out["events"] = encoded
    if span.dropped_events:
        out["droppedEventsCount"] = span.dropped_events
    links = span.links
    if links:
        encoded = []
        for link in links:
            item = {"traceId": f"{link.context.trace_id:032x}", "spanId": f"{link.context.span_id:016x}"}
            if link.attributes:
                item["attributes"] = _attributes(link.attributes)
            if link.dropped_attributes:
                item["droppedAttributesCount"] = link.dropped_attributes
            item["flags"] = _flags(link.context)
            encoded.append(item)
        out["links"] = encoded
    if span.dropped_links:
        out["droppedLinksCount"] = span.dropped_links
    status = span.status
    encoded_status: dict[str, Any] = {}
    if status is not None:
        if status.description:
            encoded_status["message"] = status.description
        if status.status_code.value:
            encoded_status["code"] = status.status_code.value
    out["status"] = encoded_status
    out["flags"] = _flags(parent)
    return out


def _scope(scope: Any) -> dict[str, Any]:
    if scope is None:
        return {}
    out: dict[str, Any] = {}
    if scope.name:
        out["name"] = scope.name
    if scope.version:
        out["version"] = scope.version
    if scope.attributes:
        out["attributes"] = _attributes(scope.attributes)
    return out


def spans_to_otlp_json(spans: Sequence[ReadableSpan]) -> dict[str, Any]:
    """One OTLP/JSON ``ExportTraceServiceRequest`` object (``{"resourceSpans": [...]}``), built
    directly (module docstring); the same object as :func:`spans_to_otlp_json_via_protobuf`.

    Spans are grouped by resource, then by scope, by value and in order of first appearance
    (as the SDK's encoder does), but each distinct resource or scope *object* is hashed once per
    call, not once per span: the SDK's ``Resource.__hash__`` JSON-dumps the attributes
    (~3 µs a span)."""
    groups: list[tuple[Any, dict[int, tuple[Any, list[dict[str, Any]]]]]] = []
    # id(object) -> (the object, kept alive so that its id is not reused in this call, its group)
    resource_slot: dict[int, tuple[Any, int]] = {}
    resource_by_value: dict[Any, int] = {}  # hashed once per distinct object
    scope_key: dict[int, tuple[Any, int]] = {}  # -> id of the first equal scope seen
    scope_by_value: dict[Any, int] = {}
    for span in spans:
        resource = span.resource
        found = resource_slot.get(id(resource))
        if found is None:
            slot = resource_by_value.get(resource)
            if slot is None:
                slot = resource_by_value[resource] = len(groups)
                groups.append((resource, {}))
            resource_slot[id(resource)] = (resource, slot)
        else:
            slot = found[1]
        scope = span.instrumentation_scope or None
        found = scope_key.get(id(scope))
        if found is None:
            key = scope_by_value.setdefault(scope, id(scope))
            scope_key[id(scope)] = (scope, key)
        else:
            key = found[1]
        scopes = groups[slot][1]
        entry_of_scope = scopes.get(key)
        if entry_of_scope is None:
            entry_of_scope = scopes[key] = (scope, [])
        entry_of_scope[1].append(_span(span))
    resource_spans = []
    for resource, scopes in groups:
        scope_spans = []
        for scope, encoded in scopes.values():
            item: dict[str, Any] = {"scope": _scope(scope), "spans": encoded}
            if scope is not None and scope.schema_url:
                item["schemaUrl"] = scope.schema_url
            scope_spans.append(item)
        entry: dict[str, Any] = {"resource": {"attributes": _attributes(resource.attributes)}
                                 if resource.attributes else {}, "scopeSpans": scope_spans}
        if resource.schema_url:
            entry["schemaUrl"] = resource.schema_url
        resource_spans.append(entry)
    return {"resourceSpans": resource_spans} if resource_spans else {}


# Bounds of one json.dumps call (benchmarks/tracing_cost.py, "encode"): on this project's
# loaded 2-core box the largest 64-span slice of a 512-span batch the engine wrote took
# 0.6-0.9 ms of GIL-holding C code, the whole batch in one call 5-10 ms.
DEFAULT_SLICE_SPANS = 64
DEFAULT_SLICE_EVENTS = 256
_EVENTS_MARK = f"tokentrace-events-{uuid.uuid4().hex}"


def slice_spans(spans: Sequence[ReadableSpan], max_spans: int = DEFAULT_SLICE_SPANS,
                max_events: int = DEFAULT_SLICE_EVENTS) -> list[list[ReadableSpan]]:
    """Consecutive slices of ``spans`` (order kept), each at most ``max_spans`` spans and at most
    ``max_events`` span events; a span with more events than that is a slice of its own."""
    if max_spans < 1 or max_events < 1:
        raise ValueError(f"slice bounds must be >= 1, got max_spans={max_spans}, max_events={max_events}")
    slices: list[list[ReadableSpan]] = []
    current: list[ReadableSpan] = []
    events = 0
    for span in spans:
        count = len(span.events)
        if current and (len(current) >= max_spans or events + count > max_events):
            slices.append(current)
            current, events = [], 0
        current.append(span)
        events += count
    if current:
        slices.append(current)
    return slices


def _dumps(obj: Any) -> str:
    return json.dumps(obj, separators=(",", ":"), ensure_ascii=False)


def _encode_slice(spans: Sequence[ReadableSpan], max_events: int) -> str:
    """One OTLP/JSON line (no newline) for a slice. A lone span with more than ``max_events``
    events has them dumped ``max_events`` at a time and spliced in: the same text as one
    dumps call (dumps without indent is compositional), no single call longer."""
    obj = spans_to_otlp_json(spans)
    if len(spans) != 1 or len(spans[0].events) <= max_events:
        return _dumps(obj)
    span_obj = obj["resourceSpans"][0]["scopeSpans"][0]["spans"][0]
    events = span_obj["events"]
    span_obj["events"] = _EVENTS_MARK
    pieces = [_dumps(events[i:i + max_events])[1:-1] for i in range(0, len(events), max_events)]
    head, tail = _dumps(obj).split(_dumps(_EVENTS_MARK), 1)
    return head + "[" + ",".join(pieces) + "]" + tail


def encode_lines(spans: Sequence[ReadableSpan], max_spans: int = DEFAULT_SLICE_SPANS,
                 max_events: int = DEFAULT_SLICE_EVENTS) -> list[str]:
    """OTLP/JSON lines (no newlines) for ``spans``: one ``ExportTraceServiceRequest`` per slice
    of :func:`slice_spans`, together holding every span once, in order."""
    return [_encode_slice(part, max_events) for part in slice_spans(spans, max_spans, max_events)]


class OTLPJsonLinesSpanExporter(SpanExporter):
    """Appends OTLP/JSON lines to ``path`` (or writes to an open text stream): one line per
    slice of an export batch (:func:`slice_spans`: at most ``max_spans`` spans and
    ``max_events`` events a line), so that no single ``json.dumps`` call holds the GIL for
    milliseconds while the engine waits for it."""

    def __init__(self, path: str | Path | None = None, *, stream: IO[str] | None = None,
                 max_spans: int = DEFAULT_SLICE_SPANS, max_events: int = DEFAULT_SLICE_EVENTS) -> None:
        if (path is None) == (stream is None):
            raise ValueError("OTLPJsonLinesSpanExporter needs exactly one of path= or stream=")
        if max_spans < 1 or max_events < 1:
            raise ValueError(f"OTLPJsonLinesSpanExporter: max_spans and max_events must be >= 1, "
                             f"got {max_spans} and {max_events}")
        self.max_spans, self.max_events = max_spans, max_events
        self.path = Path(path) if path is not None else None
        if self.path is not None:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            self._stream: IO[str] = self.path.open("a", encoding="utf-8")
            self._owns_stream = True
        else:
            assert stream is not None
            self._stream = stream
            self._owns_stream = False
        self._lock = threading.Lock()
        self._closed = False

    def export(self, spans: Sequence[ReadableSpan]) -> SpanExportResult:
        if self._closed:
            return SpanExportResult.FAILURE
        if not spans:
            return SpanExportResult.SUCCESS
        for part in slice_spans(spans, self.max_spans, self.max_events):
            line = _encode_slice(part, self.max_events)
            with self._lock:
                if self._closed:
                    return SpanExportResult.FAILURE
                self._stream.write(line + "\n")
        with self._lock:
            if not self._closed:
                self._stream.flush()
        return SpanExportResult.SUCCESS

    def force_flush(self, timeout_millis: int = 30000) -> bool:
        with self._lock:
            if not self._closed:
                self._stream.flush()
        return True

    def shutdown(self) -> None:
        with self._lock:
            if self._closed:
                return
            self._closed = True
            if self._owns_stream:
                self._stream.close()
            else:
                self._stream.flush()
