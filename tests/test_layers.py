"""The layers of docs/architecture.md, enforced: no import climbs from a lower layer to a higher one.

Every ``import`` and ``from … import`` in analyzer/ and instrument/ is read from the source
(function-level imports included), and each analyzer module is given its layer's rank:

    errors (0) → db (1) → formats (2) → query (3) → collect, audit, report (4) → verbs (5) → cli (6)

and each instrument package likewise:

    clock (0) → otel, kv (1) → hf (2) → records (3) → engines (4) → vllm (5) → gateway (6)
    → client (7)

A module may import its own layer and the layers below it, never one above; two instrument
packages never import each other both ways (each has its own rank). The whole project's
import graph has no circle (a module that imports, through any chain, a module that imports
it), function-level imports included.

Between the two halves: ``instrument`` never imports ``analyzer``; below the verbs,
``analyzer`` imports only ``instrument.kv.formula`` (the KV formula, no torch); verbs and CLI
import the engine side inside functions only, so ``analyzer`` imports without torch and
``instrument`` without duckdb (also checked by importing every module in a child process with
those packages blocked).
"""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]

RANKS: dict[str, int] = {
    "analyzer": 0, "analyzer.errors": 0,
    "analyzer.db": 1,
    "analyzer.formats": 2,
    "analyzer.query": 3,
    "analyzer.collect": 4, "analyzer.audit": 4, "analyzer.report": 4, "analyzer.compare": 4,
    "analyzer.verbs": 5,
    "analyzer.cli": 6,
}
#: the instrument side, bottom to top (docs/architecture.md)
INSTRUMENT_RANKS: dict[str, int] = {
    "instrument": 0, "instrument.clock": 0,
    "instrument.otel": 1, "instrument.kv": 1,
    "instrument.hf": 2,
    "instrument.records": 3,
    "instrument.engines": 4,
    "instrument.vllm": 5,
    "instrument.gateway": 6,
    "instrument.client": 7,
}
#: engine-side modules the lower analyzer layers may import (torch-free by design)
TORCH_FREE_INSTRUMENT = {"instrument.kv.formula", "instrument.kv"}


def _module_name(path: Path) -> str:
    parts = list(path.relative_to(REPO).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def _layer(name: str, ranks: dict[str, int] = RANKS) -> str:
    """The longest key of ``ranks`` that is ``name`` or a package above it."""
    parts = name.split(".")
    for n in range(len(parts), 0, -1):
        key = ".".join(parts[:n])
        if key in ranks:
            return key
    raise AssertionError(f"{name}: no layer in tests/test_layers.py ranks: give its package a rank")


def _imports(path: Path) -> list[tuple[int, str, bool]]:
    """(line, imported dotted name, at module level) for every import of the project's packages."""
    module = _module_name(path)
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    tree = ast.parse(path.read_text(), filename=str(path))
    top_level = {id(node) for node in tree.body}
    found: list[tuple[int, str, bool]] = []
    for node in ast.walk(tree):
        names: list[str] = []
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")[: len(package.split(".")) - (node.level - 1)]
                base = ".".join(anchor + ([base] if base else []))
            # `from analyzer.db import views` names a module too: keep the longer name when it is one
            names = [f"{base}.{a.name}" if (REPO / f"{base}.{a.name}".replace(".", "/")).exists()
                     or (REPO / (f"{base}.{a.name}".replace(".", "/") + ".py")).exists() else base
                     for a in node.names]
        for name in names:
            if name.split(".")[0] in ("analyzer", "instrument"):
                found.append((node.lineno, name, id(node) in top_level))
    return found


def _sources(package: str) -> list[Path]:
    return sorted(p for p in (REPO / package).rglob("*.py") if "__pycache__" not in p.parts)


def upward_imports() -> list[str]:
    """Every import that breaks the layering, as 'file:line: a -> b (why)'."""
    bad: list[str] = []
    for path in _sources("analyzer") + _sources("instrument"):
        module = _module_name(path)
        where = path.relative_to(REPO)
        for line, name, top in _imports(path):
            if module.startswith("instrument"):
                if name.startswith("analyzer"):
                    bad.append(f"{where}:{line}: {module} -> {name} (instrument never imports analyzer)")
                    continue
                here, there = _layer(module, INSTRUMENT_RANKS), _layer(name, INSTRUMENT_RANKS)
                if INSTRUMENT_RANKS[there] > INSTRUMENT_RANKS[here]:
                    bad.append(f"{where}:{line}: {module} ({here}) -> {name} ({there}) climbs")
                continue
            if name.startswith("instrument"):
                rank = RANKS[_layer(module)]
                if name not in TORCH_FREE_INSTRUMENT and (rank < RANKS["analyzer.verbs"] or top):
                    bad.append(f"{where}:{line}: {module} -> {name} (engine side: verbs/cli only, inside a function)")
                continue
            if name in ("analyzer.sql",) or name.startswith("analyzer.sql."):
                continue  # package data (queries/), not code
            if RANKS[_layer(name)] > RANKS[_layer(module)]:
                bad.append(f"{where}:{line}: {module} ({_layer(module)}) -> {name} ({_layer(name)}) climbs")
    return bad


def import_circles() -> list[list[str]]:
    """Every circle of the project's import graph (function-level imports included), each as
    the modules on it, smallest first: the strongly connected components of more than one
    module, and a module that imports itself."""
    graph: dict[str, set[str]] = {}
    for path in _sources("analyzer") + _sources("instrument"):
        module = _module_name(path)
        graph.setdefault(module, set()).update(name for _, name, _ in _imports(path))
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    circles: list[list[str]] = []

    def visit(start: str) -> None:  # Tarjan's algorithm, iterative (no recursion limit)
        work = [(start, iter(sorted(graph.get(start, ()))))]
        index[start] = low[start] = len(index)
        stack.append(start)
        on_stack.add(start)
        while work:
            node, edges = work[-1]
            for nxt in edges:
                if nxt not in graph:
                    continue
                if nxt not in index:
                    index[nxt] = low[nxt] = len(index)
                    stack.append(nxt)
                    on_stack.add(nxt)
                    work.append((nxt, iter(sorted(graph[nxt]))))
                    break
                if nxt in on_stack:
                    low[node] = min(low[node], index[nxt])
            else:
                work.pop()
                if work:
                    low[work[-1][0]] = min(low[work[-1][0]], low[node])
                if low[node] == index[node]:
                    component = []
                    while True:
                        member = stack.pop()
                        on_stack.discard(member)
                        component.append(member)
                        if member == node:
                            break
                    if len(component) > 1 or node in graph[node]:
                        circles.append(sorted(component))

    for module in sorted(graph):
        if module not in index:
            visit(module)
    return sorted(circles, key=len)


def test_no_import_circle() -> None:
    circles = import_circles()
    assert not circles, "modules that import each other (through the chain shown):\n" + "\n".join(
        " <-> ".join(c) for c in circles)


def test_the_check_sees_a_circle() -> None:
    """The circle finder is not blind: a planted pair of modules importing each other is found."""
    first = REPO / "instrument" / "otel" / "_planted_circle_a.py"
    second = REPO / "instrument" / "otel" / "_planted_circle_b.py"
    first.write_text("def f():\n    from instrument.otel import _planted_circle_b\n    return _planted_circle_b\n")
    second.write_text("from instrument.otel import _planted_circle_a\n")
    try:
        circles = import_circles()
    finally:
        first.unlink()
        second.unlink()
    assert ["instrument.otel._planted_circle_a", "instrument.otel._planted_circle_b"] in circles, circles


def test_the_instrument_root_holds_few_modules() -> None:
    """instrument/ by layer: the root holds the package, the clock and the client only."""
    assert sorted(p.name for p in (REPO / "instrument").glob("*.py")) == ["__init__.py", "client.py", "clock.py"], \
        "instrument/ root: put a module in the folder of its layer (docs/architecture.md)"


def test_no_import_climbs_a_layer() -> None:
    bad = upward_imports()
    assert not bad, "imports that climb a layer:\n" + "\n".join(bad)


def test_the_check_sees_a_climb(tmp_path: Path) -> None:
    """The walker is not blind: a planted upward import (db -> cli) is reported."""
    planted = REPO / "analyzer" / "db" / "_planted_climb_for_test.py"
    planted.write_text("def f():\n    from analyzer.cli._options import UserError\n    return UserError\n")
    try:
        bad = upward_imports()
    finally:
        planted.unlink()
    assert any("_planted_climb_for_test.py:2" in b and "climbs" in b for b in bad), bad


def test_every_analyzer_package_has_a_layer_and_a_one_line_docstring() -> None:
    for init in sorted((REPO / "analyzer").rglob("__init__.py")):
        name = _module_name(init)
        _layer(name)
        doc = ast.get_docstring(ast.parse(init.read_text()))
        assert doc, f"{init.relative_to(REPO)} says in no docstring what the package is"
    assert sorted(p.name for p in (REPO / "analyzer").glob("*.py")) == ["__init__.py", "errors.py"], \
        "analyzer/ root holds only the package and the errors: put a module in its layer"


_BLOCK = (
    "import sys, importlib, pkgutil\n"
    "class Block:\n"
    "    def find_spec(self, name, path=None, target=None):\n"
    "        if name.split('.')[0] in BLOCKED: raise ImportError(f'{name} is blocked for this check')\n"
    "sys.meta_path.insert(0, Block())\n"
    "import {pkg}\n"
    "failed = []\n"
    "for info in pkgutil.walk_packages({pkg}.__path__, prefix='{pkg}.'):\n"
    "    try: importlib.import_module(info.name)\n"
    "    except ImportError as exc: failed.append(f'{{info.name}}: {{exc}}')\n"
    "print('\\n'.join(failed) or 'ok')\n"
)


@pytest.mark.parametrize("package, blocked", [
    ("analyzer", ("torch", "transformers")),
    ("instrument", ("duckdb",)),
])
def test_every_module_imports_without_the_other_side(package: str, blocked: tuple[str, ...]) -> None:
    code = f"BLOCKED = {blocked!r}\n" + _BLOCK.replace("{pkg}", package).replace("{{", "{").replace("}}", "}")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300, cwd=REPO)
    assert out.stdout.strip() == "ok", (out.stdout + out.stderr)[-3000:]


def test_every_package_is_listed_in_pyproject() -> None:
    """A package missing from pyproject's explicit list would be left out of the wheel."""
    try:
        import tomllib
    except ModuleNotFoundError:  # Python 3.10
        tomllib = pytest.importorskip("tomli")
    listed = set(tomllib.loads((REPO / "pyproject.toml").read_text())["tool"]["setuptools"]["packages"])
    found = {_module_name(init) for top in ("analyzer", "instrument") for init in (REPO / top).rglob("__init__.py")
             if "__pycache__" not in init.parts}
    assert found <= listed, f"packages missing from pyproject.toml [tool.setuptools] packages: {sorted(found - listed)}"


def test_user_facing_errors_come_from_analyzer_errors_only() -> None:
    """One home for the errors a user can cause: every import of one names analyzer.errors
    (no module re-exports them), and each is a TokentraceError (caught by type in the CLI)."""
    import analyzer.errors as errors

    names = {n for n in errors.__all__ if n not in ("duckdb_message", "UserError")}
    assert all(issubclass(getattr(errors, n), errors.TokentraceError) for n in names)
    names.add("UserError")
    bad = []
    for root in ("analyzer", "tests", "benchmarks"):
        for path in sorted((REPO / root).rglob("*.py")):
            for node in ast.walk(ast.parse(path.read_text())):
                if isinstance(node, ast.ImportFrom) and node.module and node.module != "analyzer.errors" \
                        and node.module.startswith("analyzer"):
                    bad += [f"{path.relative_to(REPO)}:{node.lineno}: {a.name} from {node.module}"
                            for a in node.names if a.name in names]
    assert not bad, bad


def test_no_function_runs_past_100_lines() -> None:
    """Each function tells one step of its story: none in analyzer/ or instrument/ is longer
    than 100 lines (its docstring included)."""
    long = []
    for root in ("analyzer", "instrument"):
        for path in sorted((REPO / root).rglob("*.py")):
            for node in ast.walk(ast.parse(path.read_text())):
                if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and node.end_lineno - node.lineno >= 100:
                    long.append(f"{path.relative_to(REPO)}:{node.lineno}: {node.name} "
                                f"({node.end_lineno - node.lineno + 1} lines)")
    assert not long, long


def test_the_query_runner_does_not_mirror_the_views_package() -> None:
    """analyzer/query/runner.py exports the query files' names only; the view machinery's
    names (analyzer/db/views/) are imported from there, by every module."""
    import analyzer.db.views as views
    import analyzer.query.runner as runner

    assert not set(runner.__all__) & set(views.__all__)
    mirrored = []
    for path in sorted([*REPO.glob("analyzer/**/*.py"), *REPO.glob("tests/**/*.py"), *REPO.glob("benchmarks/*.py")]):
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.ImportFrom) and node.module == "analyzer.query.runner":
                mirrored += [f"{path.relative_to(REPO)}: {a.name}" for a in node.names if a.name in views.__all__]
    assert not mirrored, mirrored
