"""``tokentrace export`` through the real entry point."""

from __future__ import annotations

from click.testing import CliRunner

from analyzer.cli import cli
from data_paths import SAMPLES


def test_export_then_load_back(tmp_path):
    db, db2, out = tmp_path / "a.duckdb", tmp_path / "b.duckdb", tmp_path / "dump"
    run = CliRunner().invoke
    assert run(cli, ["load", str(SAMPLES / "python_sdk_otlp_json_file_exporter.jsonl"), "--db", str(db), "-q"], catch_exceptions=False).exit_code == 0
    r = run(cli, ["export", "--db", str(db), "--parquet", str(out)], catch_exceptions=False)
    assert r.exit_code == 0 and r.output.strip() == f"{out}: 3 spans, 2 events, 1 links"
    r = run(cli, ["load", str(out), "--db", str(db2)], catch_exceptions=False)
    assert f"{out} [parquet]: 3 records, 3 spans read, 3 loaded, 0 duplicates, 0 rejected" in r.output
    r = run(cli, ["export", "--db", str(db), "--parquet", str(out)], catch_exceptions=False)
    assert r.exit_code == 1 and "not empty" in r.output
    assert run(cli, ["export", "--db", str(db), "--parquet", str(out), "--overwrite"], catch_exceptions=False).exit_code == 0


def test_export_missing_db_is_a_user_error(tmp_path):
    r = CliRunner().invoke(cli, ["export", "--db", str(tmp_path / "none.duckdb"), "--parquet", str(tmp_path / "o")], catch_exceptions=False)
    assert r.exit_code == 1 and "no such database" in r.output


def test_export_has_help_with_example():
    r = CliRunner().invoke(cli, ["export", "--help"], catch_exceptions=False)
    assert r.exit_code == 0 and "Example:" in r.output
