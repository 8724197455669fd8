"""A span exporter writing OTLP/JSON lines: one ``ExportTraceServiceRequest`` per line.

Valid OTLP/JSON (opentelemetry-proto's JSON encoding rules), which protobuf's plain
``MessageToJson`` is not: trace and span ids are lowercase hex strings (not base64), enums
are integers, field names are lowerCamelCase, 64-bit integers are decimal strings. The
protobuf message comes from the SDK's own OTLP encoder, so the content is exactly what the
gRPC and HTTP exporters send. The format matches the OpenTelemetry Collector's file exporter.
"""

from __future__ import annotations

import base64
import json
import threading
from pathlib import Path
from typing import IO, Any, Sequence

from google.protobuf.json_format import MessageToDict
from opentelemetry.exporter.otlp.proto.common.trace_encoder import encode_spans
from opentelemetry.sdk.trace import ReadableSpan
from opentelemetry.sdk.trace.export import SpanExporter, SpanExportResult

__all__ = ["OTLPJsonLinesSpanExporter", "spans_to_otlp_json", "otlp_json_ids_to_base64"]

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


def spans_to_otlp_json(spans: Sequence[ReadableSpan]) -> dict[str, Any]:
    """One OTLP/JSON ``ExportTraceServiceRequest`` object (``{"resourceSpans": [...]}``)."""
    message = encode_spans(spans)
    as_dict = MessageToDict(message, use_integers_for_enums=True, preserving_proto_field_name=False)
    return _ids_base64_to_hex(as_dict)


class OTLPJsonLinesSpanExporter(SpanExporter):
    """Appends one OTLP/JSON line per export batch to ``path`` (or writes to an open text stream)."""

    def __init__(self, path: str | Path | None = None, *, stream: IO[str] | None = None) -> None:
        if (path is None) == (stream is None):
            raise ValueError("OTLPJsonLinesSpanExporter needs exactly one of path= or stream=")
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
        line = json.dumps(spans_to_otlp_json(spans), separators=(",", ":"), ensure_ascii=False)
        with self._lock:
            self._stream.write(line + "\n")
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
