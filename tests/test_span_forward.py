"""Forwarded spans (instrument/records/span_forward.py, #27): what the serving process's span
processor packs is what the span exporter process rebuilds, field by field.

Real OTel SDK spans (a recording tracer of a ``setup_tracing`` provider), real ``marshal``
payloads, the real Decoder handing spans to a provider with an in-memory exporter; the last
test runs the whole path through a real span exporter process into an OTLP-JSON file.
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

import pytest
from opentelemetry import trace
from opentelemetry.sdk.trace import ReadableSpan
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import (
    Link,
    NonRecordingSpan,
    SpanContext,
    SpanKind,
    Status,
    StatusCode,
    TraceFlags,
    TraceState,
)

from instrument.gateway.request_state import CHUNK_EVENT, CHUNK_KEYS
from instrument.otel.export_health import export_health
from instrument.otel.tracing import get_tracer, setup_tracing
from instrument.records.span_forward import Decoder, SpanForwarder, encode_span, forward_spans, forwarder_of

CHUNKS = [(0, 0, False, 1_000), (1, 1, True, 2_000), (2, 2, True, 3_500), (3, 0, False, 3_600)]


def _memory_provider() -> tuple[Any, InMemorySpanExporter]:
    memory = InMemorySpanExporter()
    provider = setup_tracing("forward-test", exporter=["none"], count_exports=False)
    provider.add_span_processor(SimpleSpanProcessor(memory))
    return provider, memory


def _fields(span: ReadableSpan) -> dict[str, Any]:
    """Everything an exporter reads of a span, in comparable form."""
    def ctx(c: SpanContext | None) -> Any:
        return None if c is None else (c.trace_id, c.span_id, int(c.trace_flags), c.is_remote,
                                       c.trace_state.to_header() if c.trace_state else "")
    scope = span.instrumentation_scope
    return {
        "name": span.name, "context": ctx(span.context), "parent": ctx(span.parent)[:4] if span.parent else None,
        "kind": span.kind, "start": span.start_time, "end": span.end_time,
        "status": (span.status.status_code, span.status.description), "attributes": dict(span.attributes),
        "events": [(e.name, dict(e.attributes or {}), e.timestamp, e.dropped_attributes) for e in span.events],
        "links": [(ctx(link.context), dict(link.attributes or {})) for link in span.links],
        "dropped": (span.dropped_attributes, span.dropped_events, span.dropped_links),
        "scope": (scope.name, scope.version, scope.schema_url) if scope else None,
        "resource": dict(span.resource.attributes),
    }


def _spans_of_a_request(tracer: Any, chunks: Any) -> list[ReadableSpan]:
    """A gateway-shaped request: a SERVER span under a remote parent with trace state, a
    preemption event before the chunks, the chunks (``chunks(span)`` puts them on), a cancel
    event after, a link, an error status; a child span."""
    remote = SpanContext(0x0AF7651916CD43DD8448EB211C80319C, 0xB7AD6B7169203331, is_remote=True,
                         trace_flags=TraceFlags(TraceFlags.SAMPLED), trace_state=TraceState([("vendor", "v1")]))
    linked = SpanContext(0x1234, 0x5678, is_remote=True, trace_flags=TraceFlags(TraceFlags.SAMPLED))
    span = tracer.start_span("gateway", context=trace.set_span_in_context(NonRecordingSpan(remote)),
                             kind=SpanKind.SERVER, start_time=500, links=[Link(linked, {"why": "retry"})],
                             attributes={"gen_ai.response.id": "chatcmpl-x", "n": 3, "f": 0.25, "ok": True,
                                         "reasons": ("length",)})
    span.add_event("tokentrace.preemption", {"tokentrace.kv.blocks": 4}, timestamp=900)
    chunks(span)
    span.add_event("tokentrace.cancel", {"tokentrace.cancel.reason": "timeout"}, timestamp=4_000)
    child = tracer.start_span("tokenize", context=trace.set_span_in_context(span), start_time=600)
    child.end(end_time=700)
    span.set_status(Status(StatusCode.ERROR, "timed out"))
    span.end(end_time=5_000)
    return [child, span]


def test_a_forwarded_span_is_rebuilt_field_by_field() -> None:
    """The chunk events as SDK events (inline) vs as raw tuples (forwarded): the rebuilt span
    equals the inline one, event order included."""
    provider, memory = _memory_provider()
    tracer = get_tracer(provider)

    def as_events(span: Any) -> None:
        for index, tokens, visible, at_ns in CHUNKS:
            span.add_event(CHUNK_EVENT, dict(zip(CHUNK_KEYS, (index, tokens, visible))), timestamp=at_ns)

    inline = _spans_of_a_request(tracer, as_events)
    forwarded_raw: list[tuple] = []

    def as_rows(span: Any) -> None:
        forwarded_raw.append((len(span.events), CHUNK_EVENT, CHUNK_KEYS, list(CHUNKS)))

    originals = _spans_of_a_request(tracer, as_rows)
    decoder = Decoder(provider)
    memory.clear()
    for span in originals:
        decoder.feed(memoryview(encode_span(span, forwarded_raw if span.name == "gateway" else ())))
    rebuilt = memory.get_finished_spans()
    assert [s.name for s in rebuilt] == ["tokenize", "gateway"]
    for original, copy, inline_span in zip(originals, rebuilt, inline):
        want, got = _fields(original), _fields(copy)
        if original.name == "gateway":  # the original never held the chunk events: compare with inline
            want["events"] = _fields(inline_span)["events"]
        assert got == want, original.name
    events = [e.name for e in rebuilt[1].events]
    assert events == ["tokentrace.preemption"] + [CHUNK_EVENT] * 4 + ["tokentrace.cancel"]
    assert rebuilt[1].parent.is_remote and rebuilt[1].context.trace_state.get("vendor") == "v1"
    provider.shutdown()


def test_limits_and_bad_payloads() -> None:
    """Dropped counts travel; merged events past the event limit keep the newest (as the
    SDK's BoundedList); a payload that is not a span is a ValueError (the exporter process
    counts it as malformed)."""
    provider = setup_tracing("forward-test", exporter=["none"], span_event_limit=3, count_exports=False)
    tracer = get_tracer(provider)
    span = tracer.start_span("gateway", attributes={"a": 1})
    rows = [(i, 1, True, 100 + i) for i in range(4)]
    span.end(end_time=1_000)
    memory_provider, memory = _memory_provider()
    decoder = Decoder(memory_provider)
    decoder.max_events = 3
    decoder.feed(memoryview(encode_span(span, [(0, CHUNK_EVENT, CHUNK_KEYS, rows)])))
    (got,) = memory.get_finished_spans()
    assert [e.timestamp for e in got.events] == [101, 102, 103] and got.dropped_events == 1
    with pytest.raises(ValueError):
        decoder.feed(memoryview(b"not a span"))
    provider.shutdown()
    memory_provider.shutdown()


@pytest.mark.timing  # the timer's send: both spans must end within flush_s of each other
def test_the_forwarder_counts_what_it_cannot_carry() -> None:
    class _Sink:  # the ExporterProcess's sender interface, recording what is sent
        def __init__(self) -> None:
            self.sent: list[tuple[bytes, int]] = []
            self.dropped_units = 0
            self.joined: list[tuple[int, Any]] = []

        def join(self, channel: int, decoder: Any, preamble: bytes = b"") -> _Sink:
            self.joined.append((channel, decoder))
            return self

        def send(self, message: Any, units: int) -> bool:
            self.sent.append((bytes(message), units))
            return True

        def flush(self, timeout_s: float) -> bool:
            return True

    sink = _Sink()
    forwarder = SpanForwarder(sink, flush_s=60.0)
    assert sink.joined == [(2, Decoder)], "the forwarder names its decoder for channel 2"
    provider = setup_tracing("forward-test", exporter=["none"], count_exports=False)
    provider.add_span_processor(forwarder)
    tracer = get_tracer(provider)
    tracer.start_span("fine").end()
    context = SpanContext(1, 2, is_remote=False, trace_flags=TraceFlags(TraceFlags.SAMPLED))
    # a value marshal cannot carry (an SDK span's attributes never hold one; another processor's might)
    forwarder.on_end(ReadableSpan("bad", context, attributes={"x": object()}, start_time=1, end_time=2))
    assert sink.sent == [], "below FLUSH_BYTES and before FLUSH_S: nothing sent yet"
    forwarder.flush()
    assert [units for _, units in sink.sent] == [1] and forwarder.unencodable == 1 and sink.dropped_units == 1
    forwarder.flush_bytes = 1
    tracer.start_span("big").end()
    assert [units for _, units in sink.sent] == [1, 1], "past FLUSH_BYTES: sent by the ending thread"
    provider.shutdown()
    # below FLUSH_BYTES, the forwarder's own thread sends ``flush_s`` after the first span packed
    # (0.5 s: the second span ends microseconds after the first, but a busy machine can pause
    # this thread for tens of ms, and at 0.05 s the timer then sent each span alone)
    timed = _Sink()
    forwarder = SpanForwarder(timed, flush_s=0.5)
    provider = setup_tracing("forward-test", exporter=["none"], count_exports=False)
    provider.add_span_processor(forwarder)
    get_tracer(provider).start_span("timed").end()
    get_tracer(provider).start_span("timed too").end()
    deadline = time.monotonic() + 30.0
    while not timed.sent and time.monotonic() < deadline:
        time.sleep(0.01)
    assert [units for _, units in timed.sent] == [2], "both spans in one message, sent by the timer"
    provider.shutdown()


def test_forward_spans_exports_from_the_exporter_process_only(tmp_path: Path) -> None:
    path = tmp_path / "spans.jsonl"
    provider = setup_tracing("forward-test", exporter=["otlp_json"], json_path=path, make_exporters=False)
    assert export_health(provider) == [], "no exporter made in this process"
    exporter = forward_spans(provider)
    forwarder = forwarder_of(provider)
    tracer = get_tracer(provider)
    span = tracer.start_span("gateway", kind=SpanKind.SERVER, start_time=10)
    assert forwarder.defer_events(span, CHUNK_EVENT, CHUNK_KEYS, CHUNKS)
    span.end(end_time=5_000)
    assert not forwarder.defer_events(span, CHUNK_EVENT, CHUNK_KEYS, CHUNKS), "an ended span takes none"
    assert provider.force_flush(30_000)
    provider.shutdown()
    assert exporter.process.poll() is not None, "the forwarder owns the process: stopped with the provider"
    (row,) = export_health(provider)
    assert row.name.startswith("exporter-process:") and (row.submitted, row.exported, row.dropped) == (1, 1, 0)
    (line,) = path.read_text(encoding="utf-8").splitlines()
    (sp,) = json.loads(line)["resourceSpans"][0]["scopeSpans"][0]["spans"]
    assert sp["name"] == "gateway" and sp["kind"] == 2
    assert [(e["timeUnixNano"], e["attributes"][0]["value"]["intValue"]) for e in sp["events"]] == [
        (str(at), str(index)) for index, _, _, at in CHUNKS]


def test_forward_spans_refuses_a_provider_that_already_exports(tmp_path: Path) -> None:
    """Exporters made in this process and forwarded too would export every span twice: refused,
    with what to do, and no exporter process is started."""
    provider = setup_tracing("forward-test", exporter=["otlp_json"], json_path=tmp_path / "spans.jsonl")
    try:
        with pytest.raises(ValueError, match="exported twice; make it with setup_tracing\\(..., make_exporters=False\\)"):
            forward_spans(provider)
        assert forwarder_of(provider) is None
    finally:
        provider.shutdown()
