"""What the plugin's per-step capture adds to vLLM's engine thread, caches cold, frames included.

Inside vLLM (benchmarks/vllm_tracing_cost.py) the plugin times itself with the thread's CPU
clock around the code inside its two scheduler wrappers and its sends; that leaves out the
wrappers' own frames (a Python call each, per step) and reads a clock that is a system call
in the middle of what it times. Here the same wrappers (those instrument/vllm/hooks/
``install`` puts on vLLM 0.32's ``Scheduler``, made around stand-ins of its ``schedule`` /
``update_from_output`` that return prepared objects, as tests/vllm_step_scenario.py does) run on
vLLM's own per-step objects (``SchedulerOutput``, ``CachedRequestData``,
``ModelRunnerOutput``) of a decode batch of ``--batch`` requests, built afresh for every step
as vLLM builds them, and each call is timed whole with ``perf_counter_ns`` (vDSO, no system
call) against the same call to the bare stand-in, interleaved step by step. Before each
timed call ``--evict-mib`` of memory streams through the caches (a stand-in for the model
step; 32 MiB: beyond this machine's caches, as a CPU model's weights; ~4: vLLM's own Python
between two steps). Sends happen as in vLLM (``LEAST_HELD`` rows, about every 64 steps; the
due time is set to 0): the held rows packed with ``pack`` into one message and freed, no
socket (its cost is counted in vllm_tracing_cost.py's ``socket_cpu_ns``).

Sides, interleaved step by step (the order rotating): ``bare`` (the stand-ins alone),
``pass-through`` (wrappers that only call through: a wrapper frame's own cost, which the
self-timing inside vLLM leaves out), and three of the plugin: ``whole`` (the step's
``engine_step`` sampled: vLLM's lists held by reference), ``few`` (``--sampled`` requests
traced, engine_step spans off: a PARTIAL row) and ``none`` (nothing traced, steps off: no
row). ``--baseline DIR`` adds the same three of another checkout's plugin (a ``git
worktree``), imported beside this one's, marked ``b``. ``--turnover``: one request new in
each step, as at steady load, instead of a pure decode batch. Prints the median schedule and
update call of bare, then per plugin side, µs per step: what its schedule and update calls
add over bare (medians), its sends (the packing's wall time summed, per step) and the total,
per token too. This is harsher than vLLM: nothing runs between the eviction and the call but
the building of the step's objects, so the interpreter's own code is cold too, where vLLM's
scheduler and runner have just warmed much of it; compare sides within one run. Sides are not
quite equal even then: the same code as its own baseline read ~10-25 % dearer than its ``b``
sides (2026-12-06, benchmarks/RESULTS.md).

Run (vLLM's venv, built by scripts/test-vllm):
  BUILD_ONLY=1 ./scripts/test-vllm
  .venv-vllm/bin/python benchmarks/cold_capture.py --steps 2000 --batch 8 --evict-mib 32 \
      [--sampled 1] [--turnover] [--baseline DIR]
"""

from __future__ import annotations

import argparse
import importlib
import statistics
import sys
import time
from pathlib import Path
from types import SimpleNamespace
from typing import Any

from vllm.v1.core.sched.output import CachedRequestData, NewRequestData, SchedulerOutput
from vllm.v1.core.sched.request_queue import FCFSRequestQueue
from vllm.v1.core.sched.scheduler import Scheduler
from vllm.v1.outputs import ModelRunnerOutput

from instrument.vllm import hooks
from instrument.vllm import rows as rows_module
from instrument.vllm import sampling as sampling_module

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
    sched.kv_holding_waiting = FCFSRequestQueue()
    sched.async_kv_waiting = FCFSRequestQueue()
    sched.requests = {"live": None}  # never empty: no IDLE send
    return sched


def step_objects(ids: list[str], step: int, turnover: bool = False) -> tuple[Any, Any]:
    """vLLM's objects of one decode step of ``ids`` (fresh lists and ints, the same id strings);
    ``turnover``: one request of them (in turn, the sampled one's every len(ids) steps) new in
    this step, its 32-token prompt in one chunk, as at steady load when one ends each step."""
    n = len(ids)
    fresh = step % n if turnover else -1
    cached_ids = [r for i, r in enumerate(ids) if i != fresh]
    blocks = [([1000 + step],) if (step + i) % 128 == 0 else None for i in range(len(cached_ids))]
    cached = CachedRequestData(req_ids=cached_ids, resumed_req_ids=set(), new_token_ids=[], all_token_ids={},
                               new_block_ids=blocks, num_computed_tokens=[500 + step + i for i in range(len(cached_ids))],
                               num_output_tokens=[300 + step + i for i in range(len(cached_ids))])
    news = [] if fresh < 0 else [NewRequestData(
        req_id=ids[fresh], prompt_token_ids=list(range(32)), mm_features=[], sampling_params=None, pooling_params=None,
        block_ids=([2000 + step, 2001 + step],), num_computed_tokens=0, lora_request=None)]
    tokens = {r: 1 for r in cached_ids}
    if news:
        tokens[ids[fresh]] = 32
    out = SchedulerOutput(scheduled_new_reqs=news, scheduled_cached_reqs=cached,
                          num_scheduled_tokens=tokens, total_num_scheduled_tokens=sum(tokens.values()),
                          scheduled_spec_decode_tokens={}, scheduled_encoder_inputs={}, finished_req_ids=set(),
                          free_encoder_mm_hashes=[])
    runner = ModelRunnerOutput(req_ids=ids[:], req_id_to_index={r: i for i, r in enumerate(ids)},
                               sampled_token_ids=[[20_000 + step + i] for i in range(n)])
    return out, runner


def _baseline(checkout: Path) -> SimpleNamespace:
    """The plugin's hooks, tap, sampling and rows modules of another checkout, imported beside
    this one's (each keeps its own module globals; sys.modules is put back after)."""
    if not (checkout / "instrument" / "vllm" / "hooks").is_dir():
        raise SystemExit(f"cold_capture: --baseline {checkout} is not a tokentrace checkout")
    ours = {name: module for name, module in sys.modules.items() if name.split(".")[0] == "instrument"}
    for name in ours:
        del sys.modules[name]
    sys.path.insert(0, str(checkout))
    try:
        found = SimpleNamespace(**{name: importlib.import_module(f"instrument.vllm.{name}")
                                   for name in ("hooks", "sampling", "rows")})
    finally:
        sys.path.remove(str(checkout))
        for name in [name for name in sys.modules if name.split(".")[0] == "instrument"]:
            del sys.modules[name]
        sys.modules.update(ours)
    return found


def _tap(code: Any, sampling: Any, sampled: list[str], sends: list[int]) -> Any:
    """A tap of ``code`` (this checkout's modules or a baseline's) whose sends pack the held
    rows into one message and free them (no socket), each send's wall time appended to
    ``sends``; ``sampled``: the requests it traces."""
    tap = code.hooks.StepTap(send=None, sampling=sampling)
    pack, message = code.rows.pack, code.rows.message
    clock = time.perf_counter_ns

    def send(idle: bool) -> None:
        start = clock()
        if tap.worth_sending(idle):
            header, rows = tap.take(idle)
            pack(message(header, 1, rows))
            rows = None
        sends.append(clock() - start)

    tap.send = send
    tap._geometry = (128, 128 * 23_040, 10_000)
    tap.free_queue = SimpleNamespace(num_free_blocks=9_000)
    tap.due_ns, tap.late_ns = 0, 2**62  # a send once LEAST_HELD rows are held, as under steady load
    tap.sampled_ids.update(sampled)
    return tap


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter,
                                     epilog="example: .venv-vllm/bin/python benchmarks/cold_capture.py --steps 2000")
    parser.add_argument("--steps", type=int, default=2000, help="steps timed per side (default 2000)")
    parser.add_argument("--batch", type=int, default=8, help="requests decoding in each step (default 8)")
    parser.add_argument("--evict-mib", type=int, default=32, help="memory streamed before each timed call, MiB")
    parser.add_argument("--sampled", type=int, default=1,
                        help="sampled requests in the batch on the 'few' side (default 1)")
    parser.add_argument("--turnover", action="store_true",
                        help="one request new in each step (steady load), not a pure decode batch")
    parser.add_argument("--baseline", type=Path, metavar="DIR",
                        help="another checkout (a git worktree): its plugin's sides too, marked 'b', interleaved")
    args = parser.parse_args()
    codes = {"": SimpleNamespace(hooks=hooks, sampling=sampling_module, rows=rows_module)}
    if args.baseline is not None:
        codes[" b"] = _baseline(args.baseline)

    shape = hooks.check_scheduler()  # (on vLLM's own methods: the stand-ins below are not checked)
    Scheduler.schedule, Scheduler.update_from_output = bare_schedule, bare_update
    ids = [f"chatcmpl-{i:032x}-{i:08x}" for i in range(args.batch)]
    # the plugin's sides: whole (its engine_step sampled: the step's whole row), few (steps
    # off, --sampled requests traced: a PARTIAL row), none (steps off, nothing traced)
    plugin_sides = [(kind + mark, code) for mark, code in codes.items() for kind in ("whole", "few", "none")]
    sends: dict[str, list[int]] = {side: [] for side, _ in plugin_sides}
    sides: dict[str, Any] = {"bare": engine(Bare), "pass-through": engine(PassThrough)}
    for side, code in plugin_sides:
        Sampling = code.sampling.Sampling
        sampling, sampled = {"whole": (Sampling(), []), "few": (Sampling(step_ratio=0.0), ids[:args.sampled]),
                             "none": (Sampling(step_ratio=0.0), [])}[side.split()[0]]
        tap = _tap(code, sampling, sampled, sends[side])
        traced = type(side, (), {"schedule": code.hooks._traced_schedule(bare_schedule, tap, shape),
                                 "update_from_output": code.hooks._traced_update(bare_update, tap)})
        sides[side] = engine(traced)
    buf = bytearray(args.evict_mib << 20)
    times: dict[tuple[str, str], list[int]] = {(s, m): [] for s in sides for m in ("schedule", "update")}
    clock = time.perf_counter_ns

    def evict() -> None:
        buf[::64] = bytes(len(buf[::64]))  # one write per cache line

    def timed_step(side: str, sched: Any, step: int) -> None:
        # vLLM builds a step's objects just before the wrappers read them (schedule() its
        # SchedulerOutput, the model runner its output): built after the eviction, so warm
        evict()
        out, runner = step_objects(ids, step, args.turnover)
        NEXT["out"] = out
        sched.current_step = step
        start = clock()
        sched.schedule()
        end = clock()
        times[side, "schedule"].append(end - start)
        evict()
        runner = step_objects(ids, step, args.turnover)[1]
        held = len(sends.get(side, ()))
        start = clock()
        sched.update_from_output(out, runner)
        end = clock()
        if len(sends.get(side, ())) == held:  # a step without a send (the send is timed on its own)
            times[side, "update"].append(end - start)

    names = list(sides)
    run_cpu, run_wall = time.thread_time_ns(), time.perf_counter_ns()
    for step in range(args.steps):  # interleaved: every side in every step, the order rotating
        turn = step % len(names)
        for side in names[turn:] + names[:turn]:
            timed_step(side, sides[side], step)
    run_cpu, run_wall = time.thread_time_ns() - run_cpu, time.perf_counter_ns() - run_wall
    _report(args, times, sends, run_cpu, run_wall)


def _report(args: argparse.Namespace, times: dict[tuple[str, str], list[int]], sends: dict[str, list[int]],
            run_cpu: int, run_wall: int) -> None:
    """Medians per call (ns) over bare, and the sends per step, per side; 72 columns."""
    def median(side: str, method: str) -> float:
        return statistics.median(times[side, method])

    print(f"batch {args.batch}{' (one new each step)' if args.turnover else ''}, {args.steps} steps per side,\n"
          f"{args.evict_mib} MiB streamed before each call; 'few': {args.sampled} request(s)\ntraced, "
          "engine_step spans off")
    # windows are wall time: one that another process interrupted reads long (the medians
    # resist a few); the thread's CPU over the run next to its wall time says how often
    print(f"run: {run_wall / 1e9:.1f} s wall, {run_cpu / 1e9:.1f} s thread CPU ({run_cpu / run_wall:.0%} on a CPU)")
    frame = sum(median("pass-through", m) - median("bare", m) for m in ("schedule", "update"))
    print(f"bare calls, ns: schedule {median('bare', 'schedule'):.0f}, update {median('bare', 'update'):.0f}; "
          f"two wrapper\nframes add {frame / 1000:.2f} µs per step (pass-through)\n")
    print(f"{'µs per step':<12} {'schedule':>9} {'update':>7} {'sends':>7} {'added':>7} {'µs/token':>9}")
    for side in sends:
        added = [median(side, m) - median("bare", m) for m in ("schedule", "update")]
        per_step = sum(sends[side]) / args.steps
        total = (sum(added) + per_step) / 1000
        print(f"{side:<12} {added[0] / 1000:9.2f} {added[1] / 1000:7.2f} {per_step / 1000:7.2f} {total:7.2f} "
              f"{total / args.batch:9.3f}")
    print("(sends: the packing's wall time summed over the run, per step; no socket)")


if __name__ == "__main__":
    main()
