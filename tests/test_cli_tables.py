"""``tokentrace tables [NAME]``: a schema you can discover. The meanings of
analyzer/db/catalog.py cannot go stale: every column of every public table and view in
DuckDB's live catalog has one, and the catalog names no column, table or view that does not
exist."""

from __future__ import annotations

import csv
import io
import json
import re
from pathlib import Path

import pytest
from click.testing import CliRunner

from analyzer.cli import cli
from analyzer.cli.tables import live_columns
from analyzer.db.catalog import CATALOG

DOCS = Path(__file__).resolve().parents[1] / "docs"


@pytest.fixture(scope="module")
def live() -> dict[str, list[tuple[str, str]]]:
    return live_columns(list(CATALOG))


def _tables(*args: str, width: int = 80):
    return CliRunner().invoke(cli, ["tables", *args], env={"COLUMNS": str(width)})


def test_every_live_column_has_a_meaning_and_no_meaning_is_stale(live) -> None:
    assert set(live) == set(CATALOG), f"described but not in the schema: {sorted(set(CATALOG) - set(live))}"
    problems = []
    for name, entry in CATALOG.items():
        have = [column for column, _ in live[name]]
        if list(entry.columns) != have:
            problems.append(f"{name}: no meaning for {[c for c in have if c not in entry.columns]}, "
                            f"no such column {[c for c in entry.columns if c not in have]}, "
                            f"or not in the view's order")
    assert not problems, "\n".join(problems)


def test_meanings_are_one_short_ascii_line() -> None:
    too_long = [(name, column, text) for name, entry in CATALOG.items()
                for column, text in [("", entry.meaning), *entry.columns.items()]
                if not text.strip() or len(text) > 100 or not text.isascii() or "\n" in text]
    assert not too_long, too_long
    assert {entry.kind for entry in CATALOG.values()} == {"table", "view"}


def test_the_catalog_covers_the_tables_and_the_views_tokentrace_sql_names(live) -> None:
    from analyzer.db.schema import create_tables
    from analyzer.db.store import connect

    con = connect(None)
    create_tables(con)
    tables = {r[0] for r in con.execute("SELECT table_name FROM duckdb_tables() WHERE NOT temporary").fetchall()}
    con.close()
    assert tables == {n for n, e in CATALOG.items() if e.kind == "table"}
    sql_help = cli.commands["sql"].help
    named = set(re.findall(r"[a-z_]+", sql_help)) & ({*tables} | set(_all_views()))
    assert named <= set(CATALOG), f"tokentrace sql names {sorted(named - set(CATALOG))}, not described"


def _all_views() -> list[str]:
    from analyzer.cli._query_verb import installed
    from analyzer.db.store import connect

    con = installed(connect(None))
    try:
        return [r[0] for r in con.execute("SELECT view_name FROM duckdb_views() WHERE NOT internal").fetchall()]
    finally:
        con.close()


def test_every_public_object_is_named_in_the_docs() -> None:
    text = "\n".join(p.read_text() for p in sorted(DOCS.glob("*.md")))
    missing = [name for name in CATALOG if f"`{name}`" not in text]
    assert not missing, f"public tables/views not named in docs/*.md: {missing}"


def test_tables_lists_every_public_object_in_80_columns() -> None:
    result = _tables()
    assert result.exit_code == 0, result.output
    lines = result.output.splitlines()
    listed = [line.split()[0] for line in lines[2:] if line and not line.startswith(" ")]
    assert listed[:len(CATALOG)] == list(CATALOG)
    assert all(len(line) <= 80 for line in lines), [line for line in lines if len(line) > 80]


def test_tables_name_shows_columns_types_and_meanings() -> None:
    result = _tables("request_metrics")
    assert result.exit_code == 0, result.output
    lines = result.output.splitlines()
    assert lines[0].startswith("request_metrics (view, 44 columns): one row per request and perspective")
    ttft = next(line for line in lines if line.startswith("ttft_ms "))
    assert ttft.split()[1] == "DOUBLE" and "time to first token" in ttft
    assert all(len(line) <= 80 for line in lines)
    long_name = lines.index("whole_request_output_tokens_per_second")  # wider than the column: its own line
    assert lines[long_name + 1].split()[0] == "DOUBLE"
    assert _tables("REQUEST_GAPS").exit_code == 0


def test_json_and_csv_parse(live) -> None:
    result = _tables("request_metrics", "--format", "json")
    assert result.exit_code == 0, result.output
    rows = json.loads(result.output)
    assert [r["column"] for r in rows] == [c for c, _ in live["request_metrics"]]
    ttft = next(r for r in rows if r["column"] == "ttft_ms")
    assert ttft == {"column": "ttft_ms", "type": "DOUBLE", "meaning": CATALOG["request_metrics"].columns["ttft_ms"]}
    result = _tables("--format", "csv")
    assert result.exit_code == 0, result.output
    rows = list(csv.DictReader(io.StringIO(result.output)))
    assert [r["name"] for r in rows] == list(CATALOG)
    assert {r["name"]: int(r["columns"]) for r in rows} == {n: len(c) for n, c in live.items()}
    assert all(r["meaning"] == CATALOG[r["name"]].meaning for r in rows)


@pytest.mark.parametrize(("name", "guess"), [
    ("request_metric", "request_metrics"), ("tt_request_facts", "request_facts"), ("nonsense", None),
])
def test_unknown_name_is_one_line_exit_1(name, guess) -> None:
    result = _tables(name)
    assert result.exit_code == 1
    assert result.stdout == ""
    err = result.stderr.strip().splitlines()
    assert len(err) == 1 and f"no public table or view {name!r}" in err[0] and "request_gaps" in err[0], err
    assert (f"did you mean {guess}?" in err[0]) if guess else ("did you mean" not in err[0])
