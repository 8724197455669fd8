"""``tokentrace itl``: every inter-token gap (queries/itl.sql)."""

from __future__ import annotations

import click

from analyzer.cli._group import cli
from analyzer.cli._options import format_option, param_option
from analyzer.cli._query_verb import (
    PERSPECTIVES,
    check_trace_id,
    columns_option,
    request_flags,
    request_option,
    run_verb,
    source_options,
)
from analyzer.cli._table_cut import limit_options, table_cut


@cli.command("itl")
@source_options
@click.option("--perspective", type=click.Choice(PERSPECTIVES), default=None,
              help="Only this perspective (default: every one a request has).")
@click.option("--trace-id", default=None, metavar="HEX32", help="Only requests of this trace.")
@request_option
@format_option
@columns_option
@limit_options("gap")
@param_option
def itl_command(db_path, parquet_dir, engine, perspective, trace_id, request, output_format, chosen_columns, limit, show_all,
                params) -> None:
    """Every gap between consecutive visible chunks of each request, per chunk and per token.

    itl_ms is the gap before a chunk; itl_per_token_ms divides it by that chunk's tokens
    (they differ under speculative decoding or per-word flushing). A request with O
    one-token chunks has O - 1 gaps. Gaps of a span that dropped events are empty with a
    reason. Each gap names its request by response_id (what the client got, chatcmpl-...)
    beside trace_id and request_span_id. Units: milliseconds; *_ns nanoseconds since the
    epoch. With --format csv or
    json every gap is written, computed one range of requests at a time (~150 rows per
    request never sit in memory whole). The table (the default) leads with the answer:
    the 20 largest gaps (--limit N), with a line saying how many were left out; --all
    prints every gap in request order. Rounded to 0.1 ms, times in UTC, fitted to the
    terminal.

    \b
    Example:
      tokentrace itl --db traces.duckdb --limit 10
      tokentrace itl --db traces.duckdb --request chatcmpl-4f1c2a --all
      tokentrace itl --db traces.duckdb --all \\
          --trace-id 4bf92f3577b34da6a3ce929d0e0e4736
      tokentrace itl --db traces.duckdb --format csv \\
          --columns request_span_id,gap_index,itl_ms
      tokentrace itl --db traces.duckdb --perspective client --format json
    """
    run_verb("itl", engine=engine, db_path=db_path, parquet_dir=parquet_dir,
             flags={"perspective": perspective, **request_flags(db_path, parquet_dir, request, check_trace_id(trace_id))},
             raw_params=params, output_format=output_format, chosen=chosen_columns,
             cut=table_cut(limit, show_all, output_format, "itl_ms", "gap"))
