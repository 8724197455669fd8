"""Every module states its public API in ``__all__``, and every name there exists."""

from __future__ import annotations

import importlib
import pkgutil

import pytest

import analyzer
import instrument


def _modules() -> list[str]:
    names: list[str] = []
    for package in (instrument, analyzer):
        for info in pkgutil.walk_packages(package.__path__, prefix=package.__name__ + "."):
            leaf = info.name.rsplit(".", 1)[-1]
            if leaf.startswith("_") or info.name.startswith("analyzer.cli"):
                continue  # CLI verb modules register commands; their API is the command line
            names.append(info.name)
    return sorted(names)


@pytest.mark.parametrize("name", ["instrument", "analyzer", *_modules()])
def test_module_all_names_exist(name: str) -> None:
    module = importlib.import_module(name)
    exported = getattr(module, "__all__", None)
    if name in ("instrument", "analyzer") and exported is None:
        return  # namespace-style package docstring only
    assert exported is not None, f"{name} has no __all__"
    missing = [n for n in exported if not hasattr(module, n)]
    assert not missing, f"{name}.__all__ names missing attributes: {missing}"
