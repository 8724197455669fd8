"""OTLP trace requests: validate spans, and convert between protobuf and OTLP/JSON.

OTLP/JSON (opentelemetry-proto's JSON encoding) differs from protobuf's generic JSON
mapping in three places, all handled here: trace/span ids are lowercase hex (not base64),
enums are integers (not names), and field names are lowerCamelCase. 64-bit integers stay
decimal strings, as both mappings write them.
"""

from __future__ import annotations

import base64
import binascii
import json
from dataclasses import dataclass, field
from typing import Any

from google.protobuf import json_format
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
    ExportTracePartialSuccess,
    ExportTraceServiceRequest,
    ExportTraceServiceResponse,
)
from opentelemetry.proto.trace.v1.trace_pb2 import Span

__all__ = [
    "ID_KEYS",
    "InvalidRequest",
    "Validation",
    "filter_invalid_spans",
    "otlp_json_to_request",
    "request_to_otlp_json",
    "response_for",
]

ID_KEYS = frozenset({"traceId", "spanId", "parentSpanId"})
TRACE_ID_BYTES = 16
SPAN_ID_BYTES = 8
MAX_REASONS = 3  # error_message names at most this many rejected spans
_BAD_HEX_SENTINEL = b"\xff"  # an id that was not hex: 1 byte, so validation rejects its span


class InvalidRequest(ValueError):
    """The whole request is malformed (HTTP 400 / gRPC INVALID_ARGUMENT)."""


@dataclass
class Validation:
    """What :func:`filter_invalid_spans` kept and dropped (counts are spans)."""

    accepted: int = 0
    rejected: int = 0
    reasons: list[str] = field(default_factory=list)

    def reject_more(self, reasons: list[str]) -> None:
        """Move ``len(reasons)`` accepted spans to rejected (the writer could not store them)."""
        self.accepted -= len(reasons)
        self.rejected += len(reasons)
        self.reasons = (self.reasons + reasons)[:MAX_REASONS]

    @property
    def error_message(self) -> str:
        if not self.rejected:
            return ""
        more = self.rejected - len(self.reasons)
        tail = f"; and {more} more" if more > 0 else ""
        return f"{self.rejected} span(s) rejected: " + "; ".join(self.reasons) + tail


def _id_problem(value: bytes, size: int, name: str, optional: bool = False) -> str | None:
    if optional and not value:
        return None
    if len(value) != size:
        return f"{name} is {len(value)} bytes, expected {size}"
    if value == bytes(size):
        return f"{name} is all zeros"
    return None


def _span_problem(span: Span) -> str | None:
    problem = (
        _id_problem(span.trace_id, TRACE_ID_BYTES, "traceId")
        or _id_problem(span.span_id, SPAN_ID_BYTES, "spanId")
        or _id_problem(span.parent_span_id, SPAN_ID_BYTES, "parentSpanId", optional=True)
    )
    if problem:
        return problem
    for i, link in enumerate(span.links):
        problem = _id_problem(link.trace_id, TRACE_ID_BYTES, f"links[{i}].traceId") or _id_problem(
            link.span_id, SPAN_ID_BYTES, f"links[{i}].spanId"
        )
        if problem:
            return problem
    return None


def filter_invalid_spans(request: ExportTraceServiceRequest) -> Validation:
    """Remove spans with malformed ids from ``request`` in place; report what was removed.

    A span is invalid when its traceId is not 16 bytes, its spanId not 8 bytes, its
    parentSpanId neither empty nor 8 bytes, either id is all zeros, or a link's ids are
    malformed. Scopes and resources left without spans by the removal are dropped.
    """
    result = Validation()
    for r in reversed(range(len(request.resource_spans))):
        resource_spans = request.resource_spans[r]
        emptied = False
        for s in reversed(range(len(resource_spans.scope_spans))):
            spans = resource_spans.scope_spans[s].spans
            before = len(spans)
            for i in reversed(range(before)):
                problem = _span_problem(spans[i])
                if problem is None:
                    continue
                result.rejected += 1
                result.reasons.append(f"resourceSpans[{r}].scopeSpans[{s}].spans[{i}] ({spans[i].name!r}): {problem}")
                del spans[i]
            result.accepted += len(spans)
            if before and not len(spans):
                del resource_spans.scope_spans[s]
                emptied = True
        if emptied and not len(resource_spans.scope_spans):
            del request.resource_spans[r]
    result.reasons = list(reversed(result.reasons))[:MAX_REASONS]
    return result


def _ids_base64_to_hex(node: Any) -> Any:
    if isinstance(node, dict):
        return {
            k: base64.b64decode(v).hex() if k in ID_KEYS and isinstance(v, str) else _ids_base64_to_hex(v)
            for k, v in node.items()
        }
    if isinstance(node, list):
        return [_ids_base64_to_hex(item) for item in node]
    return node


def _hex_to_base64(value: str) -> str:
    try:
        raw = bytes.fromhex(value)
    except ValueError:
        raw = _BAD_HEX_SENTINEL
    return base64.b64encode(raw).decode("ascii")


def _ids_hex_to_base64(node: Any) -> Any:
    if isinstance(node, dict):
        return {
            k: _hex_to_base64(v) if k in ID_KEYS and isinstance(v, str) else _ids_hex_to_base64(v)
            for k, v in node.items()
        }
    if isinstance(node, list):
        return [_ids_hex_to_base64(item) for item in node]
    return node


def request_to_otlp_json(request: ExportTraceServiceRequest) -> dict[str, Any]:
    """One OTLP/JSON ``ExportTraceServiceRequest`` object: ``{"resourceSpans": [...]}``."""
    as_dict = json_format.MessageToDict(request, use_integers_for_enums=True, preserving_proto_field_name=False)
    return _ids_base64_to_hex(as_dict)


def otlp_json_to_request(body: bytes) -> ExportTraceServiceRequest:
    """Parse an OTLP/JSON body (hex ids). Ids that are not hex make their span invalid
    (rejected by :func:`filter_invalid_spans`), not the request. Raises InvalidRequest."""
    try:
        doc = json.loads(body)
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise InvalidRequest(f"body is not JSON: {exc}") from None
    if not isinstance(doc, dict):
        raise InvalidRequest("body is not a JSON object (expected an ExportTraceServiceRequest)")
    request = ExportTraceServiceRequest()
    try:
        json_format.ParseDict(_ids_hex_to_base64(doc), request, ignore_unknown_fields=True)
    except (json_format.ParseError, binascii.Error, ValueError, TypeError) as exc:
        raise InvalidRequest(f"not an OTLP/JSON ExportTraceServiceRequest: {exc}") from None
    return request


def response_for(validation: Validation) -> ExportTraceServiceResponse:
    """The Export response: partial_success set only when spans were rejected."""
    response = ExportTraceServiceResponse()
    if validation.rejected:
        response.partial_success.CopyFrom(
            ExportTracePartialSuccess(rejected_spans=validation.rejected, error_message=validation.error_message)
        )
    return response
