"""summary.sql: distributions with linear (numpy default) percentiles."""

from __future__ import annotations

import numpy as np
import pytest

from analyzer.query.runner import run_query
from trace_fixtures import mixed_db, seed_db


def _by_metric(rows: list[dict], perspective: str) -> dict[str, dict]:
    return {r["metric"]: r for r in rows if r["perspective"] == perspective}


def test_seed_summary() -> None:
    rows = _by_metric(run_query(seed_db(), "summary", {}).dicts(), "client")
    assert rows["ttft_ms"]["p50"] == 190 and rows["e2e_ms"]["max"] == 3915
    assert rows["itl_ms"]["count"] == 149 and rows["itl_ms"]["p99"] == 25 and rows["itl_ms"]["std_pop"] == 0
    assert rows["tpot_ms"]["mean"] == pytest.approx(25)
    assert rows["decode_output_tokens_per_second"]["mean"] == pytest.approx(40)
    assert round(rows["whole_request_output_tokens_per_second"]["mean"], 2) == 38.31
    assert {r["interpolation"] for r in rows.values()} == {"linear"}


def test_percentiles_are_numpy_linear_over_the_requests_query() -> None:
    con = mixed_db()
    summary = _by_metric(run_query(con, "summary", {"perspective": "client"}).dicts(), "client")
    reqs = [r for r in run_query(con, "requests", {"perspective": "client"}).dicts() if r["outcome"] == "succeeded"]
    ttft = [r["ttft_ms"] for r in reqs if r["ttft_ms"] is not None]
    assert sorted(ttft) == [190.0] * 6 + [192.0, 193.0]  # planted: skew_b 193, skew_c 192
    row = summary["ttft_ms"]
    assert (row["count"], row["null_count"]) == (8, 2)  # zero_tokens and dropped have no TTFT
    assert row["p90"] == pytest.approx(192.3) and row["p99"] == pytest.approx(192.93)
    for q in (50, 90, 95, 99):
        assert row[f"p{q}"] == pytest.approx(np.percentile(ttft, q))  # numpy's default: linear
    assert row["std_pop"] == pytest.approx(np.std(ttft))
    itl = summary["itl_per_token_ms"]
    assert itl["min"] == 6.25 and itl["null_count"] == 126  # multi-token chunk; the dropped span's gaps


def test_failed_and_cancelled_excluded_unless_asked() -> None:
    con = mixed_db()
    ok = _by_metric(run_query(con, "summary", {"perspective": "server"}).dicts(), "server")
    every = _by_metric(run_query(con, "summary", {"perspective": "server", "include_unsuccessful": True}).dicts(),
                       "server")
    assert every["e2e_ms"]["count"] == ok["e2e_ms"]["count"] + 2  # + failed, cancelled


def test_empty_metric_is_null_with_reason() -> None:
    from trace_fixtures import RequestPlan, TraceWorld

    world = TraceWorld()
    world.add(RequestPlan(output_tokens=1))
    rows = _by_metric(run_query(world.load(), "summary", {}).dicts(), "client")
    tpot = rows["tpot_ms"]
    assert tpot["count"] == 0 and tpot["null_count"] == 1
    assert tpot["mean"] is None and tpot["p50"] is None and tpot["null_reason"] == "no known value of tpot_ms"
    assert "itl_ms" not in rows  # one chunk: no gap at all


def test_gaps_without_any_known_value_give_null_statistics_with_a_reason() -> None:
    from trace_fixtures import RequestPlan, TraceWorld

    world = TraceWorld()
    world.add(RequestPlan(output_tokens=150, max_events=128))  # events dropped: no gap has a value
    rows = _by_metric(run_query(world.load(), "summary", {}).dicts(), "client")
    for metric in ("itl_ms", "itl_per_token_ms"):
        row = rows[metric]
        assert row["count"] == 0 and row["null_count"] > 0, row
        assert (row["mean"], row["std_pop"], row["min"], row["p50"], row["p99"], row["max"]) == (None,) * 6
        assert row["null_reason"] == f"no known value of {metric}"
    assert rows["ttft_ms"]["count"] + rows["ttft_ms"]["null_count"] == 1  # the request itself is counted


def test_gap_metrics_are_each_their_own_distribution_over_request_gaps() -> None:
    """summary reads both gap metrics from one scan and one aggregation of the gaps:
    count, null_count, mean, std, min, percentiles and max must still be per metric and per
    perspective, over the gaps of succeeded requests, as numpy computes them from request_gaps."""
    con = mixed_db()
    summary = run_query(con, "summary", {}).dicts()
    gaps = con.execute(
        "SELECT g.perspective, g.itl_ms, g.itl_per_token_ms FROM request_gaps g JOIN request_metrics m"
        " ON m.trace_id = g.trace_id AND m.request_span_id = g.request_span_id"
        " AND m.perspective = g.perspective AND m.source = g.source WHERE m.outcome = 'succeeded'").fetchall()
    for perspective in ("client", "server"):
        rows = _by_metric(summary, perspective)
        for col, metric in ((1, "itl_ms"), (2, "itl_per_token_ms")):
            values = [g[col] for g in gaps if g[0] == perspective]
            known = np.array([v for v in values if v is not None])
            row = rows[metric]
            assert (row["count"], row["null_count"]) == (len(known), len(values) - len(known)), metric
            assert row["mean"] == pytest.approx(known.mean()) and row["std_pop"] == pytest.approx(known.std())
            assert (row["min"], row["max"]) == (known.min(), known.max())
            for q in (50, 90, 95, 99):
                assert row[f"p{q}"] == pytest.approx(np.percentile(known, q)), (metric, q)
    itl, per_token = _by_metric(summary, "client")["itl_ms"], _by_metric(summary, "client")["itl_per_token_ms"]
    assert itl["null_count"] < per_token["null_count"] or itl["mean"] != per_token["mean"]  # not one copy twice
