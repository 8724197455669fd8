"""``tokentrace load`` through the real entry point."""

from __future__ import annotations

from pathlib import Path

import duckdb
from click.testing import CliRunner

from analyzer.cli import cli
from data_paths import SAMPLES



def test_load_prints_per_file_accounting(tmp_path):
    db = tmp_path / "t.duckdb"
    r = CliRunner().invoke(cli, ["load", str(SAMPLES / "jaeger_otlp2jaeger_in.otlp.json"),
                                 str(SAMPLES / "otel_spec_file_exporter_traces.jsonl"), "--db", str(db), "--lenient"],
                           catch_exceptions=False)  # fmt: skip
    assert r.exit_code == 0, r.output
    assert "jaeger_otlp2jaeger_in.otlp.json [otlp_json]: 1 records, 2 spans read, 1 loaded, 1 duplicates, 0 rejected" in r.output
    assert "otel_spec_file_exporter_traces.jsonl [otlp_json_lines]: 4 records, 8 spans read, 0 loaded, 0 duplicates, 8 rejected (empty_trace_id=8)" in r.output
    assert "total: 10 spans read, 1 loaded, 1 duplicates, 8 rejected (load 1)" in r.output
    assert duckdb.connect(str(db)).execute("SELECT count(*) FROM rejects").fetchone() == (8,)


def test_strict_error_is_one_line_with_hint_and_no_traceback(tmp_path):
    r = CliRunner().invoke(cli, ["load", str(SAMPLES / "otel_spec_file_exporter_traces.jsonl"), "--db", str(tmp_path / "t.duckdb")],
                           catch_exceptions=False)  # fmt: skip
    assert r.exit_code == 1
    assert f"Error: {SAMPLES / 'otel_spec_file_exporter_traces.jsonl'}:1: empty_trace_id" in r.output
    assert "hint: use --lenient" in r.output and "Traceback" not in r.output


def test_console_exporter_text_says_not_otlp(tmp_path):
    r = CliRunner().invoke(cli, ["load", str(SAMPLES / "python_sdk_console_span_exporter.txt"), "--db", str(tmp_path / "t.duckdb")],
                           catch_exceptions=False)  # fmt: skip
    assert r.exit_code == 1 and "ConsoleSpanExporter" in r.output and "not OTLP" in r.output


def test_quiet_and_input_format(tmp_path):
    r = CliRunner().invoke(cli, ["load", str(SAMPLES / "jaeger_ui_model_ui_01.json"), "--db", str(tmp_path / "t.duckdb"),
                                 "--input-format", "jaeger-json", "--lenient", "--quiet"], catch_exceptions=False)  # fmt: skip
    assert (r.exit_code, r.output) == (0, "")
    assert duckdb.connect(str(tmp_path / "t.duckdb")).execute("SELECT spans_loaded, duplicates_conflicting FROM loads").fetchone() == (4, 1)


def test_load_has_help_with_example():
    r = CliRunner().invoke(cli, ["load", "--help"], catch_exceptions=False)
    assert r.exit_code == 0 and "Example:" in r.output and "--lenient" in r.output
