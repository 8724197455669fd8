"""The analyzer on mixed detail (a keep policy's output): every request counted in the
per-request figures, from its summary where it has no chunk events; the gap figures over the
random sample only, said with its size. The spans are made by the real keep stage
(instrument/records/keep_stage.py) from the contract's requests (tests/trace_fixtures.py)."""

from __future__ import annotations

import numpy as np
from opentelemetry.sdk.trace import ReadableSpan

from analyzer.db.store import connect, insert_rows
from analyzer.formats.sdk_spans import rows_from_sdk_spans
from analyzer.query.runner import run_query
from instrument.records.keep import KeepPolicy
from instrument.records.keep_stage import HEAD_ATTRIBUTE, EngineFacts, KeepStage
from trace_fixtures import RequestPlan, TraceWorld

TOKENS = 20
#: request -> (its gaps, ms; whether the random sample took it). The policy: a gap over 200 ms
PLANS = {
    "sampled": ([25.0] * (TOKENS - 1), True),
    "stalled": ([25.0] * 9 + [400.0] + [25.0] * 9, False),
    "quiet_a": ([30.0] * (TOKENS - 1), False),
    "quiet_b": ([35.0] * (TOKENS - 1), False),
}


def _with_head(span: ReadableSpan, head: bool) -> ReadableSpan:
    """The gateway span as HeadMarkingSampler leaves it: every request recorded, marked."""
    return ReadableSpan(span.name, span.context, span.parent, span.resource,
                        {**(span.attributes or {}), HEAD_ATTRIBUTE: head}, span.events, span.links, span.kind,
                        status=span.status, start_time=span.start_time, end_time=span.end_time,
                        instrumentation_scope=span.instrumentation_scope)


def mixed_detail_db():
    """The four requests' spans after the keep stage: the sampled and the stalled one whole,
    the two quiet ones summarized (their gateway span alone, without chunk events)."""
    world = TraceWorld()
    for i, (gaps, _) in enumerate(PLANS.values()):
        world.add(RequestPlan(start_ms=i * 10_000.0, output_tokens=TOKENS, gaps_ms=gaps))
    written = list(world.exporter.get_finished_spans())
    gateways = [s for s in written if s.name == "gateway"]
    out: list[ReadableSpan] = []
    stage = KeepStage(KeepPolicy.from_env({"TOKENTRACE_KEEP_GAP_MS": "200"}), out.extend)
    for gw, (gaps, head) in zip(gateways, PLANS.values()):
        stage.forwarded(_with_head(gw, head))
        stage.engine_ended(gw.context.trace_id, gw.context.span_id, EngineFacts(max_gap_ns=int(max(gaps) * 1e6)),
                           lambda: None)
    kept = {s.context.span_id for s in out if s.attributes["tokentrace.sampling.reason"] != "summary"}
    # a summarized request leaves its gateway span alone (its client span, a root, is the client's own)
    others = [s for s in written if s.name != "gateway" and (s.parent is None or s.parent.span_id in kept)]
    con = connect(None)
    insert_rows(con, *rows_from_sdk_spans([*others, *out]))
    return con, {s.attributes["tokentrace.sampling.reason"] for s in out}


def test_every_request_counts_and_the_gaps_only_over_the_random_sample() -> None:
    con, reasons = mixed_detail_db()
    assert reasons == {"head", "gap", "summary"}
    requests = [r for r in run_query(con, "requests", {"perspective": "server"}).dicts()]
    by_reason: dict[str, int] = {}
    for r in requests:
        by_reason[r["sampling_reason"]] = by_reason.get(r["sampling_reason"], 0) + 1
        assert r["ttft_ms"] is not None and r["e2e_ms"] is not None  # summaries too, from their attributes
    assert by_reason == {"head": 1, "gap": 1, "summary": 2}
    rows = {(r["metric"], r["perspective"]): r for r in run_query(con, "summary").dicts()}
    e2e = rows[("e2e_ms", "server")]
    assert e2e["count"] == 4 and e2e["request_set"] == "every request"
    itl = rows[("itl_ms", "server")]
    sampled_gaps = PLANS["sampled"][0]
    assert itl["count"] == len(sampled_gaps)  # the stalled request's 400 ms gap is not in it
    assert itl["max"] == max(sampled_gaps) and itl["p99"] == np.percentile(sampled_gaps, 99)
    assert itl["request_set"] == "random sample: 1 of 4 requests (1 kept for a rule and 2 summarized left out)"
    # the client perspective is labelled by its server span's decision
    assert rows[("itl_ms", "client")]["request_set"] == itl["request_set"]


def test_without_a_policy_every_figure_counts_every_request() -> None:
    world = TraceWorld()
    for i, (gaps, _) in enumerate(PLANS.values()):
        world.add(RequestPlan(start_ms=i * 10_000.0, output_tokens=TOKENS, gaps_ms=gaps))
    con = world.load()
    rows = {(r["metric"], r["perspective"]): r for r in run_query(con, "summary").dicts()}
    itl = rows[("itl_ms", "server")]
    assert itl["count"] == 4 * (TOKENS - 1) and itl["max"] == 400.0 and itl["request_set"] == "every request"


def test_stalls_label_each_request_and_group_only_the_random_sample() -> None:
    con, _ = mixed_detail_db()
    gaps = run_query(con, "stalls").dicts()
    by_reason: dict[str, list[float]] = {}
    for g in gaps:
        by_reason.setdefault(g["sampling_reason"], []).append(g["itl_ms"])
    assert sorted(by_reason) == ["gap", "head"]  # the summarized requests have no decode spans
    assert max(by_reason["gap"]) > 390 and max(by_reason["head"]) < 30  # the planted 400 ms stall, labelled
    slowest = run_query(con, "stalls_slowest", {"per_request": 1}).dicts()
    assert {(s["sampling_reason"], round(s["itl_ms"])) for s in slowest} >= {("gap", 400)}
    groups = run_query(con, "stalls_groups").dicts()
    assert {g["request_set"] for g in groups} == {
        "random sample: 1 of 2 requests with gaps (1 kept for a rule left out: tokentrace stalls --section slowest "
        "lists them)"}
    assert sum(g["gaps"] for g in groups if g["grouping"] == "batch_size") == len(by_reason["head"])
    assert max(g["itl_max_ms"] or 0 for g in groups) < 30  # the stall is not in any group's distribution


def test_window_counts_the_summarized_requests_and_says_so() -> None:
    con, _ = mixed_detail_db()
    window = run_query(con, "window", {"perspective": "server"}).dicts()[0]
    assert window["attempted"] == window["succeeded"] == 4
    assert "2 request(s) summarized by a keep policy (sampling_reason summary): counted" in window["request_counting_rule"]
    steady = run_query(con, "window", {"perspective": "server", "mode": "steady_state"}).dicts()[0]
    assert "summarized by a keep policy): their tokens are not in this count" in steady["token_counting_rule"]
    assert steady["output_tokens"] == 2 * TOKENS  # the chunk events of the two requests kept whole


def test_the_itl_listing_says_which_set_each_gap_belongs_to() -> None:
    con, _ = mixed_detail_db()
    gaps = run_query(con, "itl", {"perspective": "server"}).dicts()
    reasons = {g["sampling_reason"] for g in gaps}
    assert reasons == {"head", "gap"}
    assert max(g["itl_ms"] for g in gaps if g["sampling_reason"] == "gap") == 400.0
    assert len([g for g in gaps if g["sampling_reason"] == "head"]) == TOKENS - 1


def test_the_report_says_its_itl_rows_count_the_random_sample() -> None:
    from analyzer.report import ReportInputs, build_report

    con, _ = mixed_detail_db()
    page = build_report(con, ReportInputs())
    assert ("ITL rows, server: the random sample: 1 of 4 requests (1 kept for a rule and 2 summarized left "
            "out)") in page
    assert ">request_set<" not in page  # said once as a note, not a column of every row
