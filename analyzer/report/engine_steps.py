"""The report's "Engine steps" section: batch size and KV blocks used over time, step time
against what the step held, and ITL against co-scheduled prefill tokens (queries/steps.sql,
steps_summary.sql, stalls.sql, stalls_groups.sql). Only when the traces hold engine steps
(`tokentrace serve --engine continuous`); otherwise the section says why there is none."""

from __future__ import annotations

import html
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import duckdb

from analyzer.query.runner import run_query
from analyzer.report import plots

__all__ = ["MAX_PLOT_POINTS", "engine_steps_section"]

#: Points per plot at most; beyond, every n-th row (in the query's order) is plotted and the
#: note says so. The tables always show every group.
MAX_PLOT_POINTS = 20_000

Table = Callable[[Sequence[Mapping[str, Any]], Sequence[str]], str]


def _every_nth(rows: list[dict[str, Any]]) -> tuple[list[dict[str, Any]], str]:
    if len(rows) <= MAX_PLOT_POINTS:
        return rows, f"all {len(rows):,}"
    n = -(-len(rows) // MAX_PLOT_POINTS)
    return rows[::n], f"every {n}th of {len(rows):,}"


def engine_steps_section(con: duckdb.DuckDBPyConnection, table: Table) -> str:
    """The section's HTML (views already installed on ``con``)."""
    steps = run_query(con, "steps", views=False).dicts()
    with_steps = [r for r in steps if r["step"] is not None]
    without = [r for r in steps if r["step"] is None]
    missing = "".join(f"<li>{html.escape(str(r['clock_domain']))}: {html.escape(r['null_reason'])}</li>"
                      for r in without)
    head = "<h2>Engine steps</h2>"
    if not with_steps:
        why = f"<ul>{missing}</ul>" if missing else " (no prefill span either)."
        return (head + '<p class="note">No engine step data in these traces, so there is no batch-size, KV-block or '
                "ITL-against-prefill plot: no <code>engine_step</code> span was loaded"
                + (":" if missing else "") + "</p>" + why
                + '<p class="note">The continuous engine writes them: <code>tokentrace serve --engine continuous'
                "</code> (docs/spans.md, \"Under continuous batching\").</p>")
    summary = run_query(con, "steps_summary", views=False).dicts()
    gaps = run_query(con, "stalls", views=False).dicts()
    groups = run_query(con, "stalls_groups", views=False).dicts()
    plotted_steps, steps_note = _every_nth(with_steps)
    known = [g for g in gaps if g["itl_ms"] is not None and g["prefill_tokens"] is not None]
    plotted_gaps, gaps_note = _every_nth(known)
    prefill_groups = [g for g in groups if g["grouping"] == "prefill_tokens"]
    out = [head, f'<p class="note">{len(with_steps):,} engine steps from queries/steps.sql ({steps_note} plotted); '
           "times on the engine's clock. Definitions: docs/metrics.md, \"Engine steps and stalls\".</p>"]
    if missing:
        out.append(f'<p class="note">Clock domains without step data:</p><ul>{missing}</ul>')
    out.append(plots.engine_timeline_svg(plotted_steps))
    out.append("<h3>Step time against batch size and scheduled tokens</h3>"
               '<p class="note">From queries/steps_summary.sql: step_ms = fixed_ms + ms_per_scheduled_token × '
               "scheduled_tokens, least squares per group. A line over fewer than 5 steps or with r2 below 0.5 "
               "does not hold: no slope, and null_reason says so (fit_r2 stays, as the evidence).</p>"
               + table(summary, ["grouping", "group_label", "steps", "step_ms_mean", "step_ms_p50", "step_ms_p90",
                                 "step_ms_p99", "step_ms_max", "batch_size_mean", "ms_per_scheduled_token", "fixed_ms",
                                 "fit_r2", "null_reason"]))
    out.append("<h3>ITL against co-scheduled prefill tokens</h3>"
               f'<p class="note">Each gap between generated tokens (queries/stalls.sql, engine emission times; '
               f"{gaps_note} gaps with step data plotted) against the prefill tokens other sequences computed in "
               "the engine step that produced it; bucket figures from queries/stalls_groups.sql.</p>")
    if plotted_gaps:
        out.append(plots.itl_vs_prefill_svg(plotted_gaps, prefill_groups))
    sampled = sorted({g["request_set"] for g in groups} - {"every request", None})
    if sampled:
        out.append(f'<p class="note">The groups count the {html.escape(sampled[0])} (a keep policy: a request kept '
                   "for a rule is slow by selection).</p>")
    out.append(table(groups, [c for c in groups[0] if c not in ("group_min", "group_max", "request_set")]))
    return "".join(out)
