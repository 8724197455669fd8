"""The keep policy on the vLLM plugin, without vLLM: its settings read once (bad values said,
that rule off), the span builder's decisions at each request's end on hand-made step facts,
and the memory bound on undecided requests. On vLLM's real schedulers:
tests/test_vllm_real_scheduler.py (a planted stall, a preempted request)."""

from __future__ import annotations

import logging
from typing import Any

import pytest
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.sdk.trace.sampling import ALWAYS_ON

from instrument.otel.tracing import get_tracer
from instrument.records.keep import KeepPolicy
from instrument.vllm.facts import FINISHED_LENGTH, StepFacts
from instrument.vllm.keep import HELD_STEP_BYTES, DetailKeeper
from instrument.vllm.rows import KEPT_IF_SLOW
from instrument.vllm.sampling import MASK64, sampling_from_env
from instrument.vllm.spans import SpanBuilder

T0 = 1_764_000_000_000_000_000
MS = 1_000_000


def test_the_policy_is_read_with_the_sampling_and_a_bad_value_is_one_line_naming_it() -> None:
    sampling = sampling_from_env({"TOKENTRACE_KEEP_GAP_MS": "abc", "TOKENTRACE_KEEP_TTFT_MS": "500",
                                  "OTEL_TRACES_SAMPLER": "always_off", "TOKENTRACE_VLLM_STEP_SAMPLE_RATIO": "off"})
    assert sampling.warnings == [("tokentrace: TOKENTRACE_KEEP_GAP_MS='abc' is not a number of ms >= 0: that keep "
                                  "rule is off")]
    assert sampling.keep_policy.thresholds_ms == {"ttft": 500.0, "gap": None, "tpot": None, "e2e": None}
    # nothing sampled at arrival and no step ratio, but a policy: the plugin still runs (summaries)
    assert sampling.keeps and not sampling.traces_nothing
    only_bad = sampling_from_env({"TOKENTRACE_KEEP_SLOWEST": "2", "OTEL_TRACES_SAMPLER": "always_off",
                                  "TOKENTRACE_VLLM_STEP_SAMPLE_RATIO": "off"})
    assert only_bad.keep_policy is None and only_bad.traces_nothing  # no rule left: as without a policy
    assert only_bad.warnings == [("tokentrace: TOKENTRACE_KEEP_SLOWEST='2' is not a fraction in (0, 1]: that keep "
                                  "rule is off")]
    everything = sampling_from_env({"TOKENTRACE_KEEP_E2E_MS": "0"})
    assert everything.warnings == [("tokentrace: the keep policy (e2e > 0 ms, errors, preempted) keeps every "
                                    "request whole")]
    assert sampling_from_env({}).keep_policy is None


def _step(step: int, t_ms: int, duration_ms: int, rows: list[tuple[str, int, int, int, int]],
          **events: Any) -> StepFacts:
    """One decode or prefill step: rows (req_id, tokens, computed before, prefill kind, sampled)."""
    f = StepFacts(max(len(rows), 1))
    f.step, f.start_ns, f.sched_end_ns, f.end_ns = step, T0 + t_ms * MS, T0 + t_ms * MS + 40_000, \
        T0 + (t_ms + duration_ms) * MS
    f.n = f.batch_size = len(rows)
    f.batch_tokens = sum(r[1] for r in rows)
    f.waiting, f.kv_used, f.kv_total, f.block_tokens, f.bytes_per_block = 3, 10 + step, 400, 16, 1024
    for i, (req_id, tokens, computed, prefill, sampled) in enumerate(rows):
        f.req_ids[i], f.tokens[i], f.computed[i], f.prefill[i], f.blocks[i], f.sampled[i] = (
            req_id, tokens, computed, prefill, 1 + computed // 16, sampled)
    for name in ("arrivals", "first", "preempted", "finished"):
        getattr(f, name).extend(events.pop(name, []))
    return f


def _run(keeper: DetailKeeper | None, stall_ms: int = 400) -> tuple[list[Any], SpanBuilder]:
    """Three requests of 8 prompt tokens and 6 output tokens: "a" (the random sample) and "b"
    (not) arrive at 0 and prefill in step 1; step 3 takes ``stall_ms`` while they decode (their
    gap); "c" (not sampled) arrives as step 4 starts, prefills in it, then decodes. Steps of
    10 ms otherwise, engine_step spans off."""
    exporter = InMemorySpanExporter()
    provider = TracerProvider(sampler=ALWAYS_ON)
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    builder = SpanBuilder(get_tracer(provider), step_bound=0, keeper=keeper)
    flag = KEPT_IF_SLOW if keeper is not None else True
    stream = [_step(1, 0, 10, [("a", 8, 0, 1, 1), ("b", 8, 0, 1, 1)],
                    arrivals=[("a", T0 / 1e9, None, 8, True), ("b", T0 / 1e9, None, 8, flag)])]
    t, outputs = 10, {"a": 1, "b": 1}
    for step in range(2, 12):
        duration = stall_ms if step == 3 else 10
        rows = [(rid, 1, 8 + n - 1, 0, 1) for rid, n in outputs.items() if n < 6]
        arrivals = []
        if step == 4:
            rows.append(("c", 8, 0, 1, 1))
            arrivals = [("c", (T0 + t * MS) / 1e9, None, 8, flag)]
        for rid, *_ in rows:
            outputs[rid] = outputs.get(rid, 0) + 1
        done = [(rid, FINISHED_LENGTH, 0) for rid, *_ in rows if outputs[rid] == 6]
        stream.append(_step(step, t, duration, rows, arrivals=arrivals, finished=done))
        t += duration
    for facts in stream:
        builder.consume(facts)
    builder.close_engine_trace()
    return list(exporter.get_finished_spans()), builder


def _by_request(spans: list[Any]) -> dict[str, tuple[Any, list[str]]]:
    roots = {s.context.span_id: s for s in spans if s.name == "engine_request"}
    return {root.attributes["gen_ai.request.id"]: (root, [s.name for s in spans if s.parent is not None
                                                          and s.parent.span_id == span_id])
            for span_id, root in roots.items()}


def test_the_builder_keeps_whole_the_sample_and_the_slow_and_summarizes_the_rest() -> None:
    spans, builder = _run(DetailKeeper(KeepPolicy(gap_ms=200)))
    got = _by_request(spans)
    full = _by_request(_run(None)[0])
    assert {rid: root.attributes["tokentrace.sampling.reason"] for rid, (root, _) in got.items()} == {
        "a": "head", "b": "gap", "c": "summary"}
    assert got["a"][0].attributes["tokentrace.sampling.rules"] == ("gap 400 ms > 200 ms",)
    assert got["b"][0].attributes["tokentrace.sampling.rules"] == ("gap 400 ms > 200 ms",)
    for rid in ("a", "b"):  # whole: the spans and chunk events they have with no policy
        assert sorted(got[rid][1]) == sorted(full[rid][1]) == ["decode"] * 5 + ["prefill", "queue"]
        assert [e.attributes for e in got[rid][0].events] == [e.attributes for e in full[rid][0].events]
    root, children = got["c"]
    assert children == [] and root.events == ()
    # the summary, every request: figures in s (vLLM's names) and ms
    c = root.attributes
    assert c["tokentrace.sampling.head"] is False and got["a"][0].attributes["tokentrace.sampling.head"] is True
    assert c["gen_ai.latency.time_to_first_token"] == pytest.approx(0.010)  # arrived as step 4 started
    assert c["gen_ai.latency.e2e"] == pytest.approx(0.060)  # step 4 to step 9's end
    assert c["gen_ai.latency.time_in_queue"] == 0
    assert c["tokentrace.tpot_ms"] == pytest.approx(10.0)  # (60 - 10) / 5
    assert c["tokentrace.gap.max_ms"] == 10.0 and c["tokentrace.gap.engine_step"] == 5  # (ties: the first)
    assert c["gen_ai.latency.time_in_model_prefill"] == pytest.approx(0.010)
    assert c["gen_ai.latency.time_in_model_decode"] == pytest.approx(0.050)
    assert c["gen_ai.usage.output_tokens"] == 6 and c["gen_ai.response.finish_reasons"] == ("length",)
    assert got["b"][0].attributes["tokentrace.gap.max_ms"] == 400.0
    assert got["b"][0].attributes["tokentrace.gap.engine_step"] == 3
    # engine_step spans: off by ratio; the step of each kept request's largest gap, once
    assert [s.attributes["tokentrace.engine.step"] for s in spans if s.name == "engine_step"] == [3]
    step = next(s for s in spans if s.name == "engine_step").attributes
    assert (step["tokentrace.batch.size"], step["tokentrace.batch.waiting"], step["tokentrace.kv.blocks_used"]) == \
        (2, 3, 13)
    assert builder.keeper.kept == {"head": 1, "gap": 1, "summary": 1} and builder.keeper.held_bytes == 0


def test_without_a_stall_only_the_random_sample_is_whole() -> None:
    spans, builder = _run(DetailKeeper(KeepPolicy(gap_ms=200)), stall_ms=10)
    got = _by_request(spans)
    assert {rid: root.attributes["tokentrace.sampling.reason"] for rid, (root, _) in got.items()} == {
        "a": "head", "b": "summary", "c": "summary"}
    # the random sample is kept whole: its largest gap's step (all gaps 10 ms: the first, step 2)
    assert [s.attributes["tokentrace.engine.step"] for s in spans if s.name == "engine_step"] == [2]
    assert builder.keeper.said() == "1 kept whole (head 1), 2 summarized"


def test_past_the_memory_bound_the_oldest_undecided_is_decided_on_what_is_known(
        caplog: pytest.LogCaptureFixture) -> None:
    """A bound of one held step: "b" is decided after step 2 (its second held step), before
    the stall in step 3 has ended its gap: not kept; "c" after its second step likewise; both
    counted, said once. "a", the random sample, holds nothing."""
    keeper = DetailKeeper(KeepPolicy(gap_ms=200), max_held_bytes=HELD_STEP_BYTES)
    with caplog.at_level(logging.WARNING, logger="tokentrace.vllm"):
        spans, _ = _run(keeper)
    got = _by_request(spans)
    assert {rid: root.attributes["tokentrace.sampling.reason"] for rid, (root, _) in got.items()} == {
        "a": "head", "b": "summary", "c": "summary"}
    assert got["b"][1] == [] and got["c"][1] == []
    assert keeper.forced == 2 and keeper.held_bytes == 0
    lines = [r.getMessage() for r in caplog.records if "undecided" in r.getMessage()]
    assert lines == [("tokentrace: the keep policy holds more than 0 MiB of undecided vLLM requests: the oldest are "
                      "decided on what is known so far (counted)")]
    # a request decided early and kept writes what it held, then its detail as it comes
    keeper = DetailKeeper(KeepPolicy(gap_ms=0), max_held_bytes=HELD_STEP_BYTES)
    got = _by_request(_run(keeper)[0])
    assert sorted(got["b"][1]) == ["decode"] * 5 + ["prefill", "queue"]
    assert len(got["b"][0].events) == 6


def test_a_step_bound_that_samples_every_step_writes_each_engine_step_once() -> None:
    exporter = InMemorySpanExporter()
    provider = TracerProvider(sampler=ALWAYS_ON)
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    builder = SpanBuilder(get_tracer(provider), step_bound=MASK64 + 1, keeper=DetailKeeper(KeepPolicy(gap_ms=1)))
    s = T0 / 1e9
    builder.consume(_step(1, 0, 10, [("x", 8, 0, 1, 1)], arrivals=[("x", s, None, 8, KEPT_IF_SLOW)]))
    builder.consume(_step(2, 10, 10, [("x", 1, 8, 0, 1)], finished=[("x", FINISHED_LENGTH, 0)]))
    spans = exporter.get_finished_spans()
    assert [sp.attributes["tokentrace.engine.step"] for sp in spans if sp.name == "engine_step"] == [1, 2]


def test_the_analyzer_reads_a_summarized_requests_figures(tmp_path: Any) -> None:
    """The spans of the stall run, as OTLP/JSON lines, loaded: `requests` gives every request
    its TTFT, E2E and TPOT on the engine perspective, "c" (summarized: no chunk events) from
    its attributes, "a" and "b" (kept whole) from their chunk events, each as the hand-worked
    step times say."""
    from analyzer.db.store import connect
    from analyzer.formats.load import load_paths
    from analyzer.query.runner import run_query
    from instrument.otel.otlp_json import OTLPJsonLinesSpanExporter

    spans, _ = _run(DetailKeeper(KeepPolicy(gap_ms=200)))
    path = tmp_path / "spans.jsonl"
    exporter = OTLPJsonLinesSpanExporter(path)
    exporter.export(spans)
    exporter.shutdown()
    con = connect()
    load_paths(con, [str(path)])
    rows = {r["response_id"]: r for r in run_query(con, "requests", {"perspective": "engine"}).dicts()}
    con.close()
    # (ms: step 1 ends at 10; a and b emit at 10, 20, 420, 430, 440, 450; c at 420 + 10 .. 60)
    got = {rid: (r["ttft_ms"], r["e2e_ms"], r["tpot_ms"], r["null_reason"]) for rid, r in rows.items()}
    assert got == {"a": (pytest.approx(10.0), pytest.approx(450.0), pytest.approx(88.0), None),
                   "b": (pytest.approx(10.0), pytest.approx(450.0), pytest.approx(88.0), None),
                   "c": (pytest.approx(10.0), pytest.approx(60.0), pytest.approx(10.0), None)}
