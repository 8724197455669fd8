"""Verbs that print several query results one after the other (steps, stalls): one section
per ``queries/*.sql`` file, chosen with ``--section``. Not a verb (the leading underscore
keeps it out of verb discovery)."""

from __future__ import annotations

import json
import textwrap
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

import click

from analyzer.cli._human import terminal_width, wrap_note
from analyzer.cli._options import emit_rows, to_jsonable
from analyzer.cli._query_verb import merge_params, open_from_flags, query_rows, with_request_ids
from analyzer.errors import UserError

if TYPE_CHECKING:
    from analyzer.cli._table_cut import TableCut

__all__ = ["run_sections", "section_option"]


def section_option(names: Sequence[str]) -> Any:
    """``--section NAME`` (repeatable; default: every section, in this order)."""
    return click.option(
        "--section", "sections", multiple=True, type=click.Choice(list(names)),
        help=f"Print only this part (repeatable; default: {', '.join(names)}).",
    )


def _request_sets(result: Any) -> list[str]:
    """A section's ``request_set`` values other than 'every request' (a keep policy's random
    sample: which requests its rows count), for a note under its table."""
    if "request_set" not in result.columns:
        return []
    index = result.columns.index("request_set")
    return sorted({row[index] for row in result.rows} - {"every request", None})


def run_sections(
    sections: Mapping[str, tuple[str, Mapping[str, Any]]],
    chosen: Sequence[str],
    *,
    db_path: str | None,
    parquet_dir: str | None,
    output_format: str,
    notes: Sequence[str] = (),
    engine: str = "duckdb",
    cuts: Mapping[str, TableCut] | None = None,
    table_order: Sequence[str] | None = None,
) -> None:
    """Run ``sections`` (name -> (query, flags)) that ``chosen`` names (none: all, in order) on
    one connection and print them: a table per section under its name, the one section's csv,
    or one JSON object keyed by section name (plus ``notes``). Parameters are checked before any
    query runs. The table format prints the sections in ``table_order`` (the answer first)
    and cuts those ``cuts`` names (analyzer/cli/_table_cut.py); csv and json are complete.
    csv is one table per file: exactly one section (a UserError naming them otherwise, before
    any query), written as plain csv (no ``# name`` line)."""
    picked = list(dict.fromkeys(chosen))
    if output_format == "csv" and len(picked) != 1:
        names = list(sections)
        raise UserError(f"--format csv writes one table per file: give one --section "
                        f"({', '.join(names[:-1])} or {names[-1]}); --format json holds every section")
    order = list(table_order) if output_format == "table" and table_order else list(sections)
    names = [name for name in order if not chosen or name in chosen]
    bound = {name: merge_params(sections[name][0], sections[name][1], ()) for name in names}
    con = open_from_flags(db_path, parquet_dir, engine=engine)
    try:
        results = {name: query_rows(con, sections[name][0], bound[name]) for name in names}
        if output_format == "table":  # every request named by the id every verb shows
            results = {name: with_request_ids(con, result) for name, result in results.items()}
    finally:
        con.close()
    if output_format == "json":
        out: dict[str, Any] = {name: result.dicts() for name, result in results.items()}
        out["notes"] = list(notes)
        click.echo(json.dumps(to_jsonable(out), indent=2))
        return
    for i, (name, result) in enumerate(results.items()):
        last = i == len(results) - 1
        if output_format == "table":  # the query's human view (analyzer/cli/_views.py)
            from analyzer.cli._views import echo_human

            cut = (cuts or {}).get(name)
            rows, left_out = cut.apply(result.columns, result.rows) if cut is not None else (result.rows, None)
            click.echo(("\n" if i else "") + f"{name}: {len(result.rows)} row(s)")
            echo_human(sections[name][0], result.columns, rows, notes=(), columns_flag=False)
            if left_out:
                click.echo(textwrap.fill(left_out, terminal_width()))
            for text in _request_sets(result):
                for line in wrap_note(f"{name}: the {text}", terminal_width()):
                    click.echo(line)
            for text in notes if last else ():
                for line in wrap_note(text, terminal_width()):
                    click.echo(line)
            continue
        emit_rows(result.columns, result.rows, output_format, notes=notes if last else ())
