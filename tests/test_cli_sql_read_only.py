"""``tokentrace sql`` keeps its read-only promise: statements that would write the
database or any file are refused with one line; SELECTs over tables, views and --parquet
dumps keep working."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import pytest
from click.testing import CliRunner

from analyzer.cli import cli
from analyzer.db.store import connect
from trace_fixtures import mixed_world, write_parquet_dump


@pytest.fixture(scope="module")
def world(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("sql")
    con = mixed_world().load(connect(root / "traces.duckdb"))
    write_parquet_dump(con, str(root / "dump"))
    con.close()
    (root / "notes.txt").write_text("a file beside the database, not a table of it\n")
    return root


def _digest(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def _sql(world: Path, statement: str, *extra: str, source: str = "db"):
    flag = ["--db", str(world / "traces.duckdb")] if source == "db" else ["--parquet", str(world / "dump")]
    return CliRunner().invoke(cli, ["sql", statement, *flag, *extra])


REFUSED = [
    ("COPY (SELECT 1) TO '{w}/x.csv'", "COPY statement is refused"),
    ("COPY spans TO '{w}/x.parquet' (FORMAT parquet)", "COPY statement is refused"),
    ("EXPORT DATABASE '{w}/exported'", "EXPORT statement is refused"),
    ("ATTACH '{w}/other.duckdb' AS o", "ATTACH statement is refused"),
    ("INSTALL httpfs", "LOAD statement is refused"),
    ("LOAD httpfs", "LOAD statement is refused"),
    ("CREATE TABLE x AS SELECT 1", "CREATE statement is refused"),
    ("CREATE TEMP VIEW v AS SELECT 1", "CREATE statement is refused"),
    ("DROP VIEW spans", "DROP statement is refused"),
    ("INSERT INTO loads SELECT * FROM loads", "INSERT statement is refused"),
    ("UPDATE spans SET name = 'x'", "UPDATE statement is refused"),
    ("DELETE FROM spans", "DELETE statement is refused"),
    ("SET enable_external_access = true", "SET statement is refused"),
    ("SET temp_directory = '/'", "SET statement is refused"),
    ("PRAGMA profile_output = '{w}/p.json'", "SET statement is refused"),
    ("PRAGMA enable_profiling", "PRAGMA statement is refused"),
    ("CHECKPOINT", "CALL statement is refused"),
    # EXPLAIN ANALYZE runs the statement it wraps; with --parquet the dump folder is an
    # allowed directory, so a COPY there would be written
    ("EXPLAIN ANALYZE COPY (SELECT 42 AS x) TO '{w}/dump/spans/evil.csv'", "EXPLAIN of a COPY statement is refused"),
    ("/* c */ EXPLAIN ANALYZE COPY (SELECT 1) TO '{w}/dump/y.csv'", "EXPLAIN of a COPY statement is refused"),
    ("EXPLAIN COPY (SELECT 1) TO '{w}/dump/x.csv'", "EXPLAIN of a COPY statement is refused"),
    ("explain analyze CREATE TABLE x AS SELECT 1", "EXPLAIN of a CREATE statement is refused"),
    ("EXPLAIN ANALYZE DROP VIEW spans", "EXPLAIN of a DROP statement is refused"),
    ("EXPLAIN ANALYZE EXPORT DATABASE '{w}/dump/exported'", "syntax error"),  # not even parsed
    ("SELECT 1; SELECT 2", "give one statement, not 2"),
    ("", "give one statement, not 0"),
    # a SELECT that reaches outside: DuckDB's file access is off
    ("SELECT * FROM read_csv('/etc/passwd')", "file system operations are disabled"),
    ("SELECT * FROM read_text('{w}/notes.txt')", "file system operations are disabled"),
    ("SELECT * FROM glob('/etc/*')", "file system operations are disabled"),
]


@pytest.mark.parametrize(("statement", "message"), REFUSED)
@pytest.mark.parametrize("source", ["db", "parquet"])
def test_writing_statements_are_refused_in_one_line(world, statement, message, source) -> None:
    before = _digest(world / "traces.duckdb")
    files = sorted(str(p.relative_to(world)) for p in world.rglob("*"))
    result = _sql(world, statement.replace("{w}", str(world)), source=source)
    assert result.exit_code == 1, result.output
    assert message in result.stderr and len(result.stderr.splitlines()) == 1, result.stderr
    assert _digest(world / "traces.duckdb") == before
    assert sorted(str(p.relative_to(world)) for p in world.rglob("*")) == files  # no file written, dump included


@pytest.mark.parametrize("source", ["db", "parquet"])
def test_selects_over_tables_views_and_dumps_keep_working(world, source) -> None:
    for statement, check in [
        ("SELECT count(*) AS n FROM spans", lambda rows: rows[0]["n"] > 0),
        ("FROM request_metrics SELECT perspective, ttft_ms WHERE ttft_ms = 190", lambda rows: len(rows) >= 1),
        ("WITH g AS (SELECT * FROM request_gaps) SELECT count(*) AS n FROM g", lambda rows: rows[0]["n"] > 0),
        ("SELECT * FROM clock_pair_offsets", lambda rows: len(rows) >= 1),
        ("DESCRIBE request_metrics", lambda rows: any(r["column_name"] == "ttft_ms" for r in rows)),
        ("SHOW TABLES", lambda rows: len(rows) > 0),
        ("SUMMARIZE loads", lambda rows: len(rows) > 0),
        ("VALUES (1), (2)", lambda rows: len(rows) == 2),
        ("EXPLAIN SELECT count(*) FROM spans", lambda rows: len(rows) >= 1),
        ("EXPLAIN ANALYZE SELECT count(*) FROM spans", lambda rows: len(rows) >= 1),
        ("SELECT count(*) AS n FROM span_events WHERE name = $name", lambda rows: rows[0]["n"] > 0),
    ]:
        result = _sql(world, statement, "--format", "json", "--param", "name=tokentrace.chunk", source=source) \
            if "$name" in statement else _sql(world, statement, "--format", "json", source=source)
        assert result.exit_code == 0, (statement, result.output)
        assert check(json.loads(result.stdout)), (statement, result.stdout)


def test_db_and_parquet_agree(world) -> None:
    q = "SELECT perspective, count(*) AS n, sum(ttft_ms) AS t FROM request_metrics GROUP BY ALL ORDER BY ALL"
    a = json.loads(_sql(world, q, "--format", "json").stdout)
    b = json.loads(_sql(world, q, "--format", "json", source="parquet").stdout)
    assert a == b and a


@pytest.mark.parametrize(("statement", "hint"), [
    ("SELECT ttft FROM request_metrics", 'Candidate bindings: "ttft_ms"'),
    ("SELECT * FROM request_metric", 'Did you mean "request_metrics"?'),
])
def test_a_guessed_name_fails_with_duckdbs_suggestion_in_one_line(world, statement, hint) -> None:
    result = _sql(world, statement)
    assert result.exit_code == 1, result.output
    assert len(result.stderr.splitlines()) == 1 and hint in result.stderr, result.stderr
    assert "LINE 1" not in result.stderr, result.stderr
