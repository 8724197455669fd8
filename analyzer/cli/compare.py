"""``tokentrace compare``: two runs, each metric's change with a bootstrap interval and a
verdict, and where the mean E2E's change comes from (analyzer/compare/, docs/compare.md)."""

from __future__ import annotations

import json
import sys

import click

from analyzer.cli._group import cli
from analyzer.cli._options import emit_rows, format_option
from analyzer.cli._query_verb import PERSPECTIVES
from analyzer.errors import UserError


@cli.command("compare")
@click.argument("baseline", metavar="BASELINE")
@click.argument("candidate", metavar="CANDIDATE")
@click.option("--perspective", type=click.Choice(PERSPECTIVES), default=None,
              help="Compare from this perspective (default: the first of client, server, engine both runs have).")
@click.option("--min-effect", "min_effect", type=click.FloatRange(min=0), default=2.0, show_default=True,
              metavar="PCT", help="A change smaller than this % of the baseline is no_difference, whatever its "
                                  "interval.")
@click.option("--fail-on-regression", "fail_pct", type=click.FloatRange(min=0), default=None, metavar="PCT",
              help="Exit 1 when a figure is worse and its interval's bound nearest 0 is beyond PCT % of the "
                   "baseline.")
@click.option("--slo-ttft-ms", type=click.FloatRange(min=0, min_open=True), default=None,
              help="TTFT SLO for goodput (ms, <=).")
@click.option("--slo-tpot-ms", type=click.FloatRange(min=0, min_open=True), default=None,
              help="TPOT SLO for goodput (ms, <=).")
@click.option("--slo-e2e-ms", type=click.FloatRange(min=0, min_open=True), default=None,
              help="E2E SLO for goodput (ms, <=).")
@click.option("--resamples", type=click.IntRange(min=200, max=100_000), default=1000, show_default=True,
              help="Bootstrap resamples per figure.")
@click.option("--seed", type=int, default=0, show_default=True, help="Seed of the resampling (same seed, same "
                                                                      "intervals).")
@click.option("--max-requests", type=click.IntRange(min=20), default=1000, show_default=True,
              help="Above this many requests a side, intervals use a random subset of this many (figures: all).")
@click.option("--min-requests", type=click.IntRange(min=2), default=20, show_default=True,
              help="Fewer requests with a figure on a side: verdict too_few.")
@click.option("--stall-factor", type=click.FloatRange(min=1, min_open=True), default=3.0, show_default=True,
              help="A decode gap over this many times the baseline's median gap counts as a stall.")
@format_option
def compare_command(baseline, candidate, perspective, min_effect, fail_pct, slo_ttft_ms, slo_tpot_ms, slo_e2e_ms,
                    resamples, seed, max_requests, min_requests, stall_factor, output_format) -> None:
    """Did CANDIDATE serve faster or slower than BASELINE, by how much, how sure, and why.

    BASELINE and CANDIDATE are each a database (`tokentrace load`), a Parquet dump folder
    (`tokentrace export`), or a benchmark report's per-request records (AIPerf's
    profile_export.jsonl, vLLM's bench JSON with its per-request arrays). For TTFT, TPOT, ITL, E2E, queue, prefill and each request's output
    rate (mean, p50, p90, p99), and request / token throughput, goodput (with an SLO) and
    error rate: A, B, the change, its 95 % bootstrap interval (whole requests resampled, a
    request's gaps with it) and a verdict: worse / better only when the interval excludes 0
    and the change is at least --min-effect; no_difference otherwise; too_few under
    --min-requests. Then the workload of each run, and the mean E2E's change split into
    queue, prefill, the rest of TTFT, steady decode and decode stalls (means add).
    Succeeded requests only, as summary; units in each heading. How to read it, and why
    many figures at once call for --min-effect: docs/compare.md.

    \b
    Example:
      tokentrace compare before.duckdb after.duckdb
      tokentrace compare before/ after/ --perspective server --format json
      tokentrace compare before.duckdb after.duckdb --fail-on-regression 5
      tokentrace compare before/profile_export.jsonl after/profile_export.jsonl
    """
    from analyzer.cli._compare_render import CSV_COLUMNS, csv_rows, json_object, text_lines
    from analyzer.compare import CompareOptions, compare_runs  # without numpy/scipy: one line naming the extra
    from analyzer.compare.sides import read_sides
    from analyzer.compare.verdict import regression_beyond

    slo = {"slo_ttft_ms": slo_ttft_ms, "slo_tpot_ms": slo_tpot_ms, "slo_e2e_ms": slo_e2e_ms}
    runs, chosen = read_sides((baseline, candidate), ("BASELINE", "CANDIDATE"), perspective, slo)
    options = CompareOptions(resamples=resamples, seed=seed, max_requests=max_requests, min_effect_pct=min_effect,
                             min_requests=min_requests, stall_factor=stall_factor,
                             slo_given=any(v is not None for v in slo.values()))
    result = compare_runs(runs[0], runs[1], options)
    if not result.rows:
        raise UserError(f"no common metric ({chosen} perspective): " + "; ".join(result.not_compared))
    paths = (baseline, candidate)
    if output_format == "json":
        click.echo(json.dumps(json_object(result, paths, options), indent=2))
    elif output_format == "csv":
        emit_rows(CSV_COLUMNS, csv_rows(result), "csv")
    else:
        for line in text_lines(result, paths, options):
            click.echo(line)
    if output_format != "table":
        for warning in result.warnings:
            click.echo(f"warning: {warning}", err=True)
    if fail_pct is not None:
        tripped = [r for r in result.rows
                   if r.verdict == "worse" and regression_beyond(r.a, r.ci_low, r.ci_high, fail_pct)]
        for r in tripped:
            click.echo(f"regression: {r.label} {r.statistic} {r.a:.4g} -> {r.b:.4g} {r.unit}, the interval's bound "
                       f"nearest 0 beyond {fail_pct:g} %", err=True)
        if tripped:
            sys.exit(1)
