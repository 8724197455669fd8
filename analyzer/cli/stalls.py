"""``tokentrace stalls``: every inter-token gap joined to the engine step that produced it,
ITL by what shared the step, and each request's slowest gaps (queries/stalls.sql,
queries/stalls_groups.sql, queries/stalls_slowest.sql)."""

from __future__ import annotations

import click

from analyzer.cli._group import cli
from analyzer.cli._options import format_option
from analyzer.cli._query_verb import check_trace_id, request_flags, request_option, source_options
from analyzer.cli._sections import run_sections, section_option
from analyzer.cli._table_cut import limit_options, table_cut

SECTIONS = ("gaps", "groups", "slowest")


@cli.command("stalls")
@source_options
@click.option("--trace-id", default=None, metavar="HEX32", help="Only requests of this trace.")
@request_option
@click.option("--clock-domain", default=None, metavar="DOMAIN",
              help="Only gaps of this engine (clock domain service.name|service.instance.id|host.name).")
@click.option("--per-request", type=click.IntRange(min=1), default=None,
              help="slowest: how many gaps per request (default 3).")
@section_option(SECTIONS)
@format_option
@limit_options("gap")
def stalls_command(db_path, parquet_dir, engine, trace_id, request, clock_domain, per_request, sections, output_format, limit,
                   show_all) -> None:
    """Why a token was slow: each gap between generated tokens with the engine step that
    produced it, ITL grouped by what shared that step, and each request's slowest gaps.

    gaps: itl_ms before token n (n >= 2) on the engine's clock, from token n-1's emission to
    token n's, which is the end of the engine step its decode span names; the step's
    step_ms, batch_size, scheduled_tokens and co-scheduled prefill_tokens (bucket 0, 1-128,
    129-1024, >1024). groups: ITL count/mean/p50/p90/p99/max per prefill bucket and per
    batch size. slowest: the --per-request largest gaps of each request and the sequences
    that shared their step (decoding, prefilling, the largest co-scheduled prefill). Traces
    from `--engine sequential` keep their gaps; the step columns are empty with a reason,
    never zeros. Under vLLM's speculative decoding an accepted draft token came with the one
    before it: its gap is 0 ms (steps_in_gap 0). Units: milliseconds, tokens, sequences.

    The table (the default) leads with the answer: slowest, then groups, then gaps; slowest
    and gaps show their 20 largest gaps (--limit N, or --all for every row in order) with a
    line saying how many were left out. json holds every row of every section (gaps, groups,
    slowest); csv is one table per file: give one --section. Each gap row and slowest row
    names its request by response_id (what the client got, chatcmpl-...) beside trace_id and
    request_span_id.

    \b
    Example:
      tokentrace stalls --db traces.duckdb --section groups
      tokentrace stalls --db traces.duckdb --section slowest --per-request 5 \\
          --format json
      tokentrace stalls --db traces.duckdb --section gaps --format csv > gaps.csv
    """
    common = {**request_flags(db_path, parquet_dir, request, check_trace_id(trace_id), span_list=True),
              "clock_domain": clock_domain}
    run_sections({"gaps": ("stalls", common), "groups": ("stalls_groups", common),
                  "slowest": ("stalls_slowest", {**common, "per_request": per_request})}, sections,
                 db_path=db_path, parquet_dir=parquet_dir, output_format=output_format, engine=engine,
                 cuts={name: cut for name in ("gaps", "slowest")
                       if (cut := table_cut(limit, show_all, output_format, "itl_ms", "gap")) is not None},
                 table_order=("slowest", "groups", "gaps"),
                 notes=["itl_ms: engine emission gaps (end of the producing engine step), not the gateway's chunk writes",
                        "percentiles: linear interpolation (numpy default 'linear', DuckDB quantile_cont)"])
