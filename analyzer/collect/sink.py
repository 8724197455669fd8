"""The receiver's one write path, shared by OTLP/gRPC and OTLP/HTTP: validate, write, answer."""

from __future__ import annotations

import threading
from dataclasses import dataclass

from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
    ExportTraceServiceRequest,
    ExportTraceServiceResponse,
)

from analyzer.collect.convert import filter_invalid_spans, request_to_otlp_json, response_for
from analyzer.collect.writer import JsonlWriter

__all__ = ["ReceiverStats", "TraceSink"]


@dataclass
class ReceiverStats:
    """Counters since start. Requests are Export calls; spans are counted after validation."""

    requests_accepted: int = 0
    requests_malformed: int = 0
    requests_failed: int = 0
    spans_written: int = 0
    spans_rejected: int = 0


class TraceSink:
    """Validates one ExportTraceServiceRequest, writes its valid spans as one OTLP/JSON line,
    and returns the response. The line is on disk (flushed) before the response exists."""

    def __init__(self, writer: JsonlWriter) -> None:
        self.writer = writer
        self.stats = ReceiverStats()
        self._lock = threading.Lock()

    def export(self, request: ExportTraceServiceRequest) -> ExportTraceServiceResponse:
        """Raises OSError when the line could not be written (the caller answers "unavailable")."""
        validation = filter_invalid_spans(request)
        if validation.accepted:
            try:
                self.writer.write(request_to_otlp_json(request))
            except (OSError, RuntimeError):
                with self._lock:
                    self.stats.requests_failed += 1
                raise
        with self._lock:
            self.stats.requests_accepted += 1
            self.stats.spans_written += validation.accepted
            self.stats.spans_rejected += validation.rejected
        return response_for(validation)

    def count_malformed(self) -> None:
        with self._lock:
            self.stats.requests_malformed += 1
