"""Export health: how many spans each exporter sent, failed to send, or never got to send.

A tracing tool that silently loses spans reports wrong latencies, so every span handed to a
processor is accounted for::

    submitted = exported + failed + dropped + pending

- ``exported``: the exporter returned SUCCESS for the batch holding the span.
- ``failed``: the exporter returned FAILURE (or raised) for it: endpoint down, 503, timeout.
- ``dropped``: never handed to the exporter: the batch queue was full (the SDK evicts a
  span), or the processor shut down with the span still queued. Exact after shutdown; while
  running, the queue-full part is an estimate (a check that races with the export thread).
- ``pending``: still queued (0 after shutdown).

``setup_tracing`` wraps every exporter in :class:`CountingSpanExporter` and its processor
in :class:`CountingSpanProcessor` (``count_exports=True``, the default). At shutdown each
processor writes one log line (logger ``tokentrace.export``; WARNING when anything was lost):

    tokentrace export otlp: submitted=1200 exported=1100 failed=100 dropped=0

:func:`export_health` returns the current counts of a provider's exporters, e.g. for a
server's health endpoint.
"""

from __future__ import annotations

import logging
import os
import threading
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from typing import Any

from opentelemetry.context import Context
from opentelemetry.sdk.trace import ReadableSpan, Span, SpanProcessor
from opentelemetry.sdk.trace.export import BatchSpanProcessor, SpanExporter, SpanExportResult

__all__ = [
    "CountingSpanExporter", "CountingSpanProcessor", "ExportCounts", "export_health", "emit_sampled_spans", "LOGGER_NAME",
]

LOGGER_NAME = "tokentrace.export"
_log = logging.getLogger(LOGGER_NAME)


@dataclass(frozen=True)
class ExportCounts:
    """One exporter's span counts (see the module doc for the identity they satisfy)."""

    name: str
    submitted: int
    exported: int
    failed: int
    dropped: int
    pending: int
    batches_exported: int
    batches_failed: int
    last_error: str | None

    @property
    def lost(self) -> int:
        """Spans that will never reach the endpoint: failed + dropped."""
        return self.failed + self.dropped

    def as_dict(self) -> dict[str, Any]:
        return {**asdict(self), "lost": self.lost}

    def log_line(self) -> str:
        return (f"tokentrace export {self.name}: submitted={self.submitted} exported={self.exported} "
                f"failed={self.failed} dropped={self.dropped} pending={self.pending}"
                + (f" last_error={self.last_error}" if self.last_error else ""))


class CountingSpanExporter(SpanExporter):
    """Wraps a SpanExporter; counts spans and batches per export result. Never raises from
    ``export``: an exception from the inner exporter counts as a failed batch."""

    def __init__(self, inner: SpanExporter, name: str | None = None, where: str | None = None) -> None:
        self.inner = inner
        self.name = name or type(inner).__name__
        self.where = where  # where it sends (the OTLP endpoint), named in the first failure's line
        self._lock = threading.Lock()
        self.exported = 0
        self.failed = 0
        self.batches_exported = 0
        self.batches_failed = 0
        self.last_error: str | None = None

    def export(self, spans: Sequence[ReadableSpan]) -> SpanExportResult:
        n = len(spans)
        error: str | None
        try:
            result = self.inner.export(spans)
        except Exception as exc:  # noqa: BLE001 - an exporter bug must not kill the export thread
            result, error = SpanExportResult.FAILURE, f"{type(exc).__name__}: {exc}"[:200]
        else:
            error = None if result is SpanExportResult.SUCCESS else f"export returned {getattr(result, 'name', result)}"
        with self._lock:
            if result is SpanExportResult.SUCCESS:
                self.exported += n
                self.batches_exported += 1
            else:
                self.failed += n
                self.batches_failed += 1
                self.last_error = error
                first = self.batches_failed == 1
        if result is not SpanExportResult.SUCCESS and first:
            _log.warning("tokentrace: %s could not export %d spans%s (%s); later failures are counted and said at "
                         "shutdown", self.name, n, f" to {self.where}" if self.where else "", error)
        return result

    def shutdown(self, *args: Any, **kwargs: Any) -> None:
        try:
            self.inner.shutdown(*args, **kwargs)
        except TypeError:  # an inner shutdown() without timeout_millis
            self.inner.shutdown()

    def force_flush(self, timeout_millis: int = 30000) -> bool:
        return self.inner.force_flush(timeout_millis)


class CountingSpanProcessor(SpanProcessor):
    """Wraps the processor that feeds a :class:`CountingSpanExporter`: counts spans submitted,
    spans the batch queue dropped when full, and (at shutdown) spans left unsent."""

    def __init__(self, inner: SpanProcessor, exporter: CountingSpanExporter) -> None:
        self.inner = inner
        self.exporter = exporter
        self._lock = threading.Lock()
        self.submitted = 0
        self.dropped_queue_full = 0
        self.dropped_at_shutdown = 0
        self._shut = False

    def _queue(self) -> deque | None:
        """The BatchSpanProcessor's queue (an SDK internal; None when absent, e.g. Simple)."""
        batch = getattr(self.inner, "_batch_processor", None)
        queue = getattr(batch, "_queue", None)
        return queue if isinstance(queue, deque) else None

    def on_start(self, span: Span, parent_context: Context | None = None) -> None:
        self.inner.on_start(span, parent_context=parent_context)

    def on_end(self, span: ReadableSpan) -> None:
        queue = self._queue()
        with self._lock:
            self.submitted += 1
            # The SDK appends anyway and the deque evicts its oldest entry: one span lost.
            if queue is not None and queue.maxlen is not None and len(queue) >= queue.maxlen:
                self.dropped_queue_full += 1
        self.inner.on_end(span)

    def on_end_many(self, spans: list[ReadableSpan], *, sampled: bool = False) -> None:
        """``on_end`` for a list of finished spans: one lock and one count for the list.
        ``sampled``: the caller guarantees every span's trace flags say sampled (see
        :func:`emit_sampled_spans`)."""
        queue = self._queue()
        room = None if queue is None or queue.maxlen is None else queue.maxlen - len(queue)
        with self._lock:
            self.submitted += len(spans)
            if room is not None and len(spans) > room:
                self.dropped_queue_full += len(spans) - max(room, 0)
        if sampled:
            emit_sampled_spans(self.inner, spans)
        else:
            inner_on_end = self.inner.on_end
            for span in spans:
                inner_on_end(span)

    def counts(self) -> ExportCounts:
        e = self.exporter
        with self._lock, e._lock:
            dropped = self.dropped_queue_full + self.dropped_at_shutdown
            pending = max(0, self.submitted - e.exported - e.failed - dropped)
            return ExportCounts(e.name, self.submitted, e.exported, e.failed, dropped, pending,
                                e.batches_exported, e.batches_failed, e.last_error)

    def shutdown(self) -> None:
        if self._shut:
            return
        self._shut = True
        self.inner.shutdown()
        with self._lock, self.exporter._lock:
            # Exact once the processor is shut down: what the exporter never got was dropped.
            # (The queue-full count taken in on_end races with the export thread by a span or
            # two; it is an estimate while running, corrected here.)
            dropped = max(0, self.submitted - self.exporter.exported - self.exporter.failed)
            self.dropped_queue_full = min(self.dropped_queue_full, dropped)
            self.dropped_at_shutdown = dropped - self.dropped_queue_full
        counts = self.counts()
        _log.log(logging.WARNING if counts.lost else logging.INFO, counts.log_line())

    def force_flush(self, timeout_millis: int = 30000) -> bool:
        return self.inner.force_flush(timeout_millis)


def add_counts_source(provider: Any, source: Callable[[], list[ExportCounts]]) -> None:
    """Count ``source()`` among ``provider``'s exporters in :func:`export_health` (the span
    exporter process of instrument/records/exporter_process.py reports this way). The sources
    are the provider's ``count_sources`` (a ``TracingSetup``'s; set on any other provider)."""
    sources = getattr(provider, "count_sources", None)
    if sources is None:
        sources = provider.count_sources = []
    sources.append(source)


def export_health(provider: Any) -> list[ExportCounts]:
    """Current counts of every counted exporter of a TracerProvider made by ``setup_tracing``
    (an empty list for other providers), then those of sources added with
    :func:`add_counts_source` (another process's exporters)."""
    multi = getattr(provider, "_active_span_processor", None)
    processors = getattr(multi, "_span_processors", ())
    counts = [p.counts() for p in processors if isinstance(p, CountingSpanProcessor)]
    for source in getattr(provider, "count_sources", None) or ():
        counts.extend(source())
    return counts


def emit_sampled_spans(processor: SpanProcessor, spans: Sequence[ReadableSpan]) -> None:
    """Hand finished spans, all known to be sampled, to ``processor``.

    For the SDK's :class:`BatchSpanProcessor` this is what its ``on_end`` does for each span
    (check the sampled flag, then queue the span) done once for the list: one ``extendleft``
    on its queue and at most one wake-up of its export thread, so a span's ``context`` is
    not read on the caller's thread (decode spans build theirs lazily on the export thread).
    Anything unusual (a subclass, shutdown, a fork, a queue without room) takes the SDK's own
    per-span path, which drops, counts and logs as it always does. Other processors get
    ``on_end`` per span.
    """
    batch: Any = getattr(processor, "_batch_processor", None) if type(processor) is BatchSpanProcessor else None
    queue: Any = getattr(batch, "_queue", None)
    try:
        fast = (
            isinstance(queue, deque)
            and not batch._shutdown
            and batch._pid == os.getpid()
            and (queue.maxlen is None or queue.maxlen - len(queue) >= len(spans))
        )
    except AttributeError:  # an SDK whose batch processor is shaped differently
        fast = False
    if fast:
        queue.extendleft(spans)  # newest at the left, as emit() appends them
        if len(queue) >= batch._max_export_batch_size and not batch._worker_awaken.is_set():
            batch._worker_awaken.set()
        return
    emit = getattr(batch, "emit", None) if batch is not None else None
    for span in spans:
        if emit is not None:
            emit(span)
        else:
            processor.on_end(span)
