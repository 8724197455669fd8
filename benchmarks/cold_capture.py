"""What the plugin's per-step capture adds to vLLM's engine thread, caches cold, frames included.

Inside vLLM (benchmarks/vllm_tracing_cost.py) the plugin times itself with the thread's CPU
clock around the code inside its two scheduler wrappers and its sends; that leaves out the
wrappers' own frames (a Python call each, per step) and reads a clock that is a system call
in the middle of what it times. Here the same wrappers (instrument/vllm/hooks/ ``install``,
on vLLM 0.32's own ``Scheduler`` class, its ``schedule`` / ``update_from_output`` replaced
first by stand-ins that return prepared objects, as tests/vllm_step_scenario.py does) run on
vLLM's own per-step objects (``SchedulerOutput``, ``CachedRequestData``,
``ModelRunnerOutput``) of a decode batch of ``--batch`` requests, built afresh for every step
as vLLM builds them, and each call is timed whole with ``perf_counter_ns`` (vDSO, no system
call) against the same call to the bare stand-in, interleaved step by step. Before each
timed call ``--evict-mib`` of memory streams through the caches (a stand-in for the model
step; 32 MiB: beyond this machine's caches, as a CPU model's weights; ~4: vLLM's own Python
between two steps). Sends happen as in vLLM (``LEAST_HELD`` rows, about every 64 steps; the
due time is set to 0): the held rows packed with ``pack`` into one message and freed, no
socket (its cost is counted in vllm_tracing_cost.py's ``socket_cpu_ns``).

Three sides, interleaved step by step: ``bare`` (the stand-ins alone), ``pass-through``
(wrappers that only call through: a wrapper frame's own cost, which the self-timing inside
vLLM leaves out) and ``plugin``. Prints per step, ns: the median schedule and update call of
each side (the interquartile ranges of bare and plugin beside them), what the plugin adds
and what a frame alone adds; then, µs, the sends' median over the steps they cover, and the
total per step and per token (batch tokens per step). This is harsher than vLLM: nothing runs between the eviction and the call but the
building of the step's objects, so the interpreter's own code is cold too, where vLLM's
scheduler and runner have just warmed much of it; compare sides within one run.

Run (vLLM's venv, built by scripts/test-vllm):
  BUILD_ONLY=1 ./scripts/test-vllm
  .venv-vllm/bin/python benchmarks/cold_capture.py --steps 2000 --batch 8 --evict-mib 32
"""

from __future__ import annotations

import argparse
import statistics
import time
from types import SimpleNamespace
from typing import Any

from vllm.v1.core.sched.output import CachedRequestData, SchedulerOutput
from vllm.v1.core.sched.request_queue import FCFSRequestQueue
from vllm.v1.core.sched.scheduler import Scheduler
from vllm.v1.outputs import ModelRunnerOutput

from instrument.vllm import hooks
from instrument.vllm.hooks import StepTap
from instrument.vllm.rows import message, pack

NEXT: dict[str, Any] = {}  # what the stand-in schedule() returns next


def bare_schedule(self: Any, throttle_prefills: bool = False) -> Any:
    return NEXT["out"]


def bare_update(self: Any, scheduler_output: Any, model_runner_output: Any) -> Any:
    return NEXT


class Bare:
    """An engine without the plugin: the stand-ins as its scheduler's methods."""

    schedule = bare_schedule
    update_from_output = bare_update


def _through_schedule(self: Any, throttle_prefills: bool = False) -> Any:
    return bare_schedule(self, throttle_prefills)


def _through_update(self: Any, scheduler_output: Any, model_runner_output: Any) -> Any:
    return bare_update(self, scheduler_output, model_runner_output)


class PassThrough:
    """Wrappers that only call through (the plugin's signatures): what a wrapper's own frame
    costs, which the plugin's self-timing inside vLLM leaves out."""

    schedule = _through_schedule
    update_from_output = _through_update


def engine(cls: type) -> Any:
    """A scheduler instance of ``cls`` with the attributes the wrappers read."""
    sched = cls.__new__(cls)
    sched.current_step = 0
    sched.waiting = FCFSRequestQueue([None, None])
    sched.requests = {"live": None}  # never empty: no IDLE send
    return sched


def step_objects(ids: list[str], step: int) -> tuple[Any, Any]:
    """vLLM's objects of one decode step of ``ids`` (fresh lists and ints, the same id strings)."""
    n = len(ids)
    blocks = [([1000 + step],) if (step + i) % 128 == 0 else None for i in range(n)]
    cached = CachedRequestData(req_ids=ids[:], resumed_req_ids=set(), new_token_ids=[], all_token_ids={},
                               new_block_ids=blocks, num_computed_tokens=[500 + step + i for i in range(n)],
                               num_output_tokens=[300 + step + i for i in range(n)])
    out = SchedulerOutput(scheduled_new_reqs=[], scheduled_cached_reqs=cached,
                          num_scheduled_tokens={r: 1 for r in ids}, total_num_scheduled_tokens=n,
                          scheduled_spec_decode_tokens={}, scheduled_encoder_inputs={}, finished_req_ids=set(),
                          free_encoder_mm_hashes=[])
    runner = ModelRunnerOutput(req_ids=ids[:], req_id_to_index={r: i for i, r in enumerate(ids)},
                               sampled_token_ids=[[20_000 + step + i] for i in range(n)])
    return out, runner


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter,
                                     epilog="example: .venv-vllm/bin/python benchmarks/cold_capture.py --steps 2000")
    parser.add_argument("--steps", type=int, default=2000, help="steps timed per side (default 2000)")
    parser.add_argument("--batch", type=int, default=8, help="requests decoding in each step (default 8)")
    parser.add_argument("--evict-mib", type=int, default=32, help="memory streamed before each timed call, MiB")
    args = parser.parse_args()

    sends: list[int] = []
    tap = StepTap(send=None)
    clock = time.perf_counter_ns

    def send(idle: bool) -> None:
        start = clock()
        header, rows = tap.take(idle)
        pack(message(header, 1, rows))
        rows = None
        sends.append(clock() - start)

    tap.send = send
    tap._geometry = (128, 128 * 23_040, 10_000)
    tap.free_queue = SimpleNamespace(num_free_blocks=9_000)
    tap.due_ns, tap.late_ns = 0, 2**62  # a send once LEAST_HELD rows are held, as under steady load
    Scheduler.schedule, Scheduler.update_from_output = bare_schedule, bare_update
    assert hooks.install(tap)

    class Traced:
        schedule = Scheduler.schedule  # the plugin's wrappers around the stand-ins
        update_from_output = Scheduler.update_from_output

    sides = {"bare": engine(Bare), "pass-through": engine(PassThrough), "plugin": engine(Traced)}
    buf = bytearray(args.evict_mib << 20)
    ids = [f"chatcmpl-{i:032x}-{i:08x}" for i in range(args.batch)]
    times: dict[tuple[str, str], list[int]] = {(s, m): [] for s in sides for m in ("schedule", "update")}

    def evict() -> None:
        buf[::64] = bytes(len(buf[::64]))  # one write per cache line

    def timed_step(side: str, sched: Any, step: int) -> None:
        # vLLM builds a step's objects just before the wrappers read them (schedule() its
        # SchedulerOutput, the model runner its output): built after the eviction, so warm
        evict()
        out, runner = step_objects(ids, step)
        NEXT["out"] = out
        sched.current_step = step
        start = clock()
        sched.schedule()
        end = clock()
        times[side, "schedule"].append(end - start)
        evict()
        runner = step_objects(ids, step)[1]
        held = len(sends)
        start = clock()
        sched.update_from_output(out, runner)
        end = clock()
        if len(sends) == held:  # a step without a send (the send is timed on its own)
            times[side, "update"].append(end - start)

    names = list(sides)
    run_cpu, run_wall = time.thread_time_ns(), time.perf_counter_ns()
    for step in range(args.steps):  # interleaved: every side in every step, the order rotating
        for side in names[step % 3:] + names[:step % 3]:
            timed_step(side, sides[side], step)

    run_cpu, run_wall = time.thread_time_ns() - run_cpu, time.perf_counter_ns() - run_wall

    def quart(values: list[int]) -> tuple[float, float, float]:
        q1, med, q3 = statistics.quantiles(values, n=4)
        return med, q1, q3

    per_send = statistics.median(sends) if sends else 0.0
    steps_per_send = args.steps / max(1, len(sends))
    print(f"batch {args.batch}, {args.steps} steps per side, {args.evict_mib} MiB streamed before each call")
    # windows are wall time: one that another process interrupted reads long (the medians
    # resist a few); the thread's CPU over the run next to its wall time says how often
    print(f"run: {run_wall / 1e9:.1f} s wall, {run_cpu / 1e9:.1f} s thread CPU ({run_cpu / run_wall:.0%} on a CPU)")
    total = frames = 0.0
    print(f"{'ns per call':<11} {'bare':>7} {'through':>8} {'plugin':>7} {'added':>7} {'frame':>6}   "
          f"{'IQR bare / plugin':>18}")
    for method in ("schedule", "update"):
        bare, through, traced = (quart(times[side, method]) for side in names)
        added = traced[0] - bare[0]
        total += added
        frames += through[0] - bare[0]
        print(f"{method:<11} {bare[0]:7.0f} {through[0]:8.0f} {traced[0]:7.0f} {added:7.0f} {through[0] - bare[0]:6.0f}   "
              f"{bare[2] - bare[1]:>8.0f} / {traced[2] - traced[1]:<7.0f}")
    print(f"sends: {len(sends)}, median {per_send / 1000:,.0f} µs, one per {steps_per_send:.0f} steps: "
          f"{per_send / steps_per_send / 1000:.1f} µs per step")
    total += per_send / steps_per_send
    print(f"added per step: {total / 1000:.1f} µs = {total / args.batch / 1000:.2f} µs per token at batch "
          f"{args.batch}\n(no socket); of it the two wrappers' frames: {frames / 1000:.1f} µs")


if __name__ == "__main__":
    main()
