"""``tokentrace tables [NAME]``: the public tables and views, and their columns with types
and meanings.

The meanings come from :mod:`analyzer.db.catalog` (the one place they are written); the
column names, their order and their types from DuckDB's own catalog (``duckdb_columns()``)
of an in-memory database with the canonical tables and every view installed. The schema is
the same whatever was loaded, so the verb opens no database file and works before any load.
"""

from __future__ import annotations

import difflib
import textwrap
from collections.abc import Sequence
from typing import Any

import click

from analyzer.cli._group import cli
from analyzer.cli._options import emit_rows, format_option
from analyzer.errors import UserError

__all__ = ["live_columns", "tables_command"]

#: A column name longer than this gets a line of its own in the table layout.
_NAME_CAP = 24


def live_columns(names: Sequence[str]) -> dict[str, list[tuple[str, str]]]:
    """``{object: [(column, DuckDB type), ...]}`` for each of ``names`` that exists, in the
    object's column order, from an in-memory database with the views installed."""
    from analyzer.cli._query_verb import installed
    from analyzer.db.store import connect

    con = installed(connect(None))
    try:
        rows = con.execute(
            "SELECT table_name, column_name, data_type FROM duckdb_columns()"
            " WHERE database_name = current_database() AND schema_name = current_schema()"
            " AND list_contains($names, table_name) ORDER BY table_name, column_index",
            {"names": list(names)},
        ).fetchall()
    finally:
        con.close()
    out: dict[str, list[tuple[str, str]]] = {}
    for table, column, data_type in rows:
        out.setdefault(table, []).append((column, data_type))
    return out


def _unknown(name: str, names: Sequence[str]) -> UserError:
    close = difflib.get_close_matches(name, names, n=1, cutoff=0.6)
    guess = f" (did you mean {close[0]}?)" if close else ""
    return UserError(f"tables: no public table or view {name!r}{guess}; the names: {', '.join(names)}")


def _width() -> int:
    from analyzer.cli._human import terminal_width

    return terminal_width()


def _wrap(text: str, width: int) -> list[str]:
    return textwrap.wrap(text, max(width, 20), break_long_words=False, break_on_hyphens=False) or [""]


def _layout(columns: Sequence[str], rows: Sequence[Sequence[str]], width: int) -> list[str]:
    """Aligned text: the last column (a meaning) wraps in the width left; a first-column
    value wider than its column gets a line of its own."""
    widths = [max(len(columns[i]), *(min(len(r[i]), _NAME_CAP if i == 0 else 10**6) for r in rows))
              for i in range(len(columns) - 1)]
    indent = sum(w + 2 for w in widths)
    fill = max(width - indent, 20)

    def lines_of(values: Sequence[str]) -> list[str]:
        first = values[0]
        out = []
        if len(first) > widths[0]:
            out.append(first)
            first = ""
        head = "  ".join([first.ljust(widths[0]), *(v.ljust(w) for v, w in zip(values[1:-1], widths[1:]))])
        meaning = _wrap(values[-1], fill)
        out.append(f"{head}  {meaning[0]}".rstrip())
        out += [" " * indent + more for more in meaning[1:]]
        return out

    text = lines_of(list(columns))
    text.append("  ".join("-" * w for w in [*widths, min(fill, max(len(r[-1]) for r in rows))]))
    for r in rows:
        text += lines_of(r)
    return text


@cli.command("tables")
@click.argument("name", required=False, metavar="[NAME]")
@format_option
def tables_command(name: str | None, output_format: str) -> None:
    """List the tables and views to query (tokentrace sql), or NAME's columns.

    Without NAME: each public table and view, its kind, its number of columns and what one
    row is. With NAME: its columns in order, with DuckDB's type and a one-line meaning (the
    unit where it has one: ms, ns since the Unix epoch, tokens, bytes). The schema does not
    depend on the data: no database is opened, so this works before any load. Formulas:
    docs/metrics.md; the tables at length: docs/tables.md.

    \b
    Example:
      tokentrace tables
      tokentrace tables request_metrics
      tokentrace tables request_gaps --format csv
      tokentrace sql "SELECT avg(ttft_ms) FROM request_metrics" --db traces.duckdb
    """
    from analyzer.db.catalog import CATALOG

    names = list(CATALOG)
    if name is not None:
        wanted = name.strip().lower()
        if wanted not in CATALOG:
            raise _unknown(name, names)
        names = [wanted]
    live = live_columns(names)
    missing = [n for n in names if n not in live]
    if missing:  # the catalog names an object the schema no longer has (tests/test_cli_tables.py)
        raise UserError(f"tables: {', '.join(missing)} described but not in the schema (please report it)")
    if name is None:
        _list_objects(live, output_format)
    else:
        _list_columns(names[0], live[names[0]], output_format)


def _list_objects(live: dict[str, list[tuple[str, str]]], output_format: str) -> None:
    from analyzer.db.catalog import CATALOG

    rows: list[tuple[Any, ...]] = [(n, e.kind, len(live[n]), e.meaning) for n, e in CATALOG.items()]
    if output_format != "table":
        emit_rows(["name", "kind", "columns", "meaning"], rows, output_format)
        return
    lines = _layout(["name", "kind", "cols", "meaning"], [(n, k, str(c), m) for n, k, c, m in rows], _width())
    click.echo("\n".join(lines))
    click.echo("`tokentrace tables NAME` lists NAME's columns; `tokentrace sql` queries them.")


def _list_columns(name: str, columns: list[tuple[str, str]], output_format: str) -> None:
    from analyzer.db.catalog import CATALOG

    entry = CATALOG[name]
    rows = [(column, data_type, entry.columns.get(column, "")) for column, data_type in columns]
    if output_format != "table":
        emit_rows(["column", "type", "meaning"], rows, output_format)
        return
    width = _width()
    click.echo("\n".join(_wrap(f"{name} ({entry.kind}, {len(rows)} columns): {entry.meaning}", width)))
    click.echo()
    click.echo("\n".join(_layout(["column", "type", "meaning"], rows, width)))
