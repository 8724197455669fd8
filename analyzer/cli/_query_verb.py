"""What the query verbs (requests, itl, phases, summary, window, skew, sql) share: where the
spans come from (``--db`` or ``--parquet``) and running one ``queries/*.sql`` file with its
parameters. Not a verb (the leading underscore keeps it out of verb discovery)."""

from __future__ import annotations

import functools
import itertools
import re
import textwrap
from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any

import click
import duckdb

from analyzer.cli._options import db_option, emit_row_batches, emit_rows, parse_params, resolve_db
from analyzer.errors import UserError, duckdb_message

if TYPE_CHECKING:
    from analyzer.cli._table_cut import TableCut
    from analyzer.query.runner import (
        QueryResult,  # imported where a query runs (start-up cost of --help and usage errors)
    )

__all__ = [
    "PERSPECTIVES", "TRACE_ID_RE", "check_trace_id", "columns_option", "installed", "merge_params", "note_if_stale",
    "open_from_flags", "project_result", "query_rows", "run_verb", "source_options", "stream_rows",
]

TRACE_ID_RE = re.compile(r"^[0-9a-f]{32}$")
PERSPECTIVES = ("client", "server", "engine")
#: --engine: where a verb's query runs (Spark: requests, itl, phases, summary, window)
ENGINES = ("duckdb", "spark")


def source_options(func: Callable[..., Any]) -> Callable[..., Any]:
    """``--db PATH`` or ``--parquet DIR`` (a tokentrace export dump, read in place), and
    ``--engine duckdb|spark``: the verb takes ``db_path``, ``parquet_dir`` and ``engine`` and
    passes them on (run_verb, open_from_flags, run_sections). ``db_path`` arrives resolved
    (analyzer/cli/_options.py resolve_db): the database to read, or None with --parquet."""

    @functools.wraps(func)
    def resolved(*args: Any, db_path: str | None = None, parquet_dir: str | None = None, **kwargs: Any) -> Any:
        return func(*args, db_path=resolve_db(db_path, parquet_dir), parquet_dir=parquet_dir, **kwargs)

    verb = click.option(
        "--engine", type=click.Choice(ENGINES), default="duckdb", show_default=True,
        help="Run the query on DuckDB, or on a local Spark session over a --parquet dump (docs/spark.md).",
    )(resolved)
    verb = click.option(
        "--parquet", "parquet_dir", default=None, metavar="DIR",
        help="Query a `tokentrace export` Parquet dump in place (no load step) instead of --db.",
    )(verb)
    return db_option(optional="DuckDB database written by `tokentrace load` (default: $TOKENTRACE_DB, else "
                              "./tokentrace.duckdb).")(verb)


def columns_option(func: Callable[..., Any]) -> Callable[..., Any]:
    """``--columns NAME,...``: exactly these columns of the query, in this order, in every
    format (table: formatted for reading; csv/json: full precision)."""
    return click.option(
        "--columns", "chosen_columns", default=None, metavar="NAME,...",
        callback=lambda _ctx, _param, value: _split_columns(value),
        help="Only these columns, in this order (the csv/json names; default: the table's reading "
             "view, every column in csv and json).",
    )(func)


def _split_columns(value: str | None) -> tuple[str, ...] | None:
    if value is None:
        return None
    names = tuple(part.strip() for part in value.split(",") if part.strip())
    if not names:
        raise UserError(f"--columns {value!r}: expected NAME,... (column names, comma-separated)")
    return names


def check_columns(query: str, available: Sequence[str], chosen: Sequence[str] | None) -> None:
    """UserError naming the first of ``chosen`` that ``query`` does not return."""
    for name in chosen or ():
        if name not in available:
            raise UserError(f"--columns: {query} has no column {name!r} (its columns: {', '.join(available)})")


def project_result(result: QueryResult, chosen: Sequence[str] | None) -> QueryResult:
    """``result`` with only the ``chosen`` columns, in that order (None: as it is)."""
    if not chosen:
        return result
    from analyzer.query.runner import QueryResult

    check_columns(result.name, result.columns, chosen)
    at = [result.columns.index(name) for name in chosen]
    return QueryResult(result.name, list(chosen), [tuple(r[i] for i in at) for r in result.rows])


def _projected_sql(con: duckdb.DuckDBPyConnection, query: str, sql: str, params: Any,
                   chosen: Sequence[str] | None) -> str:
    """``sql`` as it is, or a SELECT of the ``chosen`` columns over it (row order kept)."""
    if not chosen:
        return sql
    check_columns(query, con.sql(sql, params=params).columns, chosen)
    names = ", ".join('"' + name.replace('"', '""') + '"' for name in chosen)
    return f"SELECT {names} FROM (\n{sql.rstrip().rstrip(';')}\n)"


#: click context ``meta`` key of the connection --request's lookup hands to the query
_HANDED_OVER = "tokentrace.source"


def open_from_flags(
    db_path: str | None, parquet_dir: str | None, start_ns: int | None = None, end_ns: int | None = None,
    *, engine: str = "duckdb",
) -> duckdb.DuckDBPyConnection:
    """The connection the verb queries (the caller closes it); a clear one-line error for a
    missing file or dump, or for ``--engine spark`` on a verb that runs on DuckDB only
    (run_verb runs Spark itself). ``db_path`` is resolved already (source_options, db_option).
    The connection ``--request``'s lookup opened on the same source (request_flags) is taken
    over: the database is opened once per command."""
    from analyzer.db.source import open_source
    from analyzer.errors import SourceError

    if db_path and parquet_dir:
        raise UserError("give --db or --parquet, not both")
    if engine == "spark":  # verbs outside run_verb
        raise UserError("--engine spark: this verb runs on DuckDB only (Spark: requests, itl, phases, summary, window)")
    ctx = click.get_current_context(silent=True)
    handed = ctx.meta.pop(_HANDED_OVER, None) if ctx is not None else None
    if handed is not None:
        source, con = handed
        if source == (db_path, parquet_dir, start_ns, end_ns):
            return con
        con.close()
    try:
        if parquet_dir:
            return open_source(parquet=parquet_dir, start_ns=start_ns, end_ns=end_ns)
        return open_source(db=db_path)
    except SourceError as exc:
        raise UserError(str(exc)) from None


def _hand_over(con: duckdb.DuckDBPyConnection, source: tuple[Any, ...]) -> None:
    """Keep ``con`` (opened on ``source``: db, parquet, start, end) for the command's next
    open_from_flags of the same source; closed when the command ends if nothing takes it."""
    ctx = click.get_current_context(silent=True)
    if ctx is None:
        con.close()
        return
    ctx.meta[_HANDED_OVER] = (source, con)
    ctx.call_on_close(con.close)  # closing a closed DuckDB connection does nothing


def note_if_stale(con: duckdb.DuckDBPyConnection, db_path: str | None) -> None:
    """One note on stderr when the database's derived tables (tokentrace load) describe other
    data than it holds, so this command derived them again on its own connection."""
    from analyzer.db.views import derived_status

    if db_path is not None and derived_status(con) == "stale":
        import textwrap

        from analyzer.cli._human import terminal_width

        text = (f"{db_path}: its derived tables were built over other data (rows written since "
                "tokentrace load, or another tokentrace version); this command derived them again "
                f"(`tokentrace load --db {db_path}` rebuilds them)")
        # wrapped to the terminal like every note; a path is never cut (it is what a user copies)
        for line in textwrap.wrap(f"note: {text}", terminal_width(), subsequent_indent="  ",
                                  break_long_words=False, break_on_hyphens=False):
            click.echo(line, err=True)


def check_trace_id(trace_id: str | None) -> str | None:
    """A trace id the user typed: 32 lowercase hex digits (uppercase accepted and lowered)."""
    if trace_id is None:
        return None
    lowered = trace_id.strip().lower()
    if not TRACE_ID_RE.match(lowered):
        raise UserError(f"--trace-id {trace_id!r}: expected 32 hexadecimal digits")
    return lowered


def request_option(f: Callable[..., Any]) -> Callable[..., Any]:
    """``--request ID``: one request, named by any id it has (analyzer/query/request_ids.py)."""
    return click.option("--request", "request", default=None, metavar="ID",
                        help="Only this request: its response id (chatcmpl-...), the X-Request-ID it was sent "
                             "with, or its span id (or the span id's last 8+ hex digits).")(f)


def request_flags(db_path: str | None, parquet_dir: str | None, wanted: str | None,
                  trace_id: str | None = None, *, span_list: bool = False) -> dict[str, Any]:
    """The query parameters ``--request ID`` (and ``--trace-id``) stand for: ``trace_id`` and
    ``request_span_id`` of the one request ID names, looked up in the database or dump (one
    line when it names none or several, or another trace than --trace-id). ``span_list``
    (the engine-step queries, keyed by the span that holds the decode spans): ``trace_id``
    as given and ``request_span_ids``, every span id of the request's perspectives."""
    if wanted is None:
        return {"trace_id": trace_id, "request_span_ids" if span_list else "request_span_id": None}
    from analyzer.query.request_ids import request_id_rows, resolve_request

    con = open_from_flags(db_path, parquet_dir)
    try:
        found = resolve_request(request_id_rows(installed(con)), wanted.strip())
    except BaseException:
        con.close()
        raise
    _hand_over(con, (db_path, parquet_dir, None, None))  # the query reads the same connection
    if span_list:
        return {"trace_id": trace_id, "request_span_ids": list(found["span_ids"] or [found["request_span_id"]])}
    if trace_id is not None and found["trace_id"] != trace_id:
        raise UserError(f"--request {wanted!r} is a request of trace {found['trace_id']}, not of --trace-id {trace_id}")
    return {"trace_id": found["trace_id"], "request_span_id": found["request_span_id"]}


def with_request_ids(con: duckdb.DuckDBPyConnection, result: QueryResult) -> QueryResult:
    """``result`` for the table: a ``request_id`` column, the id every verb shows for a request
    (analyzer/query/request_ids.py), beside each ``request_span_id`` (and
    ``largest_shared_prefill_request_id`` beside that span id of stalls' slowest gaps)."""
    from analyzer.query.request_ids import request_id_rows, shown_request_ids
    from analyzer.query.runner import QueryResult

    spans = [c for c in ("request_span_id", "largest_shared_prefill_request_span_id") if c in result.columns]
    if not spans or not result.rows or "request_id" in result.columns:
        return result
    shown = shown_request_ids(request_id_rows(con))
    by_span = {span: text for (trace, span), text in shown.items() if trace is None}
    trace_at = result.columns.index("trace_id") if "trace_id" in result.columns else None
    added, rows = [], []
    for column in spans:
        added.append("request_id" if column == "request_span_id" else column.replace("_span_id", "_id"))
    for row in result.rows:
        extra = []
        for column in spans:
            span = row[result.columns.index(column)]
            key = (row[trace_at], span) if trace_at is not None and column == "request_span_id" else None
            extra.append((shown.get(key) if key is not None else None) or by_span.get(span) or span)
        rows.append((*row, *extra))
    return QueryResult(result.name, [*result.columns, *added], rows)


def merge_params(query: str, flags: Mapping[str, Any], raw_params: Sequence[str]) -> dict[str, Any]:
    """Friendly flags (None = not given) overlaid by ``--param NAME=VALUE``; unknown names are errors."""
    from analyzer.query.runner import load_query

    params = {k: v for k, v in flags.items() if v is not None}
    params.update(parse_params(raw_params))
    try:
        load_query(query).bind(params)
    except ValueError as exc:
        raise UserError(str(exc)) from None
    _check_types(query, params)
    perspective = params.get("perspective")
    if perspective is not None and perspective not in PERSPECTIVES:
        raise UserError(f"perspective {perspective!r}: expected one of {', '.join(PERSPECTIVES)}")
    return params


_SCALAR_CHECKS: dict[str, tuple[Callable[[Any], bool], str]] = {
    "BIGINT": (lambda v: isinstance(v, int) and not isinstance(v, bool), "an integer"),
    "DOUBLE": (lambda v: isinstance(v, (int, float)) and not isinstance(v, bool), "a number"),
    "BOOLEAN": (lambda v: isinstance(v, bool), "true or false"),
}


def _check_types(query: str, params: Mapping[str, Any]) -> None:
    """A number, integer or boolean parameter given as something else is a one-line error
    here, whatever the data (DuckDB converts a bound value only when a row reaches it, so
    over an empty table a bad value would pass silently)."""
    from analyzer.query.runner import load_query

    declared = {p.name: p.sql_type for p in load_query(query).params}
    for name, value in params.items():
        check = _SCALAR_CHECKS.get(declared.get(name, ""))
        if value is not None and check is not None and not check[0](value):
            raise UserError(f"{query}: ${name} is {declared[name]}: expected {check[1]}, got {value!r}")


_PARAM_ERRORS = (duckdb.ConversionException, duckdb.InvalidInputException, duckdb.BinderException)
#: Rows fetched from DuckDB per batch when csv/json output is streamed.
STREAM_BATCH_ROWS = 50_000
#: Rows per Arrow batch of a part with names attached after its sort (csv: one DuckDB scan each).
ATTACHED_BATCH_ROWS = 1_000_000


def query_rows(con: duckdb.DuckDBPyConnection, query: str, params: Mapping[str, Any]) -> QueryResult:
    """Run ``queries/<query>.sql``; a DuckDB error caused by a bad parameter value becomes a UserError."""
    from analyzer.query.runner import run_query

    try:
        return run_query(con, query, params, keep_chunks=False)  # one query per connection
    except _PARAM_ERRORS as exc:
        raise UserError(f"{query}: {duckdb_message(exc)}") from None


def stream_rows(
    con: duckdb.DuckDBPyConnection, query: str, params: Mapping[str, Any], output_format: str,
    notes: Sequence[str] = (), chosen: Sequence[str] | None = None,
) -> int:
    """Run ``queries/<query>.sql`` and write its rows as csv or json batch by batch
    (:func:`analyzer.query.runner.stream_query`: itl runs one request_key range at a time), so
    output of any size never sits in memory whole. ``chosen``: only these columns (--columns).
    Returns the number of rows written."""
    from analyzer.query.runner import stream_query

    if output_format == "csv":
        written = _stream_csv(con, query, params, notes, chosen)
        if written is not None:
            return written
    columns: list[str] = []

    def batches():
        try:
            for part in stream_query(con, query, params, keep_chunks=False):  # one query per connection
                cursor = con.execute(_projected_sql(con, query, part.sql, part.params, chosen), part.params)
                columns[:] = [d[0] for d in cursor.description]
                while batch := cursor.fetchmany(STREAM_BATCH_ROWS):
                    yield batch
        except _PARAM_ERRORS as exc:
            raise UserError(f"{query}: {duckdb_message(exc)}") from None

    rows = batches()
    # Run the first part before writing anything, so a bad parameter is an error, not a
    # half-written file; stream_query yields one part at least, so the columns are known.
    first = next(rows, None)
    return emit_row_batches(columns, itertools.chain([first] if first else [], rows), output_format, notes=notes)


def _stream_csv(con: duckdb.DuckDBPyConnection, query: str, params: Mapping[str, Any],
                notes: Sequence[str], chosen: Sequence[str] | None = None) -> int | None:
    """The csv of :func:`stream_rows` with each line built by DuckDB (analyzer/cli/_csv_lines.py:
    the same bytes as Python's csv writer, several times faster); None (nothing written) when
    a column's type is not one it formats, and the rows go through Python instead."""
    import csv
    import sys

    from analyzer.cli._csv_lines import ARROW_MIN_EVENTS, csv_line_sql, iter_attached_csv_chunks, iter_csv_chunks
    from analyzer.db.views.state import installed_span_events
    from analyzer.query.runner import stream_query

    def chunks():
        try:
            for part in stream_query(con, query, params, keep_chunks=False):  # one query per connection
                sql = _projected_sql(con, query, part.sql, part.params, chosen)
                relation = con.sql(sql, params=part.params)
                line_sql = csv_line_sql(sql, relation.columns, relation.types)
                if line_sql is None:
                    yield None
                    return
                yield relation.columns
                events = installed_span_events(con)  # the views are installed by now
                # lines <= one per span (requests, phases) or per event (itl's gaps): a bound
                # that holds for producers with no chunk events too (vLLM)
                spans = con.execute("SELECT count(*) FROM spans").fetchall()[0][0] if events is not None else 0
                bound = None if events is None else events + int(spans)
                arrow = bound is None or bound >= ARROW_MIN_EVENTS
                if arrow and part.attach is not None:  # itl: names attached after an integer sort
                    yield from iter_attached_csv_chunks(part.arrow_batches(con, ATTACHED_BATCH_ROWS),
                                                        relation.columns, relation.types)
                else:
                    yield from iter_csv_chunks(con, line_sql, part.params, arrow=arrow)
        except _PARAM_ERRORS as exc:
            raise UserError(f"{query}: {duckdb_message(exc)}") from None

    parts = chunks()
    columns = next(parts)
    if columns is None:
        return None
    first = next(parts, (0, b""))  # the first part runs before anything is written (a bad parameter: no half file)
    out = sys.stdout
    csv.writer(out, lineterminator="\n").writerow(columns)
    out.flush()
    # the lines are UTF-8 bytes: written as they are to a UTF-8 stream, else decoded and re-encoded
    utf8 = (getattr(out, "encoding", None) or "").lower().replace("-", "").replace("_", "") == "utf8"
    binary = getattr(out, "buffer", None) if utf8 else None
    written = 0
    for chunk in itertools.chain([first], parts):
        if isinstance(chunk, list):  # the next part's columns: the same query, so the same header
            continue
        rows, text = chunk
        written += rows
        if binary is not None:
            binary.write(text)
        else:
            out.write(text.decode("utf-8"))
    if binary is not None:
        binary.flush()
    for note in notes:
        click.echo(f"note: {note}", err=True)
    return written


def run_verb(
    query: str,
    *,
    engine: str = "duckdb",
    db_path: str | None,
    parquet_dir: str | None,
    flags: Mapping[str, Any],
    raw_params: Sequence[str],
    output_format: str,
    notes: Sequence[str] = (),
    start_ns: int | None = None,
    end_ns: int | None = None,
    validate: Callable[[dict[str, Any]], None] | None = None,
    decorate: Callable[[QueryResult], QueryResult] | None = None,
    chosen: Sequence[str] | None = None,
    cut: TableCut | None = None,
) -> None:
    """Open the source, run one query, print its rows (and notes). On DuckDB, csv and json
    are written batch by batch as the rows come (:func:`stream_rows`); a table is printed
    once every row is in. ``decorate`` (a verb of few rows, e.g. window) rewrites the result
    before it is printed, in every format; its rows are then never streamed. A table is the
    query's human view (analyzer/cli/_views.py) at the terminal's width; ``chosen``
    (--columns): only these columns, in every format; ``cut``: the table's rows cut to what
    matters (analyzer/cli/_table_cut.py), with a line that says what was left out."""
    params = merge_params(query, flags, raw_params)
    if validate is not None:
        validate(params)
    if engine == "spark":  # analyzer/query/spark.py
        from analyzer.query.spark import spark_verb_rows

        result = spark_verb_rows(query, params, db_path=db_path, parquet_dir=parquet_dir, start_ns=start_ns,
                                 end_ns=end_ns)
    else:
        con = open_from_flags(db_path, parquet_dir, start_ns, end_ns)
        try:
            if output_format in ("csv", "json") and decorate is None:
                stream_rows(con, query, params, output_format, notes, chosen)
                note_if_stale(con, db_path)
                return
            result = query_rows(con, query, params)
            if output_format == "table":
                result = with_request_ids(con, result)
            note_if_stale(con, db_path)
        finally:
            con.close()
    if decorate is not None:
        result = decorate(result)
    if output_format == "table":
        from analyzer.cli._views import echo_human

        check_columns(query, result.columns, chosen)
        rows, left_out = cut.apply(result.columns, result.rows) if cut is not None else (result.rows, None)
        echo_human(query, result.columns, rows, notes=notes, chosen=chosen)
        if left_out:
            from analyzer.cli._human import terminal_width

            click.echo(textwrap.fill(left_out, terminal_width() or 80))
        return
    result = project_result(result, chosen)
    emit_rows(result.columns, result.rows, output_format, notes=notes)


def installed(con: duckdb.DuckDBPyConnection) -> duckdb.DuckDBPyConnection:
    """``con`` with the adapter and metric views installed (for ad-hoc SQL)."""
    from analyzer.db.views import install_views

    install_views(con)
    return con
