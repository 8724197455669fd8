"""``tokentrace requests``: per-request metrics (queries/requests.sql)."""

from __future__ import annotations

import click

from analyzer.cli._group import cli
from analyzer.cli._options import format_option, param_option
from analyzer.cli._query_verb import PERSPECTIVES, check_trace_id, columns_option, run_verb, source_options


@cli.command("requests")
@source_options
@click.option("--perspective", type=click.Choice(PERSPECTIVES), default=None,
              help="Only this perspective (default: every one a request has).")
@click.option("--trace-id", default=None, metavar="HEX32", help="Only requests of this trace.")
@format_option
@columns_option
@param_option
def requests_command(db_path, parquet_dir, engine, perspective, trace_id, output_format, chosen_columns, params) -> None:
    """One row per request and perspective: TTFT, E2E, TPOT, token rates, KV figures.

    Each perspective is its own row, on its own clock: client = the CLIENT span's; server =
    the gateway's, or vLLM's frontend (its own llm_request span), TGI's router, SGLang's;
    engine = tokentrace's bare generate span, or vLLM's engine (tokentrace's vLLM plugin).
    The table's block titles name each one's clock. Figures that cannot be computed are
    empty, and null_reason says why. Units: *_ms milliseconds, *_per_second tokens/s,
    *_bytes bytes, *_mib MiB. Formulas: docs/metrics.md.

    The table (a block per perspective) fits the terminal (80 columns in a pipe): request id
    (the response id, else the X-Request-ID), tokens in/out, TTFT, TPOT, E2E in ms, finish
    reason; wider terminals add more. csv and json hold every column at full precision;
    --columns picks columns in any format.

    \b
    Example:
      tokentrace requests --db traces.duckdb
      tokentrace requests --db traces.duckdb \\
          --columns response_id,client_request_id,ttft_ms
      tokentrace requests --db traces.duckdb --perspective client --format csv
      tokentrace requests --parquet dump/ \\
          --trace-id 4bf92f3577b34da6a3ce929d0e0e4736
    """
    run_verb("requests", engine=engine, db_path=db_path, parquet_dir=parquet_dir,
             flags={"perspective": perspective, "trace_id": check_trace_id(trace_id)},
             raw_params=params, output_format=output_format, chosen=chosen_columns)
