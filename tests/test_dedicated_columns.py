"""The dedicated columns (analyzer.db.schema.DEDICATED_COLUMNS): filled at load from the same
values as the maps, written by export with the dump's format version, and computed from the
maps for what was written before them (a format-1 dump, a folder collected across an
upgrade, an older database), with every query's rows unchanged."""

from __future__ import annotations

import shutil
from pathlib import Path

import duckdb
import pytest

from analyzer.db.schema import DEDICATED_COLUMNS, DUMP_FORMAT, FORMAT_KEY, TABLE_DDL
from analyzer.db.source import open_source
from analyzer.db.store import connect
from analyzer.errors import SourceError
from analyzer.formats.load import load_paths
from analyzer.formats.parquet_export import export_parquet
from analyzer.query.runner import list_queries, run_query
from trace_fixtures import mixed_world

CONTINUOUS_CAPTURE = Path(__file__).resolve().parent / "fixtures" / "continuous_engine"
QUERIES = ("requests", "itl", "summary", "steps", "steps_summary", "skew_rules", "phases")


def _world(con: duckdb.DuckDBPyConnection) -> duckdb.DuckDBPyConnection:
    """The mixed fixture plus the continuous engine's capture (decode spans, engine steps)."""
    con = mixed_world().load(con)
    load_paths(con, [str(CONTINUOUS_CAPTURE / "server.otlp.jsonl"), str(CONTINUOUS_CAPTURE / "client.otlp.jsonl")])
    return con


@pytest.fixture(scope="module")
def sources(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    root = tmp_path_factory.mktemp("dedicated")
    con = _world(connect(root / "traces.duckdb"))
    export_parquet(con, root / "dump")
    con.close()
    return root / "traces.duckdb", root / "dump"


def _rows(con: duckdb.DuckDBPyConnection, name: str) -> list[tuple]:
    """The query's rows, floats rounded to 9 significant digits (sums differ in the last bit
    with the order DuckDB's threads add in)."""
    return [tuple(float(f"{v:.9g}") if isinstance(v, float) else v for v in row) for row in run_query(con, name).rows]


def test_every_dedicated_column_holds_its_maps_value(sources) -> None:
    """In the database they are generated from the maps; in the dump they are stored values,
    read here straight from the files (not through open_source, which may compute them)."""
    db, dump = sources
    con = duckdb.connect(str(db), read_only=True)
    generated = {r[0] for r in con.execute(
        "SELECT column_name FROM duckdb_columns() WHERE table_name = 'spans' AND column_default IS NOT NULL"
        " AND starts_with(column_name, 'attr_')").fetchall()}
    con.close()
    assert generated == {c.name for c in DEDICATED_COLUMNS["spans"]}  # generated, so never out of step
    files = duckdb.connect()
    for table, columns in DEDICATED_COLUMNS.items():
        if not columns:
            continue
        source = f"read_parquet('{dump / table / '**' / '*.parquet'}', hive_partitioning = false)"
        for c in columns:
            differ = files.execute(f"SELECT count(*) FILTER ({c.name} IS DISTINCT FROM {c.from_map}) FROM {source}"
                                   ).fetchall()[0][0]
            assert differ == 0, (table, c.name)
    # the fixture exercises the hot ones: a decode step, KV bytes, an engine step, a chunk index
    filled = files.execute(
        f"SELECT (SELECT count(attr_tokentrace_step) FROM read_parquet('{dump}/spans/**/*.parquet')),"
        f" (SELECT count(attr_tokentrace_kv_bytes) FROM read_parquet('{dump}/spans/**/*.parquet')),"
        f" (SELECT count(attr_tokentrace_engine_step) FROM read_parquet('{dump}/spans/**/*.parquet')),"
        f" (SELECT count(attr_tokentrace_chunk_index) FROM read_parquet('{dump}/span_events/**/*.parquet'))"
    ).fetchall()[0]
    assert all(n > 0 for n in filled), filled


def test_export_writes_the_columns_and_the_format_version(sources) -> None:
    _, dump = sources
    con = duckdb.connect()
    files = sorted(dump.glob("**/*.parquet"))
    assert files
    pattern = str(dump / "**" / "*.parquet")
    versions = con.execute(
        f"SELECT DISTINCT decode(value) FROM parquet_kv_metadata('{pattern}') WHERE decode(key) = $k",
        {"k": FORMAT_KEY}).fetchall()
    assert versions == [(str(DUMP_FORMAT),)]
    events = str(dump / "span_events" / "**" / "*.parquet")
    names = {r[0] for r in con.execute(f"SELECT name FROM parquet_schema('{events}')").fetchall()}
    assert {c.name for c in DEDICATED_COLUMNS["span_events"]} <= names


def _format_1(dump: Path, target: Path, only: str | None = None) -> None:
    """``dump`` rewritten as a format-1 dump (no dedicated columns, no version key); with
    ``only`` (a partition folder name), only that partition's files are rewritten."""
    shutil.copytree(dump, target)
    con = duckdb.connect()
    for path in sorted(target.glob("**/*.parquet")):
        if only is not None and only not in str(path):
            continue
        table = path.relative_to(target).parts[0]
        drop = [c.name for c in DEDICATED_COLUMNS[table]]
        exclude = f" EXCLUDE ({', '.join(drop)})" if drop else ""
        tmp = path.with_suffix(".tmp")
        con.execute(f"COPY (SELECT *{exclude} FROM read_parquet('{path}', hive_partitioning = false)) TO '{tmp}'"
                    " (FORMAT parquet)")
        tmp.replace(path)


@pytest.mark.parametrize("only", [None, "service_name=server"], ids=["format-1 dump", "mixed folder"])
def test_older_files_give_the_same_rows(sources, tmp_path: Path, only: str | None) -> None:
    _, dump = sources
    old = tmp_path / "old"
    _format_1(dump, old, only)
    con = duckdb.connect()
    assert not con.execute(f"SELECT count(*) FROM parquet_kv_metadata('{old}/spans/service_name=server/**/*.parquet')"
                           " WHERE decode(key) = $k", {"k": FORMAT_KEY}).fetchall()[0][0]
    for name in QUERIES:
        assert _rows(open_source(parquet=old), name) == _rows(open_source(parquet=dump), name), name
    plan = "\n".join(r[1] for r in open_source(parquet=old).execute("EXPLAIN SELECT attr_tokentrace_step FROM spans")
                     .fetchall())
    assert "attr_int" in plan  # computed from the map


def test_a_newer_format_is_refused_in_one_line(sources, tmp_path: Path) -> None:
    _, dump = sources
    newer = tmp_path / "newer"
    shutil.copytree(dump, newer)
    path = sorted((newer / "spans").glob("**/*.parquet"))[0]
    con = duckdb.connect()
    tmp = path.with_suffix(".tmp")
    con.execute(f"COPY (SELECT * FROM read_parquet('{path}', hive_partitioning = false)) TO '{tmp}'"
                f" (FORMAT parquet, KV_METADATA {{'{FORMAT_KEY}': '{DUMP_FORMAT + 1}'}})")
    tmp.replace(path)
    with pytest.raises(SourceError) as err:
        open_source(parquet=newer)
    message = str(err.value)
    assert "\n" not in message and path.name in message and f"format '{DUMP_FORMAT + 1}'" in message
    assert "upgrade tokentrace" in message


def _older_database(db: Path, target: Path) -> None:
    """``db`` copied into a database whose span tables have no dedicated column (as loaded
    before 2026-12)."""
    con = duckdb.connect(str(target))
    con.execute("ATTACH $p AS src (READ_ONLY)", {"p": str(db)})
    for table in TABLE_DDL:
        drop = [c.name for c in DEDICATED_COLUMNS.get(table, ())]
        con.execute(f"CREATE TABLE {table} AS SELECT *{' EXCLUDE (' + ', '.join(drop) + ')' if drop else ''}"
                    f" FROM src.{table}")
    con.close()


def test_an_older_database_is_read_and_then_upgraded_by_a_load(sources, tmp_path: Path) -> None:
    db, _ = sources
    old = tmp_path / "old.duckdb"
    _older_database(db, old)
    for name in QUERIES:
        assert _rows(open_source(db=old), name) == _rows(open_source(db=db), name), name
    before = old.stat().st_mtime_ns
    run_query(open_source(db=old), "requests")
    reader = connect(old, read_only=True)  # as `tokentrace export` opens it
    export_parquet(reader, tmp_path / "from_old")
    reader.close()
    assert old.stat().st_mtime_ns == before  # reading and exporting never write
    for name in QUERIES:  # the export stores the columns, computed from the maps
        assert _rows(open_source(parquet=tmp_path / "from_old"), name) == _rows(open_source(db=db), name), name
    con = connect(old)  # a load's connection: the columns are added and filled from the maps
    columns = {r[0] for r in con.execute("DESCRIBE spans").fetchall()}
    assert {c.name for c in DEDICATED_COLUMNS["spans"]} <= columns
    assert con.execute("SELECT count(*) FROM spans WHERE attr_tokentrace_step IS DISTINCT FROM "
                       "attr_int['tokentrace.step']").fetchall()[0][0] == 0
    con.close()
    for name in QUERIES:
        assert _rows(open_source(db=old), name) == _rows(open_source(db=db), name), name


def test_queries_list_is_covered() -> None:
    assert set(QUERIES) <= set(list_queries())
