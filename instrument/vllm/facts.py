"""One vLLM scheduler step as plain ints and request ids: what the plugin's hooks read from vLLM
(instrument/vllm/hooks/), what the records carry (instrument/vllm/rows.py) and what the
span builder consumes (instrument/vllm/spans.py). No vLLM object crosses this seam."""

from __future__ import annotations

from array import array
from typing import Any

__all__ = ["FINISHED_ABORTED", "FINISHED_ERROR", "FINISHED_LENGTH", "FINISHED_STOPPED", "StepFacts"]

# status codes carried in StepFacts.finished (engine-neutral: no vLLM enum crosses the seam)
FINISHED_STOPPED, FINISHED_LENGTH, FINISHED_ABORTED, FINISHED_ERROR = 0, 1, 2, 3



class StepFacts:
    """One scheduler step, engine-neutral (plain ints and references to existing strings).

    Times in ns since the epoch (instrument/clock.py); counts in requests, tokens, KV blocks.
    ``batch_size`` / ``batch_tokens``: requests and tokens the step scheduled; the columns
    below hold ``n`` of them (all, or those a sampled request's spans need: the sampled ones
    and every one in a prefill; ``waiting`` and the KV figures are then 0, not read).
    Per scheduled request ``i < n``: ``req_ids[i]``, ``tokens[i]`` (scheduled),
    ``computed[i]`` (tokens computed before the step), ``prefill[i]`` (1 = prompt chunk,
    2 = recomputed prefill after a preemption, 0 = decode), ``blocks[i]`` (KV blocks held
    after scheduling), ``sampled[i]`` (tokens sampled in the step). ``arrivals``: requests
    that arrived since the previous record, ``(req_id, arrival_s, trace_headers,
    prompt_tokens, sampled)``; ``first``: cached tokens of requests scheduled for the first time,
    ``(req_id, cached_tokens)``; ``preempted``: ``(req_id, blocks_freed, time_ns)``;
    ``finished``: ``(req_id, status, time_ns)``. ``step = -1``: a record of events only.
    """

    __slots__ = ("step", "start_ns", "sched_end_ns", "end_ns", "n", "whole", "batch_size", "batch_tokens", "waiting", "kv_used", "kv_total",
                 "prefix_hit_tokens", "block_tokens", "bytes_per_block", "req_ids", "tokens", "computed", "prefill", "blocks", "sampled",
                 "arrivals", "first", "preempted", "finished")

    def __init__(self, capacity: int) -> None:
        self.step = self.start_ns = self.sched_end_ns = self.end_ns = 0
        self.whole = True  # False: read from a PARTIAL row (no engine_step figures)
        self.n = self.batch_size = self.batch_tokens = self.waiting = self.kv_used = self.kv_total = self.prefix_hit_tokens = 0
        self.block_tokens = self.bytes_per_block = 0  # KV geometry (first KV cache group)
        self.req_ids: list[str | None] = [None] * capacity
        self.tokens = array("I", bytes(4 * capacity))  # u32 columns: instrument/vllm/rows.py copies them whole
        self.computed = array("I", bytes(4 * capacity))
        self.prefill: array[int] | bytearray = array("b", bytes(capacity))  # steps.py fills a bytearray
        self.blocks = array("I", bytes(4 * capacity))
        self.sampled = array("I", bytes(4 * capacity))
        self.arrivals: list[tuple[str, float, Any, int, bool]] = []
        self.first: list[tuple[str, int]] = []
        self.preempted: list[tuple[str, int, int]] = []
        self.finished: list[tuple[str, int, int]] = []
