"""The keep policy (instrument/records/keep.py) and its stage in the exporter process
(instrument/records/keep_stage.py): which ended requests keep their whole detail, and what
every request's summary says.

The figures are the worked example's (TTFT 190 ms, E2E 3,915 ms, 150 tokens: TPOT 25 ms)."""

from __future__ import annotations

from typing import Any

import pytest
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import Event, ReadableSpan
from opentelemetry.sdk.trace.sampling import ALWAYS_OFF, ALWAYS_ON
from opentelemetry.trace import SpanContext, SpanKind, Status, StatusCode, TraceFlags

from instrument.records.keep import HeadMarkingSampler, KeepPolicy, RequestOutcome
from instrument.records.keep_stage import EngineFacts, KeepStage, outcome_of

WORKED = RequestOutcome(ttft_s=0.190, e2e_s=3.915, tpot_s=0.025, max_gap_s=0.025)
T0 = 1_700_000_000_000_000_000


def test_no_setting_is_no_policy_and_a_bad_value_turns_its_rule_off() -> None:
    said: list[str] = []
    assert KeepPolicy.from_env({}, warn=said.append) is None
    policy = KeepPolicy.from_env({"TOKENTRACE_KEEP_TTFT_MS": "fast", "TOKENTRACE_KEEP_GAP_MS": "200",
                                  "TOKENTRACE_KEEP_SLOWEST": "1.5"}, warn=said.append)
    assert policy is not None and policy.thresholds_ms["ttft"] is None and policy.thresholds_ms["gap"] == 200
    assert policy.slowest is None
    assert len(said) == 2 and "TOKENTRACE_KEEP_TTFT_MS='fast'" in said[0] and "TOKENTRACE_KEEP_SLOWEST" in said[1]
    said.clear()
    assert KeepPolicy.from_env({"TOKENTRACE_KEEP_E2E_MS": "0"}, warn=said.append).keeps_everything
    assert said == ["tokentrace: the keep policy (e2e > 0 ms, errors, preempted) keeps every request whole"]


def test_fixed_thresholds_on_the_worked_example() -> None:
    decide = lambda **kw: KeepPolicy(**kw).decide(WORKED, 0.0)  # noqa: E731 - one line per case
    assert decide(ttft_ms=150) .reason == "ttft" and decide(ttft_ms=150).rules == ("ttft 190 ms > 150 ms",)
    assert decide(ttft_ms=190).full is False, "over, not at, the threshold"
    assert decide(tpot_ms=20).rules == ("tpot 25 ms > 20 ms",)
    assert decide(e2e_ms=4000).reason == "summary"
    both = decide(e2e_ms=3000, ttft_ms=100)
    assert both.reason == "ttft" and both.rules == ("ttft 190 ms > 100 ms", "e2e 3915 ms > 3000 ms")
    head = KeepPolicy(ttft_ms=100).decide(RequestOutcome(ttft_s=0.190, head=True), 0.0)
    assert (head.full, head.reason, head.rules) == (True, "head", ("ttft 190 ms > 100 ms",))
    assert KeepPolicy(gap_ms=500).decide(RequestOutcome(error=True), 0.0).reason == "error"
    assert KeepPolicy(gap_ms=500).decide(RequestOutcome(preempted=True), 0.0).reason == "preempted"


def test_the_slowest_rule_waits_for_100_requests_then_keeps_the_tail() -> None:
    policy = KeepPolicy(slowest=0.05)
    for i in range(99):  # TTFT 10..1,000 ms, one request a second
        assert policy.decide(RequestOutcome(ttft_s=(i + 1) / 100, max_gap_s=0.01), float(i)).reason == "summary"
    policy.decide(RequestOutcome(ttft_s=0.5, max_gap_s=0.01), 99.0)
    later = 101.0  # (the quantiles are recomputed at most once a second)
    slow = policy.decide(RequestOutcome(ttft_s=0.99, max_gap_s=0.01), later)
    assert slow.reason == "slowest" and slow.rules[0].startswith("slowest: ttft 990 ms > p95 ")
    assert policy.decide(RequestOutcome(ttft_s=0.5, max_gap_s=0.01), later).reason == "summary"
    # ten minutes later the window is empty again: only fixed thresholds until 100 more
    assert policy.decide(RequestOutcome(ttft_s=5.0, max_gap_s=0.01), later + 700).reason == "summary"


def _request_span(trace_id: int, head: bool, chunk_ms: list[float], output: int, status: StatusCode = StatusCode.UNSET,
                  finish: str = "length") -> ReadableSpan:
    context = SpanContext(trace_id, trace_id + 1, is_remote=False, trace_flags=TraceFlags(TraceFlags.SAMPLED))
    events = [Event("tokentrace.chunk", {"tokentrace.chunk.index": i, "tokentrace.chunk.tokens": 1,
                                         "tokentrace.chunk.visible": True}, T0 + int(ms * 1e6))
              for i, ms in enumerate(chunk_ms)]
    return ReadableSpan("gateway", context, None, Resource.create({}), {
        "tokentrace.sampling.head": head, "gen_ai.usage.output_tokens": output,
        "gen_ai.response.finish_reasons": (finish,)}, events, (), SpanKind.SERVER,
        status=Status(status), start_time=T0, end_time=T0 + int(chunk_ms[-1] * 1e6) + 1000 if chunk_ms else T0 + 1000)


def _child(trace_id: int, name: str, start_ms: float, end_ms: float) -> ReadableSpan:
    context = SpanContext(trace_id, trace_id + 7, is_remote=False, trace_flags=TraceFlags(TraceFlags.SAMPLED))
    parent = SpanContext(trace_id, trace_id + 1, is_remote=False)
    return ReadableSpan(name, context, parent, Resource.create({}), {}, (), (), SpanKind.INTERNAL,
                        start_time=T0 + int(start_ms * 1e6), end_time=T0 + int(end_ms * 1e6))


def test_the_worked_example_request_span_gives_its_figures() -> None:
    span = _request_span(1 << 64, False, [190 + 25 * k for k in range(150)], 150)
    outcome = outcome_of(span, EngineFacts(max_gap_ns=25_000_000))
    assert outcome.ttft_s == pytest.approx(0.190) and outcome.e2e_s == pytest.approx(3.915)
    assert outcome.tpot_s == pytest.approx(0.025) and outcome.max_gap_s == pytest.approx(0.025)
    assert not outcome.error and not outcome.head


def test_the_stage_keeps_what_the_policy_names_and_summarizes_the_rest() -> None:
    out: list[Any] = []
    now = [0.0]
    stage = KeepStage(KeepPolicy(gap_ms=200), out.extend, clock=lambda: now[0])
    written: list[int] = []
    slow, fast, refused = 10 << 64, 20 << 64, 30 << 64
    # the slow request: its queue span first, then the engine's end, then its request span
    stage.forwarded(_child(slow, "queue", 1, 6))
    stage.engine_ended(slow, slow + 1, EngineFacts(max_gap_ns=412_000_000, gap_step=7, prefill_ns=150_000_000,
                                                   decode_ns=3_700_000_000), lambda: written.append(slow))
    assert out == [] and stage.held_bytes > 0, "held until both sides came"
    stage.forwarded(_request_span(slow, False, [190, 602, 627], 3))
    (queue, summary) = out
    assert written == [slow] and queue.name == "queue"
    attributes = summary.attributes
    assert attributes["tokentrace.sampling.reason"] == "gap"
    assert attributes["tokentrace.sampling.rules"] == ("gap 412 ms > 200 ms",)
    assert attributes["tokentrace.gap.max_ms"] == 412.0 and attributes["tokentrace.gap.engine_step"] == 7
    assert attributes["gen_ai.latency.time_in_queue"] == pytest.approx(0.005)
    assert attributes["gen_ai.latency.time_to_first_token"] == pytest.approx(0.190)
    assert attributes["gen_ai.latency.e2e"] == pytest.approx(0.627)
    assert attributes["gen_ai.latency.time_in_model_decode"] == pytest.approx(3.7)
    assert len(summary.events) == 3, "kept whole: its chunk events stay"
    out.clear()
    # the fast one: the request span first; not kept: summary only, no chunk events, no queue span
    stage.forwarded(_child(fast, "queue", 1, 2))
    stage.forwarded(_request_span(fast, False, [50, 75, 100], 3))
    stage.engine_ended(fast, fast + 1, EngineFacts(max_gap_ns=25_000_000), lambda: written.append(fast))
    (summary,) = out
    assert written == [slow] and summary.events == () and summary.attributes["tokentrace.sampling.reason"] == "summary"
    assert "tokentrace.sampling.rules" not in summary.attributes
    out.clear()
    # refused before the engine (an error, no output): decided at once, kept
    stage.forwarded(_request_span(refused, False, [], 0, StatusCode.ERROR, "error"))
    assert [s.attributes["tokentrace.sampling.reason"] for s in out] == ["error"]
    assert stage.kept == {"gap": 1, "summary": 1, "error": 1} and stage.held_bytes == 0


def test_a_side_that_never_comes_is_waited_for_a_bounded_time() -> None:
    out: list[Any] = []
    now = [0.0]
    stage = KeepStage(KeepPolicy(ttft_ms=100), out.extend, wait_s=2.0, clock=lambda: now[0])
    late = 40 << 64
    stage.forwarded(_request_span(late, True, [50, 60], 2))  # head: kept whole; its engine side is late
    stage.tick()
    assert out == []
    now[0] = 2.5
    stage.tick()
    assert [s.attributes["tokentrace.sampling.reason"] for s in out] == ["head"]
    written: list[int] = []
    stage.engine_ended(late, late + 1, EngineFacts(), lambda: written.append(late))
    assert written == [late], "the late engine side of a kept request still writes its spans"


def test_the_memory_bound_decides_the_oldest_first() -> None:
    out: list[Any] = []
    stage = KeepStage(KeepPolicy(gap_ms=200), out.extend, max_held_bytes=10_000)
    for n in range(1, 6):
        stage.engine_ended(n << 64, (n << 64) + 1, EngineFacts(held_bytes=4_000), lambda: None)
    assert stage.forced == 3 and stage.held_bytes <= 10_000


def test_the_head_marking_sampler_records_every_request_and_says_which_the_sampler_took() -> None:
    from opentelemetry import trace

    for inner, head in ((ALWAYS_OFF, False), (ALWAYS_ON, True)):
        result = HeadMarkingSampler(inner).should_sample(None, 5, "gateway", attributes={"a": 1})
        assert result.decision.is_sampled()
        assert result.attributes == {"a": 1, "tokentrace.sampling.head": head}, "the given attributes kept"
    parent = trace.set_span_in_context(trace.NonRecordingSpan(SpanContext(5, 6, is_remote=False)))
    child = HeadMarkingSampler(ALWAYS_OFF).should_sample(parent, 5, "queue", attributes={"b": 2})
    assert child.decision.is_sampled() and child.attributes == {"b": 2}, "a local child follows its root, unmarked"
