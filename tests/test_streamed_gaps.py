"""The gap table kept from one ordered pass over the chunk table (queries/keep/
tt_request_gap_rows.sql, analyzer.db.views.keep.streamed_gap_selects) holds exactly the rows
of the views' window (view request_gap_rows read in place), for tokentrace's spans and another
adapter's together, in one range or in ranges that split a trace's perspectives; and the
window runs instead where DuckDB is told not to preserve insertion order, or the chunk table is
not kept in the order the SQL file names."""

from __future__ import annotations

from pathlib import Path

import duckdb
import pytest

import analyzer.db.views.keep as view_keep
from analyzer.db.views import install_views
from analyzer.db.views.state import CACHE_PREFIX
from analyzer.formats.load import load_paths
from analyzer.query.runner import run_query
from trace_fixtures import mixed_world

DATA = Path(__file__).resolve().parent / "data"
CLIENTS = DATA / "real" / "openai-clients-tokentrace"  # tokentrace's server + OpenLLMetry's client spans


def _world() -> duckdb.DuckDBPyConnection:
    """The mixed fixture (dropped events, multi-token and out-of-order chunks, one-token and
    zero-token requests) plus a real capture whose client chunks another adapter reads."""
    con = mixed_world().load()
    load_paths(con, [str(CLIENTS / "server.jsonl"), str(CLIENTS / "openllmetry.jsonl")])
    return con


@pytest.fixture(scope="module")
def expected() -> list[tuple]:
    """request_gap_rows through the views' window, nothing kept."""
    con = _world()
    install_views(con)
    rows = con.execute("SELECT * FROM request_gap_rows ORDER BY ALL").fetchall()
    sources = dict(con.execute("SELECT k.source, count(*) FROM request_gap_rows g JOIN request_keys k"
                               " USING (request_key) GROUP BY ALL").fetchall())
    assert sources.get("tokentrace", 0) > 500 and sources.get("openllmetry", 0) > 10, sources
    assert any(r[6] > 0 for r in rows)  # a span that dropped events
    return rows


def _kept(monkeypatch: pytest.MonkeyPatch, range_events: int | None, *, insertion_order: bool = True) -> tuple:
    """Keep the gap table as the summary query does; returns its rows (sorted), whether the
    ordered pass ran, and the number of ranges."""
    calls: list[object] = []
    real = view_keep.streamed_gap_selects

    def spy(*args, **kwargs):
        calls.append(real(*args, **kwargs))
        return calls[-1]

    monkeypatch.setattr(view_keep, "streamed_gap_selects", spy)
    if range_events is not None:
        monkeypatch.setattr(view_keep, "RANGE_EVENTS", range_events)
    con = _world()
    if not insertion_order:
        con.execute("SET preserve_insertion_order = false")
    run_query(con, "summary")
    rows = con.execute(f"SELECT * FROM temp.{CACHE_PREFIX}request_gap_rows ORDER BY ALL").fetchall()
    assert len(calls) == 1
    return rows, calls[0] is not None, len(view_keep.request_key_ranges(con))


@pytest.mark.parametrize("range_events", [None, 1, 150])
def test_ordered_pass_gives_the_windows_rows(monkeypatch, expected, range_events) -> None:
    """One range; one request perspective per range (a trace's client and server perspective
    in different ranges, their candidates in either order); a few requests per range."""
    rows, streamed, ranges = _kept(monkeypatch, range_events)
    assert streamed
    assert ranges == 1 if range_events is None else ranges > 3
    assert rows == expected


def test_window_runs_where_insertion_order_is_not_preserved(monkeypatch, expected) -> None:
    rows, streamed, _ = _kept(monkeypatch, 150, insertion_order=False)
    assert not streamed
    assert rows == expected


def test_itl_and_summary_are_those_of_the_views(monkeypatch) -> None:
    """The metric queries over the kept table, against the same queries with nothing kept
    (a connection whose views read the window in place)."""
    monkeypatch.setattr(view_keep, "RANGE_EVENTS", 150)
    kept = _world()
    in_place = _world()
    for name in ("itl", "summary"):
        got = run_query(kept, name).rows
        want = run_query(in_place, name, keep=False).rows
        assert len(got) == len(want) > 0
        for a, b in zip(got, want):
            assert all(x == pytest.approx(y, rel=1e-12) if isinstance(x, float) else x == y for x, y in zip(a, b))


def test_the_window_runs_unless_the_chunk_table_is_kept_in_the_files_order() -> None:
    """streamed_gap_selects' conditions: the chunk table and tt_request_keys kept, the chunk
    table in the order the file's '-- over:' line names."""
    con = _world()
    install_views(con)
    order = {"tt_candidate_chunks": "candidate_key, chunk_index, time_ns"}
    kept = {"tt_candidate_chunks", "tt_request_keys"}
    assert view_keep.streamed_gap_selects(con, order, kept) is not None
    assert view_keep.streamed_gap_selects(con, order, {"tt_request_keys"}) is None
    assert view_keep.streamed_gap_selects(con, order, {"tt_candidate_chunks"}) is None
    assert view_keep.streamed_gap_selects(con, {"tt_candidate_chunks": "candidate_key, time_ns"}, kept) is None
    with pytest.raises(ValueError, match="needs ranges"):
        view_keep.keep_view(con, "request_gap_rows", range_selects=lambda low, high: [])


def test_derived_tables_of_a_database_take_the_ordered_pass(monkeypatch, expected, tmp_path) -> None:
    """tokentrace load writes the gap table into the database's derived schema the same way."""
    from analyzer.db.derived import build_derived
    from analyzer.db.store import connect
    from analyzer.db.views import DERIVED_SCHEMA

    calls: list[object] = []
    real = view_keep.streamed_gap_selects
    monkeypatch.setattr(view_keep, "streamed_gap_selects", lambda *a, **k: calls.append(real(*a, **k)) or calls[-1])
    monkeypatch.setattr(view_keep, "RANGE_EVENTS", 150)
    con = mixed_world().load(connect(tmp_path / "traces.duckdb"))
    load_paths(con, [str(CLIENTS / "server.jsonl"), str(CLIENTS / "openllmetry.jsonl")])
    build_derived(con)
    assert len(calls) == 1 and calls[0] is not None
    rows = con.execute(f"SELECT * FROM {DERIVED_SCHEMA}.{CACHE_PREFIX}request_gap_rows ORDER BY ALL").fetchall()
    assert rows == expected
