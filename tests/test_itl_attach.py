"""itl's rows with the request names attached after an integer sort (analyzer/query/attach.py,
queries/keep/itl_gaps.sql + itl_names.sql) are itl.sql's rows: the same columns in the same
order, the same values and the same row order, for tokentrace's spans and another adapter's,
dropped events included, in one request_key range and in many, for every perspective and one;
and `tokentrace itl --format csv` writes the same bytes through them as through itl.sql."""

from __future__ import annotations

from pathlib import Path

import duckdb
import pytest

import analyzer.db.views.keep as view_keep
from analyzer.db.views import install_views
from analyzer.formats.load import load_paths
from analyzer.query import attach
from analyzer.query.runner import stream_query
from trace_fixtures import mixed_world

DATA = Path(__file__).resolve().parent / "data"
CLIENTS = DATA / "real" / "openai-clients-tokentrace"  # tokentrace's server + OpenLLMetry's client spans


def _world() -> duckdb.DuckDBPyConnection:
    con = mixed_world().load()
    load_paths(con, [str(CLIENTS / "server.jsonl"), str(CLIENTS / "openllmetry.jsonl")])
    return con


def _both(con: duckdb.DuckDBPyConnection, params: dict) -> tuple[list, list, int]:
    """(rows through the attach, rows of each part's itl.sql, number of parts)."""
    import pyarrow as pa

    parts = list(stream_query(con, "itl", params))
    assert all(p.attach is not None for p in parts)
    attached = pa.Table.from_batches([b for p in parts for b in p.arrow_batches(con, 97)])
    plain = pa.concat_tables([con.sql(p.sql, params=p.params).to_arrow_table() for p in parts])
    assert attached.schema == plain.schema
    return attached.to_pylist(), plain.to_pylist(), len(parts)


@pytest.mark.parametrize("range_events", [None, 150])
@pytest.mark.parametrize("perspective", [None, "server", "client"])
def test_attached_rows_are_itls_rows(monkeypatch, range_events, perspective) -> None:
    if range_events is not None:
        monkeypatch.setattr(view_keep, "RANGE_EVENTS", range_events)
    con = _world()
    attached, plain, parts = _both(con, {"perspective": perspective})
    assert attached == plain
    assert parts == 1 if range_events is None else parts > 3
    assert len(plain) > 100
    sources = {"tokentrace", "openllmetry"} if perspective != "server" else {"tokentrace"}
    assert {r["source"] for r in plain} == sources
    if perspective is None:
        assert any(r["null_reason"] and r["null_reason"].startswith("gap unknown: ") for r in plain)


def test_a_column_missing_from_the_split_is_an_error(monkeypatch) -> None:
    """A column added to itl.sql's per-request part and not to the names file is named, not
    silently dropped."""
    monkeypatch.setitem(attach.SPLITS, "itl", ("keep/itl_gaps", "keep/tt_missing_names"))
    from analyzer.query import runner

    real = runner.load_query

    def load(name: str):
        if name == "keep/tt_missing_names":
            q = real("keep/itl_names")
            return type(q)(name, q.path, q.sql.replace("k.request_span_id, i.response_id", "i.response_id"), q.returns,
                           q.units, q.params)
        return real(name)

    monkeypatch.setattr(runner, "load_query", load)
    con = _world()
    with pytest.raises(ValueError, match="request_span_id"):
        list(stream_query(con, "itl"))


def test_narrowed_itl_runs_itl_sql() -> None:
    """One request (--request): a single part of itl.sql itself, nothing attached."""
    con = _world()
    install_views(con)
    span = con.execute("SELECT request_span_id FROM request_keys WHERE source = 'tokentrace' LIMIT 1").fetchall()
    parts = list(stream_query(con, "itl", {"request_span_id": span[0][0]}))
    assert len(parts) == 1 and parts[0].attach is None
    rows = [r for b in parts[0].arrow_batches(con, 1000) for r in b.to_pylist()]
    assert rows and {r["request_span_id"] for r in rows} == {span[0][0]}


@pytest.fixture(scope="module")
def db(tmp_path_factory) -> Path:
    from analyzer.db.derived import build_derived
    from analyzer.db.store import connect

    path = tmp_path_factory.mktemp("itlattach") / "traces.duckdb"
    disk = connect(path)
    mixed_world().load(disk)
    load_paths(disk, [str(CLIENTS / "server.jsonl"), str(CLIENTS / "openllmetry.jsonl")])
    build_derived(disk)
    disk.close()
    return path


@pytest.mark.parametrize("derived", [True, False], ids=["derived tables", "derived on the connection"])
@pytest.mark.parametrize("flags", [[], ["--perspective", "client"], ["--columns", "trace_id,gap_index,itl_ms,source"]])
def test_cli_csv_through_the_attach_is_itl_sqls_csv(db: Path, flags, derived, monkeypatch, tmp_path) -> None:
    """The csv lines built from the attached batches (analyzer/cli/_csv_lines.py) are the
    bytes itl.sql's own lines give, on a database with derived tables and without."""
    from click.testing import CliRunner

    from analyzer.cli import _csv_lines, cli
    from analyzer.db.derived import drop_derived
    from analyzer.db.store import connect

    if not derived:  # a copy without them (the fixture's file keeps its derived tables)
        import shutil

        db = Path(shutil.copy(db, tmp_path / "underived.duckdb"))
        con = connect(db)
        drop_derived(con)
        con.close()
    monkeypatch.setattr(_csv_lines, "ARROW_MIN_EVENTS", 0)  # the Arrow path, where the attach runs
    used: list[int] = []
    real = attach.arrow_batches

    def spy(*args, **kwargs):
        used.append(1)
        yield from real(*args, **kwargs)

    monkeypatch.setattr(attach, "arrow_batches", spy)
    from analyzer.query import runner

    monkeypatch.setattr(runner, "attach_batches", spy)
    attached = CliRunner().invoke(cli, ["itl", "--db", str(db), "--format", "csv", *flags])
    assert attached.exit_code == 0, attached.output
    assert used
    monkeypatch.delitem(attach.SPLITS, "itl")  # itl.sql's own rows and lines
    used.clear()
    plain = CliRunner().invoke(cli, ["itl", "--db", str(db), "--format", "csv", *flags])
    assert plain.exit_code == 0, plain.output
    assert not used
    assert attached.stdout_bytes == plain.stdout_bytes
    assert attached.stdout_bytes.count(b"\n") > 100
