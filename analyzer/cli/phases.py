"""``tokentrace phases``: TTFT decomposed into its phases (queries/phases.sql)."""

from __future__ import annotations

import click

from analyzer.cli._group import cli
from analyzer.cli._options import format_option, param_option
from analyzer.cli._query_verb import (
    check_trace_id,
    columns_option,
    request_flags,
    request_option,
    run_verb,
    source_options,
)
from analyzer.errors import OffsetSyntaxError, UserError
from analyzer.verbs.skew import parse_assume_offsets


@cli.command("phases")
@source_options
@click.option("--trace-id", default=None, metavar="HEX32", help="Only requests of this trace.")
@request_option
@click.option("--tolerance-ms", type=click.FloatRange(min=0), default=None,
              help="How far a clock pair's offset bounds may exclude 0 and still count as one clock (default 1).")
@click.option("--assume-offset", "assume_offset", multiple=True, metavar="DOMAIN=MS",
              help="DOMAIN's clock runs MS ms ahead of the client's: shift its timestamps by -MS in "
                   "cross-clock parts (repeatable; DOMAIN = clock domain or service name).")
@format_option
@columns_option
@param_option
def phases_command(db_path, parquet_dir, engine, trace_id, request, tolerance_ms, assume_offset, output_format, chosen_columns, params) -> None:
    """Client TTFT split into network-in, gateway overhead, tokenize, queue, prefill,
    first-emit and network-out, with the residual no phase span covers.

    vLLM: where tokentrace's vLLM plugin traced a request, queue, prefill and decode are
    its spans' (vLLM's engine) and vLLM's own gen_ai.latency.* figures stand beside them
    as vllm_queue_ms, vllm_prefill_ms and vllm_decode_ms; without the plugin they are
    vLLM's own (phases_basis says which). A request only the plugin saw (vLLM writes no
    span for an aborted one) is a row too.

    network_in_ms and network_out_ms subtract a server time from a client time: they are
    empty (cross_clock_reason says why) unless the clock pair's offset bounds are
    consistent with 0 (see `tokentrace skew`) or an offset is assumed. network_round_trip_ms
    and residual_ms never mix clocks. Units: milliseconds. The table shows the phases that
    fit the terminal (TTFT, queue and prefill first) and names the others.

    \b
    Example:
      tokentrace phases --db traces.duckdb \\
          --columns request_span_id,ttft_ms,queue_ms,prefill_ms
      tokentrace phases --db traces.duckdb
      tokentrace phases --db traces.duckdb --assume-offset skewed-client=35
      tokentrace phases --db traces.duckdb --request chatcmpl-tt-plugin-2
    """
    try:
        offsets = parse_assume_offsets(assume_offset)
    except OffsetSyntaxError as exc:
        raise UserError(str(exc)) from None
    run_verb("phases", engine=engine, db_path=db_path, parquet_dir=parquet_dir,
             flags={**request_flags(db_path, parquet_dir, request, check_trace_id(trace_id)),
                    "tolerance_ms": tolerance_ms, **offsets.params()},
             raw_params=params, output_format=output_format, notes=offsets.notes(), chosen=chosen_columns)
