"""Step records: the format round-trips, and spans built from records in
the exporter's SpanBuilder are the spans the engine thread writes inline from the same
steps, attribute by attribute, with the same times and parents (docs/spans.md).

Deterministic: both paths are fed the same StepRecords (a chunked prefill, a prefix-cache
hit, decode steps, a recompute after a preemption, a sequence under every:N) and their
spans go to real SDK providers with in-memory exporters.
"""

from __future__ import annotations

import struct
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
from opentelemetry import trace
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import NonRecordingSpan, SpanContext, TraceFlags, TraceState

from instrument.engines.continuous.span_builder import SpanBuilder, layout_meta
from instrument.engines.continuous.spans import EngineTraceWriter, SequenceRecord, StepRecord, write_sequence_spans
from instrument.hf.generate_spans import DecodeSpanPolicy
from instrument.kv.formula import KVLayout
from instrument.otel.span_writer import span_writer_for
from instrument.otel.tracing import get_tracer
from instrument.records import format as fmt
from instrument.records.channels import RECORD_ENTRIES, decoder_target
from instrument.records.router import Router

LAYOUT = KVLayout(layers=2, q_heads=4, kv_heads=2, head_dim=16, dtype="torch.float32", bytes_per_element=4,
                  layout="gqa", source="config.json")
BLOCK_TOKENS = 16
BYTES_PER_BLOCK = BLOCK_TOKENS * LAYOUT.kv_bytes_per_token
T0 = 1_764_000_000_000_000_000


def _provider() -> tuple[TracerProvider, InMemorySpanExporter]:
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    return provider, exporter


def test_every_entry_round_trips() -> None:
    w = fmt.RecordWriter(capacity=64)  # small on purpose: the buffer grows when a message outgrows it
    w.meta({"decode_spans": "all"})
    trace_id = 0x0123456789ABCDEF_FEDCBA9876543210
    w.open_sequence(7, trace_id, 0xAABBCCDDEEFF0011, 1, 32, "vendor=x")
    w.begin_step(41, T0, T0 + 5, 3, 40, 32, 1, 2, 9, 100, 4, 16)
    for i in range(20):
        w.sequence(7 + i, 1 + i, 2, 33 + i, fmt.SEQ_PREFILL if i == 0 else 0)
    assert w.step_open
    w.finish_step(T0 + 900, 123)
    w.end_sequence(7)
    w.idle()
    entries = list(fmt.iter_entries(bytes(w.take())))
    assert entries[0] == (fmt.META, {"decode_spans": "all"})
    assert entries[1] == (fmt.OPEN, 7, trace_id, 0xAABBCCDDEEFF0011, 1, 32, "vendor=x")
    assert entries[2] == (fmt.STEP, 41, T0, T0 + 5, T0 + 900, 3, 40, 32, 1, 2, 9, 100, 4, 16, 123)
    assert entries[3] == (fmt.SEQ, 7, 1, 2, 33, fmt.SEQ_PREFILL)
    assert entries[22] == (fmt.SEQ, 26, 20, 2, 52, 0)
    assert entries[23:] == [(fmt.END, 7), (fmt.IDLE,)]
    assert w.pending() == 0 and not w.step_open
    w.begin_step(42, T0, T0, 1, 1, 0, 0, 0, 1, 100, 0, 16)
    w.finish_step(T0 + 1, None)
    assert list(fmt.iter_entries(bytes(w.take())))[0][-1] == -1, "no device time is -1"


def test_a_malformed_message_is_refused() -> None:
    with pytest.raises(ValueError, match="unknown entry kind 99"):
        list(fmt.iter_entries(b"\x63"))
    w = fmt.RecordWriter()
    w.end_sequence(3)
    with pytest.raises((ValueError, struct.error)):
        list(fmt.iter_entries(bytes(w.take())[:-2]))


def _parent(trace_id: int, span_id: int) -> Any:
    ctx = SpanContext(trace_id, span_id, is_remote=False, trace_flags=TraceFlags(TraceFlags.SAMPLED),
                      trace_state=TraceState([("vendor", "v1")]))
    return trace.set_span_in_context(NonRecordingSpan(ctx))


def _steps() -> list[StepRecord]:
    steps = []
    for n in range(1, 13):
        start = T0 + n * 10_000_000
        steps.append(StepRecord(n, start, start + 40_000, 2, 70 if n <= 2 else 2, 64 if n <= 2 else 0, 5 + n, 100,
                                BLOCK_TOKENS, 1 if n == 1 else 0, 1 if n <= 2 else 0, 3, start + 9_000_000,
                                None if n % 2 else 1_000 * n))
    return steps


def _sequences(steps: list[StepRecord]) -> list[tuple[SequenceRecord, list[tuple[int, int, int, int, int]]]]:
    """(record as the inline path holds it, its SEQ entries: (step index, tokens, blocks, context, flags))."""
    out = []
    # a: 100-token prompt, 32 from the prefix cache, prefilled in two chunks, then 6 decode steps
    a_entries = [(0, 64, 4, 96, 1), (1, 4, 7, 100, 1)] + [(2 + i, 1, 7, 101 + i, 0) for i in range(6)]
    # b: a short prompt, 2 decode steps, preempted, recomputed (the recompute prefill emits step 3), 2 more
    b_entries = [(0, 6, 1, 6, 1), (2, 1, 1, 7, 0), (3, 1, 1, 8, 0), (5, 9, 1, 9, 1 | 2 | 4), (6, 1, 1, 10, 0),
                 (7, 1, 1, 11, 0)]
    # c: every:3 decode spans (set per test), 7 decode steps
    c_entries = [(3, 5, 1, 5, 1)] + [(4 + i, 1, 1, 6 + i, 0) for i in range(7)]
    for cached, entries, _preempted in ((32, a_entries, 0), (0, b_entries, 1), (0, c_entries, 0)):
        record = SequenceRecord(SimpleNamespace(parent_context=_parent(0xABC + len(out), 0x100 + len(out))),
                                sampler=None, cached_tokens=cached)  # type: ignore[arg-type]  # no sampler: the record is built by hand
        for index, tokens, blocks, context, flags in entries:
            rec = steps[index]
            if flags & fmt.SEQ_PREFILL:
                record.prefill.append((rec, tokens, blocks, context, bool(flags & fmt.SEQ_RECOMPUTE)))
                if flags & fmt.SEQ_RECOMPUTE_EMITS:
                    record.recomputed_steps.append(len(record.decode) + 1)
                    record.decode.append(rec)
                    record.decode_blocks.append(blocks)
                    record.decode_context.append(context)
            else:
                record.decode.append(rec)
                record.decode_blocks.append(blocks)
                record.decode_context.append(context)
        out.append((record, entries))
    return out


def _key(span: Any) -> tuple[Any, ...]:
    """Identity of a span across the two paths (an engine_step's parent is an engine root with
    fresh ids on each side: compared through :func:`_root_of_steps`)."""
    attrs = dict(span.attributes)
    own_parent = span.parent is not None and span.name != "engine_step"
    return (span.name, span.parent.span_id if own_parent else None,
            span.parent.trace_id if own_parent else None, span.start_time, span.end_time,
            attrs.get("tokentrace.engine.step"), attrs.get("tokentrace.step"), attrs.get("tokentrace.prefill.chunk"))


def _root_of_steps(spans: list[Any]) -> dict[int, int]:
    """engine step -> tokentrace.engine.first_step of the engine root its span is under."""
    roots = {s.context.span_id: s for s in spans if s.name == "engine"}
    return {s.attributes["tokentrace.engine.step"]: roots[s.parent.span_id].attributes["tokentrace.engine.first_step"]
            for s in spans if s.name == "engine_step"}


def _same_spans(inline: list[Any], built: list[Any]) -> None:
    assert len(inline) == len(built)
    left, right = sorted(inline, key=_key), sorted(built, key=_key)
    for a, b in zip(left, right):
        assert _key(a) == _key(b)
        assert dict(a.attributes) == dict(b.attributes), a.name
        assert a.kind == b.kind and list(a.events) == list(b.events) == [] and a.links == b.links
        if a.name != "engine_step":
            assert a.context.trace_id == b.context.trace_id
        assert a.context.trace_flags == b.context.trace_flags
        assert a.context.trace_state == b.context.trace_state
        assert a.instrumentation_scope == b.instrumentation_scope


@pytest.mark.parametrize("decode_spans", ["all", "every:3"])
def test_spans_built_from_records_equal_the_inline_spans(decode_spans: str) -> None:
    steps = _steps()
    sequences = _sequences(steps)
    policy = DecodeSpanPolicy.parse(decode_spans)

    inline_provider, inline_spans = _provider()
    tracer = get_tracer(inline_provider)
    writer = span_writer_for(tracer)
    engine = EngineTraceWriter(tracer, writer, steps_per_trace=5)
    for record, _ in sequences:
        write_sequence_spans(writer, record, LAYOUT, "gqa", BYTES_PER_BLOCK, policy)
    for rec in steps:
        engine.step(rec)
    engine.close()

    w = fmt.RecordWriter()
    w.meta(layout_meta(LAYOUT, "gqa", BYTES_PER_BLOCK, decode_spans, 5))
    opened: set[int] = set()
    for index, rec in enumerate(steps):
        w.begin_step(rec.step, rec.start_ns, rec.forward_start_ns, rec.batch_size, rec.scheduled_tokens,
                     rec.prefill_tokens, rec.prefill_sequences, rec.waiting, rec.kv_blocks_used, rec.kv_blocks_total,
                     rec.kv_blocks_cached, rec.kv_block_tokens)
        for slot, (record, entries) in enumerate(sequences, start=1):
            for step_index, tokens, blocks, context, flags in entries:
                if step_index != index:
                    continue
                if slot not in opened:
                    opened.add(slot)
                    parent = trace.get_current_span(record.request.parent_context).get_span_context()
                    w.open_sequence(slot, parent.trace_id, parent.span_id, parent.trace_flags, record.cached_tokens,
                                    parent.trace_state.to_header())
                w.sequence(slot, tokens, blocks, context, flags)
        w.finish_step(rec.end_ns, rec.device_ns)
    for slot in range(1, len(sequences) + 1):
        w.end_sequence(slot)
    w.idle()
    built_provider, built_spans = _provider()
    builder = SpanBuilder(built_provider)
    message = bytes(w.take())
    builder.feed(message[:0])  # an empty message is nothing
    builder.feed(message)
    assert builder.unknown_slots == 0 and not builder.sequences

    inline, built = inline_spans.get_finished_spans(), built_spans.get_finished_spans()
    names = sorted(s.name for s in inline)
    assert names.count("engine_step") == 12 and names.count("engine") == 3
    assert names.count("prefill") == 5  # a: 2 chunks, b: 2 (one a recompute), c: 1
    _same_spans([s for s in inline if s.name != "engine"], [s for s in built if s.name != "engine"])
    # engine roots: new trace ids on both sides; same attributes, times, and step children
    roots_i = sorted((s for s in inline if s.name == "engine"), key=lambda s: s.start_time)
    roots_b = sorted((s for s in built if s.name == "engine"), key=lambda s: s.start_time)
    assert [(dict(r.attributes), r.start_time, r.end_time) for r in roots_i] == [
        (dict(r.attributes), r.start_time, r.end_time) for r in roots_b]
    assert _root_of_steps(list(inline)) == _root_of_steps(list(built)) == {n: 1 + (n - 1) // 5 * 5 for n in range(1, 13)}
    recompute = [s for s in built if s.name == "prefill" and s.attributes.get("tokentrace.prefill.recompute")]
    assert len(recompute) == 1
    assert 3 not in {s.attributes["tokentrace.step"] for s in built
                     if s.name == "decode" and s.parent.span_id == 0x101}, "the recompute stands for step 3"


def test_an_entry_of_a_sequence_never_opened_is_counted() -> None:
    provider, spans = _provider()
    builder = SpanBuilder(provider)
    w = fmt.RecordWriter()
    w.meta(layout_meta(LAYOUT, "gqa", BYTES_PER_BLOCK, "all", 1000))
    w.begin_step(1, T0, T0, 1, 1, 0, 0, 0, 1, 100, 0, 16)
    w.sequence(5, 1, 1, 9, 0)  # slot 5's OPEN was in a dropped message
    w.finish_step(T0 + 10, None)
    w.end_sequence(5)
    builder.feed(bytes(w.take()))
    builder.close()
    assert builder.unknown_slots == 2
    assert sorted(s.name for s in spans.get_finished_spans()) == ["engine", "engine_step"]


def test_a_blob_reaches_its_channel_decoder_and_an_unknown_channel_is_refused() -> None:
    w = fmt.RecordWriter(capacity=16)
    w.blob(2, b"\x00" * 40)  # grows the buffer
    w.idle()
    entries = list(fmt.iter_entries(bytes(w.take())))
    assert [e[0] for e in entries] == [fmt.BLOB, fmt.IDLE]
    assert entries[0][1] == 2 and bytes(entries[0][2]) == b"\x00" * 40
    truncated = bytes([fmt.BLOB, 2]) + struct.pack("<I", 10) + b"abc"
    with pytest.raises(ValueError, match="BLOB entry truncated"):
        list(fmt.iter_entries(truncated))
    w.blob(200, b"x")
    provider, _ = _provider()
    with pytest.raises(ValueError, match="no decoder for BLOB channel 200"):
        Router(provider).feed(bytes(w.take()))


class _Tally:
    """A BLOB decoder a test names by ``module:qualname``: what it was fed."""

    def __init__(self, tracer_provider: object) -> None:
        self.payloads: list[bytes] = []
        self.closed = False

    def feed(self, payload: bytes | memoryview) -> None:
        self.payloads.append(bytes(payload))

    def close(self) -> None:
        self.closed = True


def test_the_router_reads_each_channel_with_the_decoder_its_writer_named() -> None:
    """DECODER entries open the decoders (channel 0: the engine entries), in the stream's order;
    a second decoder for a channel, an entry before any decoder and a target that does not
    import are refused."""
    provider, spans = _provider()
    router = Router(provider)
    w = fmt.RecordWriter()
    w.idle()
    with pytest.raises(ValueError, match="entry kind 6 before any writer named their decoder"):
        router.feed(bytes(w.take()))
    w.decoder(RECORD_ENTRIES, decoder_target(SpanBuilder))
    w.meta(layout_meta(LAYOUT, "gqa", BYTES_PER_BLOCK, "all", 1000))
    w.decoder(7, f"{__name__}:_Tally")
    w.begin_step(1, T0, T0, 0, 0, 0, 0, 0, 1, 100, 0, 16)
    w.finish_step(T0 + 10, None)
    w.blob(7, b"first")
    w.idle()
    w.blob(7, b"second")
    router.feed(bytes(w.take()))
    tally = router.decoders[7]
    assert tally.payloads == [b"first", b"second"]
    assert isinstance(router.decoders[RECORD_ENTRIES], SpanBuilder) and router.at_rest
    router.close()
    assert tally.closed
    assert sorted(s.name for s in spans.get_finished_spans()) == ["engine", "engine_step"]
    w.decoder(7, decoder_target(SpanBuilder))
    with pytest.raises(ValueError, match=f"record channel 7: read by {__name__}:_Tally"):
        router.feed(bytes(w.take()))
    w.decoder(9, "instrument.no_such_module:Decoder")
    with pytest.raises(ValueError, match="does not import"):
        router.feed(bytes(w.take()))
    with pytest.raises(ValueError, match="cannot be imported by name"):
        decoder_target(type("Local", (), {"__qualname__": "f.<locals>.Local"}))


def test_the_records_package_names_no_writer() -> None:
    """instrument/records/ owns the exporter process and its routing: no import of, and no
    string in its code naming, an engine's or the gateway's module (the writers name their
    decoders; docstrings may point a reader to them)."""
    import ast

    import instrument.records

    folder = Path(instrument.records.__file__).parent
    writers = ("instrument.engines", "instrument.vllm", "instrument.gateway", "instrument.hf")
    found = []
    for path in sorted(folder.glob("*.py")):
        tree = ast.parse(path.read_text(encoding="utf-8"))
        docstrings = {id(n.body[0].value) for n in ast.walk(tree)
                      if isinstance(n, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef))
                      and n.body and isinstance(n.body[0], ast.Expr) and isinstance(n.body[0].value, ast.Constant)}
        for node in ast.walk(tree):
            names: list[str] = []
            if isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom):
                names = [node.module or ""]
            elif isinstance(node, ast.Constant) and isinstance(node.value, str) and id(node) not in docstrings:
                names = [node.value]
            found += [f"{path.name}: {n[:60]!r}" for n in names if any(w in n for w in writers)]
    assert found == []
