"""Views installed once per connection and kept as temp tables (analyzer.query.runner): the same
answers as the plain views, recomputed when the data changes, never kept for one-trace
queries; the integer request_key gives itl the order of its three string keys."""

from __future__ import annotations

import duckdb
import pytest

import analyzer.db.views as db_views
from analyzer.db.views import install_views, kept_views, materialize_views, view_files
from analyzer.db.views import keep as view_keep
from analyzer.query.runner import list_queries, run_query
from engine_fixtures import EngineWorld, VllmPlan, add_vllm_request
from trace_fixtures import RequestPlan, TraceWorld, mixed_db, mixed_trace_id


def _kept(con: duckdb.DuckDBPyConnection) -> set[str]:
    return {
        r[0][len(db_views.CACHE_PREFIX):]
        for r in con.execute(
            "SELECT table_name FROM duckdb_tables() WHERE database_name = 'temp' AND starts_with(table_name, 'tt_cached_')"
        ).fetchall()
    }


def _same_rows(a: list[tuple], b: list[tuple]) -> bool:
    """Equal rows; floats to 1e-9 relative (a sum's last digits depend on the order it ran in)."""
    def same(x: object, y: object) -> bool:
        if isinstance(x, float) or isinstance(y, float):
            return x is not None and y is not None and x == pytest.approx(y, rel=1e-9, abs=1e-9)
        return x == y
    return len(a) == len(b) and all(len(r) == len(q) and all(map(same, r, q)) for r, q in zip(a, b))


def _union_parts(con: duckdb.DuckDBPyConnection, union: str) -> str:
    return con.execute("SELECT sql FROM duckdb_views() WHERE view_name = $v", {"v": union}).fetchall()[0][0]


def test_kept_views_are_read_from_the_adapter_headers() -> None:
    base, _ = view_files()
    assert kept_views(base) == ["tt_request_candidates", "tt_request_spans", "vllm_request_spans",
                                "tgi_request_spans", "sglang_request_spans", "genai_client_request_spans",
                                "vllm_engine_request_spans"]
    assert kept_views(base, chunks=True) == ["tt_candidate_chunks"]
    assert kept_views(["-- keep: a_request_spans, b\n-- keep chunks: c\nSELECT 1"]) == ["a_request_spans", "b"]


def test_every_query_gives_the_same_rows_with_and_without_kept_views() -> None:
    kept, plain = mixed_db(), mixed_db()
    names = list_queries()
    for name in names:  # in a row on one connection: later queries read what earlier ones kept
        assert _same_rows(run_query(kept, name).rows, run_query(plain, name, keep=False).rows), name
    assert {"request_facts", "request_metrics", "request_keys", "request_gap_rows", "tt_candidate_chunks"} <= _kept(kept)
    assert _kept(plain) == set(kept_views(view_files()[0]))  # the request spans only


def test_views_are_installed_once_while_the_data_is_unchanged() -> None:
    con = mixed_db()
    run_query(con, "summary")
    before = _kept(con)
    con.execute("CREATE TEMP TABLE marker AS SELECT 1")  # not a counted table: no reinstall
    run_query(con, "requests")
    assert _kept(con) == before
    install_views(con, refresh=True)
    assert _kept(con) == set(kept_views(view_files()[0]))  # refresh drops the kept request-level views


def test_new_data_on_the_connection_is_seen_by_the_next_query() -> None:
    world = TraceWorld()
    world.add(RequestPlan())
    con = world.load()
    install_views(con)
    assert "vllm_request_facts" not in _union_parts(con, "request_facts")  # no vLLM span: left out
    assert len(run_query(con, "requests").rows) == 2  # client + server; request_facts now kept
    engines = EngineWorld()
    add_vllm_request(engines, VllmPlan())
    engines.load(con)  # more spans: the kept tables are stale
    install_views(con)
    assert "vllm_request_facts" in _union_parts(con, "request_facts")
    rows = run_query(con, "requests").dicts()
    assert sorted(r["source"] for r in rows) == ["tokentrace", "tokentrace", "vllm"]


def test_a_query_for_one_trace_keeps_nothing_but_reads_what_is_kept() -> None:
    con = mixed_db()
    seed = mixed_trace_id("seed")
    one = run_query(con, "itl", {"trace_id": seed})
    assert _kept(con) == set(kept_views(view_files()[0]))
    run_query(con, "itl")
    assert "request_gap_rows" in _kept(con)
    assert _same_rows(run_query(con, "itl", {"trace_id": seed}).rows, one.rows)


def test_per_chunk_views_are_not_kept_above_the_event_limit(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(view_keep, "MATERIALIZE_MAX_EVENTS", 10)
    con = mixed_db()
    gaps = run_query(con, "itl").rows
    assert {"request_keys"} <= _kept(con) and not {"request_gap_rows", "tt_candidate_chunks"} & _kept(con)
    assert _same_rows(gaps, run_query(mixed_db(), "itl", keep=False).rows)


def test_materialize_needs_installed_views() -> None:
    con = mixed_db()
    assert materialize_views(con, "SELECT * FROM request_metrics") == []
    install_views(con)
    assert materialize_views(con, "SELECT * FROM request_metrics") == ["tt_candidate_chunks", "request_facts",
                                                                        "request_metrics"]
    assert materialize_views(con, "SELECT * FROM request_metrics") == []


def test_itl_rows_come_in_trace_request_perspective_gap_order() -> None:
    rows = run_query(mixed_db(), "itl").dicts()
    keys = [(r["trace_id"], r["request_span_id"], r["perspective"], r["gap_index"]) for r in rows]
    assert len(keys) > 150 and keys == sorted(keys)
    assert {r["perspective"] for r in rows} == {"client", "server"}


def test_a_change_that_keeps_every_row_count_needs_refresh() -> None:
    """The fingerprint is row counts (module docstring): an UPDATE keeps them, so the kept
    request_metrics still give the old TTFT until install_views(refresh=True)."""
    world = TraceWorld()
    world.add(RequestPlan())
    con = world.load()
    before = {r["perspective"]: r["ttft_ms"] for r in run_query(con, "requests").dicts()}
    assert before == {"client": 190.0, "server": 182.0}
    con.execute("UPDATE spans SET start_ns = start_ns - 10000000 WHERE kind = 'CLIENT'")  # client s 10 ms earlier
    stale = {r["perspective"]: r["ttft_ms"] for r in run_query(con, "requests").dicts()}
    assert stale == before  # documented: not seen without a refresh
    install_views(con, refresh=True)
    after = {r["perspective"]: r["ttft_ms"] for r in run_query(con, "requests").dicts()}
    assert after == {"client": 200.0, "server": 182.0}
