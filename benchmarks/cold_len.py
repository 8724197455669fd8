"""What reading vLLM's waiting-queue length costs the plugin's schedule wrapper, caches cold.

vLLM 0.32's default waiting queue, ``FCFSRequestQueue``, is a ``deque`` whose ``__len__`` is
a Python method (``return super().__len__()``), so ``len(self.waiting)`` in the wrapper
(instrument/vllm/hooks/__init__.py) is a Python call per scheduler step. The wrapper now
reads ``deque.__len__(waiting)`` (C) when the queue's type is that class. Each round first
streams ``--evict-mib`` of memory through the caches (a stand-in for the model step between
two wrapper calls, as benchmarks/clock_floor.py does), then times one of, in turn:

- an empty window (the clock's own cost, cold too: subtracted);
- ``len(q)``: the Python ``__len__`` (what the wrapper did before 2026-12-05);
- ``deque_len(q) if type(q) is fcfs else len(q)``: what it does now;

and each again warm (the same window run twice more, the second timed).

The class below copies vLLM 0.32's ``FCFSRequestQueue`` shape (a ``deque`` subclass whose
``__len__`` calls ``super().__len__()``), so this runs without vLLM. Medians and quartiles
of ``perf_counter_ns`` windows (vDSO: no system call), ns, net of an empty window's median.

Run:  .venv/bin/python benchmarks/cold_len.py [--rounds 2000] [--evict-mib 32]
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections import deque


class FCFSRequestQueue(deque):
    """vLLM 0.32's FCFSRequestQueue, as far as its length goes."""

    def __len__(self) -> int:
        return super().__len__()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     epilog="example: .venv/bin/python benchmarks/cold_len.py --rounds 2000")
    parser.add_argument("--rounds", type=int, default=2000, help="timed windows per kind")
    parser.add_argument("--evict-mib", type=int, default=32, help="memory streamed before each cold window, MiB")
    args = parser.parse_args()
    buf = bytearray(args.evict_mib << 20)
    q = FCFSRequestQueue([None] * 3)
    fcfs, deque_len, clock = FCFSRequestQueue, deque.__len__, time.perf_counter_ns
    kinds = ("python len", "C len")
    times: dict[tuple[str, str], list[int]] = {(k, w): [] for k in ("empty", *kinds) for w in ("cold", "warm")}

    def evict() -> None:
        buf[::64] = bytes(len(buf[::64]))  # one write per cache line

    def window(kind: str) -> int:
        """One timed window of ``kind`` (the expressions are inline: a call would be timed too)."""
        if kind == "empty":
            start = clock()
            end = clock()
        elif kind == "python len":
            start = clock()
            len(q)
            end = clock()
        else:
            start = clock()
            deque_len(q) if type(q) is fcfs else len(q)
            end = clock()
        return end - start

    for _ in range(args.rounds):  # interleaved: every kind in every round
        for kind in ("empty", *kinds):
            evict()
            times[kind, "cold"].append(window(kind))
            window(kind)  # (warms it)
            times[kind, "warm"].append(window(kind))
    print(f"{'window, ns':<18} {'median':>8} {'q1':>8} {'q3':>8}   (net of an empty window)")
    for warmth in ("cold", "warm"):
        base = statistics.median(times["empty", warmth])
        print(f"{'empty, ' + warmth:<18} {base:8.0f} {'':>8} {'':>8}   (not net)")
        for kind in kinds:
            q1, med, q3 = statistics.quantiles(times[kind, warmth], n=4)
            print(f"{kind + ', ' + warmth:<18} {med - base:8.0f} {q1 - base:8.0f} {q3 - base:8.0f}")


if __name__ == "__main__":
    main()
