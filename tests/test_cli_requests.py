"""CLI query verbs through the real entry point: requests, itl, phases, summary, window, sql."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from click.testing import CliRunner

from analyzer.cli import cli
from analyzer.db.store import connect
from trace_fixtures import mixed_trace_id, mixed_world, write_parquet_dump


@pytest.fixture(scope="module")
def db(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("cli")
    con = mixed_world().load(connect(root / "traces.duckdb"))
    write_parquet_dump(con, str(root / "dump"))
    con.close()
    return root / "traces.duckdb"


def _json(args: list[str]) -> list | dict:
    result = CliRunner().invoke(cli, args, catch_exceptions=False)
    assert result.exit_code == 0, result.output
    return json.loads(result.output)


def test_requests_json_has_the_seed_numbers(db) -> None:
    rows = _json(["requests", "--db", str(db), "--perspective", "client", "--format", "json",
                  "--trace-id", mixed_trace_id("seed").upper()])
    assert len(rows) == 1
    assert (rows[0]["ttft_ms"], rows[0]["e2e_ms"], rows[0]["tpot_ms"]) == (190.0, 3915.0, 25.0)


def test_requests_from_parquet_dump(db) -> None:
    a = _json(["requests", "--db", str(db), "--format", "json"])
    b = _json(["requests", "--parquet", str(db.parent / "dump"), "--format", "json"])
    assert [r["ttft_ms"] for r in a] == [r["ttft_ms"] for r in b] and len(a) == 25


def test_requests_csv_and_table(db) -> None:
    out = CliRunner().invoke(cli, ["requests", "--db", str(db), "--format", "csv"], catch_exceptions=False).output
    assert out.splitlines()[0].startswith("source,perspective,trace_id,request_span_id")
    assert len(out.splitlines()) == 26  # header + 13 requests x 2 perspectives - 1 (server_only)
    table = CliRunner().invoke(cli, ["requests", "--db", str(db)], catch_exceptions=False)
    assert table.exit_code == 0 and "3915" in table.output


def test_itl_per_token_view(db) -> None:
    rows = _json(["itl", "--db", str(db), "--trace-id", mixed_trace_id("multi_token"), "--perspective", "server",
                  "--format", "json"])
    assert [(r["itl_ms"], r["chunk_tokens"]) for r in rows] == [(25.0, 3), (25.0, 2), (25.0, 4)]
    assert rows[2]["itl_per_token_ms"] == 6.25


def test_phases_assume_offset_is_echoed(db) -> None:
    args = ["phases", "--db", str(db), "--trace-id", mixed_trace_id("skew_a")]
    plain = _json(args + ["--format", "json"])[0]
    assert plain["network_in_ms"] is None and "skew_detected" in plain["cross_clock_reason"]
    fixed = _json(args + ["--format", "json", "--assume-offset", "skewed-client=35"])[0]
    assert (fixed["network_in_ms"], fixed["network_out_ms"], fixed["assumed_offset_ms"]) == (5.0, 3.0, -35.0)
    table = CliRunner().invoke(cli, args + ["--assume-offset", "skewed-client=35"], catch_exceptions=False)
    assert "note: assumed offset: clock of 'skewed-client' runs 35 ms ahead" in table.output


def test_summary_and_window_flags(db) -> None:
    rows = _json(["summary", "--db", str(db), "--perspective", "client", "--format", "json"])
    assert rows[0]["metric"] == "ttft_ms" and rows[0]["p90"] == pytest.approx(192.3)
    w = _json(["window", "--db", str(db), "--mode", "closed_cohort", "--cancelled-as-failed",
               "--slo-ttft-ms", "191", "--format", "json"])[0]
    assert (w["attempted"], w["failed"], w["cancelled"]) == (13, 2, 0)
    assert w["slo_ttft_ms"] == 191.0
    same = _json(["window", "--db", str(db), "--param", "mode=closed_cohort", "--param", "cancelled_as_failed=true",
                  "--param", "slo_ttft_ms=191", "--format", "json"])[0]
    assert same == w


@pytest.mark.parametrize("args, message", [
    (["window", "--mode", "rolling"], "mode 'rolling': expected closed_cohort or steady_state"),
    (["window", "--param", "mode=x"], "mode 'x'"),
    (["window", "--slo-ttft-ms", "-5"], "expected a positive number"),
    (["window", "--start-ns", "10", "--end-ns", "5"], "is not after its start"),
    (["requests", "--trace-id", "xyz"], "expected 32 hexadecimal digits"),
    (["requests", "--param", "bogus=1"], "has no parameter $bogus"),
    (["requests", "--param", "perspective=moon"], "perspective 'moon'"),
    (["phases", "--assume-offset", "server"], "expected DOMAIN=MS"),
    (["sql", "SELEC 1"], "sql: Parser Error"),
])
def test_user_errors_are_one_line(db, args, message) -> None:
    result = CliRunner().invoke(cli, args + ["--db", str(db)], catch_exceptions=False)
    assert result.exit_code == 1
    assert message in result.output and "Traceback" not in result.output


def test_missing_database_says_load_first(tmp_path) -> None:
    for verb in ("requests", "itl", "phases", "summary", "window", "skew"):
        result = CliRunner().invoke(cli, [verb, "--db", str(tmp_path / "none.duckdb")], catch_exceptions=False)
        assert result.exit_code == 1
        assert "load traces first with tokentrace load" in result.output, verb
    result = CliRunner().invoke(cli, ["sql", "SELECT 1", "--db", str(tmp_path / "none.duckdb")])
    assert result.exit_code == 1 and "load traces first" in result.output


def test_sql_verb_binds_parameters_over_views(db) -> None:
    rows = _json(["sql", "SELECT count(*) AS n FROM request_gaps WHERE perspective = $p AND itl_ms > $ms",
                  "--param", "p=server", "--param", "ms=30", "--db", str(db), "--format", "json"])
    assert rows == [{"n": 2}]  # the broken request's two 50 ms gateway gaps
    rows = _json(["sql", "SELECT count(*) AS n FROM spans", "--parquet", str(db.parent / "dump"), "--format", "json"])
    assert rows[0]["n"] > 300


def test_every_query_verb_has_an_example() -> None:
    for verb in ("requests", "itl", "phases", "summary", "window", "skew", "sql"):
        result = CliRunner().invoke(cli, [verb, "--help"], catch_exceptions=False)
        assert result.exit_code == 0 and "Example:" in result.output, verb
