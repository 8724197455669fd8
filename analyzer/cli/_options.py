"""Option bundles and output rendering shared by the CLI verbs."""

from __future__ import annotations

import csv
import io
import json
import math
import sys
from collections.abc import Callable, Iterable, Sequence
from typing import Any

import click

from analyzer.errors import UserError


def resolve_db(db_path: str | None, parquet_dir: str | None = None) -> str | None:
    """The database a verb reads or loads into, resolved once when its options are parsed:
    ``--db`` as given, else (no ``--parquet`` dump either) the default of
    analyzer.db.store.default_db_path ($TOKENTRACE_DB, else ./tokentrace.duckdb); None when
    the verb reads a ``--parquet`` dump instead. Both given: one line."""
    if parquet_dir is not None:
        if db_path:
            raise UserError("give --db or --parquet, not both")
        return None
    if db_path:
        return db_path
    from analyzer.db.store import default_db_path  # imported when needed: start-up cost

    return default_db_path()


__all__ = [
    "db_option",
    "emit_row_batches",
    "emit_rows",
    "format_option",
    "param_option",
    "parse_params",
    "resolve_db",
    "to_jsonable",
]


def db_option(func: Callable[..., Any] | None = None, *, optional: str | None = None) -> Any:
    """``--db PATH``, the one declaration every verb uses, as ``db_path``. As a plain decorator:
    the database to read or load into ($TOKENTRACE_DB, else ./tokentrace.duckdb). With
    ``optional=HELP``: a database the verb may use (None when not given; the query verbs,
    which take --parquet instead, get it resolved by source_options), described by HELP."""

    def decorate(f: Callable[..., Any]) -> Callable[..., Any]:
        if optional is not None:
            return click.option("--db", "db_path", default=None, metavar="PATH", help=optional)(f)
        return click.option(
            "--db", "db_path", default=None, metavar="PATH",
            help="DuckDB database (default: $TOKENTRACE_DB, else ./tokentrace.duckdb).",
            callback=lambda _ctx, _param, value: resolve_db(value),
        )(f)

    return decorate(func) if func is not None else decorate


def format_option(func: Callable[..., Any] | None = None, *, choices: Sequence[str] = ("table", "json", "csv"),
                  help: str = "Output format.") -> Any:
    """``--format``, the one declaration every verb uses, as ``output_format`` (default table);
    ``choices``: the formats the verb writes."""

    def decorate(f: Callable[..., Any]) -> Callable[..., Any]:
        return click.option("--format", "output_format", type=click.Choice(list(choices)), default="table",
                            show_default=True, help=help)(f)

    return decorate(func) if func is not None else decorate


def param_option(func: Callable[..., Any]) -> Callable[..., Any]:
    return click.option(
        "--param",
        "params",
        multiple=True,
        metavar="NAME=VALUE",
        help="Bind a query's $NAME parameter (repeatable). Values are typed by DuckDB casts.",
    )(func)


def parse_params(pairs: Sequence[str]) -> dict[str, Any]:
    """``NAME=VALUE`` pairs to a dict; numbers become int/float, ``null`` becomes None."""
    out: dict[str, Any] = {}
    for pair in pairs:
        if "=" not in pair:
            raise UserError(f"--param {pair!r}: expected NAME=VALUE")
        name, raw = pair.split("=", 1)
        if not name.isidentifier():
            raise UserError(f"--param {pair!r}: {name!r} is not a valid parameter name")
        value: Any = raw
        if raw.lower() == "null":
            value = None
        elif raw.lower() in ("true", "false"):
            value = raw.lower() == "true"
        else:
            try:
                value = int(raw)
            except ValueError:
                try:
                    value = float(raw)
                except ValueError:
                    value = raw
        out[name] = value
    return out


def to_jsonable(value: Any) -> Any:
    """Make a DuckDB result value JSON-serialisable (NaN/Inf -> None, Decimal -> float)."""
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, dict):
        return {str(k): to_jsonable(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [to_jsonable(v) for v in value]
    if value is None or isinstance(value, (str, int, bool)):
        return value
    try:
        return float(value)  # Decimal
    except (TypeError, ValueError):
        return str(value)


def _cell(value: Any) -> str:
    if value is None:
        return ""
    if isinstance(value, float):
        # 10 significant digits: 320.3125 MiB must not print as 320.312
        return f"{value:.10g}"
    return str(value)


def emit_rows(
    columns: Sequence[str],
    rows: Sequence[Sequence[Any]],
    output_format: str,
    notes: Sequence[str] = (),
    out: Any = None,
) -> None:
    """Print query rows as a table, a JSON list of objects, or CSV.

    ``notes`` (assumptions, counting rules, corrections applied) go after a table, to stderr
    for csv, and are not printed for json (callers put them into the JSON themselves).
    """
    stream = out or sys.stdout
    if output_format in ("json", "csv"):
        emit_row_batches(columns, [rows], output_format, notes=notes, out=stream)
        return
    _emit_table(columns, rows, stream)
    for note in notes:
        stream.write(f"note: {note}\n")


def emit_row_batches(
    columns: Sequence[str],
    batches: Iterable[Sequence[Sequence[Any]]],
    output_format: str,
    notes: Sequence[str] = (),
    out: Any = None,
) -> int:
    """Write rows as JSON (a list of objects) or CSV one batch at a time, never holding more
    than one batch: the same bytes as :func:`emit_rows` over all the rows. Notes go to stderr
    for csv and are not printed for json. Returns the number of rows written."""
    stream = out or sys.stdout
    written = 0
    if output_format == "json":
        for batch in batches:
            for r in batch:
                # one object as json.dumps(list, indent=2) lays out a list element
                item = json.dumps([{c: to_jsonable(v) for c, v in zip(columns, r)}], indent=2)[2:-2]
                stream.write(("[\n" if written == 0 else ",\n") + item)
                written += 1
        stream.write("[]\n" if written == 0 else "\n]\n")
        return written
    if output_format != "csv":
        raise ValueError(f"emit_row_batches writes json or csv, not {output_format!r}")
    buf = io.StringIO()
    writer = csv.writer(buf, lineterminator="\n")
    writer.writerow(columns)
    for batch in batches:
        for r in batch:
            writer.writerow(["" if v is None else v for v in r])
            written += 1
        stream.write(buf.getvalue())
        buf.seek(0)
        buf.truncate()
    stream.write(buf.getvalue())
    for note in notes:
        click.echo(f"note: {note}", err=True)
    return written


def _is_number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def _plain_table(columns: Sequence[str], rows: Sequence[Sequence[Any]], stream: Any) -> None:
    """Aligned plain text: a header, a rule, one line per row; every cell on one line at its
    full width (a number is never wrapped or cut), numbers right-aligned."""
    numeric = [bool(rows) and all(v is None or _is_number(v) for v in (r[i] for r in rows)) for i in range(len(columns))]
    cells = [[_cell(v).replace("\n", "\\n") for v in r] for r in rows]
    widths = [max([len(columns[i]), *(len(row[i]) for row in cells)]) for i in range(len(columns))]

    def line(values: Sequence[str]) -> str:
        return "  ".join(v.rjust(w) if num else v.ljust(w) for v, w, num in zip(values, widths, numeric)).rstrip()

    stream.write(line(list(columns)) + "\n")
    stream.write("  ".join("-" * w for w in widths) + "\n")
    for row in cells:
        stream.write(line(row) + "\n")


def _emit_table(columns: Sequence[str], rows: Sequence[Sequence[Any]], stream: Any) -> None:
    """A rich table on a terminal; plain aligned text otherwise (a pipe, a file, a captured
    stream): there a cell is never wrapped, so no number is split across lines, and rich is
    not imported at all."""
    isatty = getattr(stream, "isatty", None)
    if not (callable(isatty) and isatty()):
        _plain_table(columns, rows, stream)
        return
    try:
        from rich.console import Console
        from rich.table import Table
    except ImportError:  # rich is optional
        _plain_table(columns, rows, stream)
        return
    table = Table(show_header=True, header_style="bold")
    for i, c in enumerate(columns):
        numeric = bool(rows) and all(r[i] is None or _is_number(r[i]) for r in rows)
        # numbers keep their digits together: the text columns give way when the terminal is narrow
        table.add_column(c, overflow="fold", no_wrap=numeric, justify="right" if numeric else "left",
                         min_width=max((len(_cell(r[i])) for r in rows), default=1) if numeric else None)
    for r in rows:
        table.add_row(*[_cell(v) for v in r])
    Console(file=stream).print(table)
