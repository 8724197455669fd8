"""The checks every commit runs, and what they leave in the code: scripts/test runs ruff and
mypy (configured in pyproject.toml) before pytest; every ``# noqa`` and ``type: ignore`` says
why; comments and docstrings name things (the worked example, docs/metrics.md), not issue
numbers or the founding document."""

from __future__ import annotations

import ast
import io
import re
import subprocess
import tokenize
from pathlib import Path

import pytest

tomllib = pytest.importorskip("tomllib")  # Python 3.11+

REPO = Path(__file__).resolve().parents[1]

NOQA = re.compile(r"#\s*noqa\b(?P<rest>.*)")
NOQA_WITH_REASON = re.compile(r":\s*[A-Z]+[0-9]+(?:\s*,\s*[A-Z]+[0-9]+)*\s+-\s+\S")
TYPE_IGNORE = re.compile(r"type:\s*ignore(?P<rest>.*)")
TYPE_IGNORE_WITH_REASON = re.compile(r"\[[a-z, -]+\]\s+#\s+\S")

ISSUE_NUMBER = re.compile(r"\b[Ii]ssues? #?\d+|\(#\d+|#\d+ items?\b|\bsince #\d+")
SEED = re.compile(r"\b[Tt]he seed\b|\bseed's\b")


def _python_files() -> list[Path]:
    listed = subprocess.run(["git", "ls-files", "*.py"], cwd=REPO, capture_output=True, text=True, check=True)
    return [REPO / name for name in listed.stdout.split()]


def _comments_and_docstrings(path: Path) -> list[tuple[int, str]]:
    """(line, text) of every comment and docstring of a Python file."""
    source = path.read_text()
    found = [(tok.start[0], tok.string) for tok in tokenize.generate_tokens(io.StringIO(source).readline)
             if tok.type == tokenize.COMMENT]
    for node in ast.walk(ast.parse(source, str(path))):
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)):
            doc = ast.get_docstring(node, clean=False)
            if doc is not None:
                found.append((node.body[0].lineno, doc))
    return found


def test_every_noqa_and_type_ignore_says_why() -> None:
    bare = []
    for path in _python_files():
        for tok in tokenize.generate_tokens(io.StringIO(path.read_text()).readline):
            if tok.type != tokenize.COMMENT:
                continue
            where = f"{path.relative_to(REPO)}:{tok.start[0]}: {tok.string.strip()[:90]}"
            noqa = NOQA.search(tok.string)
            if noqa and not NOQA_WITH_REASON.match(noqa["rest"]):
                bare.append(where)
            ignore = TYPE_IGNORE.search(tok.string)
            if ignore and not TYPE_IGNORE_WITH_REASON.match(ignore["rest"]):
                bare.append(where)
    assert not bare, "say which code and why (`# noqa: CODE - why`, `# type: ignore[code]  # why`):\n" + \
        "\n".join(bare)


def test_the_reason_patterns_tell_bare_from_explained() -> None:
    assert not NOQA_WITH_REASON.match(NOQA.search("x = 1  # noqa: E731")["rest"])
    assert NOQA_WITH_REASON.match(NOQA.search("x = 1  # noqa: E731 - a named one-liner")["rest"])
    assert not TYPE_IGNORE_WITH_REASON.match(TYPE_IGNORE.search("# type: ignore[arg-type]")["rest"])
    assert TYPE_IGNORE_WITH_REASON.match(TYPE_IGNORE.search("# type: ignore[arg-type]  # set above")["rest"])


def test_comments_name_things_not_issue_numbers_or_the_seed() -> None:
    found = []
    for path in _python_files():
        for line, text in _comments_and_docstrings(path):
            found += [f"{path.relative_to(REPO)}:{line}: {what}" for what, rule in
                      (("an issue number", ISSUE_NUMBER), ("the seed", SEED)) if rule.search(text)]
    for path in sorted(REPO.glob("queries/**/*.sql")):
        for line, text in enumerate(path.read_text().splitlines(), 1):
            comment = text.partition("--")[2]
            found += [f"{path.relative_to(REPO)}:{line}: {what}" for what, rule in
                      (("an issue number", ISSUE_NUMBER), ("the seed", SEED)) if rule.search(comment)]
    assert not found, "\n".join(found)


def test_the_patterns_find_what_they_are_for() -> None:
    assert ISSUE_NUMBER.search("a load generator (issue #6).") and ISSUE_NUMBER.search("records (#27): the")
    assert ISSUE_NUMBER.search("runs as printed (issue 30 item 3)") and ISSUE_NUMBER.search("written since #28")
    assert not ISSUE_NUMBER.search("vLLM PR #32573 changed it") and not ISSUE_NUMBER.search("color #0003")
    assert SEED.search("the seed's formulas") and SEED.search("The seed request")
    assert not SEED.search("the sampling seed (gen_ai.request.seed)")


def test_scripts_test_runs_ruff_and_mypy_before_pytest() -> None:
    script = (REPO / "scripts" / "test").read_text()
    commands = [line.strip() for line in script.splitlines() if line.strip().startswith(".venv/bin/python -m")]
    tools = [c.split()[2] for c in commands]
    assert tools[:2] == ["ruff", "mypy"] and "pytest" in tools[2:], commands
    assert "set -euo pipefail" in script  # a finding stops the script before the tests


def test_ruff_and_mypy_are_configured_and_installed_with_the_tests() -> None:
    config = tomllib.loads((REPO / "pyproject.toml").read_text())
    ruff = config["tool"]["ruff"]
    assert {"E", "F", "W", "I", "UP", "B"} <= set(ruff["lint"]["select"])
    mypy = config["tool"]["mypy"]
    assert mypy["check_untyped_defs"] is True and set(mypy["files"]) == {"instrument", "analyzer"}
    assert all(o.get("ignore_missing_imports") and all(m.endswith(".*") for m in o["module"])
               for o in config["tool"]["mypy"]["overrides"])  # named packages, never a blanket
    assert "ignore_missing_imports" not in mypy
    test_extra = " ".join(config["project"]["optional-dependencies"]["test"])
    assert "ruff" in test_extra and "mypy" in test_extra
