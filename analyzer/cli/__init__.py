"""Command-line interface: ``tokentrace <verb>``.

Each verb is a small function in its own module here (``analyzer/cli/<verb>.py``); logic
lives in the packages. Modules are discovered at start-up. Verbs that need torch or the
server stack import them inside the function, so ``tokentrace --help`` stays fast.
"""

from __future__ import annotations

import importlib
import pkgutil
import sys

import click

from analyzer.cli.group import cli

__all__ = ["cli", "main"]

_SKIP = {"group", "options", "kv_options"}


def _discover() -> None:
    for info in sorted(pkgutil.iter_modules(__path__), key=lambda m: m.name):
        if info.name.startswith("_") or info.name in _SKIP:
            continue
        importlib.import_module(f"{__name__}.{info.name}")


_discover()


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
