"""What the plugin's wrappers hold per vLLM scheduler step, and its turning into rows at a send.

Part of the guarded package instrument/vllm/hooks/ (pinned to ``TESTED_VLLM``): it reads
vLLM's ``SchedulerOutput`` / ``NewRequestData`` / ``CachedRequestData`` /
``ModelRunnerOutput`` fields. :class:`StepTap` keeps the engine thread's entries
(:attr:`StepTap.held`, appended by the wrappers in hooks/__init__.py) and, at each send,
turns them into the rows of instrument/vllm/records.py (:meth:`StepTap.take`): references
to the lists, dicts and sets vLLM built for the step, not read element by element here; the
exporter process reads them (instrument/vllm/steps.py).
"""

from __future__ import annotations

import logging
from typing import Any

from instrument.clock import ANCHOR_PERF_NS, ANCHOR_WALL_NS, now_wall_ns
from instrument.vllm.facts import FINISHED_ABORTED, FINISHED_ERROR, FINISHED_LENGTH, FINISHED_STOPPED
from instrument.vllm.records import ARRIVED, FINISHED, GEOMETRY, IDLE, PREEMPTED, SCHEDULED, UPDATED
from instrument.vllm.steps import MAX_IN_FLIGHT

__all__ = ["ARRIVED", "FINISHED", "MAX_HELD", "PREEMPTED", "SCHEDULED", "UPDATED", "StepTap"]

log = logging.getLogger("tokentrace.vllm")
MAX_HELD = 512  # held entries that make a send due (two per step, one per arrival, preemption, end)
_PERF_TO_WALL = ANCHOR_WALL_NS - ANCHOR_PERF_NS  # perf_counter ns + this = ns since the epoch (instrument/clock.py)


class StepTap:
    """Per-step capture for one engine-core process (one scheduler); see the module docstring."""

    def __init__(self, send: Any) -> None:
        # what the wrapped methods append, oldest first, on the engine thread:
        # (SCHEDULED, its SchedulerOutput, step, start, schedule end (perf_counter ns), waiting,
        #  KV blocks free, the length of each scheduled_new_reqs' prefill_token_ids or -1, or
        #  None when none), (UPDATED, that SchedulerOutput, the ModelRunnerOutput, end
        #  (perf_counter ns)), (ARRIVED, id, arrival s, trace headers, prompt tokens),
        #  (PREEMPTED, id, blocks freed, wall ns), (FINISHED, id, status, wall ns). Never
        #  rebound: the wrappers hold it
        self.held: list[tuple[Any, ...]] = []
        # send(idle): called on the engine thread when the held entries are due (the engine
        # went idle, MAX_HELD entries, or a step ended after due_ns); it must not wait, and
        # takes them with take()
        self.send = send
        self.due_ns = 0  # perf_counter ns
        self._geometry: tuple[int, int, int] | None = None
        self.pool: Any = None  # vLLM's block pool (free blocks read per step)
        self._in_update = False
        # id() of a SchedulerOutput taken and not yet updated -> (its step, the object: kept
        # alive so that its id() names no other step meanwhile)
        self._in_flight: dict[int, tuple[int, Any]] = {}
        self.dropped_steps = 0  # no record: scheduled and never updated (an engine error), or held when a hook failed
        self.failed = False  # a hook raised: tracing stops, vLLM goes on (one log line)
        self.measure = False  # time the hooks with the thread's CPU clock (0.25 µs a read here)
        self.hook_cpu_ns = 0  # CPU time the engine thread spent in schedule/update hooks, ns (measure)
        self.schedule_cpu_ns = 0  # ... of which in the schedule hook
        self.stats_cpu_ns = 0  # ... of which writing the plugin's stats file (TOKENTRACE_VLLM_STATS)
        self.steps = 0  # scheduler steps taken (updated)
        self.tokens = 0  # tokens sampled in them
        self.on_shutdown: Any = None  # called (once) when vLLM shuts the scheduler down

    def fail(self) -> None:
        """A hook raised (vLLM state this module did not expect): log it once, stop tracing."""
        if not self.failed:
            self.failed = True
            # what it holds may miss an event: not sent, its steps counted
            lost = sum(1 for entry in self.held if entry[0] == UPDATED)
            self.dropped_steps += lost
            self.held.clear()
            log.exception("tokentrace: the vLLM hooks failed; tracing stops (%d steps held not sent), vLLM runs "
                          "on untraced", lost)

    def geometry(self, sched: Any) -> tuple[int, int, int]:
        """(block_tokens, bytes_per_block over every layer, blocks in the pool) of the first KV group."""
        if self._geometry is None:
            group = sched.kv_cache_config.kv_cache_groups[0]
            spec = group.kv_cache_spec
            self.pool = sched.kv_cache_manager.block_pool
            self._geometry = (spec.block_size, spec.page_size_bytes * len(group.layer_names),
                              self.pool.num_gpu_blocks)
        return self._geometry

    # -- per request, outside the step loop (engine thread) -------------------------------
    def on_add(self, req: Any) -> None:
        self.held.append((ARRIVED, req.request_id, req.arrival_time, req.trace_headers, req.num_prompt_tokens))

    def on_preempt(self, sched: Any, req: Any) -> None:
        held = sched.kv_cache_manager.coordinator.single_type_managers[0].req_to_blocks.get(req.request_id)
        self.held.append((PREEMPTED, req.request_id, len(held) if held is not None else 0, now_wall_ns()))

    def on_free(self, req: Any) -> None:
        name = req.status.name
        status = (FINISHED_ABORTED if name == "FINISHED_ABORTED" else FINISHED_LENGTH if name == "FINISHED_LENGTH_CAPPED"
                  else FINISHED_STOPPED if name == "FINISHED_STOPPED" else FINISHED_ERROR)
        self.held.append((FINISHED, req.request_id, status, now_wall_ns()))

    # -- the held entries into rows (engine thread, at a send: many steps at once) ---------
    def take(self, idle: bool = False) -> tuple[list[tuple[Any, ...]], list[int]]:
        """Every held entry as a row of instrument/vllm/records.py, oldest first, after a
        GEOMETRY row (and an IDLE row last when ``idle``), with the spans each row stands for
        (loss counting); nothing stays held. vLLM's per-step lists, dicts and sets go in by
        reference: vLLM builds them anew each step and does not change them afterwards (a
        scheduled_new_reqs' prefill_token_ids, which the V2 model runner grows, was measured
        when scheduled)."""
        block_tokens, bytes_per_block, total = self._geometry or (0, 0, 0)
        rows: list[tuple[Any, ...]] = [(GEOMETRY, block_tokens, bytes_per_block, total, now_wall_ns())]
        units = [0]
        in_flight = self._in_flight
        steps = tokens = 0
        for entry in self.held:
            kind = entry[0]
            if kind == SCHEDULED:
                _, out, step, start, sched_end, waiting, free, lengths = entry
                cached, news, scheduled = out.scheduled_cached_reqs, out.scheduled_new_reqs, out.num_scheduled_tokens
                rows.append((SCHEDULED, step, start + _PERF_TO_WALL, sched_end + _PERF_TO_WALL, waiting, free, scheduled,
                             [(new.req_id, new.num_computed_tokens, len(new.block_ids[0]) if new.block_ids else 0, length)
                              for new, length in zip(news, lengths)] if news else None,
                             cached.req_ids, cached.resumed_req_ids, cached.new_block_ids, cached.num_computed_tokens,
                             cached.num_output_tokens))
                units.append(len(scheduled) + 1)
                in_flight[id(out)] = (step, out)
                if len(in_flight) > MAX_IN_FLIGHT:  # the oldest never updated (an engine error): counted
                    del in_flight[next(iter(in_flight))]
                    self.dropped_steps += 1
            elif kind == UPDATED:
                found = in_flight.pop(id(entry[1]), None)
                if found is None:  # let go (more than MAX_IN_FLIGHT in flight): no record
                    continue
                runner = entry[2]
                sampled = list(map(len, runner.sampled_token_ids))
                steps += 1
                tokens += sum(sampled)
                rows.append((UPDATED, found[0], entry[3] + _PERF_TO_WALL, runner.req_ids, sampled))
                units.append(0)
            elif kind == ARRIVED:
                _, req_id, arrival_s, headers, prompt_tokens = entry
                rows.append((ARRIVED, req_id, arrival_s, dict(headers) if headers else None, prompt_tokens))
                units.append(0)
            else:  # PREEMPTED, FINISHED: builtins already
                rows.append(entry)
                units.append(2 if kind == FINISHED else 0)
        self.held.clear()
        if idle:
            rows.append((IDLE,))
            units.append(0)
        self.steps += steps
        self.tokens += tokens
        return rows, units

    def unfinished(self) -> int:
        """Steps scheduled and not updated (at shutdown: never will be)."""
        return sum(1 for entry in self.held if entry[0] == SCHEDULED) + len(self._in_flight)
