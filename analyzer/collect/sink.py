"""The receiver's one write path, shared by OTLP/gRPC and OTLP/HTTP: validate, write, answer."""

from __future__ import annotations

import threading
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
    ExportTraceServiceRequest,
    ExportTraceServiceResponse,
)

from analyzer.collect.convert import filter_invalid_spans, request_to_otlp_json, response_for

__all__ = ["ReceiverStats", "SpanWriter", "TraceSink"]


class SpanWriter(Protocol):
    """Where accepted requests go: :class:`~analyzer.collect.writer.JsonlWriter` or
    :class:`~analyzer.collect.parquet_writer.ParquetWriter`."""

    @property
    def files(self) -> list[Path]: ...

    def write(self, document: dict[str, Any]) -> list[str]:
        """Store one OTLP/JSON request before returning; return one reason per span not stored."""
        ...

    def close(self) -> None: ...


@dataclass
class ReceiverStats:
    """Counters since start. Requests are Export calls; spans are counted after validation."""

    requests_accepted: int = 0
    requests_malformed: int = 0
    requests_failed: int = 0
    spans_written: int = 0
    spans_rejected: int = 0


class TraceSink:
    """Validates one ExportTraceServiceRequest, writes its valid spans (one OTLP/JSON line, or
    one Parquet part), and returns the response. The spans are on disk before the response exists."""

    def __init__(self, writer: SpanWriter) -> None:
        self.writer = writer
        self.stats = ReceiverStats()
        self._lock = threading.Lock()

    def export(self, request: ExportTraceServiceRequest) -> ExportTraceServiceResponse:
        """Raises OSError when the line could not be written (the caller answers "unavailable")."""
        validation = filter_invalid_spans(request)
        if validation.accepted:
            try:
                not_stored = self.writer.write(request_to_otlp_json(request))
            except (OSError, RuntimeError):
                with self._lock:
                    self.stats.requests_failed += 1
                raise
            validation.reject_more(not_stored)
        with self._lock:
            self.stats.requests_accepted += 1
            self.stats.spans_written += validation.accepted
            self.stats.spans_rejected += validation.rejected
        return response_for(validation)

    def count_malformed(self) -> None:
        with self._lock:
            self.stats.requests_malformed += 1
