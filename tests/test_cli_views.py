"""The human view of every query verb: at 80 and 120 columns no
line runs past the terminal, times are UTC ISO and not nanoseconds, numbers are rounded for
reading, each header names its unit, the request id is the one a user can find again, and a
fit that does not hold says so. csv and json keep every column at full precision; --columns
chooses columns in every format."""

from __future__ import annotations

import csv
import io
import json
import re
from pathlib import Path

import pytest
from click.testing import CliRunner

from analyzer.cli import cli
from analyzer.cli._human import Col, View, render, utc_ms_text
from analyzer.db.store import connect
from analyzer.formats.load import load_paths
from trace_fixtures import mixed_world

TESTS = Path(__file__).resolve().parent
REAL = TESTS / "data" / "real"
CAPTURES = {
    "mixed": None,  # tests/trace_fixtures.py: the worked example's request and the planted cases
    "continuous": [TESTS / "fixtures" / "continuous_engine" / "server.otlp.jsonl",
                   TESTS / "fixtures" / "continuous_engine" / "client.otlp.jsonl"],
    "aiperf": [REAL / "aiperf-0.13.0-tokentrace" / "traces.jsonl"],
    "openllmetry": [REAL / "openllmetry-0.62.4" / "client.jsonl", REAL / "openllmetry-0.62.4" / "server.jsonl"],
}
QUERY_VERBS = [["requests"], ["itl"], ["summary"], ["window"], ["phases"], ["skew"], ["steps"], ["stalls"],
               ["sql", "SELECT * FROM request_metrics"]]
RAW_NS = re.compile(r"(?<![\w.])1[67]\d{17}(?!\d)")  # an epoch timestamp in ns (2020s)
LONG_DECIMAL = re.compile(r"[1-9]\d*\.\d{4,}|0\.0*[1-9]\d{5,}")  # 216.14805133333334: more than 5 digits


@pytest.fixture(scope="module")
def dbs(tmp_path_factory) -> dict[str, Path]:
    out = {}
    for name, files in CAPTURES.items():
        path = tmp_path_factory.mktemp(name) / "traces.duckdb"
        con = connect(path)
        if files is None:
            mixed_world().load(con)
        else:
            load_paths(con, [str(f) for f in files])
        con.close()
        out[name] = path
    return out


def _run(args: list[str], width: int = 80) -> str:
    result = CliRunner().invoke(cli, args, env={"COLUMNS": str(width)}, catch_exceptions=False)
    assert result.exit_code == 0, result.output
    return result.stdout


@pytest.mark.parametrize("width", [80, 120])
@pytest.mark.parametrize("capture", list(CAPTURES))
def test_every_query_verb_fits_the_terminal_with_readable_values(dbs, capture, width) -> None:
    for verb in QUERY_VERBS:
        result = CliRunner().invoke(cli, [*verb, "--db", str(dbs[capture])], env={"COLUMNS": str(width)},
                                    catch_exceptions=False)
        assert result.exit_code == 0, result.output
        out = result.stdout
        lines = out.splitlines() + result.stderr.splitlines()  # the notes on stderr fit too
        assert lines, verb
        too_wide = [line for line in lines if len(line) > width]
        assert not too_wide, (verb, width, too_wide[:3])
        assert not RAW_NS.search(out), (verb, RAW_NS.search(out))
        assert not LONG_DECIMAL.search(out), (verb, LONG_DECIMAL.search(out))


def test_requests_at_80_columns_shows_id_tokens_ttft_tpot_e2e_and_finish(dbs) -> None:
    out = _run(["requests", "--db", str(dbs["aiperf"])])
    rows = json.loads(_run(["requests", "--db", str(dbs["aiperf"]), "--format", "json"]))
    lines = out.splitlines()
    assert lines[0] == "server perspective (the gateway's clock): 12 requests"
    assert lines[1].split() == ["request", "id", "in", "out", "TTFT", "TPOT", "E2E", "rate", "finish"]
    assert lines[2].split() == ["tok", "tok", "ms", "ms", "ms", "tok/s"]
    body = lines[4:4 + len(rows)]
    for line, row in zip(body, rows):
        cells = line.split()
        # the response id whole (what the client got back), then the figures rounded to 0.1 ms
        assert cells[0] == row["response_id"] and cells[0].startswith("chatcmpl-")
        assert cells[1:3] == [str(row["input_tokens"]), str(row["output_tokens"])]
        assert cells[3:6] == [f"{row[k]:.1f}" for k in ("ttft_ms", "tpot_ms", "e2e_ms")]
        assert cells[-1] == row["finish_reason"]
    assert body[0].split()[3] == "336.7"  # 336.724302 ms
    assert "note: not shown at 80 columns: client_request_id, s_ns, outcome" in out


def test_requests_at_120_columns_adds_the_x_request_id_and_the_utc_send_time(dbs) -> None:
    rows = json.loads(_run(["requests", "--db", str(dbs["aiperf"]), "--format", "json"]))
    out = _run(["requests", "--db", str(dbs["aiperf"])], 120)
    first = out.splitlines()[4].split()
    assert first[:2] == [rows[0]["response_id"], rows[0]["client_request_id"]]
    wide = _run(["requests", "--db", str(dbs["aiperf"])], 160)
    assert utc_ms_text(rows[0]["s_ns"]) == "2026-12-01T20:08:49.182Z"
    assert "2026-12-01T20:08:49.182Z" in wide.splitlines()[4].split()


def test_a_shared_response_id_falls_back_to_the_span_id(dbs) -> None:
    rows = json.loads(_run(["requests", "--db", str(dbs["mixed"]), "--format", "json"]))
    assert {r["response_id"] for r in rows} == {"r"}  # the fixture's gateway answers every request as "r"
    out = _run(["requests", "--db", str(dbs["mixed"])])
    client = [r for r in rows if r["perspective"] == "client"]
    body = out.splitlines()[4:4 + len(client)]
    assert [line.split()[0] for line in body] == [r["request_span_id"] for r in client]
    assert "note: request id: the span id where the response id or X-Request-ID is shared by" in out
    assert "server perspective (the gateway's clock):" in out  # one block per perspective: clocks never mixed


def test_summary_names_each_metric_and_its_unit(dbs) -> None:
    out = _run(["summary", "--db", str(dbs["aiperf"])], 120)
    labels = [line[:14].strip() for line in out.splitlines()[2:9]]
    assert labels == ["TTFT ms", "TPOT ms", "E2E ms", "ITL ms/gap", "ITL ms/token", "decode tok/s", "request tok/s"]
    rows = json.loads(_run(["summary", "--db", str(dbs["aiperf"]), "--format", "json"]))
    ttft = out.splitlines()[2].split()
    header = out.splitlines()[0].split()
    assert ttft[header.index("p50") + 1] == "1338.5"  # 1338.462429 ms to 0.1 ms, as every *_ms figure
    assert rows[0]["p50"] == pytest.approx(1338.462429)


def test_window_reads_as_name_value_lines_with_utc_times(dbs) -> None:
    out = _run(["window", "--db", str(dbs["mixed"])])
    lines = {line[:28].strip(): line[28:].strip() for line in out.splitlines() if not line.startswith(" ")}
    assert lines["window start (UTC)"] == "2026-01-01T00:00:00.000Z"
    assert lines["window end (UTC)"] == "2026-01-01T00:02:00.266Z"
    assert lines["request throughput (req/s)"] == "0.09146"
    assert lines["error rate (fraction)"] == "0.077"


def test_steps_summary_says_the_fit_does_not_hold_instead_of_a_slope(dbs) -> None:
    out = _run(["steps", "--db", str(dbs["continuous"]), "--section", "summary"])
    rows = {line.split()[1]: line for line in out.splitlines()[4:14]}
    assert "29.4 + 0.345 x tok" in rows["all"] and rows["all"].endswith("0.983")
    assert "no fit: r2 too low" in rows["1-16"] and rows["1-16"].endswith("0.077")
    assert "no fit: few steps" in rows["17-128"]
    assert "1.219" not in rows["1-16"]  # the slope of a line that explains 7.7 % of step time is not printed


def test_columns_chooses_in_every_format_and_csv_keeps_full_precision(dbs) -> None:
    db = str(dbs["aiperf"])
    full = list(csv.DictReader(io.StringIO(_run(["requests", "--db", db, "--format", "csv"]))))
    chosen = "response_id,client_request_id,ttft_ms"
    lines = _run(["requests", "--db", db, "--format", "csv", "--columns", chosen]).splitlines()
    assert lines[0] == chosen
    assert lines[1:] == [f"{r['response_id']},{r['client_request_id']},{r['ttft_ms']}" for r in full]
    assert "336.724302" in lines[1]
    as_json = json.loads(_run(["requests", "--db", db, "--format", "json", "--columns", chosen]))
    assert [list(r) for r in as_json] == [chosen.split(",")] * len(full)
    table = _run(["requests", "--db", db, "--columns", "ttft_ms,request_span_id"]).splitlines()
    assert table[0].split() == ["ttft_ms", "request_span_id"]
    assert table[2].split() == ["336.7", full[0]["request_span_id"]]
    itl = _run(["itl", "--db", db, "--format", "csv", "--columns", "itl_ms,gap_index"]).splitlines()
    assert itl[0] == "itl_ms,gap_index" and len(itl) == 1 + 127
    window = _run(["window", "--db", db, "--format", "csv", "--columns", "window_start_utc,attempted"]).splitlines()
    whole = json.loads(_run(["window", "--db", db, "--format", "json"]))[0]
    assert window == ["window_start_utc,attempted", f"{whole['window_start_utc']},{whole['attempted']}"]
    assert whole["window_start_utc"] == "2026-12-01T20:08:49.182475778Z"  # every nanosecond in csv/json


def test_an_unknown_column_is_a_one_line_error(dbs) -> None:
    for fmt in ("table", "csv", "json"):
        result = CliRunner().invoke(cli, ["requests", "--db", str(dbs["aiperf"]), "--format", fmt,
                                          "--columns", "ttft_ms,ttft"])
        assert result.exit_code == 1, fmt
        assert result.stderr.startswith("Error: --columns: requests has no column 'ttft' (its columns: source, ")
        assert result.stderr.count("\n") == 1 and result.stdout == ""


def test_render_cuts_the_widest_id_first_and_names_what_it_left_out() -> None:
    view = View((Col("a", "client clock", cut=True), Col("b", "server clock", cut=True),
                 Col("ms", "offset", "ms", kind="ms"), Col("n", "requests", rank=1)))
    lines = render(view, ["a", "b", "ms", "n"], [("c" * 20, "s" * 60, 1.26, 3)], width=50)
    assert max(map(len, lines)) <= 50
    row = lines[3].split()
    assert row[0] == "c" * 20 and row[1].startswith("s" * 10) and row[1].endswith(("…", "~"))
    assert row[2] == "1.3"  # ms to 0.1 ms
    assert "note: not shown at 50 columns: n (choose with" in " ".join(lines)


@pytest.mark.parametrize("width", [80, 120])
def test_kv_limitations_wrap_to_the_terminal(width) -> None:
    out = _run(["kv", "--layers", "80", "--kv-heads", "8", "--query-heads", "64", "--head-dim", "128",
                "--kv-dtype", "bf16"], width)
    assert max(map(len, out.splitlines())) <= width
    assert "kv_bytes_per_token: 327680" in out.splitlines()
    assert "limitation: logical unsharded K/V payload; omits: quantization scales" in " ".join(out.split())


def test_one_column_or_one_summary_row_prints_its_figures_alike() -> None:
    """14.90 beside 13.93, never 14 beside 13.93: a column's (or a summary row's) floats share
    the decimals that give its largest value 4 significant digits."""
    from analyzer.cli._human import Col, column_texts, decimals_for

    assert decimals_for([14.9, 13.93, 9.895]) == 2 and decimals_for([1687.4, 33.5]) == 0
    assert decimals_for([0.03125, 0.5]) == 4 and decimals_for([None, 0.0]) is None
    assert column_texts(Col("rate", "rate"), [{"rate": 14.0}, {"rate": 13.93}, {"rate": None}]) == ["14.00", "13.93", "-"]
    from analyzer.cli._views import _summary_figure

    row = {"unit": "tokens/s", "mean": 9.8951, "std_pop": 3.303, "min": 4.1, "p50": 8.456, "p90": 14.9,
           "p95": 16.89, "p99": 18.24, "max": 18.58}
    assert [_summary_figure(k)(row) for k in ("mean", "p50", "p90", "max")] == ["9.90", "8.46", "14.90", "18.58"]


def test_window_says_when_no_slo_was_set() -> None:
    from analyzer.cli._views import _slo_passing

    assert _slo_passing({"slo_passing": 7}) == "7 (no SLO set: every succeeded request)"
    assert _slo_passing({"slo_passing": 1, "slo_ttft_ms": 500.0}) == 1
