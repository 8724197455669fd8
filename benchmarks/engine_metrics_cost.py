"""What the server metrics and prefix caching cost the continuous engine's step.

Two comparisons, each in one run with interleaved rounds (the machine's load hits both sides
alike). A round submits --batch sequences at once (greedy, ``ignore_eos``, --max-tokens
each) and waits for all; per side: wall time per engine step and the engine thread's CPU
time per step (``pthread_getcpuclockid`` of the manager's thread), medians over rounds and
the median of the paired ratios.

metrics   One engine (tracing on, as served), its ``metrics`` hooks set (a ServerMetrics of
          instrument/gateway/metrics.py: two histogram records per step, counters on
          admission) vs None; and the hooks alone, called 20,000 times on this thread
          (``hooks_cpu_us_per_step``: step_scheduled + step_done, thread CPU time). Goal: the
          hooks add <= 20 us of CPU per step (a SmolLM2 step is ~100-300 ms on CPU; the tiny
          model's 2-6 ms step makes the whole-engine ratio noisy on a shared machine).
prefix    Two engines on the same model, prefix caching on (transformers' block sharing:
          each completed block is hashed and registered) vs off, distinct prompts (no hits,
          so the cost without the benefit). Goal: <= 2 % engine-thread CPU added per step.

Usage::

    .venv/bin/python benchmarks/engine_metrics_cost.py --model tiny --rounds 6
    .venv/bin/python benchmarks/engine_metrics_cost.py --model smollm2 --rounds 6 --max-tokens 32

Prints one JSON object.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import threading
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

PROMPTS = ("Show me wheelchair-accessible hotels in Kyoto under $200/night with onsen access.",
           "Which Kyoto temples have step-free access?",
           "Suggest a two-day Kyoto itinerary for a wheelchair user.",
           "What is a paged KV cache?")


def _round(engine: Any, prompts: list[list[int]], args: argparse.Namespace, tag: str) -> tuple[float, float, int]:
    """(wall s, engine-thread CPU s, steps) of one round."""
    from opentelemetry import trace

    from instrument.engines.base import EngineRequest
    from instrument.hf.token_sampling import SamplingParams

    done = threading.Event()
    left = [args.batch]

    def finished(_result: Any) -> None:
        left[0] -= 1
        if left[0] == 0:
            done.set()

    clock = time.pthread_getcpuclockid(engine.manager._generation_thread.ident)
    steps0, cpu0, started = engine._step, time.clock_gettime(clock), time.perf_counter()
    for i in range(args.batch):
        # distinct prompts every round (a round number in front): no prefix-cache hits
        ids = [(time.perf_counter_ns() + i) % 400 + 1] + prompts[i % len(prompts)]
        engine.submit(EngineRequest(f"{tag}-{time.perf_counter_ns()}-{i}", ids,
                                    SamplingParams(max_tokens=args.max_tokens, temperature=0.0, ignore_eos=True),
                                    trace.set_span_in_context(trace.INVALID_SPAN), lambda t, lp: None, finished))
    if not done.wait(600):
        raise RuntimeError("a round did not finish")
    return time.perf_counter() - started, time.clock_gettime(clock) - cpu0, engine._step - steps0


def _compare(sides: dict[str, Any], prompts: list[list[int]], args: argparse.Namespace) -> dict[str, Any]:
    """Interleaved rounds over ``sides`` (name -> (engine, setup callable)); per-step figures."""
    names = list(sides)
    for name in names:  # warm every path
        engine, setup = sides[name]
        setup()
        _round(engine, prompts, args, name)
    wall: dict[str, list[float]] = {n: [] for n in names}
    cpu: dict[str, list[float]] = {n: [] for n in names}
    for r in range(args.rounds):
        for name in (names if r % 2 == 0 else names[::-1]):
            engine, setup = sides[name]
            setup()
            w, c, steps = _round(engine, prompts, args, name)
            wall[name].append(w / steps * 1e3)
            cpu[name].append(c / steps * 1e3)
    a, b = names
    return {
        f"step_ms_{a}_median": statistics.median(wall[a]), f"step_ms_{b}_median": statistics.median(wall[b]),
        f"step_cpu_ms_{a}_median": statistics.median(cpu[a]), f"step_cpu_ms_{b}_median": statistics.median(cpu[b]),
        "wall_ratio_paired_median": statistics.median(x / y for x, y in zip(wall[a], wall[b])),
        "cpu_ratio_paired_median": statistics.median(x / y for x, y in zip(cpu[a], cpu[b])),
        "added_cpu_us_per_step": (statistics.median(cpu[a]) - statistics.median(cpu[b])) * 1e3,
    }


def _hooks_cpu_us(metrics: Any, calls: int = 20_000) -> float:
    """CPU time of one step's metric hooks (step_scheduled + step_done), us, on this thread."""
    for _ in range(1000):
        metrics.step_scheduled(8)
        metrics.step_done(0.28)
    started = time.thread_time_ns()
    for _ in range(calls):
        metrics.step_scheduled(8)
        metrics.step_done(0.28)
    return (time.thread_time_ns() - started) / calls / 1e3


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--model", default="tiny")
    parser.add_argument("--sections", default="metrics,prefix")
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--max-tokens", type=int, default=32)
    parser.add_argument("--rounds", type=int, default=6)
    args = parser.parse_args()
    from opentelemetry.sdk.trace import TracerProvider

    from instrument.engines.continuous import ContinuousEngine
    from instrument.gateway.metrics import ServerMetrics
    from instrument.hf.model_handle import load_model_handle

    handle = load_model_handle(args.model)
    prompts = [handle.tokenize([{"role": "user", "content": p}], None) for p in PROMPTS]
    provider = TracerProvider()  # spans are built and dropped: the engine's side of tracing only
    out: dict[str, Any] = {"model": args.model, "batch": args.batch, "max_tokens": args.max_tokens,
                           "rounds": args.rounds, "load_average_start": os.getloadavg()[0]}
    sections = [s for s in args.sections.split(",") if s]
    if "metrics" in sections:
        engine = ContinuousEngine(handle, provider)
        metrics = ServerMetrics(engine, environ={})

        def on() -> None:
            engine.metrics = metrics

        def off() -> None:
            engine.metrics = None

        out["metrics"] = _compare({"with_metrics": (engine, on), "without": (engine, off)}, prompts, args)
        out["metrics"]["hooks_cpu_us_per_step"] = _hooks_cpu_us(metrics)
        out["metrics"]["goal_20us"] = out["metrics"]["hooks_cpu_us_per_step"] <= 20
        engine.close()
        metrics.shutdown()
    if "prefix" in sections:
        with_cache = ContinuousEngine(handle, provider, prefix_caching=True)
        without = ContinuousEngine(handle, provider, prefix_caching=False)
        out["prefix"] = _compare({"prefix_caching": (with_cache, lambda: None),
                                  "no_prefix_caching": (without, lambda: None)}, prompts, args)
        out["prefix"]["goal_2pct"] = out["prefix"]["cpu_ratio_paired_median"] <= 1.02
        with_cache.close()
        without.close()
    out["load_average_end"] = os.getloadavg()[0]
    print(json.dumps(out, indent=2))


if __name__ == "__main__":
    main()
