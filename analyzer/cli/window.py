"""``tokentrace window``: request throughput, goodput and error rate over a window (queries/window.sql)."""

from __future__ import annotations

from typing import Any

import click

from analyzer.cli._group import cli
from analyzer.cli._options import format_option, param_option
from analyzer.cli._query_verb import PERSPECTIVES, columns_option, run_verb, source_options
from analyzer.errors import UserError
from analyzer.query.utc_columns import with_utc_bounds

MODES = ("closed_cohort", "steady_state")


def _validate(params: dict[str, Any]) -> None:
    mode = params.get("mode", "closed_cohort")
    if mode not in MODES:  # name the flag it came from: --mode, else --param mode=...
        ctx = click.get_current_context(silent=True)
        given = (f"--mode {mode!r}" if ctx is not None and ctx.params.get("mode") == mode
                 else f"mode {mode!r} (--param mode={mode})")
        raise UserError(f"{given}: expected closed_cohort or steady_state (see docs/metrics.md)")
    start, end = params.get("window_start_ns"), params.get("window_end_ns")
    if start is not None and end is not None and end <= start:
        raise UserError(f"window end {end} ns is not after its start {start} ns")
    for name in ("slo_ttft_ms", "slo_tpot_ms", "slo_e2e_ms"):
        value = params.get(name)
        if value is not None and not (isinstance(value, (int, float)) and value > 0):
            raise UserError(f"--{name.replace('_', '-')} {value!r}: expected a positive number of milliseconds")


@cli.command("window")
@source_options
@click.option("--mode", default=None, metavar="MODE",
              help="closed_cohort (requests starting in the window) or steady_state (completions and "
                   "chunk tokens in the window). Default: closed_cohort.")
@click.option("--start-ns", type=int, default=None, help="Window start, ns since the epoch (default: earliest s).")
@click.option("--end-ns", type=int, default=None, help="Window end, ns since the epoch (default: latest request end).")
@click.option("--perspective", type=click.Choice(PERSPECTIVES), default=None,
              help="Count every request from this perspective (default: client, else server, else engine; "
                   "a vLLM request tokentrace's vLLM plugin traced: its engine row before vLLM's own).")
@click.option("--slo-ttft-ms", type=float, default=None, help="TTFT SLO in ms (request meets it when <=).")
@click.option("--slo-tpot-ms", type=float, default=None, help="TPOT SLO in ms (O = 1 requests pass it).")
@click.option("--slo-e2e-ms", type=float, default=None, help="E2E SLO in ms.")
@click.option("--count-failed-tokens", is_flag=True, default=None, help="Count failed requests' output tokens.")
@click.option("--cancelled-as-failed", is_flag=True, default=None,
              help="Count cancelled requests as failed (default: reported on their own).")
@format_option
@columns_option
@param_option
def window_command(db_path, parquet_dir, engine, mode, start_ns, end_ns, perspective, slo_ttft_ms, slo_tpot_ms,
                   slo_e2e_ms, count_failed_tokens, cancelled_as_failed, output_format, chosen_columns, params) -> None:
    """Attempted / succeeded / failed / cancelled requests, throughput, goodput, error rate.

    Two counting modes, never interchangeable: closed_cohort counts requests whose send time
    falls in the window (and reports how many did not finish inside it); steady_state counts
    completions and the chunk tokens whose event time falls in the window (and reports how
    many requests cross a boundary). The bounds are printed in ns since the epoch and, beside
    them, as UTC (window_start_utc, window_end_utc). Units: window_s seconds, *_rps requests/s,
    output_tokens_per_s tokens/s, error_rate a fraction. The table prints one "name (unit)
    value" line per figure, the bounds in UTC to the millisecond.

    \b
    Example:
      tokentrace window --db traces.duckdb
      tokentrace window --db traces.duckdb --mode steady_state \\
          --start-ns 1767225600000000000 --end-ns 1767225610000000000 \\
          --slo-ttft-ms 500 --slo-tpot-ms 50
    """
    run_verb("window", engine=engine, db_path=db_path, parquet_dir=parquet_dir,
             flags={"mode": mode, "window_start_ns": start_ns, "window_end_ns": end_ns, "perspective": perspective,
                    "slo_ttft_ms": slo_ttft_ms, "slo_tpot_ms": slo_tpot_ms, "slo_e2e_ms": slo_e2e_ms,
                    "count_failed_tokens": count_failed_tokens, "cancelled_as_failed": cancelled_as_failed},
             raw_params=params, output_format=output_format, start_ns=start_ns, end_ns=end_ns, validate=_validate,
             decorate=with_utc_bounds, chosen=chosen_columns)
