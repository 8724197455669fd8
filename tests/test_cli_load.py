"""``tokentrace load`` through the real entry point."""

from __future__ import annotations

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


def test_a_later_file_that_fails_says_which_files_stayed_loaded(tmp_path):
    """Each file is one transaction: the ones before a failing file are committed, and the
    error says so (with the spans kept); the files after it are not read."""
    bad = tmp_path / "bad.jsonl"
    bad.write_text("garbage\n")
    db = tmp_path / "t.duckdb"
    good = SAMPLES / "jaeger_otlp2jaeger_in.otlp.json"
    r = CliRunner().invoke(cli, ["load", str(good), str(bad), str(SAMPLES / "otel_spec_file_exporter_traces.jsonl"),
                                 "--db", str(db)], catch_exceptions=False)  # fmt: skip
    assert r.exit_code == 1, r.output
    assert f"{good.name} [otlp_json]: 1 records, 2 spans read, 1 loaded, 1 duplicates, 0 rejected" in r.stdout
    error = r.stderr.splitlines()[-1]
    assert error.startswith(f"Error: {bad}: unrecognized_input"), error
    assert (f"nothing of {bad} was written, but the 1 file(s) before it stay loaded in {db} (load 1: {good}; 1 spans)"
            in error and "1 file(s) after it were not read" in error), error
    assert duckdb.connect(str(db)).execute("SELECT count(*) FROM spans").fetchone() == (1,)


def test_an_input_with_no_spans_is_a_warning_and_exit_1_unless_allowed(tmp_path):
    empty = tmp_path / "empty.jsonl"
    empty.write_text("")
    nothing = tmp_path / "nothing.json"
    nothing.write_text('{"resourceSpans": []}\n')
    good = SAMPLES / "jaeger_otlp2jaeger_in.otlp.json"
    for extra, code in (([], 1), (["--allow-empty"], 0)):
        db = tmp_path / f"t{code}.duckdb"
        r = CliRunner().invoke(cli, ["load", str(empty), str(good), str(nothing), "--db", str(db), *extra],
                               catch_exceptions=False)
        assert r.exit_code == code, r.output
        assert f"warning: {empty}: no spans in it" in r.stderr and f"warning: {nothing}: no spans in it" in r.stderr
        assert "total: 2 spans read, 1 loaded, 1 duplicates, 0 rejected (load 1)" in r.stdout
        if code:
            assert r.stderr.splitlines()[-1] == (
                f"Error: 2 of 3 inputs gave no spans ({empty}, {nothing}); the others are loaded; "
                "hint: --allow-empty accepts an input with no spans"), r.stderr
        assert duckdb.connect(str(db)).execute("SELECT count(*) FROM spans").fetchone() == (1,)
