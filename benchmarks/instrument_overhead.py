"""Overhead of traced_generate over plain generate, per decode step, on CPU.

Interleaved repetitions in one process (plain, traced, plain, traced, ... with the order
alternating each repetition), every run forced to exactly ``--tokens`` new tokens
(min_new_tokens = max_new_tokens). Spans go through a real BatchSpanProcessor to an exporter
that discards them, so span creation and the processor hand-off are included; network
encoding happens on the processor's thread, as in production.

Reports, per model: median run time plain / traced, the median of paired differences divided
by the decode steps (µs added per step), and the ratio. Then a microbenchmark of the per-step
recording path (forward tap + streamer put), of torch's hook dispatch vs the tap, of building
one decode span after the fact on the request thread, and of what the lazy spans move to the
export thread (OTLP encoding with the span fields built on first read, vs pre-built).

Run:  .venv/bin/python benchmarks/instrument_overhead.py [--tokens 128] [--reps 15] [--no-smollm2]
"""

from __future__ import annotations

import argparse
import gc
import statistics
import time
from collections.abc import Sequence
from typing import Any

import torch
from opentelemetry.sdk.trace import ReadableSpan
from opentelemetry.sdk.trace.export import SpanExporter, SpanExportResult

from instrument.hf.generate import traced_generate
from instrument.hf.generate_spans import DecodeSpanPolicy, SequenceTrace, emit_sequence_spans
from instrument.hf.recorder import GenerationRecorder, RecordedTimeline
from instrument.hf.tiny_model import load_tiny_model
from instrument.kv.runtime import inspect_runtime_kv
from instrument.otel.span_writer import ApiSpanWriter, DirectSpanWriter
from instrument.otel.tracing import get_tracer, setup_tracing


class DiscardingExporter(SpanExporter):
    """Counts spans and drops them (the export cost is not the instrument's)."""

    def __init__(self) -> None:
        self.spans = 0

    def export(self, spans: Sequence[ReadableSpan]) -> SpanExportResult:
        self.spans += len(spans)
        return SpanExportResult.SUCCESS


def compare(
    model: Any, tok: Any, label: str, tokens: int, reps: int, decode_spans: str, direct_spans: bool = True
) -> dict[str, float]:
    exporter = DiscardingExporter()
    provider = setup_tracing(exporter="none", span_exporters=[exporter])
    enc = tok("The travel copilot asks for wheelchair-accessible hotels in Kyoto", return_tensors="pt")
    kwargs = dict(max_new_tokens=tokens, min_new_tokens=tokens, do_sample=False)

    plain_cpu_ns: list[int] = []
    traced_cpu_ns: list[int] = []

    def plain() -> int:
        cpu, start = time.thread_time_ns(), time.perf_counter_ns()
        model.generate(**enc, **kwargs)
        wall = time.perf_counter_ns() - start
        plain_cpu_ns.append(time.thread_time_ns() - cpu)
        return wall

    def traced() -> int:
        cpu, start = time.thread_time_ns(), time.perf_counter_ns()
        traced_generate(
            model, tok, enc, tracer_provider=provider, decode_spans=decode_spans, direct_spans=direct_spans, **kwargs
        )
        wall = time.perf_counter_ns() - start
        traced_cpu_ns.append(time.thread_time_ns() - cpu)
        return wall

    with torch.inference_mode():
        for _ in range(2):  # warm-up both paths
            plain(), traced()
        plain_ns: list[int] = []
        traced_ns: list[int] = []
        gc.collect()
        plain_cpu_ns.clear(), traced_cpu_ns.clear()
        for rep in range(reps):
            if rep % 2 == 0:
                plain_ns.append(plain())
                traced_ns.append(traced())
            else:
                traced_ns.append(traced())
                plain_ns.append(plain())
    provider.shutdown()
    steps = tokens - 1
    paired_us = statistics.median(t - p for t, p in zip(traced_ns, plain_ns)) / 1e3
    result = {
        "plain_ms": statistics.median(plain_ns) / 1e6,
        "traced_ms": statistics.median(traced_ns) / 1e6,
        "added_us_per_step": paired_us / steps,
        "ratio": statistics.median(traced_ns) / statistics.median(plain_ns),
        "plain_us_per_step": statistics.median(plain_ns) / 1e3 / tokens,
        # Best-of-reps difference: robust when other processes share the CPU.
        "added_us_per_step_min": (min(traced_ns) - min(plain_ns)) / 1e3 / steps,
        # CPU time of the calling thread (torch runs its ops there with 1 thread): what the
        # instrument costs the request's thread, unaffected by time spent descheduled.
        "added_cpu_us_per_step": statistics.median(t - p for t, p in zip(traced_cpu_ns, plain_cpu_ns)) / 1e3 / steps,
    }
    print(
        f"{label:<22} tokens={tokens} reps={reps} decode_spans={decode_spans}: plain {result['plain_ms']:.2f} ms "
        f"({result['plain_us_per_step']:.0f} µs/token), traced {result['traced_ms']:.2f} ms, "
        f"added {result['added_us_per_step']:+.2f} µs/decode step (best-of-reps {result['added_us_per_step_min']:+.2f}), "
        f"ratio {result['ratio']:.4f}; thread CPU added {result['added_cpu_us_per_step']:+.2f} µs/decode step "
        f"(spans exported: {exporter.spans})"
    )
    return result


def _per_call_ns(fn: Any, calls: int) -> float:
    best = float("inf")
    for _ in range(5):
        start = time.perf_counter_ns()
        for _ in range(calls):
            fn()
        best = min(best, (time.perf_counter_ns() - start) / calls)
    return best


def microbenchmarks(model: Any, tok: Any, calls: int = 20000) -> None:
    token = torch.tensor([7])
    # 1. The recording path: the forward tap (model.forward replaced while recording) and the
    #    streamer's put, as generate calls them, minus the bare forward they wrap.
    identity = torch.nn.Identity()
    x = torch.zeros(1)
    bare_forward_ns = _per_call_ns(lambda: identity.forward(x), calls)
    recorder = GenerationRecorder(identity)
    streamer = recorder.streamer()
    streamer.put(torch.tensor([[1, 2, 3]]))  # the prompt
    with recorder.hooks():
        tapped = identity.forward

        def record_step() -> None:
            tapped(x)
            streamer.put(token)

        record_ns = _per_call_ns(record_step, calls) - bare_forward_ns
        recorder.forward_start_perf_ns.clear(), streamer.emit_perf_ns.clear(), streamer.chunk_tokens.clear()
    # 2. torch's dispatch cost of a forward pre-hook on the top module (the old recording
    #    path) vs the forward tap that replaced it.
    module = torch.nn.Linear(4, 4)
    x = torch.zeros(1, 4)
    with torch.inference_mode():
        bare_ns = _per_call_ns(lambda: module(x), calls)
        handle = module.register_forward_pre_hook(lambda m, a: None)
        hooked_ns = _per_call_ns(lambda: module(x), calls)
        handle.remove()
        with GenerationRecorder(module).hooks():
            tapped_ns = _per_call_ns(lambda: module(x), calls)
    # 3. Building decode spans after the fact (per span), through a BatchSpanProcessor.
    steps = 256
    exporter = DiscardingExporter()
    provider = setup_tracing(exporter="none", span_exporters=[exporter])
    tracer = get_tracer(provider)
    now = time.time_ns()
    timeline = RecordedTimeline(
        forward_start_ns=[now + i * 1000 for i in range(steps)],
        emit_ns=[now + i * 1000 + 900 for i in range(steps)],
        chunk_tokens=[1] * steps,
        forward_device_ns=None,
    )
    enc = tok("hello", return_tensors="pt")
    out = model.generate(**enc, max_new_tokens=2, min_new_tokens=2, return_dict_in_generate=True)
    kv = inspect_runtime_kv(model, out.cache, batch_size=1, tokens_held=enc["input_ids"].shape[1] + 1)
    seq = SequenceTrace(0, 10, 0, steps, steps, "length", timeline.emit_ns, [1] * steps, [True] * steps)
    policy = DecodeSpanPolicy.parse("all")
    build_ns: dict[str, float] = {}
    for label, writer in (("direct writer", DirectSpanWriter(tracer)), ("tracer API", ApiSpanWriter(tracer))):

        def build() -> None:
            emit_sequence_spans(writer, seq, timeline, kv, policy, parent_context=None, root_attributes={},  # noqa: B023 - timed in this iteration
                                call_start_ns=now, call_end_ns=now + steps * 1000)

        build_ns[label] = _per_call_ns(build, 20) / steps
    provider.shutdown()
    # 4. What the lazy spans move to the export thread: OTLP protobuf encoding of one call's
    #    spans (root + prefill + decode steps) as the direct writer leaves them (ids, contexts,
    #    attributes and events built on first read, i.e. inside the timed encoding) vs as the
    #    tracer API builds them (everything built already). The spans are collected by a
    #    processor that reads nothing, so no lazy field is built before the timer starts.
    from opentelemetry.exporter.otlp.proto.common.trace_encoder import encode_spans
    from opentelemetry.sdk.trace import SpanLimits, SpanProcessor, TracerProvider

    class Collect(SpanProcessor):
        def __init__(self) -> None:
            self.spans: list[ReadableSpan] = []

        def on_end(self, span: ReadableSpan) -> None:
            self.spans.append(span)

    encode_ns: dict[str, float] = {}
    for label, direct in (("direct writer (lazy fields)", True), ("tracer API", False)):
        collect = Collect()
        capture = TracerProvider(span_limits=SpanLimits(max_events=steps + 1))
        capture.add_span_processor(collect)
        capture_tracer = get_tracer(capture)
        writer = DirectSpanWriter(capture_tracer) if direct else ApiSpanWriter(capture_tracer)
        batches = []
        for _ in range(25):
            collect.spans = []
            emit_sequence_spans(writer, seq, timeline, kv, policy, parent_context=None, root_attributes={},
                                call_start_ns=now, call_end_ns=now + steps * 1000)
            batches.append(collect.spans)
        start = time.perf_counter_ns()
        for batch in batches:
            encode_spans(batch)
        encode_ns[label] = (time.perf_counter_ns() - start) / len(batches) / steps
        capture.shutdown()
    print(f"microbenchmark: recording path (forward tap + streamer.put) {record_ns / 1e3:.3f} µs/step")
    print(f"microbenchmark: torch forward pre-hook dispatch {(hooked_ns - bare_ns) / 1e3:+.3f} µs/forward, "
          f"forward tap {(tapped_ns - bare_ns) / 1e3:+.3f} µs/forward "
          f"(Linear(4,4): {bare_ns / 1e3:.2f} -> {hooked_ns / 1e3:.2f} / {tapped_ns / 1e3:.2f} µs)")
    for label, ns in build_ns.items():
        print(f"microbenchmark: post-hoc span building on the request thread, {label} "
              f"(decode span + chunk event, batch processor) {ns / 1e3:.2f} µs/step")
    for label, ns in encode_ns.items():
        print(f"microbenchmark: export thread, OTLP protobuf encoding of spans from the {label} "
              f"{ns / 1e3:.2f} µs/step")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--tokens", type=int, default=128, help="new tokens per run (default 128)")
    parser.add_argument("--reps", type=int, default=15, help="interleaved repetitions (default 15)")
    parser.add_argument("--smollm2-tokens", type=int, default=48)
    parser.add_argument("--smollm2-reps", type=int, default=7)
    parser.add_argument("--no-smollm2", action="store_true", help="skip the SmolLM2-135M comparison")
    parser.add_argument("--micro-only", action="store_true", help="only the microbenchmarks")
    parser.add_argument("--threads", type=int, default=1, help="torch CPU threads (default 1: least noise)")
    parser.add_argument("--gc-freeze", action="store_true",
                        help="gc.freeze() after loading each model (as `tokentrace serve` and vLLM do)")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)

    def freeze() -> None:
        if args.gc_freeze:
            gc.collect()
            gc.freeze()

    print(f"gc: {'frozen after each model load' if args.gc_freeze else 'default (no freeze)'}; "
          f"{len(gc.get_objects())} objects tracked at start")
    print(f"torch {torch.__version__}, threads {torch.get_num_threads()}, CPU")
    model, tok = load_tiny_model()
    freeze()
    if args.micro_only:
        microbenchmarks(model, tok)
        return
    for policy in ("all", "none"):
        compare(model, tok, "tiny llama (GQA 8/2)", args.tokens, args.reps, policy)
    compare(model, tok, "tiny llama, tracer API", args.tokens, args.reps, "all", direct_spans=False)
    microbenchmarks(model, tok)
    if not args.no_smollm2:
        from instrument.hf.smollm2 import load_smollm2

        smol, smol_tok = load_smollm2()
        freeze()
        compare(smol, smol_tok, "SmolLM2-135M (fp32)", args.smollm2_tokens, args.smollm2_reps, "all")


if __name__ == "__main__":
    main()
