"""``tokentrace steps``: the continuous engine's steps and step time against what they held
(queries/steps.sql and queries/steps_summary.sql)."""

from __future__ import annotations

import click

from analyzer.cli._group import cli
from analyzer.cli._options import format_option
from analyzer.cli._query_verb import source_options
from analyzer.cli._sections import run_sections, section_option

SECTIONS = ("steps", "summary")


@cli.command("steps")
@source_options
@click.option("--clock-domain", default=None, metavar="DOMAIN",
              help="Only this engine's steps (clock domain service.name|service.instance.id|host.name).")
@click.option("--min-fit-steps", type=click.IntRange(min=2), default=None,
              help="summary: a group with fewer steps gets no line, only the reason (default 5).")
@click.option("--min-fit-r2", type=click.FloatRange(min=0, max=1), default=None,
              help="summary: a line with a lower r2 is not given, only the reason (default 0.5).")
@section_option(SECTIONS)
@format_option
def steps_command(db_path, parquet_dir, engine, clock_domain, min_fit_steps, min_fit_r2, sections, output_format) -> None:
    """Every engine step of the continuous engine or of vLLM through tokentrace's plugin (one
    `engine_step` span each), then step time against batch size and against scheduled tokens.

    steps: start/end, step_ms = schedule_ms + execute_ms, batch_size, scheduled_tokens =
    prefill_tokens + decode_tokens, waiting sequences, KV blocks used of the total; under
    vLLM's speculative decoding the draft tokens verified and accepted (spec_draft_tokens,
    spec_accepted_tokens; with --format csv or json).
    summary: per group (all steps, each batch size, scheduled-token buckets 1-16, 17-128,
    129-1024, >1024) steps, step_ms mean/p50/p90/p99/max, and the least-squares line
    step_ms = fixed_ms + ms_per_scheduled_token x scheduled_tokens. A line over fewer than
    --min-fit-steps steps or with r2 below --min-fit-r2 does not hold: its slope and
    fixed_ms are empty and null_reason says "fit does not hold" (fit_r2 stays). Traces from
    `--engine sequential` have no steps: their rows are empty with a reason, never zeros.
    Units: milliseconds, tokens, sequences, KV blocks; *_ns nanoseconds since the epoch.
    json holds both sections; csv is one table per file: give one --section.

    \b
    Example:
      tokentrace steps --db traces.duckdb
      tokentrace steps --db traces.duckdb --section summary --format json
      tokentrace steps --db traces.duckdb --section summary --min-fit-r2 0.8
    """
    flags = {"clock_domain": clock_domain}
    fit = {**flags, "min_fit_steps": min_fit_steps, "min_fit_r2": min_fit_r2}
    run_sections({"steps": ("steps", flags), "summary": ("steps_summary", fit)}, sections,
                 db_path=db_path, parquet_dir=parquet_dir, output_format=output_format, engine=engine,
                 notes=["percentiles: linear interpolation (numpy default 'linear', DuckDB quantile_cont)"])
