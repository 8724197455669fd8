"""``tokentrace sql``: an ad-hoc query over the loaded tables and the metric views."""

from __future__ import annotations

import click
import duckdb

from analyzer.cli._query_verb import installed, open_from_flags, source_options
from analyzer.cli.group import cli
from analyzer.cli.options import UserError, emit_rows, format_option, param_option, parse_params


@cli.command("sql")
@click.argument("query", metavar="SQL")
@source_options
@format_option
@param_option
def sql_command(query, db_path, parquet_dir, output_format, params) -> None:
    """Run one SQL statement over spans, span_events, span_links, loads, rejects and the views
    request_facts, request_chunks, request_metrics, request_gaps, request_clock_offsets and
    clock_pair_offsets. Values go in as $NAME parameters (--param NAME=VALUE), never
    formatted into the SQL. The database is attached read-only: nothing is written.

    \b
    Example:
      tokentrace sql "SELECT perspective, avg(ttft_ms) FROM request_metrics GROUP BY ALL" --db traces.duckdb
      tokentrace sql "SELECT * FROM request_gaps WHERE itl_ms > \\$ms" --param ms=100 --db traces.duckdb
    """
    bound = parse_params(params)
    con = open_from_flags(db_path, parquet_dir)
    try:
        installed(con)
        try:
            cur = con.execute(query, bound or None)
        except duckdb.Error as exc:
            raise UserError(f"sql: {str(exc).splitlines()[0]}") from None
        if cur.description is None:
            raise UserError("sql: the statement returned no result set")
        columns = [d[0] for d in cur.description]
        rows = cur.fetchall()
    finally:
        con.close()
    emit_rows(columns, rows, output_format)
