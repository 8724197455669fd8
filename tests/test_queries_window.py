"""window.sql: closed_cohort and steady_state over SDK traces with planted boundary cases."""

from __future__ import annotations

import pytest

from analyzer.query.runner import run_query
from trace_fixtures import ANCHOR_NS, RequestPlan, TraceWorld

S = 1_000_000_000  # ns per second
WINDOW = {"window_start_ns": ANCHOR_NS, "window_end_ns": ANCHOR_NS + 10 * S}


@pytest.fixture(scope="module")
def con():
    """Window [0 s, 10 s] (true clock; one clock for client and server):
    A 0 s, 5 tokens, e 0.29 s          succeeded
    B 1 s, 3 tokens, status ERROR      failed
    C 2 s, 10 tokens, cancelled        cancelled
    F 5 s, 1 token (TPOT NULL)         succeeded
    D 9 s, 150 tokens, e 12.915 s      succeeded, crosses the end (33 chunks before 10 s)
    E -2 s, 150 tokens, e 1.915 s      succeeded, crosses the start (77 chunks after 0 s)
    """
    world = TraceWorld()
    world.add(RequestPlan(start_ms=-2000))  # E
    world.add(RequestPlan(start_ms=0, output_tokens=5))  # A
    world.add(RequestPlan(start_ms=1000, output_tokens=3, finish_reason="error", error_type="InternalError"))  # B
    world.add(RequestPlan(start_ms=2000, output_tokens=10, finish_reason="cancelled"))  # C
    world.add(RequestPlan(start_ms=5000, output_tokens=1))  # F
    world.add(RequestPlan(start_ms=9000))  # D
    c = world.load()
    yield c
    c.close()


def _window(con, **params) -> dict:
    rows = run_query(con, "window", {**WINDOW, **params}).dicts()
    assert len(rows) == 1
    return rows[0]


def test_closed_cohort_counts_requests_starting_in_window(con) -> None:
    w = _window(con, mode="closed_cohort")
    assert (w["attempted"], w["succeeded"], w["failed"], w["cancelled"]) == (5, 3, 1, 1)
    assert w["not_finished_in_window"] == 1  # D is kept and reported, not dropped
    assert w["requests_crossing_boundary"] is None
    assert w["window_s"] == 10
    assert w["request_throughput_rps"] == pytest.approx(0.3)
    assert w["error_rate"] == pytest.approx(0.2)
    assert w["output_tokens"] == 5 + 1 + 150  # succeeded only: A, F, D
    assert w["output_tokens_per_s"] == pytest.approx(15.6)


def test_closed_cohort_failed_tokens_and_cancelled_as_failed(con) -> None:
    w = _window(con, mode="closed_cohort", count_failed_tokens=True, cancelled_as_failed=True)
    assert (w["failed"], w["cancelled"]) == (2, 0)
    assert w["error_rate"] == pytest.approx(0.4)
    assert w["output_tokens"] == 156 + 3 + 10
    assert "succeeded, failed or were cancelled" in w["token_counting_rule"]


def test_steady_state_counts_completions_and_in_window_chunks(con) -> None:
    w = _window(con, mode="steady_state")
    # completions in window: A, E (at e), B, C (at span end), F; D completes after the window
    assert (w["attempted"], w["succeeded"], w["failed"], w["cancelled"]) == (5, 3, 1, 1)
    assert w["requests_crossing_boundary"] == 2  # D and E
    assert w["not_finished_in_window"] is None
    assert w["output_tokens"] == 5 + 1 + 77 + 33  # chunks of succeeded requests inside [0, 10 s]
    assert w["request_throughput_rps"] == pytest.approx(0.3)
    w = _window(con, mode="steady_state", count_failed_tokens=True)
    assert w["output_tokens"] == 116 + 3 + 10


def test_steady_state_cancelled_as_failed(con) -> None:
    w = _window(con, mode="steady_state", cancelled_as_failed=True)
    assert (w["succeeded"], w["failed"], w["cancelled"]) == (3, 2, 0)
    assert w["error_rate"] == pytest.approx(0.4)


def test_slos(con) -> None:
    # TPOT SLO 20 ms: every multi-token request has TPOT 25; F (O = 1, TPOT NULL) passes
    assert _window(con, mode="closed_cohort", slo_tpot_ms=20)["slo_passing"] == 1
    # E2E SLO 1 s: A (290 ms) and F (190 ms) pass, D (3,915 ms) fails
    w = _window(con, mode="closed_cohort", slo_e2e_ms=1000, slo_ttft_ms=190)
    assert w["slo_passing"] == 2 and w["observed_goodput_rps"] == pytest.approx(0.2)
    assert _window(con, mode="closed_cohort", slo_ttft_ms=189)["slo_passing"] == 0


def test_unknown_mode_returns_no_row(con) -> None:
    assert run_query(con, "window", {**WINDOW, "mode": "bogus"}).rows == []


def test_closed_cohort_reads_no_chunk(con) -> None:
    """steady_state's chunk-token sum is never run in closed_cohort ($mode is bound before
    DuckDB optimizes: the filter is constant false), so a closed cohort reads no chunk event."""
    import duckdb

    from analyzer.db.views import install_views

    install_views(con)
    columns = [r[0] for r in con.execute("DESCRIBE request_chunks").fetchall()]
    poisoned = ", ".join(f"CASE WHEN error('request_chunks was read') IS NULL THEN {c} END AS {c}" for c in columns)
    original = con.execute("SELECT sql FROM duckdb_views() WHERE view_name = 'request_chunks'").fetchall()[0][0]
    con.execute(f"CREATE OR REPLACE VIEW request_chunks AS SELECT {poisoned} FROM ({original.split(' AS ', 1)[1].rstrip().rstrip(';')})")
    try:
        row = run_query(con, "window", {"mode": "closed_cohort"}, views=False, keep=False).dicts()[0]
        assert row["attempted"] > 0
        with pytest.raises(duckdb.Error, match="request_chunks was read"):
            run_query(con, "window", {"mode": "steady_state"}, views=False, keep=False)
    finally:
        con.execute(original.replace("CREATE VIEW", "CREATE OR REPLACE VIEW", 1))
