"""Results in request_key ranges (analyzer.query.runner.stream_query) and the clustered kept tables
behind them: the same rows in the same order as one query, whatever the number of ranges;
the CLI's streamed csv/json are byte for byte what the in-memory writer gives."""

from __future__ import annotations

import csv
import io
import json
from pathlib import Path

import duckdb
import pytest
from click.testing import CliRunner

import analyzer.db.views as db_views
import analyzer.query.runner as queries
from analyzer.cli import cli
from analyzer.cli._options import emit_row_batches, emit_rows
from analyzer.db.store import connect
from analyzer.db.views import keep as view_keep
from analyzer.db.views import kept_order, request_key_ranges
from analyzer.query.runner import run_query, stream_query
from trace_fixtures import mixed_db, mixed_trace_id, mixed_world


def _streamed(con: duckdb.DuckDBPyConnection, name: str, params: dict | None = None) -> tuple[int, list[tuple]]:
    parts, rows = 0, []
    for part in stream_query(con, name, params):
        parts += 1
        rows += con.execute(part.sql, part.params).fetchall()
    return parts, rows


def _close(a: list[tuple], b: list[tuple]) -> bool:
    """Equal rows; floats to 1e-12 relative (a sum's last digits depend on its order)."""
    def same(x: object, y: object) -> bool:
        return x == pytest.approx(y, rel=1e-12) if isinstance(x, float) and isinstance(y, float) else x == y
    return len(a) == len(b) and all(len(r) == len(q) and all(map(same, r, q)) for r, q in zip(a, b))


def test_request_key_ranges_cover_every_request_once(monkeypatch) -> None:
    con = mixed_db()
    run_query(con, "itl")
    requests = con.execute("SELECT count(*) FROM request_keys").fetchall()[0][0]
    events = con.execute("SELECT count(*) FROM span_events").fetchall()[0][0]
    assert requests > 3
    assert request_key_ranges(con) == [(1, requests)]  # far below RANGE_EVENTS: one range
    monkeypatch.setattr(view_keep, "RANGE_EVENTS", -(-events // 3))  # three ranges' worth of events
    ranges = request_key_ranges(con)
    assert len(ranges) == 3
    assert ranges[0][0] == 1 and ranges[-1][1] == requests
    assert all(high + 1 == low for (_, high), (low, _) in zip(ranges, ranges[1:]))


def test_itl_in_ranges_gives_the_rows_of_one_query_in_order(monkeypatch) -> None:
    whole = run_query(mixed_db(), "itl").rows
    monkeypatch.setattr(view_keep, "RANGE_EVENTS", 1)  # one request perspective per range
    con = mixed_db()
    parts, rows = _streamed(con, "itl")
    requests = con.execute("SELECT count(*) FROM request_keys").fetchall()[0][0]
    assert parts == requests > 3
    assert rows == whole and len(rows) > 100
    # narrowed queries run as one part; so does a caller's own range
    assert _streamed(con, "itl", {"trace_id": mixed_trace_id("seed")})[0] == 1
    parts, narrowed = _streamed(con, "itl", {"request_key_from": 2, "request_key_to": 3})
    two = set(con.execute("SELECT source, perspective, trace_id, request_span_id FROM request_keys"
                          " WHERE request_key BETWEEN 2 AND 3").fetchall())
    assert parts == 1 and len(two) == 2
    assert narrowed == [r for r in whole if r[:4] in two] and narrowed  # exactly those two requests' gaps
    assert _streamed(con, "itl", {"perspective": "client"})[1] == [r for r in whole if r[1] == "client"]


def test_a_query_without_range_parameters_is_one_part(monkeypatch) -> None:
    monkeypatch.setattr(view_keep, "RANGE_EVENTS", 1)
    con = mixed_db()
    parts, rows = _streamed(con, "requests")
    assert parts == 1 and rows == run_query(mixed_db(), "requests").rows


def test_gap_table_kept_in_ranges_is_clustered_and_gives_the_same_summary(monkeypatch) -> None:
    whole = mixed_db()
    expected = run_query(whole, "summary").rows
    monkeypatch.setattr(view_keep, "RANGE_EVENTS", 7)
    con = mixed_db()
    got = run_query(con, "summary").rows
    assert len(got) == len(expected)
    for a, b in zip(got, expected):
        assert a[:2] == b[:2]
        assert all(x == pytest.approx(y, rel=1e-12) if isinstance(x, float) else x == y for x, y in zip(a, b))
    keys = [r[0] for r in con.execute(f"SELECT request_key FROM temp.{db_views.CACHE_PREFIX}request_gap_rows").fetchall()]
    assert len(request_key_ranges(con)) > 3
    assert keys == sorted(keys)  # range by range, each range's rows before the next range's


def test_chunk_table_is_kept_in_the_order_its_header_names() -> None:
    assert kept_order(db_views.view_files()[0]) == {"tt_candidate_chunks": "candidate_key, chunk_index, time_ns"}
    assert kept_order(["-- keep chunks: c ORDER BY k, i\n-- keep: a\nSELECT 1"]) == {"c": "k, i"}
    assert db_views.kept_views(["-- keep chunks: c ORDER BY k, i\nSELECT 1"], chunks=True) == ["c"]
    with pytest.raises(ValueError, match="names one view"):
        kept_order(["-- keep chunks: a, b ORDER BY k"])
    con = mixed_db()
    run_query(con, "requests")
    rows = con.execute(
        f"SELECT candidate_key, chunk_index, time_ns FROM temp.{db_views.CACHE_PREFIX}tt_candidate_chunks").fetchall()
    assert len(rows) > 100 and rows == sorted(rows)


@pytest.mark.parametrize("rows", [[], [(1, "a", None)], [(1, "a", 2.5), (2, None, float("nan")), (3, "c,d", 1e-9)]])
def test_batched_writer_writes_the_bytes_of_the_whole_writer(rows) -> None:
    columns = ["n", "s", "x"]
    for fmt in ("json", "csv"):
        whole, batched = io.StringIO(), io.StringIO()
        emit_rows(columns, rows, fmt, out=whole)
        assert emit_row_batches(columns, [rows[:1], [], rows[1:]], fmt, out=batched) == len(rows)
        assert batched.getvalue() == whole.getvalue()
    # what the writers wrote before they went batch by batch: one json.dumps of the whole
    # list (NaN as null), and csv.writer over every row (None as "")
    legacy = json.dumps([{"n": r[0], "s": r[1], "x": None if r[2] != r[2] else r[2]} for r in rows], indent=2) + "\n"
    out = io.StringIO()
    emit_row_batches(columns, [rows], "json", out=out)
    assert out.getvalue() == legacy
    legacy_csv = io.StringIO()
    writer = csv.writer(legacy_csv, lineterminator="\n")
    writer.writerow(columns)
    writer.writerows([["" if v is None else v for v in r] for r in rows])
    out = io.StringIO()
    emit_row_batches(columns, [rows[:2], rows[2:]], "csv", out=out)
    assert out.getvalue() == legacy_csv.getvalue()


def test_cli_itl_streams_the_rows_of_one_query(tmp_path: Path, monkeypatch) -> None:
    con = mixed_world().load(connect(tmp_path / "traces.duckdb"))
    whole = run_query(con, "itl")
    con.close()
    monkeypatch.setattr(view_keep, "RANGE_EVENTS", 1)
    args = ["itl", "--db", str(tmp_path / "traces.duckdb")]
    result = CliRunner().invoke(cli, args + ["--format", "json"], catch_exceptions=False)
    assert result.exit_code == 0, result.output
    expected = [dict(zip(whole.columns, r)) for r in whole.rows]
    assert json.loads(result.output) == expected
    result = CliRunner().invoke(cli, args + ["--format", "csv"], catch_exceptions=False)
    parsed = list(csv.reader(io.StringIO(result.output)))
    assert parsed[0] == whole.columns and len(parsed) == len(whole.rows) + 1
    assert parsed[1:] == [["" if v is None else str(v) for v in r] for r in whole.rows]
    bad = CliRunner().invoke(cli, args + ["--format", "csv", "--param", "request_key_from=x"])
    # checked before anything runs or is written: one error line, no csv header
    assert bad.exit_code == 1 and bad.output.startswith("Error: itl: $request_key_from is BIGINT")
    assert bad.output.count("\n") == 1


def test_one_query_per_connection_keeps_chunks_only_to_build_gaps() -> None:
    def kept(con: duckdb.DuckDBPyConnection) -> set[str]:
        return {r[0] for r in con.execute(
            "SELECT table_name FROM duckdb_tables() WHERE database_name = 'temp'").fetchall()}

    chunks = f"{db_views.CACHE_PREFIX}tt_candidate_chunks"
    facts = f"{db_views.CACHE_PREFIX}request_facts"
    # a per-request view read once by the query is read in place (DuckDB computes only the
    # columns used); phases reads request_facts twice (itself and through the clock offsets)
    for name, keeps_facts in (("requests", False), ("phases", True), ("window", False), ("skew_offsets", False)):
        con = mixed_db()
        rows = run_query(con, name, keep_chunks=False).rows
        assert chunks not in kept(con) and (facts in kept(con)) == keeps_facts, name
        assert _close(rows, run_query(mixed_db(), name).rows), name
    for name in ("itl", "summary"):  # the gap table is built from the kept, sorted chunks
        con = mixed_db()
        rows = run_query(con, name, keep_chunks=False).rows
        assert {chunks, f"{db_views.CACHE_PREFIX}request_gap_rows"} <= kept(con), name
        assert _close(rows, run_query(mixed_db(), name).rows), name


class _FailingInsert:
    """A connection whose n-th INSERT raises, as an interrupt between two ranges would."""

    def __init__(self, con: duckdb.DuckDBPyConnection, fail_at: int) -> None:
        self.con, self.fail_at, self.inserts = con, fail_at, 0

    def execute(self, sql: str, params: object = None):
        if sql.startswith("INSERT"):
            self.inserts += 1
            if self.inserts == self.fail_at:
                raise KeyboardInterrupt
        return self.con.execute(sql, params)


def test_an_interrupted_range_by_range_keep_leaves_nothing_kept(monkeypatch) -> None:
    monkeypatch.setattr(view_keep, "RANGE_EVENTS", 100)
    con = mixed_db()
    db_views.install_views(con)
    db_views.materialize_views(con, "SELECT * FROM request_keys")
    assert len(request_key_ranges(con)) > 3
    with pytest.raises(KeyboardInterrupt):
        view_keep.keep_view(_FailingInsert(con, 3), "request_gap_rows", ranges=request_key_ranges(con))
    temp = {r[0] for r in con.execute("SELECT table_name FROM duckdb_tables() WHERE database_name = 'temp'").fetchall()}
    assert not {f"{db_views.CACHE_PREFIX}request_gap_rows", f"{db_views.BUILDING_PREFIX}request_gap_rows"} & temp
    assert "request_gap_rows" in db_views.materialize_views(con, queries.load_query("itl").sql)  # kept whole now
    assert run_query(con, "itl").rows == run_query(mixed_db(), "itl").rows


def test_keep_header_order_by_is_for_chunk_lines_and_any_case() -> None:
    assert kept_order(["-- keep chunks: c order by k, i"]) == {"c": "k, i"}
    assert db_views.kept_views(["-- keep chunks: c Order By k"], chunks=True) == ["c"]
    with pytest.raises(ValueError, match="keep chunks"):
        kept_order(["-- keep: a ORDER BY k"])


@pytest.mark.parametrize("param", ["request_key_from=x", "request_key_to=1.5", "request_key_from=true"])
def test_a_mistyped_parameter_is_an_error_even_over_no_data(tmp_path: Path, param: str) -> None:
    connect(tmp_path / "empty.duckdb").close()
    for fmt in ("csv", "table"):
        result = CliRunner().invoke(cli, ["itl", "--db", str(tmp_path / "empty.duckdb"), "--format", fmt,
                                          "--param", param])
        assert result.exit_code == 1, result.output
        assert result.output.startswith("Error: itl: $request_key_") and "BIGINT: expected an integer" in result.output
