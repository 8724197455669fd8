"""Long tables cut to what matters on a terminal: the rows that answer the question first
(the largest inter-token gaps), at most ``--limit`` of them, and one line that says how
many were left out and how to see them all. csv and json are never cut. Not a verb (the
leading underscore keeps it out of verb discovery)."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import click

from analyzer.errors import UserError

__all__ = ["DEFAULT_TABLE_ROWS", "TableCut", "limit_options", "table_cut"]

#: Rows a cut table shows by default (``--limit``).
DEFAULT_TABLE_ROWS = 20


def limit_options(noun: str) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    """``--limit N`` and ``--all`` for a verb whose table is cut (``noun``: what a row is)."""

    def decorate(f: Callable[..., Any]) -> Callable[..., Any]:
        f = click.option("--all", "show_all", is_flag=True,
                         help=f"Table: every {noun}, in the query's order (csv and json always hold every row).")(f)
        return click.option("--limit", type=click.IntRange(min=1), default=None, metavar="N",
                            help=f"Table: the N {noun}s with the largest ITL (default {DEFAULT_TABLE_ROWS}).")(f)

    return decorate


@dataclass(frozen=True)
class TableCut:
    """How a table is cut: the ``limit`` rows with the largest ``key`` (None: every row, in
    the query's order); ``noun`` names a row in the line that says what was left out."""

    key: str
    limit: int | None
    noun: str

    def apply(self, columns: Sequence[str], rows: Sequence[Sequence[Any]]) -> tuple[list[Sequence[Any]], str | None]:
        """(the rows shown, the line under the table or None when nothing was left out)."""
        if self.limit is None:
            return list(rows), None
        ordered = list(rows)
        if self.key in columns:
            at = list(columns).index(self.key)
            ordered.sort(key=lambda r: (r[at] is None, -(r[at] or 0)))  # largest first, NULLs last (stable)
        shown = ordered[:self.limit]
        left = len(rows) - len(shown)
        if not left:
            return shown, None
        return shown, (f"{len(shown)} of {len(rows)} {self.noun}s shown, largest {self.key} first, "
                       f"{left} left out: --limit N shows more, --all every {self.noun} in order, "
                       "--format csv or json writes them all")


def table_cut(limit: int | None, show_all: bool, output_format: str, key: str, noun: str) -> TableCut | None:
    """The cut a verb's table takes from ``--limit`` / ``--all``; None for csv and json (never
    cut: a --limit or --all given with them is an error, not ignored)."""
    if limit is not None and show_all:
        raise UserError("--limit and --all: give one of them")
    if output_format != "table":
        if limit is not None or show_all:
            raise UserError(f"--limit and --all shape the table; --format {output_format} always writes every row")
        return None
    return TableCut(key, None if show_all else (limit or DEFAULT_TABLE_ROWS), noun)
