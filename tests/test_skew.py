"""Clock-skew rules, offset bounds, phases across clock domains, and --assume-offset parsing."""

from __future__ import annotations

import pytest
from trace_fixtures import CLIENT_RESOURCE, SERVER_RESOURCE, SKEWED_CLIENT_RESOURCE, domain, mixed_db, mixed_trace_id

from analyzer.queries import run_query
from analyzer.skew import OffsetSyntaxError, parse_assume_offsets

SKEWED = domain(SKEWED_CLIENT_RESOURCE)
SERVER = domain(SERVER_RESOURCE)
ASSUME_SKEWED_35 = {"offset_domains": ["skewed-client"], "offset_ms": [35.0]}


@pytest.fixture(scope="module")
def mixed():
    con = mixed_db()
    yield con
    con.close()


def test_offset_bounds_contain_the_injected_offset(mixed) -> None:
    rows = {(r["client_domain"], r["server_domain"]): r for r in run_query(mixed, "skew_offsets", {}).dicts()}
    skewed = rows[(SKEWED, SERVER)]
    # client clock 35 ms ahead: theta = server - client = -35; network in 5/9/6, out 3/2/4
    assert skewed["requests"] == 3
    assert (skewed["offset_min_ms"], skewed["offset_max_ms"]) == (-37.0, -30.0)
    assert skewed["offset_min_ms"] <= -35 <= skewed["offset_max_ms"]
    assert skewed["verdict"] == "skew_detected"
    same = rows[(domain(CLIENT_RESOURCE), SERVER)]
    assert (same["offset_min_ms"], same["offset_max_ms"], same["verdict"]) == (-3.0, 5.0, "consistent")
    assert skewed["assumed_offset_ms"] is None


def test_assumed_offset_is_echoed_and_checked_against_bounds(mixed) -> None:
    rows = run_query(mixed, "skew_offsets", ASSUME_SKEWED_35).dicts()
    skewed = next(r for r in rows if r["client_domain"] == SKEWED)
    assert skewed["assumed_offset_ms"] == -35.0 and skewed["assumed_offset_within_bounds"] is True
    wrong = run_query(mixed, "skew_offsets", {"offset_domains": ["skewed-client"], "offset_ms": [10.0]}).dicts()
    assert next(r for r in wrong if r["client_domain"] == SKEWED)["assumed_offset_within_bounds"] is False


def test_contradiction_when_no_single_offset_fits(mixed) -> None:
    assert all(r["verdict"] != "contradiction" for r in run_query(mixed, "skew_offsets", {"tolerance_ms": 0.0}).dicts())
    from trace_fixtures import RequestPlan, TraceWorld

    world = TraceWorld()  # two requests whose clocks disagree by 50 ms in opposite directions
    world.add(RequestPlan(output_tokens=2, client_clock_ahead_ms=25))
    world.add(RequestPlan(start_ms=5000, output_tokens=2, client_clock_ahead_ms=-25))
    row = run_query(world.load(), "skew_offsets", {}).dicts()[0]
    assert row["offset_min_ms"] > row["offset_max_ms"]
    assert row["verdict"] == "contradiction"


def test_skew_rules_report_every_planted_violation(mixed) -> None:
    rows = run_query(mixed, "skew_rules", {}).dicts()
    by_rule: dict[str, list[dict]] = {}
    for r in rows:
        by_rule.setdefault(r["rule"], []).append(r)
    starts = by_rule["child_starts_before_parent"]
    assert [r["trace_id"] for r in starts] == [mixed_trace_id(n) for n in ("skew_a", "skew_b", "skew_c")]
    assert [r["magnitude_ms"] for r in starts] == [30.0, 26.0, 29.0]  # 35 - network-in
    assert all(r["cross_domain"] and r["domain"] == SERVER and r["related_domain"] == SKEWED for r in starts)
    overlap = by_rule["decode_steps_overlap"]
    assert [(r["trace_id"], r["magnitude_ms"]) for r in overlap] == [(mixed_trace_id("overlap"), 2.0)] * 2
    broken = mixed_trace_id("broken")
    assert [(r["trace_id"], r["span_name"], r["magnitude_ms"]) for r in by_rule["negative_duration"]] == [
        (broken, "postprocess", 2.0)]
    assert [(r["span_name"], r["magnitude_ms"]) for r in by_rule["event_outside_span"]] == [("queue", 4.0)]
    assert [(r["span_name"], r["magnitude_ms"]) for r in by_rule["chunks_out_of_order"]] == [("gateway", 25.0)]
    assert "child_ends_after_parent" not in by_rule
    assert len(rows) == 8


def test_rule_tolerance_hides_small_violations(mixed) -> None:
    rows = run_query(mixed, "skew_rules", {"tolerance_ms": 27.0}).dicts()
    starts = [r["magnitude_ms"] for r in rows if r["rule"] == "child_starts_before_parent"]
    assert starts == [30.0, 29.0]
    assert not [r for r in rows if r["rule"] in ("decode_steps_overlap", "event_outside_span")]


def test_child_ends_after_parent() -> None:
    from trace_fixtures import RequestPlan, TraceWorld

    world = TraceWorld()  # client clock 40 ms behind: gateway ends 40 - 3 = 37 ms after the client span
    world.add(RequestPlan(output_tokens=2, client_clock_ahead_ms=-40))
    rows = [r for r in run_query(world.load(), "skew_rules", {}).dicts() if r["rule"] == "child_ends_after_parent"]
    assert [(r["span_name"], r["magnitude_ms"]) for r in rows] == [("gateway", 37.0)]


def test_phases_of_the_seed_sum_to_ttft(mixed) -> None:
    row = run_query(mixed, "phases", {"trace_id": mixed_trace_id("seed")}).dicts()[0]
    parts = ["network_in_ms", "gateway_overhead_ms", "tokenize_ms", "queue_ms", "prefill_ms", "first_emit_ms",
             "network_out_ms"]
    assert [row[p] for p in parts] == [5.0, 3.0, 11.0, 25.0, 140.0, 2.0, 3.0]
    assert row["residual_ms"] == 1.0 and row["ttft_ms"] == 190.0
    assert sum(row[p] for p in parts) + row["residual_ms"] == row["ttft_ms"]
    assert row["network_round_trip_ms"] == 8.0
    assert row["clock_pair_verdict"] == "consistent" and row["cross_clock_reason"] is None


def test_phases_never_mix_skewed_clocks_silently(mixed) -> None:
    row = run_query(mixed, "phases", {"trace_id": mixed_trace_id("skew_b")}).dicts()[0]
    assert row["network_in_ms"] is None and row["network_out_ms"] is None
    assert row["cross_clock_reason"].startswith("clock pair skew_detected (offset bounds -37.0 .. -30.0 ms)")
    assert row["network_round_trip_ms"] == 11.0  # 9 in + 2 out, measured on one clock each
    assert row["ttft_ms"] == 193.0 and row["residual_ms"] == 1.0
    fixed = run_query(mixed, "phases", {"trace_id": mixed_trace_id("skew_b"), **ASSUME_SKEWED_35}).dicts()[0]
    assert (fixed["network_in_ms"], fixed["network_out_ms"]) == (9.0, 2.0)
    assert fixed["assumed_offset_ms"] == -35.0 and fixed["cross_clock_reason"] is None


def test_phases_with_lost_events_or_no_client(mixed) -> None:
    dropped = run_query(mixed, "phases", {"trace_id": mixed_trace_id("dropped")}).dicts()[0]
    assert dropped["first_emit_ms"] is None and dropped["network_out_ms"] is None and dropped["ttft_ms"] is None
    assert dropped["null_reason"].startswith("f/e unknown: 23 events dropped")
    assert dropped["prefill_ms"] == 140.0
    alone = run_query(mixed, "phases", {"trace_id": mixed_trace_id("server_only")}).dicts()[0]
    assert alone["network_in_ms"] is None and alone["cross_clock_reason"].startswith("no client span")
    assert alone["residual_ms"] == 1.0


@pytest.mark.parametrize("bad", ["server", "=5", "server=abc", "server=nan", "server=inf"])
def test_assume_offset_syntax_errors(bad: str) -> None:
    with pytest.raises(OffsetSyntaxError):
        parse_assume_offsets([bad])


def test_assume_offset_parsing() -> None:
    parsed = parse_assume_offsets(["server|s-1|gpu-1=-12.5", "client=3"])
    assert parsed.params() == {"offset_domains": ["server|s-1|gpu-1", "client"], "offset_ms": [-12.5, 3.0]}
    assert "runs -12.5 ms ahead" in parsed.notes()[0] and "shifted by 12.5 ms" in parsed.notes()[0]
    with pytest.raises(OffsetSyntaxError, match="given twice"):
        parse_assume_offsets(["a=1", "a=2"])
    assert parse_assume_offsets([]).params() == {"offset_domains": None, "offset_ms": None}
