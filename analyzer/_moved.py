"""Import paths of modules that moved in the 2026-12 layout (issue #32), kept working.

``from analyzer.queries import run_query`` still runs: a finder on ``sys.meta_path`` answers
an old dotted name with the module at its new place, imported once, so both names are the
same module object. New code imports the new names (docs/architecture.md).
"""

from __future__ import annotations

import importlib
import importlib.abc
import importlib.machinery
import sys
from types import ModuleType
from typing import Sequence

__all__ = ["MOVED", "install"]

#: old dotted name -> new dotted name
MOVED: dict[str, str] = {
    "analyzer.claims": "analyzer.audit.claims",
    "analyzer.dbfile": "analyzer.db.dbfile",
    "analyzer.demo": "analyzer.verbs.demo",
    "analyzer.derived": "analyzer.db.derived",
    "analyzer.engine": "analyzer.db.source",
    "analyzer.engines": "analyzer.query",
    "analyzer.engines.spark": "analyzer.query.spark",
    "analyzer.engines.spark_sql": "analyzer.query.spark_sql",
    "analyzer.export": "analyzer.formats.parquet_export",
    "analyzer.load": "analyzer.formats.load",
    "analyzer.pull": "analyzer.collect.pull",
    "analyzer.queries": "analyzer.query.runner",
    "analyzer.schema": "analyzer.db.schema",
    "analyzer.skew": "analyzer.verbs.skew",
    "analyzer.store": "analyzer.db.store",
    "analyzer.timeline": "analyzer.formats.timeline",
    "analyzer.view_keep": "analyzer.db.view_keep",
    "analyzer.view_sql": "analyzer.db.view_sql",
    "analyzer.view_state": "analyzer.db.view_state",
    "analyzer.views": "analyzer.db.views",
}


class _MovedLoader(importlib.abc.Loader):
    def __init__(self, new_name: str) -> None:
        self.new_name = new_name

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> ModuleType:
        module = importlib.import_module(self.new_name)
        self._spec = module.__spec__  # the import system sets __spec__ to the old name's; put it back
        return module

    def exec_module(self, module: ModuleType) -> None:
        module.__spec__ = self._spec  # already executed under its new name


class _MovedFinder(importlib.abc.MetaPathFinder):
    def find_spec(self, fullname: str, path: Sequence[str] | None, target: ModuleType | None = None,
                  ) -> importlib.machinery.ModuleSpec | None:
        new_name = MOVED.get(fullname)
        if new_name is None:
            return None
        return importlib.machinery.ModuleSpec(fullname, _MovedLoader(new_name))


def install() -> None:
    """Put the finder on ``sys.meta_path`` once (idempotent)."""
    if not any(isinstance(f, _MovedFinder) for f in sys.meta_path):
        sys.meta_path.append(_MovedFinder())
