"""--db paths that are not DuckDB databases: write verbs refuse them (the file untouched), read
verbs name what they are; a missing folder and an empty file are one-line errors."""

from __future__ import annotations

import hashlib
from pathlib import Path

import duckdb
import pytest
from click.testing import CliRunner

from analyzer.cli import cli
from analyzer.db.dbfile import check_database_path, describe_file
from analyzer.db.store import connect
from analyzer.errors import DatabaseFileError
from data_paths import SAMPLES

TRACES = SAMPLES / "python_sdk_otlp_json_file_exporter.jsonl"


def _digest(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def _not_databases(tmp_path: Path) -> dict[str, tuple[Path, str]]:
    """name -> (path, the words the error must use for it)."""
    csv = tmp_path / "victim.csv"
    csv.write_text("a,b\n1,2\n")
    parquet = tmp_path / "victim.parquet"
    duckdb.sql(f"COPY (SELECT 1 AS a) TO '{parquet}' (FORMAT parquet)")
    empty = tmp_path / "empty.duckdb"
    empty.write_bytes(b"")
    js = tmp_path / "spans.duckdb"
    js.write_text('{"resourceSpans": []}\n')
    return {"csv": (csv, "a text file (CSV)"), "parquet": (parquet, "a Parquet file"),
            "empty": (empty, "an empty file"), "json": (js, "a JSON file")}


@pytest.mark.parametrize("kind", ["csv", "parquet", "empty", "json"])
def test_load_refuses_a_file_that_is_not_a_database_and_leaves_it_untouched(tmp_path, kind) -> None:
    path, words = _not_databases(tmp_path)[kind]
    before = _digest(path)
    r = CliRunner().invoke(cli, ["load", str(TRACES), "--db", str(path)])
    assert r.exit_code == 1, r.output
    assert r.output.count("\n") == 1, r.output
    assert r.output.startswith(f"Error: {path}: {words}, not a DuckDB database; left untouched"), r.output
    assert "loaded" not in r.output and "Traceback" not in r.output
    assert _digest(path) == before


def test_load_into_a_missing_folder_is_one_line(tmp_path) -> None:
    target = tmp_path / "no" / "such" / "x.duckdb"
    r = CliRunner().invoke(cli, ["load", str(TRACES), "--db", str(target)])
    assert r.exit_code == 1
    assert r.output == f"Error: {target}: folder {target.parent} does not exist (create it first)\n"
    assert not target.parent.exists()


def test_timeline_db_refuses_a_csv(tmp_path, seed_csv) -> None:
    victim = _not_databases(tmp_path)["csv"][0]
    before = _digest(victim)
    r = CliRunner().invoke(cli, ["timeline", str(seed_csv), "--output-tokens", "150", "--db", str(victim)])
    assert r.exit_code == 1 and "a text file (CSV), not a DuckDB database; left untouched" in r.output, r.output
    assert _digest(victim) == before


@pytest.mark.parametrize("kind", ["csv", "parquet", "empty"])
def test_read_verbs_name_what_the_file_is(tmp_path, kind) -> None:
    path, words = _not_databases(tmp_path)[kind]
    before = _digest(path)
    for verb in (["requests"], ["summary"], ["sql", "SELECT 1"], ["export", "--parquet", str(tmp_path / "out")],
                 ["report", "--html", str(tmp_path / "r.html")]):
        r = CliRunner().invoke(cli, [*verb, "--db", str(path)])
        assert r.exit_code == 1, (verb, r.output)
        assert f"{path}: {words}, not a DuckDB database" in r.output and r.output.count("\n") == 1, (verb, r.output)
    assert _digest(path) == before
    assert not (tmp_path / "r.html").exists()


def test_a_parquet_dump_given_to_db_hints_parquet(tmp_path) -> None:
    db = tmp_path / "t.duckdb"
    assert CliRunner().invoke(cli, ["load", str(TRACES), "--db", str(db)]).exit_code == 0
    dump = tmp_path / "dump"
    assert CliRunner().invoke(cli, ["export", "--db", str(db), "--parquet", str(dump)]).exit_code == 0
    r = CliRunner().invoke(cli, ["requests", "--db", str(dump)])
    assert r.exit_code == 1
    assert f"{dump}: a Parquet dump folder, not a DuckDB database file (query it in place with --parquet {dump}" in r.output
    r = CliRunner().invoke(cli, ["requests", "--parquet", str(db)])
    assert r.exit_code == 1 and f"{db}: a DuckDB database, not a Parquet dump folder (a database is read with --db" in r.output


def test_library_connect_checks_the_path(tmp_path) -> None:
    csv = _not_databases(tmp_path)["csv"][0]
    with pytest.raises(DatabaseFileError, match="a text file"):
        connect(csv)
    with pytest.raises(DatabaseFileError, match="no such database"):
        connect(tmp_path / "missing.duckdb", read_only=True)
    con = connect(tmp_path / "new.duckdb")  # a new file in an existing folder is fine
    con.close()
    check_database_path(tmp_path / "new.duckdb", for_write=True)
    check_database_path(tmp_path / "new.duckdb", for_write=False)
    assert describe_file(tmp_path / "new.duckdb") == "a DuckDB database"


def test_tokentrace_memory_limit_applies_to_every_connection(tmp_path, monkeypatch) -> None:
    db = tmp_path / "t.duckdb"
    assert CliRunner().invoke(cli, ["load", str(TRACES), "--db", str(db), "-q"]).exit_code == 0
    monkeypatch.setenv("TOKENTRACE_MEMORY_LIMIT", "300MB")
    r = CliRunner().invoke(cli, ["sql", "SELECT current_setting('memory_limit') AS m", "--db", str(db), "--format", "csv"])
    assert r.exit_code == 0 and r.stdout.splitlines()[1] in ("286.1 MiB", "300.0 MB"), r.stdout
    con = connect(tmp_path / "w.duckdb")
    assert con.execute("SELECT current_setting('memory_limit')").fetchall()[0][0] == r.stdout.splitlines()[1]
    con.close()
    monkeypatch.setenv("TOKENTRACE_MEMORY_LIMIT", "lots")
    for args in (["requests", "--db", str(db)], ["load", str(TRACES), "--db", str(tmp_path / "new.duckdb")]):
        r = CliRunner().invoke(cli, args)
        assert r.exit_code == 1 and r.stderr.startswith("Error: $TOKENTRACE_MEMORY_LIMIT='lots': "), r.stderr
        assert len(r.stderr.splitlines()) == 1
    assert not (tmp_path / "new.duckdb").exists()
