"""Run by tests/test_vllm_plugin.py with .venv-vllm's Python: the plugin's own schedule and update
wrappers (hooks.install on vLLM's Scheduler class, whose schedule / update_from_output are
replaced first by stand-ins that return prepared outputs) on vLLM's own per-step objects
(SchedulerOutput, NewRequestData, CachedRequestData, ModelRunnerOutput of the installed
vLLM); the rows StepTap.take gives, packed and unpacked as the socket carries them, read by
StepReader, in the cases a live CPU run does not reach: a step scheduled before the previous one was
updated (several steps in flight), num_scheduled_tokens in another order than
scheduled_cached_reqs, a request resumed through scheduled_new_reqs (the V2 model runner), and
ends after the last step. Prints the records read, as one JSON line."""

from __future__ import annotations

import inspect
import json
import time
from types import SimpleNamespace

from vllm.v1.core.sched.output import CachedRequestData, NewRequestData, SchedulerOutput
from vllm.v1.core.sched.request_queue import FCFSRequestQueue
from vllm.v1.core.sched.scheduler import Scheduler
from vllm.v1.outputs import ModelRunnerOutput

from instrument.vllm import hooks
from instrument.vllm.hooks import ARRIVED, FINISHED, PREEMPTED, StepTap
from instrument.vllm.rows import message, pack, unpack
from instrument.vllm.steps import StepReader

READERS: dict[StepTap, StepReader] = {}  # the exporter process's side of the tap
NEXT: dict[str, SchedulerOutput] = {}  # what the stand-in schedule() returns next
# the attributes of a Scheduler instance the wrappers read (requests: never empty, so no send is
# due; waiting: vLLM's default FCFS queues, two requests waiting and one holding KV while waiting:
# three, as Scheduler.get_request_counts counts them)
ENGINE = SimpleNamespace(current_step=0, waiting=FCFSRequestQueue([None, None]),
                         kv_holding_waiting=FCFSRequestQueue([None]), async_kv_waiting=FCFSRequestQueue(),
                         requests={"live": None})
# the signature the schedule wrapper repeats (instrument/vllm/hooks/__init__.py)
SIGNATURE = inspect.signature(Scheduler.schedule)
assert [(p.name, p.default) for p in SIGNATURE.parameters.values()] == [("self", inspect.Parameter.empty),
                                                                      ("throttle_prefills", False)], SIGNATURE
STAND_IN_SCHEDULE = Scheduler.schedule = lambda self, throttle_prefills=False: NEXT["out"]  # (wrapped by install)
FINISH_INSIDE: list[str] = []  # ids the stand-in update finishes itself (vLLM: requests in error)


def stand_in_update(self: object, scheduler_output: object, model_runner_output: object) -> dict:
    """vLLM's update_from_output stand-in; finishes FINISH_INSIDE's ids through
    finish_requests, as vLLM 0.32's own update does for requests in error."""
    for req_id in FINISH_INSIDE:
        TAP.held.append((FINISHED, req_id, 3, 1))  # (what the _free_request wrapper appends)
        Scheduler.finish_requests(self, [req_id], None)
    FINISH_INSIDE.clear()
    return {}


STAND_IN_UPDATE = Scheduler.update_from_output = stand_in_update
Scheduler.finish_requests = lambda self, request_ids, finished_status: []  # (wrapped by install)
SHUT: list[int] = []  # the stand-in shutdown's calls
Scheduler.shutdown = lambda self: SHUT.append(len(TAP.held))
TAP = StepTap(send=None)
TAP.due_ns = 2**62
TAP.free_queue = SimpleNamespace(num_free_blocks=100)  # KV blocks free, as the stand-in block pool says
assert hooks.install(TAP, hooks.check_scheduler())


def new(req_id: str, prompt: int, computed: int, blocks: list[int], tokens: list[int] | None = None) -> NewRequestData:
    return NewRequestData(req_id=req_id, prompt_token_ids=list(range(prompt)), mm_features=[], sampling_params=None,
                          pooling_params=None, block_ids=(blocks,), num_computed_tokens=computed, lora_request=None,
                          prefill_token_ids=tokens)


def cached(rows: list[tuple[str, int, list[int] | None, int]], resumed: set[str] | None = None) -> CachedRequestData:
    """rows: (id, computed before the step, blocks added or None, output tokens so far)."""
    return CachedRequestData(req_ids=[r[0] for r in rows], resumed_req_ids=resumed or set(), new_token_ids=[],
                             all_token_ids={}, new_block_ids=[(r[2],) if r[2] is not None else None for r in rows],
                             num_computed_tokens=[r[1] for r in rows], num_output_tokens=[r[3] for r in rows])


def output(new_reqs: list[NewRequestData], cached_reqs: CachedRequestData, scheduled: dict[str, int]) -> SchedulerOutput:
    return SchedulerOutput(scheduled_new_reqs=new_reqs, scheduled_cached_reqs=cached_reqs,
                           num_scheduled_tokens=scheduled, total_num_scheduled_tokens=sum(scheduled.values()),
                           scheduled_spec_decode_tokens={}, scheduled_encoder_inputs={}, finished_req_ids=set(),
                           free_encoder_mm_hashes=[])


def scheduled(out: SchedulerOutput, step: int, free: int = 98) -> tuple:
    """The row the plugin's schedule wrapper appends when vLLM's schedule() returns ``out``
    as step ``step`` (taken back off the tap, for the scenario to place)."""
    ENGINE.current_step, NEXT["out"], TAP.free_queue.num_free_blocks = step, out, free
    assert Scheduler.schedule(ENGINE) is out
    return TAP.held.pop()


def updated(out: SchedulerOutput, sampled: dict[str, int]) -> tuple:
    """The row the plugin's update wrapper appends for ``out`` and a runner output sampling
    ``sampled`` tokens per request."""
    Scheduler.update_from_output(ENGINE, out, runner(sampled))
    return TAP.held.pop()


def runner(sampled: dict[str, int]) -> ModelRunnerOutput:
    ids = list(sampled)
    return ModelRunnerOutput(req_ids=ids, req_id_to_index={r: i for i, r in enumerate(ids)},
                             sampled_token_ids=[[7] * sampled[r] for r in ids])


def new_tap() -> StepTap:
    """The installed tap, emptied, with a new reader (one scenario each)."""
    TAP.held.clear()
    TAP._geometry = (16, 1024, 100)  # (block tokens, bytes per block, blocks in the pool)
    READERS[TAP] = StepReader()
    return TAP


def taken(tap: StepTap, records: list[dict]) -> None:
    header, rows = tap.take()
    reader = READERS[tap]
    for f in reader.read(unpack(pack(message(header, reader.number + 1, rows)))):  # as the socket carries them
        if f is None:
            continue
        records.append({"step": f.step, "times": [f.start_ns, f.sched_end_ns, f.end_ns], "n": f.n,
                        "batch": [f.batch_size, f.batch_tokens], "req_ids": list(f.req_ids[:f.n]),
                            "tokens": list(f.tokens[:f.n]), "computed": list(f.computed[:f.n]),
                            "prefill": list(f.prefill[:f.n]), "blocks": list(f.blocks[:f.n]),
                        "sampled": list(f.sampled[:f.n]), "first": f.first, "hits": f.prefix_hit_tokens,
                        "kv_used": f.kv_used, "waiting": f.waiting, "arrivals": [a[0] for a in f.arrivals],
                        "preempted": [p[:2] for p in f.preempted], "finished": [e[:2] for e in f.finished]})


def state(tap: StepTap) -> list[int]:
    """What the reader keeps per request: prompts, blocks, phases, ended but still in flight."""
    reader = READERS[tap]
    return [len(reader._prompt), len(reader._blocks), len(reader._phase), len(reader._ending)]


def in_flight(tap: StepTap) -> int:
    """Steps scheduled, not yet updated, as the reader pairs them."""
    return len(READERS[tap]._opened)


def main() -> None:
    tap = new_tap()
    held = tap.held
    records: list[dict] = []

    def take() -> None:
        taken(tap, records)

    def step(k: int, out: SchedulerOutput, sampled: dict[str, int] | None, free: int = 90) -> None:
        held.append(scheduled(out, k, free))
        if sampled is not None:
            held.append(updated(out, sampled))

    held.append((ARRIVED, "a", 1.5, None, 20, True))
    step(1, output([new("a", 20, 0, [0, 1])], cached([]), {"a": 20}), {"a": 1})
    held.append((ARRIVED, "b", 1.6, {"traceparent": "00-" + "1" * 32 + "-" + "2" * 16 + "-01"}, 40, True))
    step(2, output([new("b", 40, 16, [2, 3, 4])], cached([("a", 20, None, 1)]), {"a": 1, "b": 24}), {"a": 1, "b": 1})
    take()
    out3 = output([], cached([("a", 21, None, 2), ("b", 40, None, 1)]), {"a": 1, "b": 1})
    step(3, out3, None)  # scheduled; its update comes after this send
    take()
    held.append(updated(out3, {"a": 1, "b": 1}))
    step(4, output([], cached([("a", 22, [5], 3), ("b", 41, None, 2)]), {"b": 1, "a": 1}), {"b": 1, "a": 1}, free=89)
    take()
    held.append((PREEMPTED, "a", 3, 4950))  # inside schedule(): a is not in step 5
    step(5, output([], cached([("b", 42, None, 3)]), {"b": 1}), {"b": 1}, free=92)
    # a resumed through scheduled_new_reqs (V2 model runner) with its whole block list: 16
    # tokens found in the prefix cache, the other 8 of its 20 + 4 recomputed
    resumed = new("a", 20, 16, [0, 6], tokens=list(range(24)))
    step(6, output([resumed], cached([("b", 43, None, 4)]), {"b": 1, "a": 8}), {"b": 1, "a": 1})
    out7 = output([], cached([("a", 24, None, 5), ("b", 44, None, 5)]), {"a": 1, "b": 1})
    held.append(scheduled(out7, 7, 90))
    held.append((FINISHED, "a", 1, 7850))  # inside update_from_output: before the step's end
    held.append(updated(out7, {"a": 1, "b": 1}))
    held.append((FINISHED, "b", 2, 7950))  # an abort after the step: an events-only record
    take()
    print(json.dumps({"records": records, "held": len(held), "in_flight": in_flight(tap), "steps": sum(1 for r in records if r["step"] >= 0),
                      "tokens": sum(sum(r["sampled"]) for r in records),
                      "state": state(tap), "async": async_end(), "v1": v1_resume(), "v2": v2_live_tokens(),
                      "reuse": id_used_again(), "sends": send_triggers(), "counts": sampled_counts(), "shutdown": shutdown_first(),
                      "now_ns": time.time_ns(), "aborts": abort_sends(), "start": start_failure(),
                      "partial": partial_rows(),
                      "failing": failing_hook()}))  # (last: it takes the wrappers off)


def abort_sends() -> list:
    """finish_requests with an end as the last row held: from the frontend, outside a step, it
    sends at once; from inside vLLM's update_from_output (requests in error) it does not (the
    step's own row comes after). [idle flag of each send]."""
    new_tap()
    sends: list = []
    TAP.send = lambda idle: (sends.append(idle), TAP.held.clear())
    TAP.due_ns = TAP.late_ns = 2**62
    out = output([], cached([("h", 5, None, 1)]), {"h": 1})
    NEXT["out"] = out
    Scheduler.schedule(ENGINE)
    FINISH_INSIDE.append("h")
    Scheduler.update_from_output(ENGINE, out, runner({"h": 1}))
    inside = len(sends)
    TAP.held.append((FINISHED, "i", 0, 2))  # an abort from the frontend, between two steps
    Scheduler.finish_requests(ENGINE, ["i"], None)
    TAP.send = None
    TAP.held.clear()
    return [inside, sends]


def start_failure() -> dict:
    """The span exporter process does not start at the first send (here: RecordSink raises):
    tracing stops with one error line and vLLM's own schedule and update_from_output go back
    on the class (no row held per step after). The wrappers are put back afterwards for the
    scenarios that follow."""
    import instrument.vllm as plugin
    import instrument.vllm.sink as sink_module

    new_tap()
    wrapped = Scheduler.schedule, Scheduler.update_from_output
    plugin._state["tap"], TAP.send = TAP, plugin._start_pipeline
    real = sink_module.RecordSink

    def broken(*args: object, **kwargs: object) -> None:
        raise OSError("no process")

    sink_module.RecordSink = broken
    try:
        out = output([], cached([("g", 5, None, 1)]), {"g": 1})
        NEXT["out"] = out
        Scheduler.schedule(ENGINE)
        idle = SimpleNamespace(current_step=1, waiting=ENGINE.waiting, kv_holding_waiting=ENGINE.kv_holding_waiting,
                               async_kv_waiting=ENGINE.async_kv_waiting, requests={})  # the first send is due
        Scheduler.update_from_output(idle, out, runner({"g": 1}))
    finally:
        sink_module.RecordSink = real
    got = {"failed": TAP.failed, "schedule_back": Scheduler.schedule is STAND_IN_SCHEDULE,
           "update_back": Scheduler.update_from_output is STAND_IN_UPDATE, "held": len(TAP.held),
           "dropped": TAP.dropped_steps}
    Scheduler.schedule, Scheduler.update_from_output = wrapped
    TAP.failed, TAP.send, TAP.dropped_steps = False, None, 0
    return got


def failing_hook() -> dict:
    """A wrapper that raises (here: vLLM's block pool without the counter the schedule wrapper
    reads): the step's output still reaches vLLM, tracing stops, and vLLM's own schedule and
    update_from_output are back on the class, so no later step runs the plugin's code."""
    new_tap()
    TAP.free_queue = SimpleNamespace()  # no num_free_blocks
    out = output([], cached([("f", 5, None, 1)]), {"f": 1})
    NEXT["out"] = out
    wrapped = Scheduler.schedule
    returned = Scheduler.schedule(ENGINE) is out
    return {"returned": returned, "failed": TAP.failed, "was_wrapped": wrapped is not STAND_IN_SCHEDULE,
            "schedule_back": Scheduler.schedule is STAND_IN_SCHEDULE,
            "update_back": Scheduler.update_from_output is STAND_IN_UPDATE, "held": len(TAP.held)}


def send_triggers() -> list:
    """When the update wrapper asks for a send: [(idle, rows held then)] for a step not due, a
    step ending after due_ns with fewer than LEAST_HELD rows, one ending after late_ns, one
    after due_ns with LEAST_HELD rows, MAX_HELD rows held, and the scheduler left with no
    request."""
    new_tap()
    calls: list = []
    TAP.send = lambda idle: (calls.append((idle, len(TAP.held))), TAP.held.clear())
    out = output([], cached([("t", 5, None, 1)]), {"t": 1})

    def step() -> None:
        ENGINE.current_step += 1
        NEXT["out"] = out
        Scheduler.schedule(ENGINE)
        Scheduler.update_from_output(ENGINE, out, runner({"t": 1}))

    def hold(rows: int) -> None:
        TAP.held.extend([(ARRIVED, f"f{i}", 1.0, None, 1, True) for i in range(rows)])

    step()  # not due
    TAP.due_ns, TAP.late_ns = 0, 2**62
    step()  # ends after due_ns, 4 rows held: not enough
    TAP.late_ns = 0
    step()  # ends after late_ns: 6 rows
    TAP.late_ns = 2**62
    hold(hooks.LEAST_HELD - 2)
    step()  # after due_ns, its two rows make LEAST_HELD
    TAP.due_ns = 2**62
    hold(hooks.MAX_HELD - 2)
    step()  # its two rows make MAX_HELD
    ENGINE.requests = {}
    step()  # the scheduler holds no request after it
    ENGINE.requests = {"live": None}
    TAP.send = None
    TAP.held.clear()
    return calls


def shutdown_first() -> list:
    """vLLM's scheduler shutdown (SIGTERM to the server) with a step held, no send due: the
    wrapper calls the plugin's close (on_shutdown) first, the rows still held, then vLLM's
    own shutdown; once: [(who, rows held then)]."""
    new_tap()
    calls: list = []
    TAP.due_ns = TAP.late_ns = 2**62
    TAP.on_shutdown = lambda: calls.append(("tokentrace", len(TAP.held)))
    out = output([], cached([("t", 5, None, 1)]), {"t": 1})
    NEXT["out"] = out
    Scheduler.schedule(ENGINE)
    Scheduler.update_from_output(ENGINE, out, runner({"t": 1}))
    Scheduler.shutdown(ENGINE)
    Scheduler.shutdown(ENGINE)  # (vLLM may call it again: the close runs once)
    calls += [("vllm", held) for held in SHUT]
    TAP.held.clear()
    return calls


def sampled_counts() -> list:
    """The tokens sampled per request as the update wrapper counts them (the lengths of
    vLLM's sampled_token_ids): one, three (speculative decoding: two drafts accepted), and
    none when the runner sends no sampled_token_ids at all (vLLM reads [] as nothing sampled)."""
    tap, records = new_tap(), []
    held = tap.held
    held.append((ARRIVED, "s", 1.0, None, 4, True))
    out1 = output([new("s", 4, 0, [0])], cached([]), {"s": 4})
    held += [scheduled(out1, 1), updated(out1, {"s": 1})]
    out2 = output([], cached([("s", 4, None, 1)]), {"s": 3})
    held += [scheduled(out2, 2), updated(out2, {"s": 3})]
    out3 = output([], cached([("s", 7, None, 4)]), {"s": 1})
    held.append(scheduled(out3, 3))
    Scheduler.update_from_output(ENGINE, out3, ModelRunnerOutput(req_ids=["s"], req_id_to_index={"s": 0},
                                                                 sampled_token_ids=[]))
    taken(tap, records)
    return [r["sampled"] for r in records if r["step"] >= 0]


def id_used_again() -> dict:
    """VLLM_DISABLE_REQUEST_ID_RANDOMIZATION: x aborted outside a step, then a new x arrives
    before the next step; the new x's state survives the old x's end."""
    tap, records = new_tap(), []
    held = tap.held
    held.append((ARRIVED, "x", 1.0, None, 4, True))
    out1 = output([new("x", 4, 0, [0])], cached([]), {"x": 4})
    held += [scheduled(out1, 1), updated(out1, {"x": 1})]
    held += [(FINISHED, "x", 2, 1950), (ARRIVED, "x", 2.0, None, 6, True)]
    out2 = output([new("x", 6, 0, [3])], cached([]), {"x": 6})
    held += [scheduled(out2, 2), updated(out2, {"x": 1})]
    out3 = output([], cached([("x", 6, None, 1)]), {"x": 1})
    held += [scheduled(out3, 3), updated(out3, {"x": 1})]
    taken(tap, records)
    return {"records": records, "state": state(tap)}


def v2_live_tokens() -> dict:
    """The V2 model runner hands scheduled_new_reqs the request's own token list, which grows
    by one with each update: p, resumed with all but its last token in the prefix cache, is
    a decode step (its list read when scheduled, not at the send)."""
    tap, records = new_tap(), []
    held = tap.held
    tokens = list(range(10))  # the request's list: prompt, then each sampled token appended
    held.append((ARRIVED, "p", 1.0, None, 10, True))
    out1 = output([new("p", 10, 0, [0], tokens=tokens)], cached([]), {"p": 10})
    held.append(scheduled(out1, 1))
    tokens.append(10)
    held.append(updated(out1, {"p": 1}))
    out2 = output([], cached([("p", 10, None, 1)]), {"p": 1})
    held.append(scheduled(out2, 2))
    tokens.append(11)
    held += [updated(out2, {"p": 1}), (PREEMPTED, "p", 1, 3050)]
    out3 = output([new("p", 10, 11, [0], tokens=tokens)], cached([]), {"p": 1})
    held.append(scheduled(out3, 3))
    tokens.append(12)
    held.append(updated(out3, {"p": 1}))
    taken(tap, records)
    return {"records": records}


def async_end() -> dict:
    """Async scheduling: step 2 is scheduled before step 1's update, in which r ends (stop);
    step 2 still names r (vLLM discards its token)."""
    tap, records = new_tap(), []
    held = tap.held
    held.append((ARRIVED, "r", 1.0, None, 5, True))
    out1 = output([new("r", 5, 0, [0])], cached([]), {"r": 5})
    out2 = output([], cached([("r", 5, None, 1)]), {"r": 1})
    held += [scheduled(out1, 1), scheduled(out2, 2)]
    held += [(FINISHED, "r", 0, 1850), updated(out1, {"r": 1})]
    taken(tap, records)
    after_first = state(tap)
    held.append(updated(out2, {"r": 1}))
    taken(tap, records)
    return {"records": records, "after_first": after_first, "state": state(tap), "in_flight": in_flight(tap)}


def v1_resume() -> dict:
    """The V1 model runner: q resumed through scheduled_cached_reqs.resumed_req_ids with its
    whole block list; and 9 steps of z scheduled, never updated: the oldest let go, its blocks
    and first schedule kept."""
    tap, records = new_tap(), []
    held = tap.held
    held.append((ARRIVED, "q", 1.0, None, 20, True))
    out1 = output([new("q", 20, 0, [0, 1])], cached([]), {"q": 20})
    held += [scheduled(out1, 1), updated(out1, {"q": 1})]
    out2 = output([], cached([("q", 20, None, 1)]), {"q": 1})
    held += [scheduled(out2, 2), updated(out2, {"q": 1})]
    held.append((PREEMPTED, "q", 2, 3050))
    # 16 of its 22 tokens in the prefix cache: the other 6 recomputed, emitting token 3
    out3 = output([], cached([("q", 16, [7, 8], 2)], resumed={"q"}), {"q": 6})
    held += [scheduled(out3, 3), updated(out3, {"q": 1})]
    out4 = output([], cached([("q", 22, None, 3)]), {"q": 1})
    held += [scheduled(out4, 4), updated(out4, {"q": 1})]
    held.append((ARRIVED, "z", 5.0, None, 3, True))
    lost = [output([new("z", 3, 0, [9])], cached([]), {"z": 3})] + \
        [output([], cached([("z", 3 + k, [10 + k] if k == 4 else None, k)]), {"z": 1}) for k in range(8)]
    held += [scheduled(out, 5 + k) for k, out in enumerate(lost)]
    taken(tap, records)
    dropped = READERS[tap].let_go
    out6 = output([], cached([("z", 12, None, 9)]), {"z": 1})
    held += [scheduled(out6, 20), updated(out6, {"z": 1})]
    taken(tap, records)
    return {"records": records, "dropped": dropped, "in_flight": in_flight(tap), "let_go": READERS[tap].let_go}


def step_bound(bound: int) -> None:
    """Set the engine_step ratio the installed schedule wrapper holds (bound at install, as a
    positional default) to ``bound`` (0: no step sampled; 2**64: every step)."""
    wrapper = Scheduler.schedule
    names = wrapper.__code__.co_varnames[:wrapper.__code__.co_argcount]
    defaults = list(wrapper.__defaults__)
    defaults[names.index("_step_bound") - (len(names) - len(defaults))] = bound
    wrapper.__defaults__ = tuple(defaults)


def partial_rows() -> dict:
    """A step whose engine_step is not sampled, with one sampled request (s) in flight beside
    unsampled ones: n new, p in a chunked prefill (no output yet), r preempted earlier and
    recomputing, d decoding. Held as a PARTIAL row (d left out), then the same step held whole
    (its engine_step sampled): both read into the same figures for s and the step."""
    reads = {}
    for kind, bound in (("partial", 0), ("whole", 2**64)):
        tap, records = new_tap(), []
        step_bound(bound)
        tap.sampled_ids.add("s")
        tap.recomputing.add("r")
        for req_id, prompt in (("s", 50), ("p", 100), ("r", 10), ("d", 55), ("n", 30)):
            tap.held.append((ARRIVED, req_id, 1.0, None, prompt, req_id == "s"))
        out = output([new("n", 30, 0, [20, 21])], cached([("s", 54, None, 5), ("p", 32, [30], 0),
                                                          ("r", 12, [40], 7), ("d", 63, None, 9)]),
                     {"n": 30, "s": 1, "p": 16, "r": 16, "d": 1})
        tap.held.append(scheduled(out, 9))
        row = tap.held[-1]
        tap.held.append(updated(out, {"n": 1, "s": 1, "p": 0, "r": 1, "d": 1}))
        taken(tap, records)
        reads[kind] = {"kind": row[0], "records": records}
        tap.sampled_ids.clear()
        tap.recomputing.clear()
    step_bound(2**64)
    return reads


if __name__ == "__main__":
    main()
