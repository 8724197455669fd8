"""The serving process's own spans, forwarded whole to the span exporter process (channel 2).

With ``--span-export process`` the engine's spans are built in the span exporter process
from step records (instrument/engines/continuous/record_sink.py); the spans the serving process itself
finishes (``gateway`` with one ``tokentrace.chunk`` event per token, ``tokenize``,
``queue``, whatever else ends on its provider) go there too, so that nothing is encoded or
exported in the serving process:

- :class:`SpanForwarder` is the serving provider's only span processor. At ``on_end`` it
  reads the finished span through the SDK's public ``ReadableSpan`` properties and packs it
  with ``marshal`` (name, trace / span / parent ids, flags, trace state, kind, start / end ns,
  status, attributes, events, links, scope, dropped counts) into one BLOB entry of channel
  2 (instrument/records/format.py). Events a caller hands over raw with
  :meth:`SpanForwarder.defer_events` (the gateway's chunk events: one ``(index, tokens,
  visible, ns)`` tuple per chunk) travel as those tuples, with their place among the span's
  other events: no SDK ``Event`` is built in the serving process. Entries go out in one
  message per ``FLUSH_BYTES`` (sent by the thread that ends the span filling it) or per
  ``FLUSH_S`` (sent by the forwarder's own thread, which sleeps while nothing is pending),
  through a :class:`~instrument.records.exporter_process.RecordSender` of its own: never
  waits; a message dropped at a full socket or a dead exporter counts its spans as dropped.
- :class:`Decoder` (the exporter process, channel 2) rebuilds each span as an SDK
  ``ReadableSpan`` with the same ids, parent, times, attributes, events, links, status and
  scope, with the exporter process's resource (the serving provider's attributes, passed
  at start), and hands it to that provider's processors.

:func:`forward_spans` wires one serving provider this way: it starts the exporter process
(made from the provider's exporter settings: ``setup_tracing(make_exporters=False)``
records them without building any exporter here), adds the forwarder, counts the exporter
process's counts among the provider's, and keeps the process on the provider (a
``TracingSetup``'s ``exporter_process``), so that the continuous engine's step records share
it (:func:`exporter_process_of`). ``provider.shutdown()``
sends what is pending and stops the exporter process (bounded).
"""

from __future__ import annotations

import logging
import marshal
import threading
from collections.abc import Sequence
from typing import Any

from opentelemetry.attributes import BoundedAttributes
from opentelemetry.sdk.trace import Event, ReadableSpan, SpanProcessor
from opentelemetry.sdk.util import BoundedList
from opentelemetry.sdk.util.instrumentation import InstrumentationScope
from opentelemetry.trace import Link, SpanContext, SpanKind, Status, StatusCode, TraceFlags, TraceState

from instrument.otel.tracing import TracingSetup
from instrument.records.format import RecordWriter

__all__ = ["CHANNEL", "Decoder", "FLUSH_BYTES", "FLUSH_S", "SpanForwarder", "encode_span", "exporter_process_of",
           "forward_spans", "forwarder_of"]

LOGGER = logging.getLogger("tokentrace.export")
# as the engine's records (instrument/engines/continuous/record_sink.py): a send that wakes the sleeping
# exporter costs ~40 µs on the sending thread, so one per 32 KiB or 50 ms, not one per span
FLUSH_BYTES = 32 * 1024
FLUSH_S = 0.05
CHANNEL = 2  # the record stream's channel of forwarded spans (read by Decoder)
_VERSION = 1

Deferred = tuple[int, str, tuple[str, ...], Sequence[tuple[Any, ...]]]  # (position, name, keys, rows)


# --- the serving process's side -------------------------------------------------------------
def encode_span(span: ReadableSpan, deferred: Sequence[Deferred] = ()) -> bytes:
    """One finished span as ``marshal`` bytes (public ``ReadableSpan`` properties only).

    ``deferred``: events kept raw, each segment ``(position, name, keys, rows)``: one event
    ``name`` per row, attributes ``zip(keys, row)``, timestamp ``row[-1]`` (ns), placed
    before the span's ``position``-th own event. Raises ValueError for an attribute value
    ``marshal`` cannot carry."""
    ctx = span.context
    parent = span.parent
    status = span.status
    scope = span.instrumentation_scope
    state = ctx.trace_state
    links = span.links
    return marshal.dumps((
        _VERSION, span.name, ctx.trace_id, ctx.span_id, int(ctx.trace_flags), state.to_header() if state else "",
        None if parent is None else (parent.trace_id, parent.span_id, int(parent.trace_flags), parent.is_remote),
        span.kind.value, span.start_time, span.end_time, status.status_code.value, status.description,
        dict(span.attributes or {}), span.dropped_attributes,
        tuple((e.name, dict(e.attributes or {}), e.timestamp, e.dropped_attributes) for e in span.events),
        span.dropped_events, tuple((p, n, tuple(k), list(r)) for p, n, k, r in deferred),
        tuple((link.context.trace_id, link.context.span_id, int(link.context.trace_flags), link.context.is_remote,
               link.context.trace_state.to_header() if link.context.trace_state else "",
               dict(link.attributes or {}), link.dropped_attributes) for link in links) if links else (),
        span.dropped_links,
        None if scope is None else (scope.name, scope.version, scope.schema_url,
                                    dict(scope.attributes) if scope.attributes else None),
    ))


class SpanForwarder(SpanProcessor):
    """The serving provider's span processor under ``--span-export process`` (module docstring).

    ``exporter``: the ExporterProcess it sends to (one sender of its own); ``owns``: stop the
    process at shutdown (:func:`forward_spans`)."""

    def __init__(self, exporter: Any, *, owns: bool = False, flush_bytes: int = FLUSH_BYTES,
                 flush_s: float = FLUSH_S, stop_timeout_s: float = 8.0) -> None:
        self.exporter = exporter
        self.sender = exporter.join(CHANNEL, Decoder)
        self.owns = owns
        self.flush_bytes = flush_bytes
        self.flush_s = flush_s
        self.stop_timeout_s = stop_timeout_s
        self.unencodable = 0  # spans marshal could not carry (counted as dropped too)
        self._writer = RecordWriter()
        self._units = 0  # spans packed and not yet sent
        self._lock = threading.Lock()
        self._deferred: dict[int, list[Deferred]] = {}  # span id -> raw event segments
        self._armed = False  # the flusher thread is (about to be) timing a send
        self._wake = threading.Event()
        self._stop = threading.Event()
        self._shut = False
        self._thread = threading.Thread(target=self._run, name="tokentrace-span-forward", daemon=True)
        self._thread.start()

    def defer_events(self, span: Any, name: str, keys: tuple[str, ...], rows: Sequence[tuple[Any, ...]]) -> bool:
        """Keep ``rows`` as events of the live ``span`` without building them here: one event
        ``name`` per row, attributes ``zip(keys, row)``, timestamp ``row[-1]`` (ns since the
        epoch), placed after the events the span holds now. False (nothing kept) when the
        span no longer records (ended, or not sampled into recording)."""
        if not rows or not span.is_recording():
            return False
        self._deferred.setdefault(span.get_span_context().span_id, []).append(
            (len(span.events), name, keys, rows))
        return True

    def on_start(self, span: Any, parent_context: Any = None) -> None:
        pass

    def on_end(self, span: ReadableSpan) -> None:
        deferred = self._deferred.pop(span.context.span_id, ())
        if self._shut:  # ended after shutdown: nothing will send it; counted, not kept
            with self._lock:
                self.sender.dropped_units += 1
            return
        try:
            payload = encode_span(span, deferred)
        except (ValueError, TypeError) as exc:  # a value marshal cannot carry: lost, counted
            with self._lock:
                self.unencodable += 1
                self.sender.dropped_units += 1
                first = self.unencodable == 1
            if first:
                LOGGER.error("tokentrace: span %r not forwarded to the span exporter process (%s); "
                             "counted as dropped", span.name, exc)
            return
        wake = False
        with self._lock:
            writer = self._writer
            writer.blob(CHANNEL, payload)
            self._units += 1
            if writer.pending() >= self.flush_bytes:
                self._send_locked()
            elif not self._armed:
                self._armed = wake = True
        if wake:
            self._wake.set()

    def _send_locked(self) -> None:
        if self._writer.pending():
            units, self._units = self._units, 0
            self.sender.send(self._writer.take(), units)

    def flush(self) -> None:
        """Send what is packed now (one message; never waits)."""
        with self._lock:
            self._armed = False
            self._send_locked()

    def _run(self) -> None:
        """Sleeps until a span is packed into an empty batch, then sends ``flush_s`` later."""
        while True:
            self._wake.wait()
            if self._stop.wait(self.flush_s):
                return
            self._wake.clear()
            self.flush()

    def force_flush(self, timeout_millis: int = 30000) -> bool:
        """Send what is packed and wait until the exporter process has exported everything
        sent so far (its engine records too)."""
        self.flush()
        return bool(self.exporter.flush(timeout_millis / 1000))

    def shutdown(self) -> None:
        """Send what is pending; stop the exporter process when this forwarder owns it."""
        if self._shut:
            return
        self._shut = True
        self._stop.set()
        self._wake.set()
        self._thread.join(1.0)
        self.flush()
        if self.owns:
            self.exporter.stop(self.stop_timeout_s)


def forward_spans(tracer_provider: Any) -> Any:
    """Start the span exporter process for ``tracer_provider`` (exporters given by name to
    ``setup_tracing``, ideally with ``make_exporters=False``) and forward every span the
    provider finishes there; returns the ExporterProcess. ValueError when the provider's
    exporters cannot be made again in another process, or were already made in this one
    (every span would be exported twice). The process and its forwarder are kept on the
    provider (a ``TracingSetup``: ``exporter_process``, ``span_forwarder``)."""
    from instrument.otel.export_health import add_counts_source
    from instrument.otel.tracing import exporter_settings
    from instrument.records.exporter_process import ExporterProcess

    running = exporter_process_of(tracer_provider)
    if running is not None:
        return running
    if (exporter_settings(tracer_provider) or {}).get("built"):
        raise ValueError("--span-export process: the tracer provider already exports from this process "
                         "(setup_tracing made its exporters): forwarded too, every span would be exported "
                         "twice; make it with setup_tracing(..., make_exporters=False)")
    exporter = ExporterProcess.for_provider(tracer_provider)  # ValueError unless a TracingSetup
    forwarder = SpanForwarder(exporter, owns=True)
    tracer_provider.add_span_processor(forwarder)
    add_counts_source(tracer_provider, exporter.counts)
    tracer_provider.exporter_process, tracer_provider.span_forwarder = exporter, forwarder
    tracer_provider.span_export = "process"
    return exporter


def exporter_process_of(tracer_provider: Any) -> Any:
    """The exporter process :func:`forward_spans` started for this provider, or None."""
    return tracer_provider.exporter_process if isinstance(tracer_provider, TracingSetup) else None


def forwarder_of(tracer_provider: Any) -> SpanForwarder | None:
    """The provider's :class:`SpanForwarder` (None unless :func:`forward_spans` wired it)."""
    return tracer_provider.span_forwarder if isinstance(tracer_provider, TracingSetup) else None


# --- the exporter process's side ------------------------------------------------------------
class Decoder:
    """Channel 2's decoder in the exporter process (named by :class:`SpanForwarder` when it
    joins): forwarded spans -> the process's span processors."""

    def __init__(self, tracer_provider: Any) -> None:
        from instrument.otel.span_writer import span_writer_for
        from instrument.otel.tracing import get_tracer
        from instrument.records.keep_stage import keep_stage_of

        tracer = get_tracer(tracer_provider)
        self.writer = span_writer_for(tracer)
        # tokentrace's SDK provider: span_writer_for gives the direct writer (hand_off is its)
        self.stage = keep_stage_of(tracer_provider, self.writer.hand_off)  # type: ignore[union-attr]  # see above
        self.resource = tracer_provider.resource
        self.max_events = getattr(getattr(self.writer, "limits", None), "max_events", None)
        self._scopes: dict[Any, InstrumentationScope] = {}
        self._states: dict[str, TraceState | None] = {"": None}
        self.spans = 0

    def _state(self, header: str) -> TraceState | None:
        state = self._states.get(header)
        if state is None and header:
            state = self._states[header] = TraceState.from_header([header])
            if len(self._states) > 256:
                self._states = {"": None, header: state}
        return state

    def _scope(self, key: Any) -> InstrumentationScope | None:
        if key is None:
            return None
        hashable = (key[0], key[1], key[2], tuple(sorted(key[3].items())) if key[3] else None)
        scope = self._scopes.get(hashable)
        if scope is None:
            scope = self._scopes[hashable] = InstrumentationScope(key[0], key[1], key[2], key[3])
        return scope

    def build(self, payload: bytes | memoryview) -> ReadableSpan:
        """The ReadableSpan one payload carries (ValueError when it is not one)."""
        try:
            (version, name, trace_id, span_id, flags, state, parent, kind, start, end, code, description, attributes,
             dropped_attributes, events, dropped_events, deferred, links, dropped_links, scope) = marshal.loads(payload)
        except (EOFError, TypeError, ValueError) as exc:
            raise ValueError(f"forwarded span: unreadable payload ({exc})") from None
        if version != _VERSION:
            raise ValueError(f"forwarded span: format version {version}, this exporter reads {_VERSION}")
        context = SpanContext(trace_id, span_id, is_remote=False, trace_flags=TraceFlags(flags),
                              trace_state=self._state(state))
        parent_context = None if parent is None else SpanContext(parent[0], parent[1], is_remote=parent[3],
                                                                 trace_flags=TraceFlags(parent[2]))
        event_list = self._events(events, deferred, dropped_events)
        link_list: Any = [Link(SpanContext(t, s, is_remote=r, trace_flags=TraceFlags(f), trace_state=self._state(h)),
                               _bounded(a, d)) for t, s, f, r, h, a, d in links]
        if dropped_links:
            link_list = _bounded_list(link_list, dropped_links)
        code = StatusCode(code)
        status = Status(code, description) if code is StatusCode.ERROR else Status(code)
        return ReadableSpan(name, context, parent_context, self.resource, _bounded(attributes, dropped_attributes),
                            event_list, link_list, SpanKind(kind), status=status, start_time=start, end_time=end,
                            instrumentation_scope=self._scope(scope))

    def _events(self, events: Sequence[Any], deferred: Sequence[Any], dropped: int) -> Any:
        own = [Event(n, _bounded(a, d), t) for n, a, t, d in events]
        if not deferred:
            return _bounded_list(own, dropped) if dropped else own
        merged: list[Event] = []
        at = 0
        for position, name, keys, rows in deferred:
            merged.extend(own[at:position])
            at = max(at, position)
            merged.extend(Event(name, dict(zip(keys, row)), row[-1]) for row in rows)
        merged.extend(own[at:])
        limit = self.max_events
        if limit is not None and len(merged) > limit:  # as the SDK's BoundedList: the oldest go
            dropped += len(merged) - limit
            merged = merged[-limit:]
        return _bounded_list(merged, dropped) if dropped else merged

    def feed(self, payload: memoryview) -> None:
        """Rebuild one forwarded span and hand it to the provider's processors (under a keep
        policy: to the keep stage, which hands it on once its request is decided)."""
        span = self.build(payload)
        if self.stage is not None:
            self.stage.forwarded(span)
        else:
            self.writer.hand_off([span])  # type: ignore[union-attr]  # the direct writer (__init__)
        self.spans += 1

    def tick(self) -> None:
        if self.stage is not None:
            self.stage.tick()

    def close(self) -> None:
        """Shutdown: the keep stage decides what it still holds (nothing else is held)."""
        if self.stage is not None:
            self.stage.close()


def _bounded(attributes: dict[str, Any], dropped: int) -> Any:
    """``attributes`` as the span held them: a plain dict, or with the count of those the
    serving process's limits dropped (the exporters write it as dropped_attributes_count)."""
    if not dropped:
        return attributes
    bounded = BoundedAttributes(None, attributes, immutable=True)
    bounded.dropped = dropped
    return bounded


def _bounded_list(items: list[Any], dropped: int) -> BoundedList:
    bounded = BoundedList.from_seq(None, items)
    bounded.dropped = dropped
    return bounded
