"""The three sides the keep-policy benchmarks compare (keep_policy_cost.py for the continuous
engine's records, vllm_keep_cost.py for the vLLM plugin's rows), and their interleaved rounds:
``full`` (no policy: every span built), ``summary`` (a policy no request crosses) and ``kept``
(a policy every request crosses). Each benchmark brings its own records and decoder."""

from __future__ import annotations

import os
import statistics
import tempfile
import time
from collections.abc import Callable
from typing import Any

SIDES = ("full", "summary", "kept")
KEEP_ENV = ("TOKENTRACE_KEEP_GAP_MS", "TOKENTRACE_KEEP_TTFT_MS")


def set_side(side: str) -> None:
    """The policy of ``side`` in this process's environment (the decoders read it when made)."""
    for var in KEEP_ENV:
        os.environ.pop(var, None)
    if side == "summary":
        os.environ["TOKENTRACE_KEEP_GAP_MS"] = "1000000"  # no request crosses it
    elif side == "kept":
        os.environ["TOKENTRACE_KEEP_TTFT_MS"] = "0"  # every request crosses it


def timed_feed(provider: Any, feed: Callable[[], None], path: str) -> tuple[float, int, int]:
    """Run ``feed`` (it feeds and closes its decoder) and flush ``provider``; (process CPU s,
    spans exported, bytes its OTLP-JSON lines file ``path`` holds). Shuts the provider down."""
    from instrument.otel.export_health import export_health

    cpu = time.process_time()
    feed()
    provider.force_flush()
    cpu = time.process_time() - cpu
    exported = sum(c.exported for c in export_health(provider))
    provider.shutdown()
    return cpu, exported, os.path.getsize(path)


def run_sides(one_round: Callable[[str, str], tuple[float, int, int]], tokens: int, rounds: int,
              heading: str) -> None:
    """A warm-up round, then ``rounds`` rounds of every side in turn (``one_round(side, path)``);
    prints µs of process CPU per generated token (median), x full, spans, bytes per token."""
    per_token: dict[str, list[float]] = {s: [] for s in SIDES}
    spans: dict[str, int] = {}
    written: dict[str, int] = {}
    with tempfile.TemporaryDirectory() as folder:
        path = os.path.join(folder, "spans.jsonl")
        one_round("full", path)  # warm-up: imports, caches
        for _ in range(rounds):
            for side in SIDES:
                cpu, spans[side], written[side] = one_round(side, path)
                per_token[side].append(cpu / tokens * 1e6)
    full = statistics.median(per_token["full"])
    print(f"{heading}; {rounds} rounds, process CPU per generated token (median)")
    for side in SIDES:
        value = statistics.median(per_token[side])
        print(f"  {side:8s} {value:6.2f} µs/token {value / full:5.2f}x full  {spans[side]:6d} spans "
              f"{written[side] / tokens:7.1f} B/token")
