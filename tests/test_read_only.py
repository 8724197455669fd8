"""Read verbs open the database read-only and leave it byte-identical: a checksum
of the file (and no WAL beside it) before and after every read verb, report included."""

from __future__ import annotations

import hashlib
from pathlib import Path

import pytest
from click.testing import CliRunner

from analyzer.cli import cli
from analyzer.db.store import connect
from trace_fixtures import mixed_trace_id, mixed_world

CLAIMS = "ttft_ms: {value: 190, stat: p50}\n"


@pytest.fixture(scope="module", params=["derived", "plain"])
def db(request, tmp_path_factory) -> Path:
    """A database as tokentrace load leaves it (derived tables built), and one without them
    (written by the library: every read verb derives on its own in-memory connection)."""
    from analyzer.db.derived import build_derived

    root = tmp_path_factory.mktemp(f"ro-{request.param}")
    path = root / "traces.duckdb"
    con = mixed_world().load(connect(path))
    if request.param == "derived":
        build_derived(con)
    con.close()
    (root / "claims.yaml").write_text(CLAIMS)
    return path


def _state(path: Path) -> tuple[str, int, bool]:
    data = path.read_bytes()
    return hashlib.sha256(data).hexdigest(), len(data), path.with_name(path.name + ".wal").exists()


def _read_verbs(db: Path) -> list[list[str]]:
    seed = mixed_trace_id("seed")
    verbs = []
    plain = "plain" in db.parent.name
    for fmt in (("table", "csv") if plain else ("table", "json", "csv")):
        verbs += [["requests", "--format", fmt], ["itl", "--format", fmt], ["phases", "--format", fmt],
                  ["summary", "--format", fmt], ["window", "--format", fmt], ["skew", "--format", fmt],
                  # csv is one table per file: one section each
                  *([["steps", "--format", fmt]] if fmt != "csv" else
                    [["steps", "--format", fmt, "--section", s] for s in ("steps", "summary")]),
                  *([["stalls", "--format", fmt]] if fmt != "csv" else
                    [["stalls", "--format", fmt, "--section", s] for s in ("gaps", "groups", "slowest")])]
    verbs += [
        ["requests", "--trace-id", seed], ["itl", "--trace-id", seed, "--perspective", "client"],
        ["window", "--mode", "steady_state", "--slo-ttft-ms", "500"],
        ["sql", "SELECT count(*) FROM request_metrics"], ["sql", "SELECT * FROM request_gaps LIMIT 3"],
        ["sql", "SELECT * FROM clock_pair_offsets"], ["sql", "SELECT * FROM request_step_gaps LIMIT 3"],
        ["steps", "--section", "summary"], ["stalls", "--section", "slowest"],
        ["report", "--html", str(db.parent / "report.html")],
        ["export", "--parquet", str(db.parent / "dump")],
        ["audit", str(db.parent / "claims.yaml")],
    ]
    return verbs


def test_every_read_verb_leaves_the_database_byte_identical(db) -> None:
    before = _state(db)
    assert not before[2]
    seen = set()
    for args in _read_verbs(db):
        result = CliRunner().invoke(cli, [*args, "--db", str(db)])
        assert result.exit_code in (0, 1) and result.exception is None or isinstance(result.exception, SystemExit), (
            args, result.output)
        assert "Error" not in result.stderr, (args, result.stderr)
        assert _state(db) == before, f"{args} changed the database"
        seen.add(args[0])
    assert seen >= {"requests", "itl", "phases", "summary", "window", "skew", "steps", "stalls", "sql", "report",
                    "export", "audit"}
    assert (db.parent / "report.html").stat().st_size > 10_000


def test_report_reads_the_same_rows_and_leaves_no_views_in_the_file(db) -> None:
    import duckdb

    before = _state(db)
    out = db.parent / "r2.html"
    assert CliRunner().invoke(cli, ["report", "--db", str(db), "--html", str(out)]).exit_code == 0
    assert _state(db) == before
    con = duckdb.connect(str(db), read_only=True)
    try:
        views = con.execute("SELECT count(*) FROM duckdb_views() WHERE NOT internal AND database_name = 'traces'"
                            " AND schema_name = 'main'").fetchall()
    finally:
        con.close()
    assert views == [(0,)]
    assert _state(db) == before
