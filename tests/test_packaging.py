"""Packaging: queries/ ships as package data, every verb has help with an example, the
packages keep their import boundaries."""

from __future__ import annotations

import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

from analyzer.cli import cli
from analyzer.db.views import queries_dir
from analyzer.query.runner import list_queries

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
    assert "analyzer/examples/claims.yaml" in names  # the audit example
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
        "import sys, analyzer.cli, analyzer.query.runner, analyzer.verbs.timeline; "
        "assert 'torch' not in sys.modules and 'transformers' not in sys.modules, 'analyzer pulled torch'; "
        "import instrument.kv.formula; print('ok')"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.stdout.strip() == "ok", out.stderr[-2000:]
    code = "import sys, instrument, instrument.kv.formula; assert 'duckdb' not in sys.modules; print('ok')"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.stdout.strip() == "ok", out.stderr[-2000:]


def _extra_requirements(extra: str, seen: set[str] | None = None) -> set[str]:
    """Distribution names (normalized) that `pip install -e ".[extra]"` installs directly:
    the base dependencies, the extra's, and those of every tokentrace[...] it names."""
    import re

    try:
        import tomllib
    except ModuleNotFoundError:  # Python 3.10
        tomllib = pytest.importorskip("tomli")
    project = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
    seen = seen if seen is not None else set()
    names: set[str] = set()

    def name(req: str) -> str:
        return re.split(r"[\s<>=!~;\[]", req, maxsplit=1)[0].lower().replace("_", "-")

    for req in project["dependencies"]:
        names.add(name(req))
    for req in project["optional-dependencies"][extra]:
        nested = re.fullmatch(r"tokentrace\[([a-z,]+)\]", req.replace(" ", ""))
        if nested:
            for inner in nested[1].split(","):
                if inner not in seen:
                    seen.add(inner)
                    names |= _extra_requirements(inner, seen)
        else:
            names.add(name(req))
    return names


def test_the_bench_extra_provides_every_module_the_benchmarks_import() -> None:
    import ast
    from importlib.metadata import packages_distributions

    provided = _extra_requirements("bench")
    by_module = packages_distributions()
    local = {"analyzer", "instrument", "benchmarks", "tests", *(p.stem for p in (REPO / "benchmarks").glob("*.py"))}
    # run with vLLM's own venv (scripts/test-vllm builds .venv-vllm), never with the bench extra:
    # vLLM is not something `pip install tokentrace[bench]` may pull in
    in_vllm_venv = {"cold_capture.py": {"vllm"}}
    missing = []
    for script in sorted((REPO / "benchmarks").glob("*.py")):
        for node in ast.walk(ast.parse(script.read_text())):
            modules = [a.name for a in node.names] if isinstance(node, ast.Import) else \
                [node.module] if isinstance(node, ast.ImportFrom) and node.module and node.level == 0 else []
            for module in modules:
                top = module.split(".")[0]
                if top in sys.stdlib_module_names or top in local or top in in_vllm_venv.get(script.name, ()):
                    continue
                dists = {d.lower().replace("_", "-") for d in by_module.get(top, [top])}
                # a module installed as a dependency of a listed package (torch's numpy, ...) is
                # not enough: the extra must name what the benchmark imports
                if not dists & provided:
                    missing.append(f"{script.name}: {module} ({', '.join(sorted(dists))})")
    assert not missing, missing
