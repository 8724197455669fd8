"""How the vLLM plugin's self-timing should subtract its clock's own cost (TOKENTRACE_VLLM_STATS).

The plugin times its few µs of work per vLLM step with the thread's CPU clock, a system call
(instrument/vllm/hooks/__init__.py ``_clock_start``). A window holds one read's cost, so a
floor is subtracted; the question is which interval measures it when the caches are cold,
as they are after a CPU model step. Here each round first streams ``--evict-mib`` of memory
through the caches (a stand-in for the model step), then times, in turn:

- an empty window with the floor from the first two reads (the first read cold): what the
  plugin did before 2026-12-04;
- an empty window with the floor from reads two and three (the first read only a warm-up):
  what it does now;
- the same two calibrations around ``marshal.dumps`` of rows shaped like the plugin's (20
  steps of 8 requests), and that work timed with ``perf_counter_ns`` (vDSO, no system call)
  with the same three-read floor.

A good floor leaves an empty window near 0 ns. Medians and quartiles, ns.

Run:  .venv/bin/python benchmarks/clock_floor.py [--rounds 400] [--evict-mib 64]
"""

from __future__ import annotations

import argparse
import marshal
import time
from collections.abc import Callable


def _rows() -> list[tuple[object, ...]]:
    """20 steps of 8 requests, shaped like instrument/vllm/rows.py's SCHEDULED rows."""
    ids = [f"chatcmpl-{i:04d}-0123abcd" for i in range(8)]
    return [(0, 1000 + s, s, 10**9 + s, 10**9 + s + 5, 0, 900, dict.fromkeys(ids, 1), None, ids, set(),
             [None] * 8, [300 + s + i for i in range(8)], [s] * 8) for s in range(20)]


def _two_reads(clock: Callable[[], int], work: Callable[[], object] | None) -> int:
    first = clock()
    start = clock()
    if work is not None:
        work()
    return clock() - start - (start - first)


def _three_reads(clock: Callable[[], int], work: Callable[[], object] | None) -> int:
    clock()
    first = clock()
    start = clock()
    if work is not None:
        work()
    return clock() - start - (start - first)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     epilog="example: .venv/bin/python benchmarks/clock_floor.py --rounds 400")
    parser.add_argument("--rounds", type=int, default=400, help="timed windows per kind")
    parser.add_argument("--evict-mib", type=int, default=64, help="memory streamed before each window, MiB")
    args = parser.parse_args()
    buf = bytearray(args.evict_mib << 20)
    rows = _rows()

    def work() -> object:
        return marshal.dumps(rows, 4)

    kinds: list[tuple[str, Callable[[], int]]] = [
        ("empty, floor from reads 1-2", lambda: _two_reads(time.thread_time_ns, None)),
        ("empty, floor from reads 2-3", lambda: _three_reads(time.thread_time_ns, None)),
        ("marshal, floor from reads 1-2", lambda: _two_reads(time.thread_time_ns, work)),
        ("marshal, floor from reads 2-3", lambda: _three_reads(time.thread_time_ns, work)),
        ("marshal, perf_counter, 2-3", lambda: _three_reads(time.perf_counter_ns, work)),
    ]
    found: dict[str, list[int]] = {name: [] for name, _ in kinds}
    for _ in range(args.rounds):  # interleaved: a drift of the machine hits every kind alike
        for name, timed in kinds:
            buf.count(b"\x01")  # streams the buffer through the caches
            found[name].append(timed())
    print(f"thread CPU clock windows after {args.evict_mib} MiB streamed, ns ({args.rounds} each)")
    print(f"{'window':31s} {'median':>9s} {'p25':>9s} {'p75':>9s}")
    for name, values in found.items():
        values.sort()
        n = len(values)
        print(f"{name:31s} {values[n // 2]:9,d} {values[n // 4]:9,d} {values[3 * n // 4]:9,d}")


if __name__ == "__main__":
    main()
