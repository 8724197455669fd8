"""Per-chunk views are kept at every size (analyzer.db.views.MATERIALIZE_MAX_EVENTS = None):
the same rows as the plain views, and a kept table larger than DuckDB's memory_limit is
evicted to temp_directory instead of failing (the 1e6-request case of docs/metrics.md)."""

from __future__ import annotations

from pathlib import Path

import duckdb
import pytest

import analyzer.db.views as db_views
import analyzer.query.runner as queries
from analyzer.db.views import keep as view_keep
from analyzer.query.runner import run_query
from trace_fixtures import mixed_db


def _kept(con: duckdb.DuckDBPyConnection) -> set[str]:
    return {
        r[0][len(db_views.CACHE_PREFIX):]
        for r in con.execute(
            "SELECT table_name FROM duckdb_tables() WHERE database_name = 'temp' AND starts_with(table_name, $p)",
            {"p": db_views.CACHE_PREFIX},
        ).fetchall()
    }


def test_per_chunk_views_are_kept_whatever_the_event_count() -> None:
    assert db_views.MATERIALIZE_MAX_EVENTS is None
    con = mixed_db()
    gaps = run_query(con, "itl").rows
    assert {"request_keys", "request_gap_rows", "tt_candidate_chunks"} <= _kept(con)
    summary = run_query(con, "summary").rows  # reads the kept gaps
    plain = mixed_db()
    assert gaps == run_query(plain, "itl", keep=False).rows
    want = run_query(plain, "summary", keep=False).rows
    assert len(summary) == len(want)
    for got, row in zip(summary, want):  # every number, not only the counts
        assert all(g == pytest.approx(w, rel=1e-9, abs=1e-9) if isinstance(w, float) else g == w
                   for g, w in zip(got, row)), got


def test_a_kept_table_larger_than_the_memory_limit_spills(tmp_path: Path) -> None:
    con = duckdb.connect(":memory:")
    con.execute("SET threads = 1")
    con.execute("SET memory_limit = '64MB'")
    con.execute("SET temp_directory = $d", {"d": str(tmp_path)})
    # 8M rows x 3 BIGINTs: 192 MB, three times the limit
    con.execute("CREATE VIEW wide AS SELECT r AS a, r * 7 AS b, r % 150 AS c FROM range(8000000) t(r)")
    assert view_keep.keep_view(con, "wide") == 8_000_000
    in_memory, spilled = con.execute(
        "SELECT memory_usage_bytes, temporary_storage_bytes FROM duckdb_memory() WHERE tag = 'IN_MEMORY_TABLE'"
    ).fetchall()[0]
    # What does not fit went to temp_directory (how much exactly depends on what else holds
    # memory at that moment: 63-70 MB measured), and the table kept in memory is under the limit.
    assert spilled > 32_000_000 and in_memory <= 64 * 1024 * 1024, (in_memory, spilled)
    assert con.execute("SELECT sum(c), max(b) FROM wide").fetchall() == [(sum(range(150)) * 53333 + sum(range(50)),
                                                                         7 * 7_999_999)]


def test_an_int_cap_keeps_no_per_chunk_view_above_it(monkeypatch) -> None:
    """MATERIALIZE_MAX_EVENTS = N restores the old rule: above N span events the per-chunk
    views are derived in each query, never kept; the request-level ones still are, and the
    answers are the same."""
    plain = mixed_db()
    want_itl, want_summary = run_query(plain, "itl", keep=False).rows, run_query(plain, "summary", keep=False).rows
    monkeypatch.setattr(view_keep, "MATERIALIZE_MAX_EVENTS", 0)
    con = mixed_db()
    assert run_query(con, "itl").rows == want_itl
    summary = run_query(con, "summary").rows
    assert [r[:5] for r in summary] == [r[:5] for r in want_summary]
    assert {"request_facts", "request_keys"} <= _kept(con)
    assert not {"request_gap_rows", "tt_candidate_chunks"} & _kept(con)
    assert [p.params for p in queries.stream_query(con, "itl")] == [{"perspective": None, "trace_id": None, "request_span_id": None,
                                                                     "request_key_from": None, "request_key_to": None}]
    monkeypatch.setattr(view_keep, "MATERIALIZE_MAX_EVENTS", 10**9)  # above the count: kept again
    run_query(con, "itl")
    assert {"request_gap_rows", "tt_candidate_chunks"} <= _kept(con)
