"""benchmarks/floor_queries.py: the hand-written floor of each verb gives the verb's rows on the
test traces (planted breaks, dropped events, a server-only request, a skewed client), so the
ratios benchmarks/verbs.py prints compare the same answers."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

from analyzer.query.runner import run_query
from trace_fixtures import mixed_world

BENCH = Path(__file__).resolve().parents[1] / "benchmarks"


def _module(name: str):
    spec = importlib.util.spec_from_file_location(f"_floors_{name}", BENCH / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


FLOORS = _module("floor_queries").FLOORS
VERBS = _module("verbs")


@pytest.fixture(scope="module")
def con():
    connection = mixed_world().load()
    yield connection
    connection.close()


@pytest.mark.parametrize("verb", sorted(FLOORS))
def test_the_floor_gives_the_verbs_rows(con, verb) -> None:
    names = ["skew_rules", "skew_offsets"] if verb == "skew" else [verb]
    verb_tables = [run_query(con, name).dicts() for name in names]
    floor_tables = []
    for sql in FLOORS[verb]:
        cur = con.execute(sql)
        columns = [d[0] for d in cur.description]
        floor_tables.append([dict(zip(columns, r)) for r in cur.fetchall()])
    assert any(verb_tables), verb  # the traces give rows for every verb
    assert VERBS.floor_differences(verb_tables, floor_tables) == []
