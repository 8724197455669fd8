"""Packaging: queries/ ships as package data, every verb has help with an example, the
packages keep their import boundaries."""

from __future__ import annotations

import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

from analyzer.cli import cli
from analyzer.queries import list_queries, queries_dir

REPO = Path(__file__).resolve().parents[1]


def test_queries_dir_is_the_repo_folder_in_a_checkout() -> None:
    assert queries_dir().resolve() == (REPO / "queries").resolve()
    assert "requests" in list_queries() and "window" in list_queries()


def test_wheel_ships_queries_and_examples(tmp_path) -> None:
    build = subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "--no-build-isolation", "-w", str(tmp_path), str(REPO)],
        capture_output=True, text=True, timeout=300,
    )
    assert build.returncode == 0, build.stderr[-2000:]
    wheel = next(tmp_path.glob("tokentrace-*.whl"))
    names = set(zipfile.ZipFile(wheel).namelist())
    for sql in (REPO / "queries").rglob("*.sql"):
        assert f"analyzer/sql/{sql.relative_to(REPO / 'queries').as_posix()}" in names, sql
    assert "analyzer/examples/request-timeline.csv" in names
    # Installed from the wheel (no checkout on the path), the SQL is found as package data.
    target = tmp_path / "site"
    subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--target", str(target), str(wheel)],
                   check=True, capture_output=True, timeout=300)
    probe = subprocess.run(
        [sys.executable, "-S", "-c",
         "import sys; sys.path.insert(0, sys.argv[1]); from importlib import resources; "
         "f = resources.files('analyzer.sql'); print((f / 'requests.sql').is_file(), (f / 'views').is_dir(), f)",
         str(target)],
        capture_output=True, text=True, timeout=60, cwd=tmp_path,
    )
    assert probe.stdout.split()[:2] == ["True", "True"], probe.stdout + probe.stderr
    assert str(target) in probe.stdout


def _commands():
    return sorted(cli.commands.items())


@pytest.mark.parametrize("name, command", _commands())
def test_every_verb_has_help_with_an_example(name, command) -> None:
    assert command.help and "Example" in command.help, f"tokentrace {name} needs an 'Example:' block in its help"


def test_analyzer_imports_without_torch_and_instrument_without_duckdb() -> None:
    code = (
        "import sys, analyzer.cli, analyzer.queries, analyzer.timeline; "
        "assert 'torch' not in sys.modules and 'transformers' not in sys.modules, 'analyzer pulled torch'; "
        "import instrument.kv; print('ok')"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.stdout.strip() == "ok", out.stderr[-2000:]
    code = "import sys, instrument, instrument.kv; assert 'duckdb' not in sys.modules; print('ok')"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.stdout.strip() == "ok", out.stderr[-2000:]
