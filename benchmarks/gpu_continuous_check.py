"""GPU check of the continuous engine (called by benchmarks/gpu_instrument_check.py).

On the ~1B random Llama in bf16 on CUDA, through ``ContinuousEngine`` (transformers'
continuous batching, traced per step):

- CUDA event time per engine step: ``tokentrace.device_ns`` on every ``engine_step`` span,
  > 0 and not longer than the step's wall time;
- the contract under batching: for every step the request spans' tokens add up to its
  ``tokentrace.batch.tokens``; physical KV >= logical on every request span;
- tracing cost on GPU: rounds of ``--cb-sequences`` sequences x ``--tokens`` tokens with
  the engine's tracing on and off, interleaved; per-step time = round wall time / steps
  (span export flushed inside the round), median ratio.
"""

from __future__ import annotations

import statistics
import threading
import time
from collections import defaultdict
from typing import Any

import torch
from opentelemetry import trace
from opentelemetry.sdk.trace.export import SimpleSpanProcessor, SpanExporter, SpanExportResult
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

__all__ = ["check_continuous"]


class _EncodeOnly(SpanExporter):
    """Encodes every batch as the OTLP exporters do (protobuf bytes) and drops it: the export
    thread's real CPU cost without a network."""

    def export(self, spans: Any) -> SpanExportResult:
        from opentelemetry.exporter.otlp.proto.common.trace_encoder import encode_spans

        encode_spans(spans).SerializeToString()
        return SpanExportResult.SUCCESS


def _handle(model: Any) -> Any:
    from instrument.hf.model_handle import ModelHandle, _kv_bytes_per_token

    return ModelHandle(model, None, "llama-1b-random-bf16", (), None, _kv_bytes_per_token(model))


def _round(engine: Any, prompts: list[list[int]], tokens: int, flush: Any) -> tuple[float, int]:
    from opentelemetry.trace import SpanKind

    from instrument.engines.base import EngineRequest
    from instrument.hf.token_sampling import SamplingParams

    done = threading.Event()
    left = [len(prompts)]

    def finished(_result: Any) -> None:
        left[0] -= 1
        if left[0] == 0:
            done.set()

    steps0 = engine._step
    started = time.perf_counter()
    for i, ids in enumerate(prompts):
        # a valid parent, as the gateway passes it: its recording ``gateway`` span (an invalid
        # parent would send decode spans down the span writer's slow eager path)
        gateway = engine.tracer.start_span("gateway", kind=SpanKind.SERVER)
        engine.submit(EngineRequest(f"gpu-{time.perf_counter_ns()}-{i}", ids,
                                    SamplingParams(max_tokens=tokens, temperature=0.0, ignore_eos=True),
                                    trace.set_span_in_context(gateway), lambda t, lp: None,
                                    lambda result, span=gateway: (span.end(), finished(result))))
    if not done.wait(300):
        raise RuntimeError("a round of the continuous engine did not finish in 300 s")
    flush()
    return time.perf_counter() - started, engine._step - steps0


def check_continuous(model: Any, *, tokens: int, sequences: int, prompt_tokens: int, rounds: int) -> list[str]:
    """Run the checks of the module docstring; the failed ones (empty: all passed)."""
    from instrument.engines.continuous import ContinuousEngine
    from instrument.otel.tracing import setup_tracing

    failures: list[str] = []
    generator = torch.Generator(device="cpu").manual_seed(1)
    prompts = [torch.randint(3, int(model.config.vocab_size), (prompt_tokens // (1 + i % 3),), generator=generator).tolist()
               for i in range(sequences)]
    memory = InMemorySpanExporter()
    provider = setup_tracing(exporter="none", span_exporters=[_EncodeOnly()])
    provider.add_span_processor(SimpleSpanProcessor(memory))
    engine = ContinuousEngine(_handle(model), provider, max_batch_tokens=2048, max_batch_size=sequences)
    health = engine.health()
    print(f"continuous engine: {health['kv_blocks_total']} KV blocks of {health['kv_block_tokens']} tokens, "
          f"{health['kv_bytes_per_block']} bytes a block")
    _round(engine, prompts, tokens, provider.force_flush)  # warm, and the spans checked below
    spans = memory.get_finished_spans()
    steps = {s.attributes["tokentrace.engine.step"]: s for s in spans if s.name == "engine_step"}
    tokens_by_step: dict[int, int] = defaultdict(int)
    for s in spans:
        if s.name in ("prefill", "decode"):
            tokens_by_step[s.attributes["tokentrace.engine.step"]] += (
                s.attributes["tokentrace.prefill.tokens"] if s.name == "prefill" else 1)
            if s.attributes["tokentrace.kv.physical_bytes"] < s.attributes["tokentrace.kv.bytes"]:
                failures.append(f"{s.name}: physical KV below logical")
    for step, span in steps.items():
        device_ns = span.attributes.get("tokentrace.device_ns")
        wall_ns = span.end_time - span.start_time
        if not isinstance(device_ns, int) or device_ns <= 0:
            failures.append(f"engine_step {step}: device_ns {device_ns!r}")
        elif device_ns > wall_ns * 1.05 + 20_000:
            failures.append(f"engine_step {step}: device {device_ns} ns > wall {wall_ns} ns")
        if span.attributes["tokentrace.batch.tokens"] != tokens_by_step[step]:
            failures.append(f"engine_step {step}: batch tokens {span.attributes['tokentrace.batch.tokens']} "
                            f"!= request spans' {tokens_by_step[step]}")
    device = [s.attributes.get("tokentrace.device_ns", 0) for s in steps.values()]
    wall = [s.end_time - s.start_time for s in steps.values()]
    if steps:
        print(f"engine steps: {len(steps)}, median wall {statistics.median(wall) / 1e6:.1f} ms, "
              f"device {statistics.median(device) / 1e6:.1f} ms, "
              f"max batch {max(s.attributes['tokentrace.batch.size'] for s in steps.values())}")
    else:
        failures.append("no engine_step spans")
    per_step: dict[bool, list[float]] = {True: [], False: []}
    for r in range(rounds):
        for mode in ((True, False) if r % 2 == 0 else (False, True)):
            memory.clear()
            engine.tracing = mode
            wall_s, n = _round(engine, prompts, tokens, provider.force_flush)
            per_step[mode].append(wall_s / n * 1e6)
    engine.close()
    provider.shutdown()
    paired = [t / u for t, u in zip(per_step[True], per_step[False])]
    print(f"continuous tracing cost: a step {statistics.median(per_step[False]) / 1e3:.1f} ms untraced, "
          f"{statistics.median(per_step[True]) / 1e3:.1f} ms traced")
    print(f"  paired median ratio {statistics.median(paired):.3f} ({rounds} rounds x {sequences} sequences "
          f"x {tokens} tokens)")
    return failures
