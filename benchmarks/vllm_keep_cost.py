"""What the keep policy costs the vLLM plugin's span exporter process, per generated token: a
request it summarizes against one it keeps whole, and against today's full detail (no policy).

The rows of a vLLM run are made here as the plugin's engine thread writes them under a keep
policy (instrument/vllm/rows.py: every step's SCHEDULED row whole, its UPDATED row, one
ARRIVED and one FINISHED row per request), ``--requests`` requests of ``--tokens`` output
tokens each, ``--batch`` decoding together (a plain decode step: no per-step lists, as vLLM
sends them for one token each), packed in messages of 512 rows as the plugin's sink packs
them. Each round feeds all of them through the exporter process's vLLM decoder
(instrument/vllm/consumer.py) into a provider whose exporter writes OTLP-JSON lines to a
temporary file, in this process, timed with the process's CPU clock (``force_flush`` inside
the timed part: the batch processor's encoding counts too). Three sides, interleaved round by
round, each with engine_step spans off: ``full`` (no policy, every request sampled: every
span built, today), ``summary`` (a policy no request crosses, none in the random sample: the
engine_request span alone) and ``kept`` (a policy every request crosses: all of it, plus the
decision). Prints µs of process CPU per generated token, median of the rounds, the ratios,
and the OTLP-JSON bytes written per generated token.

Run: .venv/bin/python benchmarks/vllm_keep_cost.py --requests 64 --tokens 256 --rounds 5
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run from a checkout without installing

T0_S = 1_700_000_000.0
STEP_NS = 20_000_000  # a step every 20 ms
PROMPT = 20
ROWS_PER_MESSAGE = 512
from keep_sides import run_sides, set_side, timed_feed

ENV = ("TOKENTRACE_KEEP_GAP_MS", "TOKENTRACE_KEEP_TTFT_MS", "OTEL_TRACES_SAMPLER", "TOKENTRACE_VLLM_STEP_SAMPLE_RATIO")


def _messages(requests: int, tokens: int, batch: int, sampled: Any) -> list[bytes]:
    """The packed messages of the run (``sampled``: each ARRIVED row's flag)."""
    from instrument.vllm.facts import FINISHED_LENGTH
    from instrument.vllm.rows import (
        ARRIVED,
        FINISHED,
        IDLE,
        SCHEDULED,
        UPDATED,
        message,
        message_end,
        pack,
    )

    rows: list[tuple[Any, ...]] = []
    step, perf = 0, 0  # the engine core's perf_counter ns (the GEOMETRY shift makes them T0-based)
    for first in range(0, requests, batch):
        group = [f"cmpl-{r}-0-abcdefgh" for r in range(first, min(requests, first + batch))]
        for rid in group:
            rows.append((ARRIVED, rid, T0_S + perf / 1e9, None, PROMPT, sampled))
        for k in range(tokens):  # step k: the prefill (k = 0, emits token 1) or decode step k
            step += 1
            if k == 0:
                news = [(rid, 0, 2, -1) for rid in group]
                rows.append((SCHEDULED, step, step, perf, perf + 40_000, 0, 1000, {rid: PROMPT for rid in group},
                             news, [], 0, [], [], []))
            else:  # a plain decode step: vLLM's lists for one token each, None for num_scheduled_tokens
                rows.append((SCHEDULED, step, step, perf, perf + 40_000, 0, 1000, None, None, group, 0,
                             [None] * len(group), [PROMPT + k - 1] * len(group), [k] * len(group)))
            perf += STEP_NS
            rows.append((UPDATED, step, perf - 1000, None, None))
        for rid in group:
            rows.append((FINISHED, rid, FINISHED_LENGTH, 0))
        rows.append((IDLE,))
    out, start, number = [], 0, 0
    header = (16, 16 * 23_040, 1000, 0, int(T0_S * 1e9))
    while start < len(rows):
        stop = message_end(rows, start, ROWS_PER_MESSAGE)
        number += 1
        out.append(pack(message(header, number, rows[start:stop])))
        start = stop
    return out


def _round(messages: list[bytes], side: str, path: str) -> tuple[float, int, int]:
    """Feed the messages through a fresh vLLM decoder writing OTLP-JSON lines to ``path``;
    (process CPU s, spans exported, bytes written)."""
    from opentelemetry.sdk.trace.sampling import ALWAYS_ON

    from instrument.otel.tracing import setup_tracing
    from instrument.vllm.consumer import RecordConsumer

    for var in ENV:
        os.environ.pop(var, None)
    set_side(side)
    os.environ["TOKENTRACE_VLLM_STEP_SAMPLE_RATIO"] = "off"
    if os.path.exists(path):
        os.remove(path)
    provider = setup_tracing("vllm-keep-cost", exporter=["otlp_json"], json_path=path, sampler=ALWAYS_ON)
    consumer = RecordConsumer(provider)

    def feed() -> None:
        for payload in messages:
            consumer.feed(memoryview(payload))
        consumer.close()

    return timed_feed(provider, feed, path)


def main() -> None:
    from instrument.vllm.rows import KEPT_IF_SLOW

    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     epilog="example: .venv/bin/python benchmarks/vllm_keep_cost.py --rounds 5")
    parser.add_argument("--requests", type=int, default=64, help="requests per round (default 64)")
    parser.add_argument("--tokens", type=int, default=256, help="output tokens per request (default 256)")
    parser.add_argument("--batch", type=int, default=32, help="requests decoding together (default 32)")
    parser.add_argument("--rounds", type=int, default=5, help="interleaved rounds per side (default 5)")
    args = parser.parse_args()
    messages = {"full": _messages(args.requests, args.tokens, args.batch, True)}
    messages["summary"] = messages["kept"] = _messages(args.requests, args.tokens, args.batch, KEPT_IF_SLOW)
    run_sides(lambda side, path: _round(messages[side], side, path), args.requests * args.tokens, args.rounds,
              f"{args.requests} requests x {args.tokens} tokens, batch {args.batch}")


if __name__ == "__main__":
    main()
