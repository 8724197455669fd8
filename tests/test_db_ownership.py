"""Write verbs write only into a new file or a database tokentrace created: another program's
DuckDB database is refused before any write (one line naming what it holds, the file byte-for-byte
and mtime unchanged), and a failed first load leaves no file behind."""

from __future__ import annotations

import hashlib
from pathlib import Path

import duckdb
import pytest
from click.testing import CliRunner

from analyzer.cli import cli
from analyzer.db.ownership import SCHEMA_TABLE, SCHEMA_VERSION
from analyzer.db.schema import TABLE_DDL
from data_paths import SAMPLES

TRACES = SAMPLES / "python_sdk_otlp_json_file_exporter.jsonl"


def _state(path: Path) -> tuple[str, int, bool]:
    """(sha256, mtime in ns, whether a .wal sits beside it)."""
    return (hashlib.sha256(path.read_bytes()).hexdigest(), path.stat().st_mtime_ns,
            Path(str(path) + ".wal").exists())


def _database(path: Path, *statements: str) -> Path:
    con = duckdb.connect(str(path))
    for statement in statements:
        con.execute(statement)
    con.close()
    return path


def _foreign(tmp_path: Path) -> dict[str, tuple[Path, str]]:
    """name -> (another program's database, the words the refusal must use for it)."""
    shop = _database(tmp_path / "shop.duckdb", "CREATE TABLE customers (id INTEGER, name VARCHAR)",
                     "INSERT INTO customers VALUES (1, 'Ada')", "CREATE TABLE orders (id INTEGER)",
                     "CREATE VIEW big_orders AS SELECT * FROM orders")
    spans = _database(tmp_path / "spans.duckdb", "CREATE TABLE spans (id INTEGER, name VARCHAR, took_ms DOUBLE)",
                      "INSERT INTO spans VALUES (1, 'a', 2.5)")
    newer = _database(tmp_path / "newer.duckdb", *TABLE_DDL.values(),
                      f"CREATE TABLE {SCHEMA_TABLE} (schema_version INTEGER NOT NULL, created_by VARCHAR NOT NULL)",
                      f"INSERT INTO {SCHEMA_TABLE} VALUES ({SCHEMA_VERSION + 1}, 'tokentrace 9')")
    mixed = _database(tmp_path / "mixed.duckdb", *TABLE_DDL.values(), "CREATE TABLE customers (id INTEGER)")
    return {
        "shop": (shop, "not a tokentrace database (tables or views tokentrace does not write: "
                       "big_orders, customers, orders"),
        "spans": (spans, "not a tokentrace database (a spans table of another shape: no column attr_bool"),
        "newer": (newer, f"a tokentrace database of schema version {SCHEMA_VERSION + 1}, written by a newer "
                         f"tokentrace (this one writes version {SCHEMA_VERSION})"),
        "mixed": (mixed, "not a tokentrace database (tables or views tokentrace does not write: customers"),
    }


@pytest.mark.parametrize("kind", ["shop", "spans", "newer", "mixed"])
def test_load_refuses_another_programs_database_before_any_write(tmp_path, kind) -> None:
    path, words = _foreign(tmp_path)[kind]
    before = _state(path)
    r = CliRunner().invoke(cli, ["load", str(TRACES), "--db", str(path)])
    assert r.exit_code == 1, r.output
    assert r.output.count("\n") == 1 and "Traceback" not in r.output, r.output
    assert r.output.startswith(f"Error: {path}: {words}"), r.output
    assert "; left untouched" in r.output
    assert _state(path) == before


@pytest.mark.parametrize("verb", ["load-derive-only", "timeline", "bench"])
def test_every_write_verb_refuses_it_too(tmp_path, verb, seed_csv) -> None:
    path, words = _foreign(tmp_path)["shop"]
    before = _state(path)
    args = {"load-derive-only": ["load"],
            "timeline": ["timeline", str(seed_csv), "--output-tokens", "150"],
            # refused before the run: nothing listens on port 9, and no request is sent
            "bench": ["bench", "--url", "http://127.0.0.1:9", "--requests", "1", "--concurrency", "1",
                      "--model", "m"]}[verb]
    r = CliRunner().invoke(cli, [*args, "--db", str(path)])
    assert r.exit_code == 1, r.output
    assert r.stderr.count("\n") == 1 and r.stderr.startswith(f"Error: {path}: not a tokentrace database ("), r.stderr
    assert _state(path) == before


def test_a_database_tokentrace_created_is_marked_and_loaded_again(tmp_path) -> None:
    db = tmp_path / "t.duckdb"
    for _ in range(2):
        r = CliRunner().invoke(cli, ["load", str(TRACES), "--db", str(db), "-q"])
        assert r.exit_code == 0, r.output
    con = duckdb.connect(str(db), read_only=True)
    assert con.execute(f"SELECT schema_version FROM {SCHEMA_TABLE}").fetchall() == [(SCHEMA_VERSION,)]
    assert con.execute("SELECT count(*) FROM loads").fetchall() == [(2,)]
    con.close()


def test_a_database_of_an_older_tokentrace_without_the_marker_is_accepted(tmp_path) -> None:
    """Tables as an older tokentrace wrote them (no marker; spans without the generated
    dedicated columns): accepted, rebuilt with them, and marked."""
    old_spans = TABLE_DDL["spans"].split("load_id BIGINT")[0] + "load_id BIGINT\n)"
    old_events = TABLE_DDL["span_events"].split("dropped_attributes_count")[0] + \
        "dropped_attributes_count BIGINT NOT NULL DEFAULT 0\n)"
    db = _database(tmp_path / "old.duckdb", old_spans, old_events,
                   *(ddl for name, ddl in TABLE_DDL.items() if name not in ("spans", "span_events")))
    r = CliRunner().invoke(cli, ["load", str(TRACES), "--db", str(db), "-q"])
    assert r.exit_code == 0, r.output
    con = duckdb.connect(str(db), read_only=True)
    assert con.execute(f"SELECT schema_version FROM {SCHEMA_TABLE}").fetchall() == [(SCHEMA_VERSION,)]
    assert con.execute("SELECT count(*) FROM spans WHERE attr_tokentrace_step IS NULL").fetchall()[0][0] > 0
    con.close()


def test_an_empty_duckdb_database_is_taken_as_new(tmp_path) -> None:
    db = _database(tmp_path / "empty.duckdb", "SELECT 1")
    r = CliRunner().invoke(cli, ["load", str(TRACES), "--db", str(db), "-q"])
    assert r.exit_code == 0, r.output


@pytest.mark.parametrize("kind", ["empty", "truncated", "garbage"])
def test_a_failed_first_load_leaves_nothing_behind(tmp_path, kind) -> None:
    source = tmp_path / f"{kind}.jsonl"
    source.write_bytes({"empty": b"", "truncated": TRACES.read_bytes()[:300], "garbage": b"garbage\n"}[kind])
    db = tmp_path / "new.duckdb"
    r = CliRunner().invoke(cli, ["load", str(source), "--db", str(db)])
    assert r.exit_code == 1, r.output
    assert r.stderr.splitlines()[-1].startswith("Error: "), r.stderr
    assert sorted(p.name for p in tmp_path.iterdir()) == [source.name]
