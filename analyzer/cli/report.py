"""``tokentrace report``: a self-contained HTML report of a trace database."""

from __future__ import annotations

from pathlib import Path

import click

from analyzer.cli._group import cli
from analyzer.cli._options import db_option
from analyzer.errors import UserError


@cli.command("report")
@db_option
@click.option("--html", "html_path", required=True, type=click.Path(dir_okay=False), help="Where to write the HTML file.")
@click.option("--request", "request_span_id", default=None, metavar="ID",
              help="The request to detail, by any id it has: its response id (chatcmpl-...), the X-Request-ID it "
                   "was sent with, or its span id (or the span id's last 8+ hex digits); default: the typical "
                   "request (E2E closest to the median).")
@click.option("--audit", "audit_json", default=None, type=click.Path(dir_okay=False),
              help="Findings from `tokentrace audit --format json` to include.")
@click.option("--mode", type=click.Choice(["closed_cohort", "steady_state"]), default="closed_cohort",
              show_default=True, help="Window mode of the run summary.")
@click.option("--slo-ttft-ms", type=float, default=None, help="TTFT SLO for goodput (ms).")
@click.option("--slo-tpot-ms", type=float, default=None, help="TPOT SLO for goodput (ms).")
@click.option("--slo-e2e-ms", type=float, default=None, help="E2E SLO for goodput (ms).")
@click.option("--bucket-s", type=click.FloatRange(min=0.001), default=1.0, show_default=True,
              help="Bucket width of the throughput-over-time plot (s).")
@click.option("--timeline-requests", type=click.IntRange(min=1), default=10, show_default=True, metavar="N",
              help="Timeline: draw the N slowest requests (E2E), each with its neighbours in time (all when N or "
                   "fewer).")
@click.option("--title", default="tokentrace report", show_default=True, help="Report title.")
@click.option("--compare", "baseline", default=None, metavar="BASELINE",
              help="Add a comparison with this baseline run (a database or a Parquet dump folder): "
                   "`tokentrace compare`'s verdicts and both runs' CDFs (needs the compare extra).")
def report_command(db_path, html_path, request_span_id, audit_json, mode, slo_ttft_ms, slo_tpot_ms, slo_e2e_ms,
                   bucket_s, timeline_requests, title, baseline) -> None:
    """Write one self-contained HTML file (inline SVG plots, no CDN) about a trace database.

    It opens with the numbers a person wants first: TTFT, TPOT and E2E p50/p99, throughput,
    goodput, errors and prompt-cache hits, the window in UTC. Then: run summary (window
    metrics, SLOs, goodput, counting rule); distributions; a
    waterfall of one request (client, gateway, tokenize, queue, prefill, every decode step,
    chunk events; each lane labelled with its clock); ITL per gap and KV bytes per decode
    step; CDFs of TTFT, TPOT, E2E; throughput over time with the window shaded; engine steps
    (batch size and KV blocks used over time, ITL against co-scheduled prefill tokens; only
    with step data, else the reason); the timeline (a lane per request on the engine's time
    axis, the engine steps beneath, running / waiting / KV blocks above, the slowest gaps
    boxed with what shared their step; --timeline-requests); TTFT phase breakdown;
    clock-skew bounds and rule violations; audit findings with --audit. Every number comes
    from the SQL in queries/, rounded for reading, under a header that names it and its
    unit. Every table fits a 1280-pixel window; on a phone (390 pixels) a wide table or
    plot scrolls sideways in its own box, plots never shrink below 80 % of their size.

    \b
    Example:
      tokentrace report --db tokentrace-demo/traces.duckdb --html report.html \\
          --slo-ttft-ms 500
      tokentrace report --db traces.duckdb --html report.html --slo-ttft-ms 500 \\
          --slo-tpot-ms 50 --timeline-requests 20
      tokentrace report --db after.duckdb --html report.html \\
          --compare before.duckdb
    """
    from analyzer.cli._query_verb import open_from_flags
    from analyzer.report import ReportInputs, build_report, load_audit_findings

    out = Path(html_path)
    if not out.parent.is_dir():
        raise UserError(f"--html {html_path}: folder {out.parent} does not exist")
    findings = None
    if audit_json:
        try:
            findings = load_audit_findings(audit_json)
        except ValueError as exc:
            raise UserError(str(exc)) from None
    comparison_html = None
    if baseline is not None:
        comparison_html = _comparison_html(baseline, db_path, {"slo_ttft_ms": slo_ttft_ms, "slo_tpot_ms": slo_tpot_ms,
                                                              "slo_e2e_ms": slo_e2e_ms})
    inputs = ReportInputs(
        request_span_id=request_span_id,
        window_params={"mode": mode, "slo_ttft_ms": slo_ttft_ms, "slo_tpot_ms": slo_tpot_ms, "slo_e2e_ms": slo_e2e_ms},
        bucket_s=bucket_s,
        timeline_requests=timeline_requests,
        audit_findings=findings,
        title=title,
        comparison_html=comparison_html,
    )
    # Attached read-only, as every query verb: the report's views live in memory, and the
    # database file stays byte-identical.
    con = open_from_flags(db_path, None)
    try:
        page = build_report(con, inputs)
    except ValueError as exc:
        raise UserError(str(exc)) from None
    finally:
        con.close()
    Path(html_path).write_text(page, encoding="utf-8")
    click.echo(f"wrote {html_path} ({len(page) / 1024:.0f} KiB)")


def _comparison_html(baseline: str, db_path: str, slo: dict) -> str:
    """The comparison section: ``baseline`` against the report's database, as ``tokentrace
    compare BASELINE DB`` compares them (default options, the report's SLOs)."""
    from analyzer.compare import CompareOptions, compare_runs
    from analyzer.compare.sides import read_sides
    from analyzer.report.comparison import comparison_section

    runs, chosen = read_sides((baseline, db_path), ("BASELINE", "this run"), None, slo)
    result = compare_runs(runs[0], runs[1], CompareOptions(slo_given=any(v is not None for v in slo.values())))
    if not result.rows:
        raise UserError(f"--compare {baseline}: no common metric ({chosen} perspective): "
                        + "; ".join(result.not_compared))
    return comparison_section(result, baseline)
