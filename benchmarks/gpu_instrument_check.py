"""GPU check of traced_generate: a ~1B Llama (random weights, bf16) on CUDA, with device time.

Self-contained: builds the model from a config (no hub, no network), feeds random token ids,
and runs plain ``generate`` and ``traced_generate`` interleaved (order alternating), every run
forced to exactly ``--tokens`` new tokens. Then checks what the spans say:

- one prefill span and tokens-1 decode spans, steps 1..tokens-1, monotonic times;
- ``tokentrace.device_ns`` on every span, > 0 and not longer than the span itself;
- ``tokentrace.kv.dtype`` is bf16 and the last step's ``tokentrace.kv.bytes`` equals the
  summed nbytes of the returned DynamicCache;
- overhead: median paired difference per decode step (µs) and the ratio, with and without
  CUDA-event device time.

Then the continuous engine on the same model (benchmarks/gpu_continuous_check.py): CUDA
event time per engine step, the batching contract, and its tracing cost on GPU
(``--no-continuous`` skips it). The whole script is sized to finish in under 8 minutes on one
H100/H200 (defaults; about 3 minutes of it is the model build and warm-up).

Then what tracing costs per generated token on the GPU (benchmarks/tracing_cost.py): the
continuous engine at batch 64 and 128 (``--tc-batches``), ABBA rounds traced vs untraced, each
sequence under a recording ``gateway`` span, OTLP-JSON lines behind the SDK's batch processor:
(a) engine-thread CPU, (b) process CPU, (c) exporter-process CPU, (d) probe thread p99 wake-up
delay, with the goals of benchmarks/tracing_cost.py (reported; not a pass/fail check, since the
goals are for the finished pipeline). ``--no-tracing-cost`` skips it; ``--tracing-cost-only``
runs only it.

Run on a CUDA machine:  python benchmarks/gpu_instrument_check.py [--tokens 128] [--reps 9]
Without CUDA, ``--cpu-fallback`` runs the tracing-cost part on the tiny model on the CPU
(batch 8 and 16, a few tokens: the wiring, not GPU figures).
Exit status 0 when every check passes, 1 otherwise, 2 without CUDA (and no --cpu-fallback).
"""

from __future__ import annotations

import argparse
import gc
import statistics
import sys
import time
import traceback
from collections.abc import Callable
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run from a checkout without installing
sys.path.insert(0, str(Path(__file__).resolve().parent))

import torch
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from instrument.hf.generate import traced_generate
from instrument.kv.runtime import cache_tensor_bytes
from instrument.otel.tracing import setup_tracing


def build_llama_1b(device: str = "cuda") -> Any:
    """A TinyLlama-1.1B-shaped model (22 layers, 32 query / 4 KV heads, head_dim 64), bf16, random."""
    from transformers import LlamaConfig, LlamaForCausalLM

    config = LlamaConfig(
        vocab_size=32000, hidden_size=2048, intermediate_size=5632, num_hidden_layers=22,
        num_attention_heads=32, num_key_value_heads=4, max_position_embeddings=4096,
        bos_token_id=1, eos_token_id=2, pad_token_id=0,
    )
    config.dtype = "bfloat16"
    torch.manual_seed(0)
    with torch.device(device):
        model = LlamaForCausalLM._from_config(config, dtype=torch.bfloat16)
    model.generation_config.pad_token_id = 0
    return model.eval()


def overhead(model: Any, input_ids: Any, tokens: int, reps: int, device_time: bool) -> dict[str, float]:
    exporter = InMemorySpanExporter()
    provider = setup_tracing(exporter="none", span_exporters=[exporter])
    kwargs = dict(max_new_tokens=tokens, min_new_tokens=tokens, do_sample=False)

    def plain() -> int:
        torch.cuda.synchronize()
        start = time.perf_counter_ns()
        model.generate(input_ids=input_ids, **kwargs)
        torch.cuda.synchronize()
        return time.perf_counter_ns() - start

    def traced() -> int:
        torch.cuda.synchronize()
        start = time.perf_counter_ns()
        traced_generate(model, None, input_ids, tracer_provider=provider, device_time=device_time, **kwargs)
        torch.cuda.synchronize()
        return time.perf_counter_ns() - start

    plain(), traced()  # warm-up
    plain_ns, traced_ns = [], []
    for rep in range(reps):
        if rep % 2 == 0:
            plain_ns.append(plain())
            traced_ns.append(traced())
        else:
            traced_ns.append(traced())
            plain_ns.append(plain())
        exporter.clear()
    provider.shutdown()
    steps = tokens - 1
    return {
        "plain_ms": statistics.median(plain_ns) / 1e6,
        "traced_ms": statistics.median(traced_ns) / 1e6,
        "added_us_per_step": statistics.median(t - p for t, p in zip(traced_ns, plain_ns)) / 1e3 / steps,
        "ratio": statistics.median(traced_ns) / statistics.median(plain_ns),
    }


def check_spans(model: Any, input_ids: Any, tokens: int) -> list[str]:
    """Run once with device time and return the failed checks (empty: all passed)."""
    exporter = InMemorySpanExporter()
    provider = setup_tracing(exporter="none", batch=False)
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    result = traced_generate(
        model, None, input_ids, tracer_provider=provider, max_new_tokens=tokens, min_new_tokens=tokens,
        do_sample=False, return_dict_in_generate=True,
    )
    spans = exporter.get_finished_spans()
    failures: list[str] = []
    prefill = [s for s in spans if s.name == "prefill"]
    decodes = sorted((s for s in spans if s.name == "decode"), key=lambda s: s.attributes["tokentrace.step"])
    if len(prefill) != 1:
        failures.append(f"expected 1 prefill span, got {len(prefill)}")
    if [d.attributes["tokentrace.step"] for d in decodes] != list(range(1, tokens)):
        failures.append(f"decode steps are not 1..{tokens - 1}")
    for span in prefill + decodes:
        device_ns = span.attributes.get("tokentrace.device_ns")
        wall_ns = span.end_time - span.start_time
        if not isinstance(device_ns, int) or device_ns <= 0:
            failures.append(f"{span.name} {span.attributes.get('tokentrace.step', '')}: device_ns {device_ns!r}")
        elif device_ns > wall_ns * 1.05 + 20_000:
            failures.append(f"{span.name} {span.attributes.get('tokentrace.step', '')}: device {device_ns} ns > wall {wall_ns} ns")
    times = [t for s in prefill + decodes for t in (s.start_time, s.end_time)]
    if times != sorted(times):
        failures.append("span times are not monotonic")
    if prefill and prefill[0].attributes.get("tokentrace.kv.dtype") != "bf16":
        failures.append(f"kv dtype {prefill[0].attributes.get('tokentrace.kv.dtype')!r}, expected bf16")
    cache_bytes = cache_tensor_bytes(result.output.cache)
    if decodes and decodes[-1].attributes.get("tokentrace.kv.bytes") != cache_bytes:
        failures.append(f"last kv.bytes {decodes[-1].attributes.get('tokentrace.kv.bytes')} != cache nbytes {cache_bytes}")
    if decodes:
        device = [d.attributes["tokentrace.device_ns"] for d in decodes if "tokentrace.device_ns" in d.attributes]
        wall = [d.end_time - d.start_time for d in decodes]
        # no device_ns at all is already a failure above: report it, do not end the run here
        median_device = f"{statistics.median(device) / 1e6:.1f} ms" if device else "none"
        print(f"decode steps: median wall {statistics.median(wall) / 1e6:.1f} ms, device {median_device}")
        if prefill:
            print(f"prefill: device {prefill[0].attributes.get('tokentrace.device_ns', 0) / 1e6:.1f} ms")
    print(f"kv: {prefill[0].attributes.get('tokentrace.kv.bytes_per_token')} bytes/token, "
          f"last step {decodes[-1].attributes.get('tokentrace.kv.bytes')} bytes, cache {cache_bytes} bytes"
          if prefill and decodes else "kv: no spans")
    provider.shutdown()
    return failures


def tracing_cost_gpu(model: Any, batches: list[int], tokens: int, rounds: int, prompt_tokens: int,
                     span_export: str = "process") -> list[str]:
    """(a)-(d) per generated token on the GPU (benchmarks/tracing_cost.py),
    through ``span_export`` (serve's default with the continuous engine: process)."""
    import tracing_cost
    from gpu_continuous_check import _handle

    generator = torch.Generator(device="cpu").manual_seed(2)
    prompts = [torch.randint(3, int(model.config.vocab_size), (max(8, prompt_tokens // (1 + i % 4)),),
                             generator=generator).tolist() for i in range(8)]
    load_start = tracing_cost.load_average()
    result = tracing_cost.section_engine(_handle(model), batches, tokens, rounds, max_batch_tokens=4096,
                                         prompts=prompts, capture=True, unfreeze=False, span_export=span_export)
    spans = result.pop("captured_spans", [])
    print(f"tracing cost on {torch.cuda.get_device_name()}, --span-export {span_export}")
    print(f"  {tokens} tokens a sequence, {rounds} rounds a side (ABBA)")
    print(tracing_cost.engine_table(result))
    if spans:
        print(tracing_cost.encode_table(tracing_cost.section_encode(spans)))
    gc.unfreeze()
    print(f"load average: start {load_start}, end {tracing_cost.load_average()}")
    return [] if result["batches"] else ["tracing cost: no batch measured"]


def tracing_cost_cpu_fallback(span_export: str = "process") -> int:
    """The tracing-cost part on the tiny model on the CPU (wiring check without CUDA)."""
    import tracing_cost
    from instrument.hf.model_handle import load_model_handle

    print("gpu_instrument_check: no CUDA (--cpu-fallback): tracing cost, tiny model, CPU")
    result = tracing_cost.section_engine(load_model_handle("tiny"), [8, 16], 8, 1, capture=True, unfreeze=False,
                                         span_export=span_export)
    spans = result.pop("captured_spans", [])
    print(tracing_cost.engine_table(result))
    if spans:
        print(tracing_cost.encode_table(tracing_cost.section_encode(spans)))
    gc.unfreeze()
    return 0 if result["batches"] else 1


def _section(name: str, run: Callable[[], list[str]]) -> list[str]:
    """One part of the check: its failures, or one failure naming its crash (traceback printed), so
    that a part that raises does not cost the parts after it (the GPU run is one shot). Prints the
    part's seconds."""
    started = time.perf_counter()
    print(f"--- {name}")
    try:
        return run()
    except Exception as exc:  # noqa: BLE001 - reported as a failed check
        traceback.print_exc()
        return [f"{name}: crashed: {type(exc).__name__}: {exc}"]
    finally:
        print(f"--- {name}: {time.perf_counter() - started:.1f} s")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--tokens", type=int, default=128)
    parser.add_argument("--prompt-tokens", type=int, default=512)
    parser.add_argument("--reps", type=int, default=9)
    parser.add_argument("--continuous", action=argparse.BooleanOptionalAction, default=True,
                        help="also check the continuous engine (default on)")
    parser.add_argument("--cb-sequences", type=int, default=16, help="continuous: sequences per round")
    parser.add_argument("--cb-rounds", type=int, default=6, help="continuous: rounds per tracing mode")
    parser.add_argument("--tracing-cost", action=argparse.BooleanOptionalAction, default=True,
                        help="also measure tracing cost per token (benchmarks/tracing_cost.py; default on)")
    parser.add_argument("--tracing-cost-only", action="store_true", help="run only the tracing-cost part")
    parser.add_argument("--tc-batches", default="64,128", type=lambda s: [int(x) for x in s.split(",") if x],
                        help="tracing cost: sequences per round (default 64,128)")
    parser.add_argument("--tc-tokens", type=int, default=64, help="tracing cost: tokens per sequence (default 64)")
    parser.add_argument("--tc-rounds", type=int, default=4, help="tracing cost: ABBA rounds per side (default 4)")
    parser.add_argument("--span-export", choices=("inline", "process"), default="process",
                        help="tracing cost: the engine's span path (serve's --span-export; default process, "
                             "serve's default with the continuous engine; inline adds the encode section)")
    parser.add_argument("--cpu-fallback", action="store_true",
                        help="without CUDA: run the tracing-cost part on the tiny model on the CPU")
    args = parser.parse_args()
    if not torch.cuda.is_available():
        if args.cpu_fallback:
            return tracing_cost_cpu_fallback(args.span_export)
        print("gpu_instrument_check: CUDA is not available; run this on a GPU machine "
              "(or --cpu-fallback)", file=sys.stderr)
        return 2
    started = time.perf_counter()
    print(f"torch {torch.__version__}, {torch.cuda.get_device_name()}")
    model = build_llama_1b()
    params = sum(p.numel() for p in model.parameters())
    print(f"model: {params / 1e9:.2f} B parameters, bf16 ({time.perf_counter() - started:.1f} s)")
    generator = torch.Generator(device="cpu").manual_seed(0)
    input_ids = torch.randint(3, 32000, (1, args.prompt_tokens), generator=generator).to("cuda")
    failures: list[str] = []

    def overheads() -> list[str]:
        for device_time in (True, False):
            r = overhead(model, input_ids, args.tokens, args.reps, device_time)
            print(f"device_time={device_time}: plain {r['plain_ms']:.1f} ms, traced {r['traced_ms']:.1f} ms")
            print(f"  added {r['added_us_per_step']:+.1f} µs per decode step, ratio {r['ratio']:.3f}")
        return []

    if not args.tracing_cost_only:
        with torch.inference_mode():
            failures += _section("spans", lambda: check_spans(model, input_ids, args.tokens))
            failures += _section("overhead", overheads)
        if args.continuous:
            from gpu_continuous_check import check_continuous

            failures += _section("continuous", lambda: check_continuous(
                model, tokens=args.tokens, sequences=args.cb_sequences, prompt_tokens=args.prompt_tokens,
                rounds=args.cb_rounds))
    if args.tracing_cost or args.tracing_cost_only:
        failures += _section("tracing cost", lambda: tracing_cost_gpu(
            model, args.tc_batches, args.tc_tokens, args.tc_rounds, args.prompt_tokens, args.span_export))
    for failure in failures:
        print("FAIL:", failure)
    print("all checks passed" if not failures else f"{len(failures)} checks failed",
          f"({time.perf_counter() - started:.0f} s)")
    return 1 if failures else 0


if __name__ == "__main__":
    raise SystemExit(main())
