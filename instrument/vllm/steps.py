"""The exporter process's reading of vLLM step rows into StepFacts (instrument/vllm/rows.py).

:class:`StepReader` takes the rows of each message in order and follows every request across
steps and messages, as vLLM's scheduler reports it: ``scheduled_new_reqs`` is a request
scheduled for the first time, or, with the V2 model runner, resumed after a preemption, with
its whole block list; ``scheduled_cached_reqs`` holds the others, with the blocks added in the
step (the whole list for ``resumed_req_ids``); both give ``num_computed_tokens`` before the
step. KV blocks held are followed per request from those lists (the first KV cache group).
The rows mirror vLLM 0.32's fields (instrument/vllm/hooks/, the guarded package, writes them),
but this module imports no vLLM and runs outside vLLM's processes.
"""

from __future__ import annotations

import logging
from array import array
from collections.abc import Iterator
from typing import Any

from instrument.vllm.facts import StepFacts
from instrument.vllm.rows import (
    ARRIVED,
    FINISHED,
    GEOMETRY,
    IDLE,
    PARTIAL,
    PREEMPTED,
    SCHEDULED,
    UPDATED,
    scheduled_ids,
)

__all__ = ["MAX_IN_FLIGHT", "StepReader"]

log = logging.getLogger("tokentrace.vllm")
MAX_IN_FLIGHT = 8  # steps scheduled and not yet updated; the oldest beyond this never will be (an engine error)


class StepReader:
    """Rows in, :class:`StepFacts` out, one reader per engine core (one thread)."""

    def __init__(self) -> None:
        # per live request: prompt tokens, KV blocks held, 1 once scheduled / 2 once preempted
        # since, ended but still named by a step in flight
        self._prompt: dict[str, int] = {}
        self._blocks: dict[str, int] = {}
        self._phase: dict[str, int] = {}
        self._ending: set[str] = set()
        # the id() vLLM's SchedulerOutput had in the engine core -> its SCHEDULED row, until its
        # UPDATED row (unique among the steps in flight: vLLM keeps a step's SchedulerOutput
        # alive until its update; an id scheduled again while open was never updated)
        self._opened: dict[int, tuple[Any, ...]] = {}
        self._first_carried: list[tuple[str, int]] = []  # first schedules in steps let go
        self._facts = StepFacts(0)  # what read() writes into
        self.geometry = (0, 0, 0)  # tokens per KV block, bytes per block, blocks in the pool
        self.sent_ns = 0  # the latest send's time, ns since the epoch (events-only records)
        self.perf_to_wall = 0  # the engine core's perf_counter ns + this = ns since the epoch
        self.let_go = 0  # steps scheduled and never updated: no record
        self.number = 0  # the last message's number (GEOMETRY)
        self.lost_messages = 0  # gaps in the numbers

    def read(self, rows: list[tuple[Any, ...]]) -> Iterator[StepFacts | None]:
        """Each step whose UPDATED row is in ``rows``, oldest first, as StepFacts (one object,
        rewritten for the next: use it before asking for another), with the events given
        before its end; an events-only record (``step = -1``) for events after the last step;
        None for an IDLE row. Steps scheduled and not yet updated wait for a later message."""
        opened = self._opened
        arrivals: list[Any] = []
        preempted: list[Any] = []
        finished: list[Any] = []
        reborn: set[str] = set()  # ids that ended and arrived again since the last record
        for row in rows:
            kind = row[0]
            if kind == SCHEDULED or kind == PARTIAL:
                earlier = opened.pop(row[1], None)
                if earlier is not None:  # its object is gone, never updated: let go
                    self._let_go(earlier)
                opened[row[1]] = row
                if len(opened) > MAX_IN_FLIGHT:
                    self._let_go(opened.pop(next(iter(opened))))
            elif kind == UPDATED:
                scheduled = opened.pop(row[1], None)
                if scheduled is not None:
                    yield self._fill(scheduled, row, arrivals, preempted, finished)
                    if finished or self._ending:
                        self._forget(finished, reborn)
                    arrivals, preempted, finished = [], [], []
                    reborn = set()
            elif kind == ARRIVED:
                arrivals.append(row[1:])
                self._arrive(row[1], row[4])
                if any(end[0] == row[1] for end in finished):
                    reborn.add(row[1])
            elif kind == PREEMPTED:
                preempted.append(row[1:])
            elif kind == FINISHED:
                finished.append(row[1:])
                reborn.discard(row[1])
            elif kind == GEOMETRY:
                self.geometry, self.sent_ns, self.perf_to_wall = row[1:4], row[4], row[5]
                if row[6] > self.number + 1:  # messages dropped at a full socket: rows missing
                    lost = row[6] - self.number - 1
                    self.lost_messages += lost
                    log.warning("tokentrace: %d vLLM step message(s) lost at a full socket; KV blocks and cached "
                                "tokens of the requests live then may be off until the engine goes idle (%d so far)",
                                lost, self.lost_messages)
                self.number = row[6]
            elif kind == IDLE:
                if arrivals or preempted or finished:
                    yield self._fill(None, None, arrivals, preempted, finished)
                    self._forget(finished, reborn)
                    arrivals, preempted, finished = [], [], []
                # no request is live: what is still known of one lost its end in a dropped message
                self._forget([(req_id, 0, 0) for req_id in {*self._prompt, *self._blocks, *self._phase}], set())
                yield None
        if arrivals or preempted or finished:
            yield self._fill(None, None, arrivals, preempted, finished)
            self._forget(finished, reborn)

    def _arrive(self, req_id: str, prompt_tokens: int) -> None:
        """A request's state from its arrival (an id used again starts afresh)."""
        self._prompt[req_id] = prompt_tokens
        self._blocks.pop(req_id, None)
        self._phase.pop(req_id, None)
        self._ending.discard(req_id)

    def _forget(self, finished: list[Any], reborn: set[str]) -> None:
        """Drop the state of requests that ended, once no step in flight still schedules them
        (with async scheduling the step after a request's last is scheduled before its end is
        known); not that of an id that arrived again after its end (``reborn``)."""
        ending = self._ending
        ending.update(end[0] for end in finished if end[0] not in reborn)
        for req_id in list(ending):
            if not any(req_id in scheduled_ids(row) for row in self._opened.values()):
                ending.discard(req_id)
                self._prompt.pop(req_id, None)
                self._blocks.pop(req_id, None)
                self._phase.pop(req_id, None)

    def _let_go(self, row: tuple[Any, ...]) -> None:
        """A step scheduled and never updated: no record, but the blocks given in it count for
        the steps after, and its requests' first schedules (cached tokens) go with the next
        record."""
        self.let_go += 1
        scratch = StepFacts(0)
        self._columns(row, None, scratch)
        self._first_carried += scratch.first
        if self._ending:
            self._forget([], set())

    def _fill(self, scheduled: Any, updated: Any, arrivals: list[Any], preempted: list[Any],
              finished: list[Any]) -> StepFacts:
        """One step (its SCHEDULED and UPDATED rows; None: events only)."""
        facts = self._facts
        facts.first, self._first_carried = self._first_carried, []
        facts.arrivals, facts.preempted, facts.finished = arrivals, preempted, finished
        if scheduled is None:
            facts.step, facts.n, facts.batch_size, facts.batch_tokens = -1, 0, 0, 0
            facts.start_ns = facts.sched_end_ns = facts.end_ns = self.sent_ns
            return facts
        shift = self.perf_to_wall
        facts.block_tokens, facts.bytes_per_block, total = self.geometry
        facts.whole = scheduled[0] != PARTIAL
        if not facts.whole:  # the step's figures; its requests' columns for a few of them
            _, _, facts.step, start, sched_end, facts.batch_size, facts.batch_tokens, _ = scheduled
            facts.waiting = facts.kv_total = facts.kv_used = 0  # (engine_step figures: not held)
        else:
            _, _, facts.step, start, sched_end, facts.waiting, free = scheduled[:7]
            facts.kv_total, facts.kv_used = total, total - free
        facts.start_ns, facts.sched_end_ns, facts.end_ns = start + shift, sched_end + shift, updated[2] + shift
        self._columns(scheduled, updated, facts)
        return facts

    def _columns(self, scheduled: tuple[Any, ...], updated: tuple[Any, ...] | None, facts: StepFacts) -> None:
        """Per scheduled request: tokens, computed before, KV blocks held, tokens sampled,
        prefill kind; first schedules into ``facts.first``."""
        prompt_of, blocks_of, phase_of = self._prompt, self._blocks, self._phase
        # tokens sampled per request, in the runner's order (None: one each)
        sampled = updated[4] if updated is not None else ()
        one_each = sampled is None
        index = {req_id: i for i, req_id in enumerate(updated[3])} if updated is not None and not one_each else {}
        got = 0 if one_each else len(sampled)
        # (id, tokens computed before the step, blocks given in the step, output tokens so far
        # (< 0 for scheduled_new_reqs: -2 - its tokens so far when the V2 model runner gives
        # them, else -1), resumed)
        if scheduled[0] == PARTIAL:  # these rows already, with the tokens scheduled last
            rows = scheduled[7]
            tokens_of = {row[0]: row[5] for row in rows}
        else:
            (_, _, _, _, _, _, _, tokens_of, news, cached_ids, resumed_ids, cached_blocks, cached_computed,
             cached_outputs) = scheduled
            resumed_ids = resumed_ids or ()  # (0: a release that re-sends a resumed request as new, 0.34)
            rows = [(req_id, before, given, -2 - so_far if so_far >= 0 else -1, False)
                    for req_id, before, given, so_far in news or ()]
            for j, req_id in enumerate(cached_ids):
                given = cached_blocks[j]
                rows.append((req_id, cached_computed[j], len(given[0]) if given else 0, cached_outputs[j],
                             req_id in resumed_ids))
        n = len(rows)
        req_ids: list[str | None] = []
        tokens, computed, blocks, counts = (array("I", bytes(4 * n)) for _ in range(4))
        prefill = bytearray(n)
        hits = 0
        for i, (req_id, before, added, outputs, resumed, *_) in enumerate(rows):
            phase = phase_of.get(req_id, 0)
            if outputs < 0:  # scheduled_new_reqs: new, or resumed (V2 model runner; 0.34) with its whole list
                # (resumed: seen scheduled before, or its tokens so far run past its prompt:
                # its first steps were not recorded, sampling.py)
                resumed = phase != 0 or -2 - outputs > prompt_of.get(req_id, 0) > 0
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
                if outputs < 0:
                    facts.first.append((req_id, before))
                    hits += before
                # (else a cached request never seen scheduled: first scheduled in a step not
                # recorded, sampling.py, or before the hooks were installed; its hits went then)
            prompt = prompt_of.get(req_id, 0)  # (0: arrived before the hooks were installed; not expected)
            # its tokens so far: prompt + outputs; for scheduled_new_reqs the V2 model runner's
            # prefill_token_ids (prompt and outputs), else unknown (-1: a recompute throughout)
            total = prompt + outputs if outputs >= 0 else -2 - outputs
            if phase == 2 and (total < 0 or before < total - 1):
                prefill[i] = 2  # recomputing what a preemption freed
            elif before < prompt:
                prefill[i] = 1
            req_ids.append(req_id)
            tokens[i] = 1 if tokens_of is None else tokens_of[req_id]  # (None: a plain decode step)
            computed[i] = before
            blocks[i] = blocks_of[req_id]
            if one_each:
                counts[i] = 1
            else:
                at = index.get(req_id)
                counts[i] = sampled[at] if at is not None and at < got else 0
        facts.req_ids, facts.n = req_ids, n
        facts.tokens, facts.computed, facts.blocks, facts.sampled, facts.prefill = tokens, computed, blocks, counts, prefill
        if scheduled[0] == SCHEDULED:  # (a PARTIAL row says them)
            facts.batch_size, facts.batch_tokens = n, sum(tokens)
        facts.prefix_hit_tokens = hits
