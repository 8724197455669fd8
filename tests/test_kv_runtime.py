"""KV attributes use the dtype the cache really holds, and are withheld when they would be wrong."""

from __future__ import annotations

import copy

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")

from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from instrument.hf.generate import traced_generate
from instrument.hf.tiny_model import load_tiny_model
from instrument.otel.tracing import setup_tracing

PROMPT = "The quick brown fox"


@pytest.fixture(scope="module")
def tiny():
    return load_tiny_model()


def _run(model, tok, **kwargs):
    exporter = InMemorySpanExporter()
    provider = setup_tracing(exporter="none", span_exporters=[exporter], batch=False)
    result = traced_generate(model, tok, PROMPT, tracer_provider=provider, max_new_tokens=5, **kwargs)
    spans = exporter.get_finished_spans()
    prefill = next(s for s in spans if s.name == "prefill")
    decodes = [s for s in spans if s.name == "decode"]
    return result, prefill, decodes


def test_runtime_dtype_wins_over_the_config(tiny):
    model, tok = tiny
    lying = copy.deepcopy(model)
    lying.config.dtype = "bfloat16"  # what a GGUF's config may say while the weights are fp32
    _, prefill, _ = _run(lying, tok)
    assert prefill.attributes["tokentrace.kv.dtype"] == "fp32"
    assert prefill.attributes["tokentrace.kv.bytes_per_token"] == 256


def test_bf16_model_halves_the_bytes(tiny):
    model, tok = tiny
    half = copy.deepcopy(model).to(torch.bfloat16)
    result, prefill, decodes = _run(half, tok, return_dict_in_generate=True)
    assert prefill.attributes["tokentrace.kv.dtype"] == "bf16"
    assert prefill.attributes["tokentrace.kv.bytes_per_token"] == 128
    cache_bytes = sum(int(layer.keys.nbytes) + int(layer.values.nbytes) for layer in result.output.cache.layers)
    assert max(decodes, key=lambda s: s.attributes["tokentrace.step"]).attributes["tokentrace.kv.bytes"] == cache_bytes


def test_static_cache_reports_allocated_bytes_separately(tiny):
    model, tok = tiny
    result, prefill, decodes = _run(model, tok, cache_implementation="static")
    allocated = prefill.attributes["tokentrace.kv.allocated_bytes"]
    input_tokens = result.sequences[0].input_tokens
    assert prefill.attributes["tokentrace.kv.bytes"] == 256 * input_tokens
    assert allocated >= 256 * (input_tokens + 4)
    assert allocated % 256 == 0
    assert decodes[0].attributes["tokentrace.kv.bytes"] == 256 * (input_tokens + 1)


def test_unsupported_architecture_gets_a_reason_and_no_bytes(tiny):
    model, tok = tiny
    mla = copy.deepcopy(model)
    mla.config.kv_lora_rank = 16  # the config now describes multi-head latent attention
    _, prefill, decodes = _run(mla, tok)
    assert prefill.attributes["tokentrace.kv.layout"].startswith("unsupported:")
    assert "latent" in prefill.attributes["tokentrace.kv.layout"]
    for span in [prefill, *decodes]:
        assert "tokentrace.kv.bytes" not in span.attributes
        assert "tokentrace.kv.bytes_per_token" not in span.attributes


def test_config_that_disagrees_with_the_cache_is_refused(tiny):
    model, tok = tiny
    wrong = copy.deepcopy(model)
    wrong.config.num_key_value_heads = 8  # query heads substituted for KV heads: 4x too big
    _, prefill, decodes = _run(wrong, tok)
    layout = prefill.attributes["tokentrace.kv.layout"]
    assert layout.startswith("unsupported:") and "formula gives" in layout
    assert all("tokentrace.kv.bytes" not in s.attributes for s in decodes)


def test_no_cache_means_no_kv_figures(tiny):
    model, tok = tiny
    _, prefill, decodes = _run(model, tok, use_cache=False)
    assert prefill.attributes["tokentrace.kv.layout"].startswith("unsupported:no KV cache")
    assert len(decodes) == 4
