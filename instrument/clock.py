"""One wall-clock anchor per process plus a monotonic clock (span contract: Principles).

``time.time_ns()`` is read once at import; every span/event time is that anchor plus a
``time.perf_counter_ns()`` delta, so a wall-clock step during a request can never produce a
negative duration. Everything that writes spans in one process (generate, the gateway) must
convert through this module so their times share one clock domain.
"""

from __future__ import annotations

import time

__all__ = ["ANCHOR_WALL_NS", "ANCHOR_PERF_NS", "wall_ns_from_perf_ns", "wall_ns_from_perf_ns_list", "now_wall_ns"]

ANCHOR_WALL_NS: int = time.time_ns()
ANCHOR_PERF_NS: int = time.perf_counter_ns()


def wall_ns_from_perf_ns(perf_ns: int) -> int:
    """Nanoseconds since the Unix epoch for a ``time.perf_counter_ns()`` reading."""
    return ANCHOR_WALL_NS + (perf_ns - ANCHOR_PERF_NS)


def wall_ns_from_perf_ns_list(perf_ns: list[int]) -> list[int]:
    """:func:`wall_ns_from_perf_ns` of each reading (one offset, no call per element)."""
    return list(map((ANCHOR_WALL_NS - ANCHOR_PERF_NS).__add__, perf_ns))


def now_wall_ns() -> int:
    """Now, in nanoseconds since the Unix epoch, on the process's anchored monotonic clock."""
    return ANCHOR_WALL_NS + (time.perf_counter_ns() - ANCHOR_PERF_NS)
