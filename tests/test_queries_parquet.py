"""analyzer.db.source.open_source: the same queries over a DuckDB file and over a Parquet dump."""

from __future__ import annotations

from pathlib import Path

import pytest

from analyzer.db.source import open_source
from analyzer.db.store import connect
from analyzer.errors import SourceError
from analyzer.query.runner import list_queries, run_query
from trace_fixtures import ANCHOR_NS, mixed_world, write_parquet_dump

DAY_NS = 86_400 * 10**9


@pytest.fixture(scope="module")
def sources(tmp_path_factory) -> tuple[Path, Path]:
    root = tmp_path_factory.mktemp("src")
    db = root / "traces.duckdb"
    con = mixed_world().load(connect(db))
    write_parquet_dump(con, str(root / "dump"))
    con.close()
    return db, root / "dump"


def test_every_query_gives_the_same_rows_from_file_and_parquet(sources) -> None:
    db, dump = sources
    assert (dump / "spans" / "service_name=server" / "date=2026-01-01").is_dir()
    for name in list_queries():
        a = run_query(open_source(db=db), name).rows
        b = run_query(open_source(parquet=dump), name).rows
        assert len(a) == len(b), name
        for ra, rb in zip(a, b):  # floats may differ in the last bit (summation order)
            assert _same(ra, rb), (name, ra, rb)
        assert a, f"{name} returned nothing over the fixture"


def _same(a: tuple, b: tuple) -> bool:
    return all(x == pytest.approx(y, rel=1e-12) if isinstance(x, float) else x == y for x, y in zip(a, b))


def test_partitions_outside_the_window_are_pruned(sources) -> None:
    _, dump = sources
    con = open_source(parquet=dump, start_ns=ANCHOR_NS + 5 * DAY_NS, end_ns=ANCHOR_NS + 6 * DAY_NS)
    assert con.execute("SELECT count(*) FROM spans").fetchone()[0] == 0
    plan = "\n".join(r[1] for r in con.execute("EXPLAIN SELECT count(*) FROM spans").fetchall())
    assert "Total Files Read: 0" in plan or "date" in plan.lower()
    inside = open_source(parquet=dump, start_ns=ANCHOR_NS, end_ns=ANCHOR_NS + 10**9)
    assert inside.execute("SELECT count(*) FROM spans").fetchone()[0] > 0


def test_database_is_not_written(sources) -> None:
    db, _ = sources
    before = db.stat().st_mtime_ns
    run_query(open_source(db=db), "requests")
    assert db.stat().st_mtime_ns == before


def test_clear_errors(tmp_path) -> None:
    with pytest.raises(SourceError, match="load traces first with tokentrace load"):
        open_source(db=tmp_path / "missing.duckdb")
    with pytest.raises(SourceError, match="no such directory"):
        open_source(parquet=tmp_path / "nothing")
    (tmp_path / "empty").mkdir()
    with pytest.raises(SourceError, match="no Parquet files under spans/"):
        open_source(parquet=tmp_path / "empty")
    with pytest.raises(SourceError, match="either"):
        open_source()
    other = tmp_path / "other.duckdb"
    import duckdb

    duckdb.connect(str(other)).execute("CREATE TABLE t (x INT)").close()
    with pytest.raises(SourceError, match="not a tokentrace database"):
        open_source(db=other)
