"""Command-line interface: ``tokentrace <verb>``.

Each verb is a small function in its own module here (``analyzer/cli/<verb>.py``, the module
named as the verb); modules that are not verbs (the group, shared options, helpers) start with
``_``. Logic lives in the packages. Verb modules are imported when they are
needed: ``tokentrace requests`` imports ``analyzer.cli.requests`` only (and what it
imports), ``--help`` and anything that lists the verbs import them all. Verbs that need torch
or the server stack import them inside the function. This keeps a command's start-up cost
near a bare ``import duckdb`` (benchmarks/verbs.py measures it).
"""

from __future__ import annotations

import importlib
import pkgutil
import sys
from collections.abc import Iterator
from functools import lru_cache
from typing import Any

import click

from analyzer.cli._group import cli

__all__ = ["cli", "main", "verb_modules"]

@lru_cache(maxsize=1)
def verb_modules() -> list[str]:
    """The verb module names beside this file (without importing them): every module whose
    name does not start with ``_`` (the group, shared options and helpers do)."""
    return sorted(info.name for info in pkgutil.iter_modules(__path__) if not info.name.startswith("_"))


class _LazyVerbs(dict):
    """``cli.commands``: a verb's module is imported the first time the verb is looked up
    (``get``, ``in``); iterating or sizing the mapping imports every verb module first, so
    listings (``--help``, tests over ``cli.commands``) always see every verb."""

    _complete = False

    def _load(self, name: str) -> None:
        if not dict.__contains__(self, name) and name in verb_modules():
            importlib.import_module(f"{__name__}.{name}")

    def _load_all(self) -> None:
        if not self._complete:
            self._complete = True
            for name in verb_modules():
                importlib.import_module(f"{__name__}.{name}")

    def get(self, name: Any, default: Any = None) -> Any:
        self._load(name)
        if not dict.__contains__(self, name):
            self._load_all()  # a module that registers a verb under another name
        return dict.get(self, name, default)

    def __contains__(self, name: object) -> bool:
        return self.get(name) is not None

    def __getitem__(self, name: Any) -> Any:
        found = self.get(name)
        if found is None:
            raise KeyError(name)
        return found

    def __iter__(self) -> Iterator[Any]:
        self._load_all()
        return dict.__iter__(self)

    def __len__(self) -> int:
        self._load_all()
        return dict.__len__(self)

    def keys(self):
        self._load_all()
        return dict.keys(self)

    def items(self):
        self._load_all()
        return dict.items(self)

    def values(self):
        self._load_all()
        return dict.values(self)


cli.commands = _LazyVerbs(cli.commands)


def main(argv: list[str] | None = None) -> None:
    """Console-script entry point."""
    try:
        cli.main(args=argv, prog_name="tokentrace", standalone_mode=True)
    except KeyboardInterrupt:  # pragma: no cover - interactive
        click.echo("interrupted", err=True)
        sys.exit(130)
    except BrokenPipeError:  # `tokentrace itl --format csv | head`: the reader left; not an error of ours
        import os

        # Python would report the pipe again when it flushes stdout at exit
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        sys.exit(1)
