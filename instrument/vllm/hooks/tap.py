"""What the plugin's wrappers hold per vLLM scheduler step and request event, until a send.

Part of the guarded package instrument/vllm/hooks/ (checked at install, hooks/shape.py): it reads
vLLM's ``NewRequestData``, ``Request`` and KV cache manager fields. :class:`StepTap` keeps
the rows of instrument/vllm/rows.py the wrappers in hooks/__init__.py append (vLLM's
per-step lists, dicts and sets by reference; read by the exporter process,
instrument/vllm/steps.py) and hands them over at each send (:meth:`StepTap.take`).
"""

from __future__ import annotations

import logging
import time
from typing import Any

from instrument.clock import ANCHOR_PERF_NS, ANCHOR_WALL_NS, now_wall_ns
from instrument.vllm.facts import FINISHED_ABORTED, FINISHED_ERROR, FINISHED_LENGTH, FINISHED_STOPPED
from instrument.vllm.rows import ARRIVED, FINISHED, IDLE, KEPT_IF_SLOW, PARTIAL, PREEMPTED, SCHEDULED, UPDATED
from instrument.vllm.sampling import Sampling

__all__ = ["ARRIVED", "FINISHED", "FLUSH_LATE_NS", "FLUSH_NS", "LEAST_HELD", "MAX_HELD", "PARTIAL", "PREEMPTED",
           "SCHEDULED", "UPDATED", "StepTap", "few_rows", "new_rows"]

log = logging.getLogger("tokentrace.vllm")
MAX_HELD = 512  # held rows that make a send due (two per step, one per arrival, preemption, end)
# held rows that make a send due once due_ns has passed (about 64 steps); fewer wait for late_ns.
# Besides its part per step, a send has a fixed part (~70-130 µs on the engine thread:
# instrument/vllm/sink.py), so a send should cover many steps: with slow steps (vLLM on CPU,
# ~300 ms a step at batch 8) 2 s held ~7
LEAST_HELD = 128
FLUSH_NS = 2_000_000_000  # a send is due this long after the last with LEAST_HELD rows held (instrument/vllm/sink.py)
FLUSH_LATE_NS = 10_000_000_000  # ... and this long after it, whatever is held
_PERF_TO_WALL = ANCHOR_WALL_NS - ANCHOR_PERF_NS  # perf_counter ns + this = ns since the epoch (instrument/clock.py)


def new_rows(news: Any) -> list[tuple[str, int, int, int]]:
    """``scheduled_new_reqs`` as a SCHEDULED row carries them: (id, num_computed_tokens, blocks
    given (first KV group), tokens so far when the V2 model runner gives them (its list grows
    with each token: measured when scheduled), else -1)."""
    return [(new.req_id, new.num_computed_tokens, len(new.block_ids[0]) if new.block_ids else 0,
             -1 if new.prefill_token_ids is None else len(new.prefill_token_ids)) for new in news]


def few_rows(out: Any, cached: Any, sampled: set[str], recomputing: set[str], resumed: Any) -> list[tuple[Any, ...]]:
    """A PARTIAL row's requests (instrument/vllm/rows.py): of ``out`` (vLLM's
    ``SchedulerOutput``; ``cached`` its ``scheduled_cached_reqs``) every request scheduled as
    new, every cached one with no output token yet (a prompt chunk) or preempted earlier
    (``recomputing``: a recompute), and the ``sampled`` ones; ``resumed``: the step's
    ``resumed_req_ids`` (0 on a release without them). Found with C scans of vLLM's lists
    (``count``, ``index``), never a Python loop over the batch."""
    tokens_of = out.num_scheduled_tokens
    rows = [(new.req_id, new.num_computed_tokens, len(new.block_ids[0]) if new.block_ids else 0,
             -1 if new.prefill_token_ids is None else -2 - len(new.prefill_token_ids), False, tokens_of[new.req_id])
            for new in out.scheduled_new_reqs]
    ids, outputs = cached.req_ids, cached.num_output_tokens
    picked: list[int] = []
    if 0 in outputs:
        j = -1
        for _ in range(outputs.count(0)):
            j = outputs.index(0, j + 1)
            picked.append(j)
    for req_id in (*sampled, *recomputing) if recomputing else sampled:
        if req_id in tokens_of:
            try:
                picked.append(ids.index(req_id))
            except ValueError:  # scheduled as new: already there
                pass
    if picked:
        given_of, computed = cached.new_block_ids, cached.num_computed_tokens
        resumed = resumed or ()
        for j in sorted(set(picked)):
            req_id, given = ids[j], given_of[j]
            rows.append((req_id, computed[j], len(given[0]) if given else 0, outputs[j], req_id in resumed,
                         tokens_of[req_id]))
    return rows


class StepTap:
    """Per-step capture for one engine-core process (one scheduler); see the module docstring."""

    def __init__(self, send: Any, sampling: Sampling | None = None) -> None:
        # the rows of instrument/vllm/rows.py the wrapped methods append, oldest first, on
        # the engine thread. Never rebound: the wrappers hold it
        self.held: list[tuple[Any, ...]] = []
        # send(idle): called on the engine thread when the held rows are due (the engine went
        # idle; MAX_HELD rows; a step ended after due_ns with LEAST_HELD rows, or after
        # late_ns); it must not wait, and takes them with take()
        self.send = send
        self.due_ns = 0  # perf_counter ns (the sink sets it FLUSH_NS after each send)
        self.late_ns = 0  # perf_counter ns (... and this FLUSH_LATE_NS after)
        self._geometry: tuple[int, int, int] | None = None
        self.free_queue: Any = None  # vLLM's free KV block queue (its num_free_blocks read per step)
        self.dropped_steps = 0  # steps held when a hook or a send failed: not sent
        self.failed = False  # a hook raised: tracing stops, vLLM goes on (one log line)
        self.measure = False  # time the hooks with the thread's CPU clock (0.25 µs a read here; read by install)
        self.hook_cpu_ns = 0  # CPU time the engine thread spent in schedule/update hooks, ns (measure)
        self.schedule_cpu_ns = 0  # ... of which in the schedule hook
        self.stats_cpu_ns = 0  # ... of which writing the plugin's stats file (TOKENTRACE_VLLM_STATS)
        self.hook_wall_ns = 0  # wall time of the same windows, ns (measure): CPU plus what the thread waited
        self.stats_wall_ns = 0  # ... of which writing the stats file
        self.steps = 0  # scheduler steps updated (counted only when measure is on)
        self.tokens = 0  # tokens sampled in them (likewise)
        # which requests and steps are traced (instrument/vllm/sampling.py): requests decided at
        # arrival; the live sampled ones' ids (never rebound: the wrappers hold it). A step with
        # none of them in flight, and whose engine_step span is not sampled, holds no row
        self.sampling = sampling if sampling is not None else Sampling()
        # a keep policy: every request recorded, every step's row whole (the hooks then never
        # hold a PARTIAL row); its detail decided in the exporter process once it has ended
        self.keeps = self.sampling.keeps
        self.sampled_ids: set[str] = set()
        # requests preempted since their arrival (a recompute may be under way: a PARTIAL row
        # carries them; never rebound: the wrappers hold it)
        self.recomputing: set[str] = set()
        # id() of each SchedulerOutput whose row was held, until its update: True for a
        # SCHEDULED row, a PARTIAL row's requests for one (never rebound: the wrappers hold it)
        self.recorded: dict[int, Any] = {}
        # something held that the exporter process needs: a step's row, or an event of a sampled
        # request (only arrivals and ends of unsampled requests otherwise: see worth_sending)
        self.needs_send = False
        # a send went out since the engine was last idle: the exporter process may follow
        # requests it was told of, so the next idle is sent (its IDLE row makes it forget them)
        self.sent_since_idle = False
        self.on_shutdown: Any = None  # called (once) when vLLM shuts the scheduler down
        self.uninstall: Any = None  # puts vLLM's own step methods back (hooks.install sets it)

    def fail(self) -> None:
        """A hook raised (vLLM state this module did not expect): log it once, stop tracing
        (vLLM's own step methods go back on its scheduler class)."""
        if not self.failed:
            self.failed = True
            if self.uninstall is not None:
                self.uninstall()
            # what it holds may miss an event: not sent, its steps counted
            self.dropped_steps += sum(1 for row in self.held if row[0] == UPDATED)
            self.held.clear()
            log.exception("tokentrace: the vLLM hooks failed; tracing stops (%d steps held not sent), vLLM runs "
                          "on untraced", self.dropped_steps)

    def geometry(self, sched: Any) -> tuple[int, int, int]:
        """(block_tokens, bytes_per_block over every layer, blocks in the pool) of the first KV group."""
        if self._geometry is None:
            group = sched.kv_cache_config.kv_cache_groups[0]
            spec = group.kv_cache_spec
            pool = sched.kv_cache_manager.block_pool
            # what BlockPool.get_num_free_blocks() returns, read without the call (bound once in
            # BlockPool.__init__)
            self.free_queue = pool.free_block_queue
            self._geometry = (spec.block_size, spec.page_size_bytes * len(group.layer_names),
                              pool.num_gpu_blocks)
        return self._geometry

    # -- per request, outside the step loop (engine thread) -------------------------------
    def on_add(self, req: Any) -> None:
        """An arrival: decided sampled or not, once (its trace headers go along only if sampled;
        an unsampled request's row still says its prompt length, which its neighbours' step
        facts need)."""
        headers = req.trace_headers
        sampled: bool | int = self.sampling.request_sampled(headers)
        if self.keeps:  # a keep policy: every request recorded; the decision above marks the random sample
            sampled = True if sampled else KEPT_IF_SLOW
        if sampled:
            self.sampled_ids.add(req.request_id)
            self.needs_send = True
        self.held.append((ARRIVED, req.request_id, req.arrival_time, dict(headers) if headers and sampled else None,
                          req.num_prompt_tokens, sampled))

    def on_preempt(self, sched: Any, req: Any) -> None:
        self.needs_send = self.needs_send or req.request_id in self.sampled_ids
        self.recomputing.add(req.request_id)
        held = sched.kv_cache_manager.coordinator.single_type_managers[0].req_to_blocks.get(req.request_id)
        self.held.append((PREEMPTED, req.request_id, len(held) if held is not None else 0, now_wall_ns()))

    def on_free(self, req: Any) -> None:
        self.recomputing.discard(req.request_id)
        if req.request_id in self.sampled_ids:
            self.sampled_ids.discard(req.request_id)
            self.needs_send = True
        name = req.status.name
        status = (FINISHED_ABORTED if name == "FINISHED_ABORTED" else FINISHED_LENGTH if name == "FINISHED_LENGTH_CAPPED"
                  else FINISHED_STOPPED if name == "FINISHED_STOPPED" else FINISHED_ERROR)
        self.held.append((FINISHED, req.request_id, status, now_wall_ns()))

    # -- at a send (engine thread) ----------------------------------------------------------
    def worth_sending(self, idle: bool) -> bool:
        """Whether a send that fell due has anything the exporter process needs (the plugin's
        send asks first). Without a step's row or a sampled request's event, what is held is
        the arrivals and ends of unsampled requests, kept only for the prompt lengths a later
        recorded step may need: at idle every one of them ended and is dropped (unless a send
        went out since the last idle: then this one goes, so that the exporter process forgets
        the requests it was told of); at MAX_HELD rows those that arrived and ended since the
        last send are dropped (sent after all if half stay); the send's timers restart. Under sampling this keeps the engine thread from sending
        (a fixed ~70-130 µs a send) what no span will read, and the exporter process from
        starting before anything is sampled."""
        if self.needs_send or (idle and self.sent_since_idle):
            self.needs_send = False
            self.sent_since_idle = not idle
            return True
        held = self.held
        if idle:
            held.clear()
        elif len(held) >= MAX_HELD:  # requests that arrived and ended since the last send
            arrived = {row[1] for row in held if row[0] == ARRIVED}
            ended = {row[1] for row in held if row[0] == FINISHED and row[1] in arrived}
            held[:] = [row for row in held if row[1] not in ended]
            if len(held) >= MAX_HELD // 2:
                return True
        now = time.perf_counter_ns()
        self.due_ns, self.late_ns = now + FLUSH_NS, now + FLUSH_LATE_NS
        return False

    def take(self, idle: bool = False) -> tuple[tuple[int, int, int, int, int], list[tuple[Any, ...]]]:
        """(the GEOMETRY fields for this send's messages: tokens per KV block, bytes per block,
        blocks in the pool, now (ns since the epoch), the perf_counter shift; every held row,
        oldest first, and an IDLE row last when ``idle``); nothing stays held. vLLM builds its
        per-step lists, dicts and sets anew each step, so the rows still say what they said
        when appended (a scheduled_new_reqs' prefill_token_ids, which the V2 model runner
        grows, was measured then; speculative decoding's ngram GPU proposer trims
        num_scheduled_tokens in place during the model step, before the update: read trimmed,
        as vLLM's own update does; not run here)."""
        block_tokens, bytes_per_block, total = self._geometry or (0, 0, 0)
        rows = self.held[:]
        self.held.clear()
        if len(self.recorded) > 64:  # steps scheduled and never updated (an engine error): let go
            self.recorded.clear()
        if idle:
            rows.append((IDLE,))
        return (block_tokens, bytes_per_block, total, now_wall_ns(), _PERF_TO_WALL), rows
