"""What the plugin's wrappers hold per vLLM scheduler step, and its reading into StepFacts.

Part of the guarded package instrument/vllm/hooks/ (pinned to ``TESTED_VLLM``): it reads
vLLM's ``SchedulerOutput`` / ``NewRequestData`` / ``CachedRequestData`` /
``ModelRunnerOutput`` fields. :class:`StepTap` keeps the engine thread's entries
(:attr:`StepTap.held`, appended by the wrappers in hooks/__init__.py) and turns them into
:class:`~instrument.vllm.facts.StepFacts` at each send (:meth:`StepTap.drain`).
"""

from __future__ import annotations

import logging
from array import array
from collections.abc import Iterator
from itertools import compress
from typing import Any

from instrument.clock import ANCHOR_PERF_NS, ANCHOR_WALL_NS, now_wall_ns
from instrument.vllm.facts import FINISHED_ABORTED, FINISHED_ERROR, FINISHED_LENGTH, FINISHED_STOPPED, StepFacts

__all__ = ["ARRIVED", "FINISHED", "MAX_HELD", "PREEMPTED", "SCHEDULED", "UPDATED", "StepTap"]

log = logging.getLogger("tokentrace.vllm")
SCHEDULED, UPDATED, ARRIVED, PREEMPTED, FINISHED = range(5)  # kinds of StepTap.held entries
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
        # reads them with drain()
        self.send = send
        self.due_ns = 0  # perf_counter ns
        self._geometry: tuple[int, int, int] | None = None
        self.pool: Any = None  # vLLM's block pool (free blocks read per step)
        self._in_update = False
        # drain()'s state per live request (see _columns)
        self._prompt: dict[str, int] = {}
        self._blocks: dict[str, int] = {}
        self._phase: dict[str, int] = {}
        self._prefilling: set[str] = set()
        self._ending: set[str] = set()  # ended, still scheduled in a step not yet updated
        self._first_carried: list[tuple[str, int]] = []  # first schedules in steps let go
        self._facts = StepFacts(0)  # what drain() writes into
        self.dropped_steps = 0  # no record: scheduled and never updated (an engine error), or held when a hook failed
        self.failed = False  # a hook raised: tracing stops, vLLM goes on (one log line)
        self.measure = False  # time the hooks with the thread's CPU clock (0.25 µs a read here)
        self.hook_cpu_ns = 0  # CPU time the engine thread spent in schedule/update hooks, ns (measure)
        self.schedule_cpu_ns = 0  # ... of which in the schedule hook
        self.stats_cpu_ns = 0  # ... of which writing the plugin's stats file (TOKENTRACE_VLLM_STATS)
        self.steps = 0  # scheduler steps drained
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
        """(block_tokens, bytes_per_block over every layer, blocks_total) of the first KV group."""
        if self._geometry is None:
            group = sched.kv_cache_config.kv_cache_groups[0]
            spec = group.kv_cache_spec
            self.pool = sched.kv_cache_manager.block_pool
            self._geometry = (spec.block_size, spec.page_size_bytes * len(group.layer_names),
                              self.pool.num_gpu_blocks - 1)
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

    # -- the held entries into StepFacts (engine thread, at a send: many steps at once) ------
    def drain(self) -> Iterator[StepFacts]:
        """Each step held, oldest first, as StepFacts (one object, rewritten for the next: use
        it before asking for another), with the events held before its end; then, if events
        follow the last step, an events-only record (``step = -1``). Afterwards only the steps
        scheduled and not yet updated (several steps in flight) stay held."""
        held = self.held
        opened: dict[int, tuple[Any, ...]] = {}  # id() of a SchedulerOutput held in `held` (alive)
        arrivals: list[Any] = []
        preempted: list[Any] = []
        finished: list[Any] = []
        reborn: set[str] = set()  # ids that ended and arrived again since the last record
        try:
            for entry in held:
                kind = entry[0]
                if kind == SCHEDULED:
                    opened[id(entry[1])] = entry
                    if len(opened) > 8:  # the oldest never updated (an engine error): let it go, counted
                        self._let_go(opened.pop(next(iter(opened))), opened)
                elif kind == UPDATED:
                    scheduled = opened.pop(id(entry[1]), None)
                    if scheduled is not None:
                        yield self._fill(scheduled, entry, arrivals, preempted, finished)
                        if finished or self._ending:
                            self._forget(finished, reborn, opened)
                        arrivals, preempted, finished = [], [], []
                        reborn.clear()
                elif kind == ARRIVED:
                    arrivals.append(entry[1:])
                    self._arrive(entry[1], entry[4])
                    if any(end[0] == entry[1] for end in finished):
                        reborn.add(entry[1])
                elif kind == PREEMPTED:
                    preempted.append(entry[1:])
                else:
                    finished.append(entry[1:])
                    reborn.discard(entry[1])
            if arrivals or preempted or finished:
                yield self._fill(None, None, arrivals, preempted, finished)
                self._forget(finished, reborn, opened)
        finally:
            held.clear()
            held.extend(opened.values())

    def _arrive(self, req_id: str, prompt_tokens: int) -> None:
        """A request's state from its arrival (an id used again starts afresh)."""
        self._prompt[req_id] = prompt_tokens
        self._blocks.pop(req_id, None)
        self._phase.pop(req_id, None)
        self._prefilling.discard(req_id)
        self._ending.discard(req_id)

    def _forget(self, finished: list[Any], reborn: set[str], opened: dict[int, tuple[Any, ...]]) -> None:
        """Drop the state of requests that ended, once no held step still schedules them (with
        async scheduling the step after a request's last is scheduled before its end is known);
        not that of an id that arrived again after its end (``reborn``)."""
        ending = self._ending
        ending.update(req_id for req_id, _, _ in finished if req_id not in reborn)
        for req_id in list(ending):
            if not any(req_id in entry[1].num_scheduled_tokens for entry in opened.values()):
                ending.discard(req_id)
                self._prompt.pop(req_id, None)
                self._blocks.pop(req_id, None)
                self._phase.pop(req_id, None)
                self._prefilling.discard(req_id)

    def _let_go(self, entry: tuple[Any, ...], opened: dict[int, tuple[Any, ...]]) -> None:
        """A step scheduled and never updated: no record (counted in dropped_steps), but the
        blocks given in it count for the steps after, and its requests' first schedules (cached
        tokens) go with the next record."""
        self.dropped_steps += 1
        scratch = StepFacts(0)
        out = entry[1]
        self._columns(out, out.scheduled_cached_reqs, entry[7], {}, (), scratch)
        self._first_carried += scratch.first
        if self._ending:
            self._forget([], set(), opened)

    def unfinished(self) -> int:
        """Steps held that were scheduled and not updated (at shutdown: never will be)."""
        return sum(1 for entry in self.held if entry[0] == SCHEDULED)

    def _fill(self, scheduled: Any, updated: Any, arrivals: list[Any], preempted: list[Any],
              finished: list[Any]) -> StepFacts:
        """One step (``scheduled``, ``updated``: its two held entries; None: events only).

        Read from vLLM's own per-step objects, which vLLM builds anew each step and does not
        change afterwards: ``SchedulerOutput`` (``scheduled_new_reqs``: a request scheduled
        for the first time, or, with the V2 model runner, resumed after a preemption, with its
        whole block list; ``scheduled_cached_reqs``: the others, with the blocks added in the
        step, the whole list for the ``resumed_req_ids``; both with ``num_computed_tokens``
        before the step) and ``ModelRunnerOutput`` (``sampled_token_ids`` per request). KV
        blocks held are followed per request from those lists (the first KV cache group)."""
        facts = self._facts
        facts.first, self._first_carried = self._first_carried, []
        facts.arrivals, facts.preempted, facts.finished = arrivals, preempted, finished
        if scheduled is None:  # events only
            facts.step, facts.n = -1, 0
            facts.start_ns = facts.sched_end_ns = facts.end_ns = now_wall_ns()
        else:
            _, out, facts.step, start, sched_end, facts.waiting, free, lengths = scheduled
            facts.start_ns, facts.sched_end_ns, facts.end_ns = start + _PERF_TO_WALL, sched_end + _PERF_TO_WALL, \
                updated[3] + _PERF_TO_WALL
            facts.block_tokens, facts.bytes_per_block, _ = self._geometry  # type: ignore[misc]
            total = self.pool.num_gpu_blocks
            facts.kv_total, facts.kv_used = total, total - free
            cached = out.scheduled_cached_reqs
            runner_output = updated[2]
            index, sampled = runner_output.req_id_to_index, runner_output.sampled_token_ids
            if out.scheduled_new_reqs or cached.resumed_req_ids or self._prefilling or not self._decodes(
                    out, cached, index, sampled, facts):
                self._columns(out, cached, lengths, index, sampled, facts)
            self.steps += 1
            self.tokens += sum(facts.sampled)
        return facts

    def _decodes(self, out: Any, cached: Any, index: dict[str, int], sampled: Any, facts: StepFacts) -> bool:
        """A step of decodes only (no request new, resumed or in its prefill): every column in
        C-level passes over vLLM's lists (each a read of memory the model step left cold);
        False when a request is not where expected (nothing changed then)."""
        ids = cached.req_ids
        n = len(ids)
        blocks = self._blocks
        try:
            counts = array("I", map(len, map(sampled.__getitem__, map(index.__getitem__, ids))))
            held = array("I", map(blocks.__getitem__, ids))
        except (KeyError, IndexError):  # a request the runner did not sample, or not seen arriving
            return False
        given = cached.new_block_ids
        for i, added in zip(compress(range(n), given), filter(None, given)):
            held[i] += len(added[0])
            blocks[ids[i]] = held[i]
        scheduled = out.num_scheduled_tokens
        # the scheduler fills num_scheduled_tokens in the order of scheduled_cached_reqs here:
        # then its values are the column as they stand (compared by identity first, cheaply)
        facts.tokens = array("I", scheduled.values() if list(scheduled) == ids else map(scheduled.__getitem__, ids))
        facts.req_ids, facts.n = ids, n
        facts.sampled, facts.blocks = counts, held
        facts.computed = array("I", cached.num_computed_tokens)
        facts.prefill = bytes(n)
        facts.prefix_hit_tokens = 0
        return True

    def _columns(self, out: Any, cached: Any, lengths: list[int] | None, index: dict[str, int], sampled: Any,
                 facts: StepFacts) -> None:
        """Any step, one request at a time. Per request: ``_prompt`` its prompt tokens,
        ``_blocks`` its KV blocks held, ``_phase`` 1 once scheduled / 2 once preempted since,
        ``_prefilling`` while it computes prompt tokens (and one step after)."""
        prompt_of, blocks_of, phase_of, prefilling = self._prompt, self._blocks, self._phase, self._prefilling
        scheduled = out.num_scheduled_tokens
        got = len(sampled)
        hits = 0
        resumed_ids = cached.resumed_req_ids
        # the requests of scheduled_new_reqs, then the cached ones: (id, tokens computed before
        # the step, blocks given in the step, output tokens so far (< 0 for scheduled_new_reqs:
        # -2 - its tokens so far when the V2 model runner gives them (their count when
        # scheduled: the list grows with each token), else -1), resumed)
        rows = [(new.req_id, new.num_computed_tokens, new.block_ids, -2 - length if length >= 0 else -1, False)
                for new, length in zip(out.scheduled_new_reqs, lengths or [-1] * len(out.scheduled_new_reqs))]
        for j, req_id in enumerate(cached.req_ids):
            rows.append((req_id, cached.num_computed_tokens[j], cached.new_block_ids[j], cached.num_output_tokens[j],
                         req_id in resumed_ids))
        n = len(rows)
        req_ids: list[str] = []
        tokens, computed, blocks, counts = array("I", bytes(4 * n)), array("I", bytes(4 * n)), array("I", bytes(4 * n)), \
            array("I", bytes(4 * n))
        prefill = bytearray(n)
        for i, (req_id, before, given, outputs, resumed) in enumerate(rows):
            phase = phase_of.get(req_id, 0)
            added = len(given[0]) if given else 0
            if outputs < 0:  # scheduled_new_reqs: new, or resumed (V2 model runner) with its whole list
                resumed = phase != 0
                blocks_of[req_id] = added
            elif resumed:  # the whole list
                blocks_of[req_id] = added
            else:
                blocks_of[req_id] = blocks_of.get(req_id, 0) + added
            if resumed:
                phase_of[req_id] = phase = 2  # its prefill is recomputed (prefix-cache hits skipped)
                hits += before
            elif not phase:
                phase_of[req_id] = phase = 1
                facts.first.append((req_id, before))
                hits += before
            prompt = prompt_of.get(req_id, 0)  # (0: arrived before the hooks were installed; not expected)
            # its tokens so far: prompt + outputs; for scheduled_new_reqs the V2 model runner's
            # prefill_token_ids (prompt and outputs), else unknown (-1: a recompute throughout)
            total = prompt + outputs if outputs >= 0 else -2 - outputs
            if phase == 2 and (total < 0 or before < total - 1):
                prefill[i] = 2  # recomputing what a preemption freed
            elif before < prompt:
                prefill[i] = 1
            if prefill[i]:
                prefilling.add(req_id)
            else:
                prefilling.discard(req_id)
            req_ids.append(req_id)
            tokens[i] = scheduled[req_id]
            computed[i] = before
            blocks[i] = blocks_of[req_id]
            j = index.get(req_id)
            counts[i] = len(sampled[j]) if j is not None and j < got else 0
        facts.req_ids, facts.n = req_ids, n
        facts.tokens, facts.computed, facts.blocks, facts.sampled, facts.prefill = tokens, computed, blocks, counts, prefill
        facts.prefix_hit_tokens = hits
