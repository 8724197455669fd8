"""traced_generate on the real tiny Llama GQA model, spans read from an in-memory exporter."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")

from opentelemetry import trace
from opentelemetry.sdk.trace import SpanLimits, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import SpanKind

from instrument.hf.generate import instrument_model, traced_generate, uninstrument_model
from instrument.hf.tiny_model import load_tiny_model
from instrument.kv.runtime import cache_tensor_bytes
from instrument.otel.tracing import setup_tracing

PROMPT = "Hello world, the quick brown fox"


@pytest.fixture(scope="module")
def tiny():
    return load_tiny_model()


@pytest.fixture
def spans_out():
    exporter = InMemorySpanExporter()
    provider = setup_tracing(exporter="none", span_exporters=[exporter], batch=False)
    yield provider, exporter
    provider.shutdown()


def _by_name(spans, name):
    return [s for s in spans if s.name == name]


@pytest.mark.parametrize("direct_spans", [True, False], ids=["direct-writer", "tracer-api"])
def test_prefill_and_one_decode_span_per_step(tiny, spans_out, direct_spans):
    model, tok = tiny
    provider, exporter = spans_out
    result = traced_generate(model, tok, PROMPT, tracer_provider=provider, max_new_tokens=12, direct_spans=direct_spans)
    spans = exporter.get_finished_spans()
    (root,) = _by_name(spans, "generate")
    (prefill,) = _by_name(spans, "prefill")
    decodes = sorted(_by_name(spans, "decode"), key=lambda s: s.attributes["tokentrace.step"])
    seq = result.sequences[0]
    input_tokens = len(tok(PROMPT)["input_ids"])
    assert (seq.input_tokens, seq.generated_tokens, seq.finish_reason) == (input_tokens, 12, "length")
    assert [d.attributes["tokentrace.step"] for d in decodes] == list(range(1, 12))
    assert [d.attributes["tokentrace.context_tokens"] for d in decodes] == [input_tokens + k for k in range(1, 12)]
    # Scope and kind are the contract's.
    for span in spans:
        assert (span.instrumentation_scope.name, span.instrumentation_scope.version) == ("tokentrace", "3")
        assert span.kind == SpanKind.INTERNAL
    # Parentage: prefill and decode spans are children of the root, which has no parent.
    assert root.parent is None
    for child in [prefill, *decodes]:
        assert child.parent.span_id == root.context.span_id
        assert child.context.trace_id == root.context.trace_id
    # Times: monotonic, nested in the root, one step after another.
    assert root.start_time <= prefill.start_time < prefill.end_time <= decodes[0].start_time
    for earlier, later in zip(decodes, decodes[1:]):
        assert earlier.start_time < earlier.end_time <= later.start_time < later.end_time
    assert decodes[-1].end_time <= root.end_time
    # Root usage attributes (engine perspective) and chunk events at the decode span ends.
    assert root.attributes["gen_ai.usage.input_tokens"] == input_tokens
    assert root.attributes["gen_ai.usage.output_tokens"] == seq.output_tokens
    assert root.attributes["tokentrace.generated_tokens"] == 12
    assert tuple(root.attributes["gen_ai.response.finish_reasons"]) == ("length",)
    events = root.events
    assert [e.attributes["tokentrace.chunk.index"] for e in events] == list(range(12))
    assert all(e.name == "tokentrace.chunk" and e.attributes["tokentrace.chunk.tokens"] == 1 for e in events)
    assert events[0].timestamp == prefill.end_time
    assert [e.timestamp for e in events[1:]] == [d.end_time for d in decodes]
    assert root.dropped_events == 0


def test_kv_bytes_after_generate_equal_the_returned_cache(tiny, spans_out):
    model, tok = tiny
    provider, exporter = spans_out
    result = traced_generate(model, tok, PROMPT, tracer_provider=provider, max_new_tokens=9, return_dict_in_generate=True)
    cache = result.output.cache
    last = max(_by_name(exporter.get_finished_spans(), "decode"), key=lambda s: s.attributes["tokentrace.step"])
    cache_bytes = sum(int(layer.keys.nbytes) + int(layer.values.nbytes) for layer in cache.layers)
    assert last.attributes["tokentrace.kv.bytes"] == cache_bytes == cache_tensor_bytes(cache)
    (prefill,) = _by_name(exporter.get_finished_spans(), "prefill")
    # 2 x 2 layers x 2 kv heads x 8 head_dim x 4 bytes (fp32)
    assert prefill.attributes["tokentrace.kv.bytes_per_token"] == 256
    assert prefill.attributes["tokentrace.kv.layout"] == "gqa"
    assert prefill.attributes["tokentrace.kv.dtype"] == "fp32"
    assert prefill.attributes["tokentrace.kv.bytes"] == 256 * result.sequences[0].input_tokens


def test_stop_token_counts_in_g_not_in_o(tiny, spans_out):
    model, tok = tiny
    provider, exporter = spans_out
    plain = model.generate(**tok(PROMPT, return_tensors="pt"), max_new_tokens=8, do_sample=False)
    prompt_len = len(tok(PROMPT)["input_ids"])
    stop_id = int(plain[0, prompt_len + 4])  # the 5th greedy token becomes the stop token
    first_stop = plain[0, prompt_len:].tolist().index(stop_id)
    result = traced_generate(model, tok, PROMPT, tracer_provider=provider, max_new_tokens=8, eos_token_id=stop_id)
    seq = result.sequences[0]
    assert seq.generated_tokens == first_stop + 1
    assert seq.finish_reason == "stop"
    assert seq.chunk_visible[-1] is False
    assert seq.output_tokens == sum(seq.chunk_visible) == seq.generated_tokens - 1
    assert len(_by_name(exporter.get_finished_spans(), "decode")) == seq.generated_tokens - 1


@pytest.mark.parametrize(("policy", "steps"), [("every:3", [1, 4, 7, 10]), ("none", [])])
def test_decode_span_policy_thins_steps_but_keeps_chunks(tiny, spans_out, policy, steps):
    model, tok = tiny
    provider, exporter = spans_out
    traced_generate(model, tok, PROMPT, tracer_provider=provider, max_new_tokens=12, decode_spans=policy)
    spans = exporter.get_finished_spans()
    assert sorted(d.attributes["tokentrace.step"] for d in _by_name(spans, "decode")) == steps
    assert len(_by_name(spans, "generate")[0].events) == 12


@pytest.mark.parametrize("policy", ["all", "none", "every:1", "every:2", "every:3", "every:50"])
def test_decode_span_policy_steps_and_keeps_agree(policy):
    from instrument.hf.generate_spans import DecodeSpanPolicy

    p = DecodeSpanPolicy.parse(policy)
    for generated in range(0, 40):
        assert list(p.steps(generated)) == [k for k in range(1, generated) if p.keeps(k)], (policy, generated)


def test_sampling_with_user_streamer_and_content_capture(tiny, spans_out):
    model, tok = tiny
    provider, exporter = spans_out
    received = []

    class ListStreamer:
        def put(self, value):
            received.append(value.tolist())

        def end(self):
            received.append("end")

    torch.manual_seed(1)
    result = traced_generate(
        model, tok, PROMPT, tracer_provider=provider, max_new_tokens=6, do_sample=True, temperature=0.8,
        top_p=0.9, streamer=ListStreamer(), capture_content=True,
    )
    assert len(received) == 1 + 6 + 1  # prompt, one put per token, end
    (root,) = _by_name(exporter.get_finished_spans(), "generate")
    assert root.attributes["gen_ai.request.temperature"] == pytest.approx(0.8)
    assert root.attributes["gen_ai.request.top_p"] == pytest.approx(0.9)
    assert PROMPT in root.attributes["gen_ai.input.messages"]
    assert result.sequences[0].completion_text is not None
    assert '"role": "assistant"' in root.attributes["gen_ai.output.messages"]


def test_no_content_by_default(tiny, spans_out):
    model, tok = tiny
    provider, exporter = spans_out
    traced_generate(model, tok, PROMPT, tracer_provider=provider, max_new_tokens=3)
    for span in exporter.get_finished_spans():
        assert not any(key.startswith(("gen_ai.input", "gen_ai.output")) for key in span.attributes)


def test_parent_context_makes_steps_children_of_the_callers_span(tiny, spans_out):
    model, tok = tiny
    provider, exporter = spans_out
    tracer = provider.get_tracer("gateway-test")
    with tracer.start_as_current_span("gateway", kind=SpanKind.SERVER) as gateway:
        ctx = trace.set_span_in_context(gateway)
        result = traced_generate(model, tok, PROMPT, tracer_provider=provider, parent_context=ctx, max_new_tokens=5)
        gateway.set_attributes(result.sequences[0].usage_attributes())
    spans = exporter.get_finished_spans()
    assert not _by_name(spans, "generate")
    (gw,) = _by_name(spans, "gateway")
    children = _by_name(spans, "prefill") + _by_name(spans, "decode")
    assert len(children) == 5
    assert all(s.parent.span_id == gw.context.span_id for s in children)
    assert gw.attributes["tokentrace.generated_tokens"] == 5


def test_batch_gets_one_root_per_sequence(tiny, spans_out):
    model, tok = tiny
    provider, exporter = spans_out
    prompts = ["Hello", "The quick brown fox jumps over"]
    result = traced_generate(model, tok, prompts, tracer_provider=provider, max_new_tokens=4)
    spans = exporter.get_finished_spans()
    roots = sorted(_by_name(spans, "generate"), key=lambda s: s.attributes["tokentrace.batch.index"])
    assert len(roots) == 2
    for root, prompt, seq in zip(roots, prompts, result.sequences):
        assert root.attributes["gen_ai.usage.input_tokens"] == len(tok(prompt)["input_ids"]) == seq.input_tokens
        children = [s for s in spans if s.parent is not None and s.parent.span_id == root.context.span_id]
        assert sorted(s.name for s in children) == ["decode"] * 3 + ["prefill"]
        for child in children:
            if child.name == "decode":
                k = child.attributes["tokentrace.step"]
                assert child.attributes["tokentrace.context_tokens"] == seq.input_tokens + k


def test_clear_errors_for_unsupported_modes(tiny):
    model, tok = tiny
    provider = TracerProvider(span_limits=SpanLimits(max_events=128))
    with pytest.raises(ValueError, match="num_beams"):
        traced_generate(model, tok, PROMPT, tracer_provider=provider, max_new_tokens=3, num_beams=2)
    with pytest.raises(ValueError, match="assistant_model"):
        traced_generate(model, tok, PROMPT, tracer_provider=provider, max_new_tokens=3, assistant_model=model)
    with pytest.raises(ValueError, match="span event limit"):
        traced_generate(model, tok, PROMPT, tracer_provider=provider, max_new_tokens=150)
    with pytest.raises(ValueError, match="decode_spans"):
        traced_generate(model, tok, PROMPT, tracer_provider=provider, max_new_tokens=3, decode_spans="every:0")
    ctx = trace.set_span_in_context(provider.get_tracer("t").start_span("gateway"))
    with pytest.raises(ValueError, match="parent_context"):
        traced_generate(model, tok, ["a", "b"], tracer_provider=provider, parent_context=ctx, max_new_tokens=3)


def test_instrument_model_traces_plain_generate_calls(tiny, spans_out):
    model, tok = tiny
    provider, exporter = spans_out
    instrument_model(model, tok, tracer_provider=provider)
    try:
        out = model.generate(**tok(PROMPT, return_tensors="pt"), max_new_tokens=4)
    finally:
        uninstrument_model(model)
    assert isinstance(out, torch.Tensor) and out.shape[1] == len(tok(PROMPT)["input_ids"]) + 4
    assert len(_by_name(exporter.get_finished_spans(), "decode")) == 3
    assert "generate" not in model.__dict__


def test_failed_generate_leaves_an_error_root(tiny, spans_out):
    model, tok = tiny
    provider, exporter = spans_out

    class Exploding:
        def put(self, value):
            if value.dim() == 1:
                raise RuntimeError("client went away")

        def end(self):
            pass

    with pytest.raises(RuntimeError, match="client went away"):
        traced_generate(model, tok, PROMPT, tracer_provider=provider, max_new_tokens=4, streamer=Exploding())
    (root,) = _by_name(exporter.get_finished_spans(), "generate")
    assert root.status.status_code.name == "ERROR"
    assert root.attributes["error.type"] == "RuntimeError"
    assert "forward" not in model.__dict__  # the forward tap is removed when generate raises
    again = traced_generate(model, tok, PROMPT, tracer_provider=provider, max_new_tokens=3, min_new_tokens=3)
    assert len(again.timeline.forward_start_ns) == 3  # and the next call records normally


@pytest.mark.parametrize("direct_spans", [True, False], ids=["direct-writer", "tracer-api"])
def test_sampler_is_respected(tiny, direct_spans):
    from opentelemetry.sdk.trace.sampling import ALWAYS_OFF, ParentBased

    model, tok = tiny
    exporter = InMemorySpanExporter()
    provider = TracerProvider(sampler=ParentBased(ALWAYS_OFF), span_limits=SpanLimits(max_events=1000))
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    result = traced_generate(model, tok, PROMPT, tracer_provider=provider, max_new_tokens=4, direct_spans=direct_spans)
    assert exporter.get_finished_spans() == ()
    assert result.sequences[0].generated_tokens == 4


def test_decode_spans_handed_off_as_a_batch_are_counted_and_exported(tiny):
    """The bulk decode-span path (``write_steps`` -> ``on_end_many``) keeps the export
    accounting exact: every span submitted is counted, exported and parented."""
    from instrument.otel.export_health import export_health

    model, tok = tiny
    exporter = InMemorySpanExporter()
    provider = setup_tracing(exporter="none", span_exporters=[exporter], batch=True)
    try:
        results = [
            traced_generate(model, tok, PROMPT, tracer_provider=provider, max_new_tokens=9, min_new_tokens=9)
            for _ in range(3)
        ]
        provider.force_flush()
        [counts] = export_health(provider)
    finally:
        provider.shutdown()
    spans = exporter.get_finished_spans()
    assert len(spans) == 3 * (1 + 1 + 8)  # generate + prefill + 8 decode steps, per call
    assert counts.submitted == counts.exported == len(spans) and counts.dropped == 0
    for result in results:
        root_id = result.sequences[0].span_context.span_id
        steps = sorted(s.attributes["tokentrace.step"] for s in spans if s.name == "decode" and s.parent.span_id == root_id)
        assert steps == list(range(1, 9))


def test_visible_token_cache_matches_a_fresh_decode(tiny):
    """Visibility answers remembered per tokenizer give the same O as decoding afresh."""
    from instrument.hf import generate as generate_module

    model, tok = tiny
    provider = setup_tracing(exporter="none", span_exporters=[InMemorySpanExporter()], batch=False)
    try:
        first = traced_generate(model, tok, PROMPT, tracer_provider=provider, max_new_tokens=16)
        generate_module._VISIBLE.pop(tok, None)
        again = traced_generate(model, tok, PROMPT, tracer_provider=provider, max_new_tokens=16)
    finally:
        provider.shutdown()
    ids = set(again.output[0, -16:].tolist())
    expected = {i for i in ids if tok.decode([i], skip_special_tokens=True) != ""} - {tok.eos_token_id}
    assert generate_module._VISIBLE[tok] and {i for i in ids if generate_module._VISIBLE[tok].get(i)} == expected
    assert first.sequences[0].output_tokens == again.sequences[0].output_tokens


def test_concurrent_calls_on_one_model_record_only_their_own_forwards(tiny):
    """Two threads generating on the same model at once: each call's timeline holds exactly its
    own G forwards (the forward tap is per thread; a module hook would see both threads')."""
    import threading

    model, tok = tiny
    provider = setup_tracing(exporter="none", span_exporters=[InMemorySpanExporter()], batch=False)
    results: dict[int, list] = {7: [], 13: []}
    errors: list[BaseException] = []
    barrier = threading.Barrier(2)

    def run(tokens: int) -> None:
        try:
            barrier.wait(timeout=30)
            for _ in range(4):
                results[tokens].append(traced_generate(
                    model, tok, PROMPT, tracer_provider=provider, max_new_tokens=tokens, min_new_tokens=tokens))
        except BaseException as error:  # noqa: BLE001 - reported below, after the threads end
            errors.append(error)

    threads = [threading.Thread(target=run, args=(n,)) for n in results]
    try:
        for t in threads:
            t.start()
        for t in threads:
            t.join(timeout=120)
    finally:
        provider.shutdown()
    assert not errors, errors
    for tokens, runs in results.items():
        assert len(runs) == 4
        for result in runs:
            assert len(result.timeline.forward_start_ns) == tokens and result.timeline.prefill_forwards == 1
            starts, emits = result.timeline.forward_start_ns, result.timeline.emit_ns
            assert all(starts[k] < emits[k] <= starts[k + 1] for k in range(tokens - 1))
    assert "forward" not in model.__dict__  # the tap is gone once no call records


def test_forward_tap_wraps_and_restores_an_instance_forward(tiny, spans_out):
    """A model whose forward is already replaced on the instance (as accelerate's hooks do)
    keeps that forward: it runs under the tap and is put back afterwards."""
    model, tok = tiny
    provider, _ = spans_out
    calls = []
    real = model.forward

    def own_forward(*args, **kwargs):
        calls.append(1)
        return real(*args, **kwargs)

    model.forward = own_forward
    try:
        result = traced_generate(model, tok, PROMPT, tracer_provider=provider, max_new_tokens=5, min_new_tokens=5)
        assert model.__dict__["forward"] is own_forward
    finally:
        del model.forward
    assert len(calls) == 5 and len(result.timeline.forward_start_ns) == 5


def test_nested_recording_on_one_thread_is_a_clear_error(tiny, spans_out):
    model, tok = tiny
    provider, _ = spans_out

    class Reentrant:
        def put(self, value):
            traced_generate(model, tok, PROMPT, tracer_provider=provider, max_new_tokens=2)

        def end(self):
            pass

    with pytest.raises(RuntimeError, match="already recording this model"):
        traced_generate(model, tok, PROMPT, tracer_provider=provider, max_new_tokens=3, streamer=Reentrant())
    assert "forward" not in model.__dict__
