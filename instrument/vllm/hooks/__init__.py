"""The one package that reaches into vLLM's V1 scheduler internals (guarded, checked at install).

vLLM's V1 scheduler has no per-step callback. :func:`install` wraps seven methods of
``vllm.v1.core.sched.scheduler.Scheduler`` on the class (every instance, in the engine-core
process, which is the only process that builds one):

``schedule()`` (the step's number, start, schedule end, requests waiting, KV blocks free,
its ``SchedulerOutput``), ``update_from_output()`` (the step's end: tokens handed to the
output queue; its ``ModelRunnerOutput``), ``_preempt_request()`` (blocks held just before
they are freed), ``_free_request()`` (the end and its status; ``FINISHED_ABORTED``: the
client disconnected or the frontend aborted), ``add_request()`` (arrival: the frontend's
wall clock, s; ``trace_headers``; prompt tokens), ``finish_requests()`` (an abort outside
a step: its end goes out at once) and ``shutdown()`` (the plugin's pipeline closes first).

Per step each step wrapper appends one row of instrument/vllm/rows.py to
:attr:`StepTap.held` (only for a step with a sampled request in flight or a sampled
``engine_step``, instrument/vllm/sampling.py; any other step costs a few comparisons): for a
sampled ``engine_step`` (or more than ``FEW_SAMPLED`` sampled requests in flight) vLLM's
per-step lists, dicts and sets by reference (vLLM builds them anew each step; None for those
of a plain decode step: one token scheduled and sampled per request); else a PARTIAL row of
the step's counts and the few requests the sampled ones' spans need (found with C scans of
vLLM's lists, :func:`~instrument.vllm.hooks.tap.few_rows`); a few ints and ``perf_counter`` times; the update wrapper counts the tokens
sampled per request in one C pass (``map(len, ...)``, while vLLM's lists are still warm in
the caches) and compares a few ints to see whether a send is due (the engine went idle;
``MAX_HELD`` rows; 2 s after the last send with ``LEAST_HELD`` rows, about 64 steps; 10 s
after it). An arrival, preemption or end appends one row. Nothing else is read per
scheduled request on vLLM's side (only a new request's computed tokens, blocks and token
count, once): at a send
(still on the engine thread, instrument/vllm/sink.py) ``marshal`` packs the rows in C,
and the exporter process follows each request across steps (instrument/vllm/steps.py).
Whatever the engine thread runs between two model steps finds the CPU's caches cold (the
same few lines cost 3-5× their cost in a loop; a call to a small helper function cost ~3 µs
there), so the rows are built inline in the wrappers. No span, dict or string is made per
token (docs/spans.md "vLLM").

Another vLLM release may rename any of this: :func:`check_scheduler` (hooks/shape.py) reads
the wrapped methods' signatures and every field used on the installed vLLM before anything is
wrapped, and decides the differences between releases once (a resumed request sent as cached
with ``resumed_req_ids`` on 0.32 / 0.33, re-sent in full as new on 0.34; the waiting queues
vLLM counts); a vLLM that differs gets one log line naming what differs and runs untraced.
"""

from __future__ import annotations

import logging
import sys
import time
from typing import Any

from instrument.vllm.facts import FINISHED_ABORTED, FINISHED_ERROR, FINISHED_LENGTH, FINISHED_STOPPED, StepFacts
from instrument.vllm.hooks.shape import CHECKED_RELEASES, SchedulerShape, check_scheduler, installed_version
from instrument.vllm.hooks.tap import (
    ARRIVED,
    FINISHED,
    LEAST_HELD,
    MAX_HELD,
    PARTIAL,
    PREEMPTED,
    SCHEDULED,
    UPDATED,
    StepTap,
    few_rows,
    new_rows,
)
from instrument.vllm.rows import FEW_SAMPLED
from instrument.vllm.sampling import MASK64, STEP_SPREAD

__all__ = ["ARRIVED", "CHECKED_RELEASES", "FINISHED", "FINISHED_ABORTED", "FINISHED_ERROR", "FINISHED_LENGTH",
           "FINISHED_STOPPED", "LEAST_HELD", "MAX_HELD", "PREEMPTED", "SCHEDULED", "UPDATED", "SchedulerShape", "StepFacts",
           "StepTap", "check_scheduler", "clock_start", "install", "installed_version"]

_MARK = "_tokentrace_tap"
log = logging.getLogger("tokentrace.vllm")


def clock_start() -> tuple[int, int]:
    """(the thread's CPU clock now, ns; what reading it costs here, ns): timing a few µs of
    work with a clock that is a system call (~0.25 µs warm, several µs with cold caches), the
    window also holds one read's cost, measured just before and subtracted.

    Three reads: the first, cold after a model step, is only a warm-up. The interval between
    a cold read and the next holds the cold read's return path (~3-4 µs more than a warm
    interval in benchmarks/clock_floor.py), so a floor taken from it made every window read
    that much short; the floor is the interval between the two warm reads, like the one
    that closes the window."""
    time.thread_time_ns()
    first = time.thread_time_ns()
    now = time.thread_time_ns()
    return now, now - first


def install(tap: StepTap, shape: SchedulerShape) -> bool:
    """Wrap the scheduler's methods so they report to ``tap``; False when already installed.

    ``shape``: what :func:`check_scheduler` found on the installed vLLM (call it first); its
    differences between releases are bound here, once, never looked at per step.
    """
    from vllm.v1.core.sched.scheduler import Scheduler

    if getattr(Scheduler, _MARK, None) is not None:
        return False
    schedule, update = Scheduler.schedule, Scheduler.update_from_output
    preempt, free, add = Scheduler._preempt_request, Scheduler._free_request, Scheduler.add_request
    finish, shutdown = Scheduler.finish_requests, Scheduler.shutdown

    # every wrapper made before any is set: one that cannot be made leaves the class as it was
    traced_schedule, traced_update = _traced_schedule(schedule, tap, shape), _traced_update(update, tap)
    traced_preempt = _noting(preempt, tap, tap.on_preempt)
    traced_free = _noting(free, tap, lambda sched, request: tap.on_free(request))
    traced_add = _noting(add, tap, lambda sched, request: tap.on_add(request))
    traced_finish = _traced_finish(finish, tap, update.__code__)
    traced_shutdown = _traced_shutdown(shutdown, tap)

    Scheduler.schedule = traced_schedule
    Scheduler.update_from_output = traced_update
    Scheduler._preempt_request = traced_preempt
    Scheduler._free_request = traced_free
    Scheduler.add_request = traced_add
    Scheduler.finish_requests = traced_finish
    Scheduler.shutdown = traced_shutdown
    setattr(Scheduler, _MARK, tap)

    def uninstall() -> None:
        """vLLM's own step methods back (a wrapper raised: vLLM runs on untraced)."""
        Scheduler.schedule, Scheduler.update_from_output = schedule, update

    tap.uninstall = uninstall
    return True


# The step wrappers (_traced_schedule, _traced_update): per step, each appends one row
# (instrument/vllm/rows.py): a tuple of vLLM's own per-step lists, dicts and sets, taken by
# reference, and a few ints. The rows are built in the wrappers, inline: code run between two
# model steps finds the CPU's caches cold, and a call to a helper function cost ~3 µs there
# (measured); what is read from the lists waits for the send (marshal, in C, many steps at
# once). What the wrappers use comes in as positional defaults after vLLM's own parameters
# (copied from one tuple at the call, where closure cells and globals are each an object of
# their own, cold; keyword-only defaults cost more than either: a dict lookup each at the
# call, benchmarks/cold_capture.py), and a wrapper that raised takes the plugin's wrappers off
# the class (tap.fail), so nothing checks per step whether tracing still runs (or is measured:
# tap.measure is read once, at install).
# A plain decode step (every scheduled request scheduled one token, none new) holds None
# for num_scheduled_tokens; an update where every request sampled one token of one
# scheduled holds None for the runner's ids and counts: vLLM frees those itself, marshal
# does not read them cold (instrument/vllm/steps.py reads None as one token each).
# vLLM 0.32's signature (tests/vllm_step_scenario.py checks it), not *args / **kwargs: no
# tuple and dict packed per step
def _traced_schedule(schedule: Any, tap: StepTap, shape: SchedulerShape) -> Any:
    """vLLM's ``schedule`` appending the step's SCHEDULED row to ``tap.held`` (the comment
    above says how the wrappers are built)."""
    from collections import deque
    from operator import attrgetter

    from vllm.v1.core.sched.request_queue import FCFSRequestQueue

    held = tap.held  # (never rebound)
    # releases that re-send a resumed request in full as new (0.34) have no resumed_req_ids:
    # the row's slot then holds 0 (what ().count returns for anything: a C call, like the
    # attrgetter it stands for; the reader takes a false value as no resumed request)
    resumed_of = attrgetter("resumed_req_ids") if shape.resumed_in_cached else ().count
    # vLLM's waiting queues (Scheduler.get_request_counts sums them): one C call gives them all
    # (two at least: check_scheduler requires kv_holding_waiting, so it gives a tuple)
    queues_of = attrgetter(*shape.waiting_queues)
    # engine_step spans (instrument/vllm/sampling.py); a keep policy: every step's row whole
    step_bound = MASK64 + 1 if tap.keeps else tap.sampling.step_bound
    # the FCFS waiting queue (vLLM's default policy) is a deque whose __len__ is a Python method
    # (super().__len__()): its C length is read directly, a Python call there costs µs
    fcfs, deque_len = FCFSRequestQueue, deque.__len__

    def traced_schedule(self: Any, throttle_prefills: bool = False, _schedule: Any = schedule,
                        _perf: Any = time.perf_counter_ns, _append: Any = held.append, _tap: StepTap = tap,
                        _measure: bool = tap.measure, _kind: int = SCHEDULED, _fcfs: type = fcfs,
                        _deque_len: Any = deque_len, _new_rows: Any = new_rows, _id: Any = id, _len: Any = len,
                        _type: Any = type, _sum: Any = sum, _map: Any = map, _queues_of: Any = queues_of,
                        _resumed_of: Any = resumed_of, _sampled: set[str] = tap.sampled_ids,
                        _step_bound: int = step_bound, _spread: int = STEP_SPREAD, _mask: int = MASK64,
                        _recorded: dict[int, Any] = tap.recorded, _few: int = FEW_SAMPLED, _partial: int = PARTIAL,
                        _few_rows: Any = few_rows, _recomputing: set[str] = tap.recomputing) -> Any:
        start = _perf()
        out = _schedule(self, throttle_prefills)
        total = out.total_num_scheduled_tokens
        if total > 0:
            cpu, floor = clock_start() if _measure else (0, 0)
            wall = _perf() if cpu else 0
            try:
                # this step's engine_step span sampled (sampling.py's step_sampled, inlined), or
                # more than a few sampled requests in flight: the step's whole row; a few: a
                # PARTIAL row of the requests their spans need; none: nothing
                if (self.current_step * _spread) & _mask < _step_bound or _len(_sampled) > _few:
                    free = _tap.free_queue or (_tap.geometry(self) and _tap.free_queue)
                    cached, news, queues = out.scheduled_cached_reqs, out.scheduled_new_reqs, _queues_of(self)
                    ids = cached.req_ids
                    _append((_kind, _id(out), self.current_step, start, _perf(),
                             _sum(_map(_deque_len if _type(queues[0]) is _fcfs else _len, queues)), free.num_free_blocks,
                             None if total == _len(ids) and not news else out.num_scheduled_tokens,
                             _new_rows(news) if news else None, ids, _resumed_of(cached), cached.new_block_ids,
                             cached.num_computed_tokens, cached.num_output_tokens))
                    _recorded[_id(out)] = True
                    _tap.needs_send = True
                elif _sampled:
                    _tap.free_queue or _tap.geometry(self)
                    cached, news = out.scheduled_cached_reqs, out.scheduled_new_reqs
                    ids, outputs = cached.req_ids, cached.num_output_tokens
                    if _recomputing or 0 in outputs:  # a cached request may be in a prefill: tap.few_rows
                        few = _few_rows(out, cached, _sampled, _recomputing, _resumed_of(cached))
                    else:  # cached ones decode (none preempted or without an output yet): new and sampled ones
                        few, tokens_of = [], out.num_scheduled_tokens
                        for new in news:
                            given, so_far = new.block_ids, new.prefill_token_ids
                            few.append((new.req_id, new.num_computed_tokens, _len(given[0]) if given else 0,
                                        -1 if so_far is None else -2 - _len(so_far), False, tokens_of[new.req_id]))
                        for req_id in _sampled:
                            if req_id in tokens_of:
                                try:
                                    j = ids.index(req_id)
                                except ValueError:  # scheduled as new: there already
                                    continue
                                given = cached.new_block_ids[j]
                                few.append((req_id, cached.num_computed_tokens[j], _len(given[0]) if given else 0,
                                            outputs[j], False, tokens_of[req_id]))
                    _append((_partial, _id(out), self.current_step, start, _perf(), _len(ids) + _len(news), total,
                             few))
                    _recorded[_id(out)] = few
                    _tap.needs_send = True
            except Exception:  # noqa: BLE001 - a hook never breaks vLLM: the tap stops and says why
                _tap.fail()
            if cpu:
                spent = time.thread_time_ns() - cpu - floor
                _tap.hook_cpu_ns += spent
                _tap.schedule_cpu_ns += spent
                _tap.hook_wall_ns += _perf() - wall
        return out

    return traced_schedule


def _traced_update(update: Any, tap: StepTap) -> Any:
    """vLLM's ``update_from_output`` appending the step's UPDATED row (tokens sampled per
    request) and sending the held rows when a send is due."""
    held = tap.held  # (never rebound)

    def traced_update(self: Any, scheduler_output: Any, model_runner_output: Any, _update: Any = update,
                      _perf: Any = time.perf_counter_ns, _append: Any = held.append, _held: list[Any] = held,
                      _tap: StepTap = tap, _measure: bool = tap.measure, _kind: int = UPDATED,
                      _most: int = MAX_HELD, _least: int = LEAST_HELD, _id: Any = id, _len: Any = len,
                      _map: Any = map, _sum: Any = sum, _recorded_pop: Any = tap.recorded.pop) -> Any:
        result = _update(self, scheduler_output, model_runner_output)
        cpu, floor = clock_start() if _measure else (0, 0)
        wall = _perf() if cpu else 0
        try:
            end = _perf()
            held_as = _recorded_pop(_id(scheduler_output), None)
            if held_as is True:  # its SCHEDULED row is held
                ids, sampled = model_runner_output.req_ids, model_runner_output.sampled_token_ids
                n = _len(ids)
                # one token scheduled and one sampled per request (without drafts a request samples
                # at most one): None, None; else tokens sampled per request, counted now in one C
                # pass while vLLM's lists are warm (held, they would be read and freed cold)
                if scheduler_output.total_num_scheduled_tokens == n and _sum(_map(_len, sampled)) == n:
                    _append((_kind, _id(scheduler_output), end, None, None))
                else:
                    _append((_kind, _id(scheduler_output), end, ids, [*_map(_len, sampled)]))
                _tap.needs_send = True
            elif held_as is not None:  # its PARTIAL row: tokens sampled by the requests it carries
                ids, sampled = model_runner_output.req_ids, model_runner_output.sampled_token_ids
                named, counts = [], []
                for row in held_as:
                    try:
                        j = ids.index(row[0])
                    except ValueError:  # (not in the runner's output)
                        continue
                    named.append(row[0])
                    counts.append(_len(sampled[j]))
                _append((_kind, _id(scheduler_output), end, named, counts))
                _tap.needs_send = True
            idle = not self.requests
            if idle or _len(_held) >= _most or end >= _tap.due_ns and (_len(_held) >= _least or end >= _tap.late_ns):
                _tap.send(idle)
            if cpu:
                _tap.hook_cpu_ns += time.thread_time_ns() - cpu - floor
                _tap.hook_wall_ns += _perf() - wall
                # (only when measuring: TOKENTRACE_VLLM_STATS; every step, recorded or not)
                _tap.steps += bool(model_runner_output.req_ids)
                _tap.tokens += _sum(_map(_len, model_runner_output.sampled_token_ids))
        except Exception:  # noqa: BLE001 - a hook never breaks vLLM: the tap stops and says why
            _tap.fail()
        return result

    return traced_update


def _noting(method: Any, tap: StepTap, note: Any) -> Any:
    """``method`` with ``note(scheduler, request)`` called first (once per request event)."""
    def traced(self: Any, request: Any, *args: Any, **kwargs: Any) -> Any:
        if not tap.failed:
            try:
                note(self, request)
            except Exception:  # noqa: BLE001 - a hook never breaks vLLM: the tap stops and says why
                tap.fail()
        return method(self, request, *args, **kwargs)

    return traced


def _traced_finish(finish: Any, tap: StepTap, update_code: Any) -> Any:
    """vLLM's ``finish_requests``, sending at once the end of a request aborted outside a step
    (``update_code``: ``update_from_output``'s code, whose own calls wait for its row)."""
    held = tap.held  # (never rebound)

    def traced_finish(self: Any, *args: Any, **kwargs: Any) -> Any:
        result = finish(self, *args, **kwargs)
        if not tap.failed:
            cpu, floor = clock_start() if tap.measure else (0, 0)
            wall = time.perf_counter_ns() if cpu else 0
            try:  # an abort from the frontend, outside a step: its end goes out now
                # (not when update_from_output itself finishes requests: its step's row comes after)
                if held and held[-1][0] == FINISHED and sys._getframe(1).f_code is not update_code:
                    tap.send(not self.requests)
            except Exception:  # noqa: BLE001 - a hook never breaks vLLM: the tap stops and says why
                tap.fail()
            if cpu:
                tap.hook_cpu_ns += time.thread_time_ns() - cpu - floor
                tap.hook_wall_ns += time.perf_counter_ns() - wall
        return result

    return traced_finish


def _traced_shutdown(shutdown: Any, tap: StepTap) -> Any:
    """vLLM's ``shutdown``, closing the plugin's pipeline (``tap.on_shutdown``) first."""

    def traced_shutdown(self: Any, *args: Any, **kwargs: Any) -> Any:
        callback, tap.on_shutdown = tap.on_shutdown, None
        if callback is not None:
            try:
                callback()
            except Exception:
                log.exception("tokentrace: closing the vLLM span pipeline failed")
        return shutdown(self, *args, **kwargs)

    return traced_shutdown
