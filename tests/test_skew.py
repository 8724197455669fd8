"""Clock-skew rules, offset bounds, phases across clock domains, and --assume-offset parsing."""

from __future__ import annotations

import pytest

from analyzer.errors import OffsetSyntaxError
from analyzer.query.runner import run_query
from analyzer.verbs.skew import parse_assume_offsets
from trace_fixtures import CLIENT_RESOURCE, SERVER_RESOURCE, SKEWED_CLIENT_RESOURCE, domain, mixed_db, mixed_trace_id

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


def _planted_world():
    """Spans written directly through the SDK: one trace with two decode parents whose steps
    overlap each other in time (only parent B's own steps overlap), root decode steps without
    a parent, an event after its span's end and chunks out of order on one of two spans; a
    second trace with the same event fault, to check the $trace_id filter."""
    from opentelemetry import trace as otel_trace

    from trace_fixtures import TraceWorld, _ns

    world = TraceWorld()
    tracer = world.tracer(SERVER_RESOURCE, 1000)
    planted: dict[str, object] = {}

    def span(name, parent=None, start=0.0, end=1.0, attrs=None):
        ctx = otel_trace.set_span_in_context(parent) if parent is not None else None
        s = tracer.start_span(name, context=ctx, start_time=_ns(start), attributes=attrs or {})
        return s

    def steps(parent, starts_ends):
        made = []
        for step, (start, end) in enumerate(starts_ends, 1):
            s = span("decode", parent, start, end, {"tokentrace.step": step})
            s.end(end_time=_ns(end))
            made.append(s)
        return made

    root = span("gateway", None, 0.0)
    a = span("engine_a", root, 1.0)
    b = span("engine_b", root, 1.0)
    steps(a, [(10.0, 20.0), (20.0, 30.0), (30.0, 40.0)])  # in order
    b_steps = steps(b, [(12.0, 22.0), (19.0, 28.0), (28.0, 35.0)])  # step 2 starts 3 ms early
    planted["overlap_b"] = (b_steps[1], b_steps[0], 3.0)
    for s in (a, b):
        s.end(end_time=_ns(50.0))
    late = span("emit", root, 5.0)
    late.add_event("tokentrace.chunk", {"tokentrace.chunk.index": 0}, timestamp=_ns(6.0))
    late.add_event("tokentrace.chunk", {"tokentrace.chunk.index": 2}, timestamp=_ns(7.0))
    late.add_event("tokentrace.chunk", {"tokentrace.chunk.index": 1}, timestamp=_ns(9.5))  # chunk 2 is 2.5 ms early
    late.add_event("done", {}, timestamp=_ns(60.0))  # 15 ms after the span's end at 45
    late.end(end_time=_ns(45.0))
    fine = span("emit_ok", root, 5.0)
    for i, t in enumerate((6.0, 7.0, 8.0)):
        fine.add_event("tokentrace.chunk", {"tokentrace.chunk.index": i}, timestamp=_ns(t))
    fine.end(end_time=_ns(45.0))
    root.end(end_time=_ns(100.0))
    planted["trace"] = format(root.get_span_context().trace_id, "032x")
    planted["late"] = late

    orphan_root = span("decode", None, 0.0, 10.0, {"tokentrace.step": 1})  # decode roots, no parent
    orphan_root.end(end_time=_ns(10.0))
    other = span("decode", None, 200.0, 210.0, {"tokentrace.step": 1})  # its own trace
    other.add_event("done", {}, timestamp=_ns(211.0))  # 1 ms after its end
    other.end(end_time=_ns(210.0))
    planted["other_trace"] = format(other.get_span_context().trace_id, "032x")
    planted["other"] = other
    return world, planted


def _hex_span(s) -> str:
    return format(s.get_span_context().span_id, "016x")


def test_skew_rules_keep_decode_parents_apart_and_filter_by_trace() -> None:
    world, planted = _planted_world()
    con = world.load()
    rows = run_query(con, "skew_rules", {}).dicts()
    overlap = [r for r in rows if r["rule"] == "decode_steps_overlap"]
    step, prev, magnitude = planted["overlap_b"]
    # engine_a's steps overlap engine_b's in time, but only steps of one parent are compared
    assert [(r["trace_id"], r["span_id"], r["related_span_id"], r["magnitude_ms"]) for r in overlap] == [
        (planted["trace"], _hex_span(step), _hex_span(prev), magnitude)]
    outside = sorted((r["trace_id"], r["span_id"], r["magnitude_ms"], r["detail"])
                     for r in rows if r["rule"] == "event_outside_span")
    assert outside == sorted([
        (planted["trace"], _hex_span(planted["late"]), 15.0, "event done #3 after span end"),
        (planted["other_trace"], _hex_span(planted["other"]), 1.0, "event done #0 after span end"),
    ])
    chunks = [r for r in rows if r["rule"] == "chunks_out_of_order"]
    assert [(r["span_id"], r["span_name"], r["magnitude_ms"], r["detail"]) for r in chunks] == [
        (_hex_span(planted["late"]), "emit", 2.5, "chunk 2 earlier than chunk 1")]
    only = run_query(con, "skew_rules", {"trace_id": planted["other_trace"]}).dicts()
    assert [(r["rule"], r["span_id"]) for r in only] == [("event_outside_span", _hex_span(planted["other"]))]
    assert len(rows) == 4


def test_decode_steps_without_a_parent_are_compared_within_their_trace() -> None:
    from opentelemetry import trace as otel_trace

    from trace_fixtures import TraceWorld, _ns

    world = TraceWorld()
    tracer = world.tracer(SERVER_RESOURCE, 1000)
    root = tracer.start_span("decode", start_time=_ns(0.0), attributes={"tokentrace.step": 1})
    root.end(end_time=_ns(10.0))
    # a second root decode span in the same trace (a new root in the trace's context would be a
    # child): both are parentless once the parent link is dropped below
    second = tracer.start_span("decode", context=otel_trace.set_span_in_context(root), start_time=_ns(6.0),
                               attributes={"tokentrace.step": 2})
    second.end(end_time=_ns(12.0))
    con = world.load()
    con.execute("UPDATE spans SET parent_span_id = NULL")
    rows = [r for r in run_query(con, "skew_rules", {}).dicts() if r["rule"] == "decode_steps_overlap"]
    assert [(r["span_id"], r["related_span_id"], r["magnitude_ms"]) for r in rows] == [
        (_hex_span(second), _hex_span(root), 4.0)]
