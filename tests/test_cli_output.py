"""What a new user reads: the config path named once, window bounds in UTC
beside the nanoseconds, tables that never wrap a number off a terminal, a short request id in
the demo's per-request table, and a report axis that says what its origin is."""

from __future__ import annotations

import io
import json
import re
from pathlib import Path

import pytest
from click.testing import CliRunner

from analyzer.cli import cli
from analyzer.cli._options import emit_rows
from analyzer.db.store import connect
from analyzer.query.utc_columns import utc_text
from trace_fixtures import mixed_world


@pytest.fixture(scope="module")
def db(tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("out") / "traces.duckdb"
    mixed_world().load(connect(path)).close()
    return path


def test_a_truncated_model_config_is_named_once(tmp_path) -> None:
    config = tmp_path / "truncated.json"
    config.write_text('{"num_hidden_layers": 2, "num_key')
    result = CliRunner().invoke(cli, ["kv", "--model-config", str(config)])
    assert result.exit_code == 1
    assert result.stderr.count(str(config)) == 1, result.stderr
    assert result.stderr.startswith(f"Error: {config}:1: not valid JSON")


def test_utc_text_keeps_every_nanosecond() -> None:
    assert utc_text(1_767_225_600_000_000_000) == "2026-01-01T00:00:00.000000000Z"
    assert utc_text(1_767_225_600_123_456_789) == "2026-01-01T00:00:00.123456789Z"
    assert utc_text(1_767_225_599_999_999_999) == "2025-12-31T23:59:59.999999999Z"  # no float rounding up
    assert utc_text(None) is None


def test_window_prints_utc_bounds_beside_the_nanoseconds(db) -> None:
    result = CliRunner().invoke(cli, ["window", "--db", str(db), "--format", "json"])
    row = json.loads(result.stdout)[0]
    keys = list(row)
    assert keys.index("window_start_utc") == keys.index("window_start_ns") + 1
    assert keys.index("window_end_utc") == keys.index("window_end_ns") + 1
    assert row["window_start_utc"] == utc_text(row["window_start_ns"])
    assert row["window_end_utc"] == utc_text(row["window_end_ns"])
    start = 1_767_225_600_000_000_000 + 1_500_000_000
    result = CliRunner().invoke(cli, ["window", "--db", str(db), "--format", "csv", "--start-ns", str(start),
                                      "--end-ns", str(start + 10**9)])
    header, line = result.stdout.splitlines()[:2]
    values = dict(zip(header.split(","), line.split(",")))
    assert values["window_start_utc"] == "2026-01-01T00:00:01.500000000Z"
    assert values["window_end_utc"] == "2026-01-01T00:00:02.500000000Z"


def test_a_table_off_a_terminal_never_wraps_a_number() -> None:
    columns = [f"a_rather_long_column_name_{i}" for i in range(14)]
    row = [1796154684592477775 + i if i % 2 else 0.01220703125 * (i + 1) for i in range(14)]
    buf = io.StringIO()  # not a terminal
    emit_rows(columns, [row, row], "table", out=buf)
    lines = buf.getvalue().splitlines()
    assert len(lines) == 4  # header, rule, two rows: nothing folded onto extra lines
    cells = lines[2].split()
    assert cells == [str(v) if isinstance(v, int) else f"{v:.10g}" for v in row]
    assert lines[0].split() == columns


def test_cli_tables_in_a_pipe_are_one_line_per_row(db) -> None:
    result = CliRunner().invoke(cli, ["requests", "--db", str(db)], env={"COLUMNS": "80"})
    json_rows = json.loads(CliRunner().invoke(cli, ["requests", "--db", str(db), "--format", "json"]).stdout)
    lines = result.stdout.splitlines()
    # a block per perspective: its title, two header lines (name, unit), a rule, one line per row
    blocks = "\n".join(lines).split("\n\n")
    perspectives = sorted({r["perspective"] for r in json_rows})
    assert len(blocks) == len(perspectives)
    rows = sum(len([ln for ln in b.splitlines()[4:] if not ln.startswith(("note:", "  "))]) for b in blocks)
    assert rows == len(json_rows)
    assert lines[4].split()[0] == json_rows[0]["request_span_id"]  # the response id "r" is shared: the span id


def test_demo_tables_are_the_verbs_human_views(db, capsys, monkeypatch) -> None:
    """The demo (and bench) print requests / window / skew_offsets as `tokentrace requests`,
    `window` and `skew` do: within 80 columns, the id a user can find again, UTC times."""
    from analyzer.cli._views import request_id
    from analyzer.cli.demo import print_query_results
    from analyzer.db.source import open_source
    from analyzer.verbs.demo import REQUEST_ID_CHARS, summary_queries

    monkeypatch.setenv("COLUMNS", "80")
    con = open_source(db=db)
    try:
        results = summary_queries(con)
    finally:
        con.close()
    requests = results["requests"].dicts()
    assert REQUEST_ID_CHARS == 8 and all(r["request"] == r["request_span_id"][-8:] for r in requests)
    print_query_results(results)
    out = capsys.readouterr().out
    assert max(len(line) for line in out.splitlines()) <= 80
    table = out.split("Per-request metrics (queries/requests.sql)\n")[1].split("\nWindow summary")[0]
    verb = CliRunner().invoke(cli, ["requests", "--db", str(db)], env={"COLUMNS": "80"})
    def rows_of(text: str) -> list[str]:  # the tables; the notes differ (the demo has no --columns)
        return [line for line in text.strip().split("\nnote:")[0].splitlines()]

    assert verb.exit_code == 0 and rows_of(table) == rows_of(verb.output)  # the same view, line for line
    shared = {request_id(r) for r in requests if sum(request_id(x) == request_id(r) for x in requests) > 2}
    shown = {line.split()[0] for line in table.splitlines()[3:] if line[:1].isalnum()}
    assert {r["request_span_id"] for r in requests if request_id(r) in shared} <= shown
    window = out.split("Window summary (queries/window.sql, closed cohort)\n")[1].split("Clock skew check")[0]
    assert re.search(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z", window)
    assert not re.search(r"\b1[67]\d{17}\b", out)  # no epoch nanoseconds


def test_report_waterfall_axis_names_its_origin(db, tmp_path) -> None:
    pytest.importorskip("matplotlib")
    out = tmp_path / "r.html"
    assert CliRunner().invoke(cli, ["report", "--db", str(db), "--html", str(out)]).exit_code == 0
    page = out.read_text()
    assert "ms after the request was sent (the client span&#39;s start; without one, the server&#39;s arrival)" in page \
        or "ms after the request was sent (the client span's start; without one, the server's arrival)" in page
    assert "request's s (ms)" not in page and "request&#39;s s (ms)" not in page
