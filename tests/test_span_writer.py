"""The span writers: the direct writer's lazy decode-step spans and chunk events export exactly
what the tracer API writes, and the bulk hand-off to the SDK's batch processor keeps its
queue and drop accounting."""

from __future__ import annotations

import json
import threading
from typing import Any

import pytest
from opentelemetry.context import Context
from opentelemetry.exporter.otlp.proto.common.trace_encoder import encode_spans
from opentelemetry.sdk.trace import SpanLimits, TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor, SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.sdk.trace.sampling import ALWAYS_ON, Decision, Sampler, SamplingResult

from instrument.hf.generate_spans import DecodeSpanPolicy, SequenceTrace, emit_sequence_spans
from instrument.hf.recorder import RecordedTimeline
from instrument.kv.formula import KVLayout
from instrument.kv.runtime import RuntimeKV
from instrument.otel.export_health import CountingSpanExporter, CountingSpanProcessor, emit_sampled_spans
from instrument.otel.span_writer import ApiSpanWriter, DirectSpanWriter, LazyEvents, resolve_context
from instrument.otel.tracing import get_tracer, setup_tracing

T0 = 1_700_000_000_000_000_000
STEPS = 40


def _timeline(device: bool) -> RecordedTimeline:
    # Forward k starts at T0 + 1000k + 7k² ns; token k+1 is emitted 900 ns later.
    starts = [T0 + 1000 * k + 7 * k * k for k in range(STEPS)]
    return RecordedTimeline(
        forward_start_ns=starts,
        emit_ns=[s + 900 for s in starts],
        chunk_tokens=[1] * STEPS,
        forward_device_ns=[500 + k for k in range(STEPS)] if device else None,
    )


def _kv() -> RuntimeKV:
    layout = KVLayout(layers=2, q_heads=8, kv_heads=2, head_dim=8, dtype="fp32", bytes_per_element=4, layout="gqa")
    return RuntimeKV(layout=layout, layout_name="gqa")


def _write(writer_kind: str, sampler: Sampler = ALWAYS_ON, *, device: bool = False, policy: str = "all",
           limits: SpanLimits | None = None):
    exporter = InMemorySpanExporter()
    provider = TracerProvider(sampler=sampler, span_limits=limits)
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    tracer = get_tracer(provider)
    writer = DirectSpanWriter(tracer) if writer_kind == "direct" else ApiSpanWriter(tracer)
    timeline = _timeline(device)
    visible = [k % 5 != 4 for k in range(STEPS)]
    seq = SequenceTrace(0, 10, 0, STEPS, sum(visible), "length", timeline.emit_ns, [1] * STEPS, visible)
    emit_sequence_spans(writer, seq, timeline, _kv(), DecodeSpanPolicy.parse(policy), parent_context=None,
                        root_attributes={"gen_ai.operation.name": "chat"}, call_start_ns=T0 - 50,
                        call_end_ns=timeline.emit_ns[-1] + 10)
    provider.shutdown()
    return exporter.get_finished_spans()


def _comparable(spans) -> list[tuple]:
    """Everything a span carries except its random ids (parentage by span name)."""
    by_id = {s.context.span_id: s.name for s in spans}
    rows = []
    for s in spans:
        rows.append((
            s.name, s.kind, by_id.get(s.parent.span_id) if s.parent else None, s.start_time, s.end_time,
            sorted(s.attributes.items()), [(e.name, e.timestamp, sorted(e.attributes.items())) for e in s.events],
            s.status.status_code, s.dropped_attributes, s.dropped_events, s.dropped_links, list(s.links),
            s.instrumentation_scope, s.resource.attributes,
        ))
    return sorted(rows, key=lambda r: (r[0], r[3]))


@pytest.mark.parametrize("device", [False, True], ids=["cpu", "device-time"])
@pytest.mark.parametrize("policy", ["all", "every:7"])
def test_lazy_spans_export_what_the_tracer_api_writes(device: bool, policy: str) -> None:
    direct = _write("direct", device=device, policy=policy)
    api = _write("api", device=device, policy=policy)
    steps = list(DecodeSpanPolicy.parse(policy).steps(STEPS))
    assert len(direct) == len(api) == 2 + len(steps)
    assert _comparable(direct) == _comparable(api)
    decodes = sorted((s for s in direct if s.name == "decode"), key=lambda s: s.attributes["tokentrace.step"])
    assert [s.attributes["tokentrace.step"] for s in decodes] == steps
    # Step k: forward k start -> emission of token k+1; kv bytes for I + k tokens (256 B/token).
    timeline = _timeline(device)
    for span in decodes:
        k = span.attributes["tokentrace.step"]
        assert (span.start_time, span.end_time) == (timeline.forward_start_ns[k], timeline.emit_ns[k])
        assert span.attributes["tokentrace.kv.bytes"] == 256 * (10 + k)
        if device:
            assert span.attributes["tokentrace.device_ns"] == 500 + k


def test_lazy_step_span_fields_are_built_once_and_ids_are_unique() -> None:
    spans = _write("direct")
    decodes = [s for s in spans if s.name == "decode"]
    first_read = [s.context for s in decodes]
    assert [s.context for s in decodes] == first_read and all(a is b for a, b in zip(first_read, (s.context for s in decodes)))
    assert decodes[0]._attributes is decodes[0]._attributes  # built once (the property wraps it in a proxy)
    ids = {s.context.span_id for s in spans}
    assert len(ids) == len(spans) and 0 not in ids
    (root,) = [s for s in spans if s.name == "generate"]
    assert all(s.context.trace_id == root.context.trace_id for s in spans)
    # The SDK's JSON and the OTLP protobuf encoder read the private fields and properties.
    as_json = json.loads(decodes[3].to_json())
    assert as_json["name"] == "decode" and as_json["attributes"]["tokentrace.step"] == 4
    request = encode_spans(spans)
    encoded = [span for rs in request.resource_spans for ss in rs.scope_spans for span in ss.spans]
    assert sorted(s.span_id.hex() for s in encoded) == sorted(f"{i:016x}" for i in ids)


def test_racing_first_reads_agree_on_one_span_id() -> None:
    spans = [s for s in _write("direct") if s.name == "decode"]
    # Fresh, unread copies: rebuild the spans and read their contexts from 8 threads at once.
    fresh = [type(s)(s._shared, s._step) for s in spans]
    seen: list[list[int]] = []
    barrier = threading.Barrier(8)

    def read() -> None:
        barrier.wait()
        seen.append([s.context.span_id for s in fresh])

    threads = [threading.Thread(target=read) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=30)
    assert len(seen) == 8 and all(row == seen[0] for row in seen)


class _AddsAttribute(Sampler):
    def should_sample(self, parent_context, trace_id, name, kind=None, attributes=None, links=None, trace_state=None):
        return SamplingResult(Decision.RECORD_AND_SAMPLE, {**(attributes or {}), "sampler.note": name})

    def get_description(self) -> str:
        return "adds sampler.note"


def test_a_sampler_that_adds_attributes_gets_them_on_every_span() -> None:
    direct = _write("direct", _AddsAttribute())
    assert _comparable(direct) == _comparable(_write("api", _AddsAttribute()))
    assert {s.attributes["sampler.note"] for s in direct if s.name == "decode"} == {"decode"}


@pytest.mark.parametrize("sampler", [ALWAYS_ON, "adds"], ids=["always-on", "adds-attribute"])
def test_sibling_spans_keep_their_own_attribute_keys(sampler: Any) -> None:
    """The writer takes one sampling decision per (parent, name) and reuses it for the parent's
    later spans of that name; the SDK's samplers hand back the attributes of the span they
    decided for, and those must not reach its siblings (a vLLM speculative decode step's keys
    once showed up on the plain decode steps after it). A sampler's own keys reach every span."""
    sampler = _AddsAttribute() if sampler == "adds" else sampler
    got = {}
    for kind in ("direct", "api"):
        exporter = InMemorySpanExporter()
        provider = TracerProvider(sampler=sampler)
        provider.add_span_processor(SimpleSpanProcessor(exporter))
        writer = DirectSpanWriter(get_tracer(provider)) if kind == "direct" else ApiSpanWriter(get_tracer(provider))
        parent = writer.write("parent", Context(), {}, T0, T0 + 100)
        if kind == "direct":
            parent = resolve_context(parent)
        writer.write("decode", parent, {"k": 1, "only.first": 4}, T0, T0 + 10)
        writer.write("decode", parent, {"k": 2}, T0 + 10, T0 + 20)
        writer.write_children("decode", parent, [({"k": 3}, T0 + 20, T0 + 30)])
        provider.shutdown()
        got[kind] = sorted((dict(s.attributes) for s in exporter.get_finished_spans() if s.name == "decode"),
                           key=lambda a: a["k"])
    note = {"sampler.note": "decode"} if isinstance(sampler, _AddsAttribute) else {}
    assert got["direct"] == got["api"] == [{"k": 1, "only.first": 4, **note}, {"k": 2, **note}, {"k": 3, **note}]


def test_span_attribute_limits_apply_as_through_the_tracer_api() -> None:
    """Span attribute limits (count, string length) bound the direct writer's spans as the SDK
    bounds its own: the root's and prefill's attributes, and the decode steps' (which then take
    the eager path)."""
    limits = SpanLimits(max_span_attributes=3, max_span_attribute_length=4)
    direct = _write("direct", device=True, limits=limits)
    api = _write("api", device=True, limits=limits)
    assert _comparable(direct) == _comparable(api)
    decodes = [s for s in direct if s.name == "decode"]
    assert decodes and all(len(s.attributes) == 3 and s.dropped_attributes == 2 for s in decodes)
    (root,) = [s for s in direct if s.name == "generate"]
    assert len(root.attributes) == 3 and root.dropped_attributes > 0


def test_lazy_events_count_and_build_once() -> None:
    built = []

    def build():
        built.append(1)
        return ["a", "b", "c"]

    events = LazyEvents(build, 3)
    assert len(events) == 3 and not built
    assert list(events) == ["a", "b", "c"] and events[1] == "b" and events[-1] == "c"
    assert len(built) == 1
    with pytest.raises(RuntimeError, match="built 2 events, 3 announced"):
        list(LazyEvents(lambda: ["x", "y"], 3))


def _readable(n: int):
    provider = TracerProvider()
    tracer = provider.get_tracer("t")
    spans = []
    for _ in range(n):
        span = tracer.start_span("s")
        span.end()
        spans.append(span)
    return spans


def test_bulk_hand_off_queues_in_order_and_falls_back_when_the_queue_is_full() -> None:
    exporter = CountingSpanExporter(InMemorySpanExporter())
    batch = BatchSpanProcessor(exporter, max_queue_size=64, max_export_batch_size=64, schedule_delay_millis=60_000)
    processor = CountingSpanProcessor(batch, exporter)
    first, second = _readable(50), _readable(30)
    queue = batch._batch_processor._queue
    with batch._batch_processor._export_lock:  # the export thread cannot drain the queue meanwhile
        processor.on_end_many(first, sampled=True)  # room for 64: one extendleft
        assert list(reversed(queue)) == first  # oldest at the right, as emit() leaves them
        processor.on_end_many(second, sampled=True)  # 30 > 14 free: the SDK's per-span path evicts the oldest
        assert len(queue) == 64 and processor.submitted == 80 and processor.dropped_queue_full == 16
        assert list(reversed(queue)) == first[16:] + second
    processor.shutdown()
    counts = processor.counts()
    assert (counts.submitted, counts.exported, counts.dropped, counts.pending) == (80, 64, 16, 0)


def test_bulk_hand_off_after_shutdown_drops_like_on_end() -> None:
    exporter = InMemorySpanExporter()
    batch = BatchSpanProcessor(exporter)
    batch.shutdown()
    emit_sampled_spans(batch, _readable(5))
    assert exporter.get_finished_spans() == ()


def test_traced_spans_reach_an_otlp_json_file_through_the_batch_processor(tmp_path) -> None:
    """End to end through setup_tracing's batch processor and the OTLP-JSON file exporter: the
    lazy spans are built on the export thread and written as valid OTLP/JSON."""
    path = tmp_path / "spans.jsonl"
    provider = setup_tracing(exporter="otlp_json", json_path=str(path), service_name="lazy-test")
    tracer = get_tracer(provider)
    timeline = _timeline(False)
    seq = SequenceTrace(0, 10, 0, STEPS, STEPS, "length", timeline.emit_ns, [1] * STEPS, [True] * STEPS)
    emit_sequence_spans(DirectSpanWriter(tracer), seq, timeline, _kv(), DecodeSpanPolicy.parse("all"),
                        parent_context=None, root_attributes={}, call_start_ns=T0 - 50, call_end_ns=T0 + 10**6)
    provider.shutdown()  # flushes the queue through the exporter
    spans = [
        span
        for line in path.read_text().splitlines()
        for rs in json.loads(line)["resourceSpans"]
        for ss in rs["scopeSpans"]
        for span in ss["spans"]
    ]
    decodes = sorted((s for s in spans if s["name"] == "decode"), key=lambda s: int(s["startTimeUnixNano"]))
    assert len(spans) == 2 + (STEPS - 1) and len(decodes) == STEPS - 1
    (root,) = [s for s in spans if s["name"] == "generate"]
    assert len(root["events"]) == STEPS and all(d["parentSpanId"] == root["spanId"] for d in decodes)
    assert [int(d["startTimeUnixNano"]) for d in decodes] == timeline.forward_start_ns[1:]
    assert len({d["spanId"] for d in decodes}) == STEPS - 1


def test_default_setup_keeps_decode_steps_on_the_lazy_path() -> None:
    """setup_tracing sets an attribute value length limit; decode-step attributes are numbers
    that no limit touches, so the steps must still be lazy ``_StepSpan``s (the ~0.2 µs/step
    path), while a root attribute past the length limit is still cut."""
    from instrument.otel.span_writer import _StepSpan
    from instrument.otel.tracing import DEFAULT_ATTRIBUTE_VALUE_LENGTH_LIMIT

    memory = InMemorySpanExporter()
    provider = setup_tracing(exporter="none", span_exporters=[memory], batch=False)
    assert get_tracer(provider)._span_limits.max_span_attribute_length == DEFAULT_ATTRIBUTE_VALUE_LENGTH_LIMIT
    timeline = _timeline(False)
    seq = SequenceTrace(0, 10, 0, STEPS, STEPS, "length", timeline.emit_ns, [1] * STEPS, [True] * STEPS)
    long_text = "x" * (DEFAULT_ATTRIBUTE_VALUE_LENGTH_LIMIT + 5)
    emit_sequence_spans(DirectSpanWriter(get_tracer(provider)), seq, timeline, _kv(), DecodeSpanPolicy.parse("all"),
                        parent_context=None, root_attributes={"note": long_text}, call_start_ns=T0 - 50,
                        call_end_ns=T0 + 10**6)
    provider.shutdown()
    spans = memory.get_finished_spans()
    decodes = [s for s in spans if s.name == "decode"]
    assert len(decodes) == STEPS - 1 and all(type(s) is _StepSpan for s in decodes)
    (root,) = [s for s in spans if s.name == "generate"]
    assert root.attributes["note"] == long_text[:DEFAULT_ATTRIBUTE_VALUE_LENGTH_LIMIT]


def test_lazy_spans_do_not_read_the_callers_lists_after_the_call() -> None:
    """traced_generate returns its timeline to the caller; lazy step spans and chunk events
    are built when the exporter reads them. A caller clearing or editing those lists in
    between must change nothing (it used to move a step's start to 0, or raise IndexError
    on the batch processor's thread and drop the batch)."""
    exporter = InMemorySpanExporter()  # keeps the span objects; reads nothing
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    timeline = _timeline(device=True)
    expected = [(timeline.forward_start_ns[k], timeline.emit_ns[k]) for k in range(1, STEPS)]
    visible = [True] * STEPS
    seq = SequenceTrace(0, 10, 0, STEPS, STEPS, "length", list(timeline.emit_ns), [1] * STEPS, visible)
    emit_sequence_spans(DirectSpanWriter(get_tracer(provider)), seq, timeline, _kv(), DecodeSpanPolicy.parse("all"),
                        parent_context=None, root_attributes={}, call_start_ns=T0 - 50,
                        call_end_ns=timeline.emit_ns[-1] + 10)
    provider.shutdown()
    timeline.forward_start_ns[:] = [0] * STEPS
    timeline.emit_ns.clear()
    timeline.forward_device_ns.clear()
    seq.chunk_emit_ns.clear()
    seq.chunk_tokens.clear()
    spans = exporter.get_finished_spans()
    decodes = sorted((s for s in spans if s.name == "decode"), key=lambda s: s.attributes["tokentrace.step"])
    assert [(s.start_time, s.end_time) for s in decodes] == expected
    assert [s.attributes["tokentrace.device_ns"] for s in decodes] == [500 + k for k in range(1, STEPS)]
    root = next(s for s in spans if s.name == "generate")
    assert len(root.events) == STEPS and root.events[-1].timestamp == expected[-1][1]
