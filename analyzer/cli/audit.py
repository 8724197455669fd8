"""``tokentrace audit``: check a published latency report against its own numbers."""

from __future__ import annotations

import json
import sys

import click

from analyzer.cli._group import cli
from analyzer.cli._options import db_option, format_option, to_jsonable
from analyzer.errors import UserError

KIND_CHOICES = ["auto", "vllm", "vllm-nightly", "aiperf", "aiperf-server-metrics", "llmperf", "guidellm", "prometheus",
                "claims", "tokentrace"]


@cli.command("audit")
@click.argument("report", metavar="REPORT", type=click.Path())
@click.option("--kind", type=click.Choice(KIND_CHOICES), default="auto", show_default=True, metavar="KIND",
              help=f"Report format, one of {', '.join(KIND_CHOICES)}; auto detects it from the file's "
                   "suffix and keys.")
@click.option("--individual", type=click.Path(), default=None, metavar="FILE",
              help="Per-request records: LLMPerf *_individual_responses.json, AIPerf profile_export.jsonl, "
                   "or the vLLM benchmark JSON behind a nightly table row; with a /metrics scrape or AIPerf's "
                   "server-metrics export, AIPerf's profile_export.jsonl (TTFT and E2E against the client's).")
@db_option(optional="tokentrace DuckDB database: recompute the claimed figures from its traces; for vLLM "
                    "bench and AIPerf reports, join each request to its traced request by id and compare.")
@click.option("--model-config", type=click.Path(), default=None, metavar="PATH",
              help="HuggingFace config.json for the KV check (overrides the claims file's model).")
@click.option("--baseline", type=click.Path(), default=None, metavar="BEFORE.prom",
              help="For a Prometheus scrape (/metrics text): the scrape taken before the run; the audited "
                   "window is REPORT minus it.")
@format_option(choices=("table", "json"))
@click.option("--rel-tol", type=click.FloatRange(min=0, max=1), default=None, metavar="X",
              help="Relative tolerance of every comparison (default 1e-4; a figure printed with "
                   "decimals also gets half a unit of its last decimal).")
def audit_command(report, kind, individual, db_path, model_config, baseline, output_format, rel_tol) -> None:
    """Check a latency report: internal consistency, counting, statistics recomputed from its
    raw arrays (in DuckDB SQL, with the tool's own percentile and std method), KV from the
    model config, labelling, and (with --db) the traces, request by request where the report
    has request ids (vLLM bench --request-id-prefix, AIPerf x_request_id, guidellm
    response_id). A forced --kind whose keys the file lacks is an error. Times in ms, rates
    per second. One row per check; exits 1 when a check fails, so it can gate CI.

    \b
    Example:
      tokentrace audit benchmark_serving_result.json
      tokentrace audit llmperf_summary.json \\
          --individual llmperf_individual_responses.json
      tokentrace audit claims.yaml --model-config ./config.json --format json
      tokentrace audit claims.yaml --db traces.duckdb
      # vllm bench --request-id-prefix ids
      tokentrace audit bench.json --db traces.duckdb
      tokentrace audit profile_export_aiperf.json \\
          --individual profile_export.jsonl --db traces.duckdb
      # guidellm's report (or benchmarks.yaml), records joined by response_id
      tokentrace audit benchmarks.json --db traces.duckdb
      # AIPerf's server-metrics export, or two /metrics scrapes, vs traces
      tokentrace audit server_metrics_export.json --db traces.duckdb
      tokentrace audit after.prom --baseline before.prom --db traces.duckdb
      tokentrace audit after.prom --baseline before.prom \\
          --individual profile_export.jsonl
    """
    from pathlib import Path

    from analyzer.audit import audit_report
    from analyzer.audit.compare import DEFAULT_REL_TOL
    from analyzer.errors import AuditInputError

    if db_path is not None and not Path(db_path).is_file():
        raise UserError(f"--db {db_path}: no such database file")
    try:
        findings = audit_report(report, kind, individual=individual, db=db_path, model_config=model_config,
                                rel_tol=DEFAULT_REL_TOL if rel_tol is None else rel_tol, baseline=baseline)
    except AuditInputError as exc:
        raise UserError(str(exc)) from None
    if output_format == "json":
        click.echo(json.dumps([to_jsonable(f.to_dict()) for f in findings], indent=2))
    else:
        _echo_findings(findings)
        counts = {v: sum(f.verdict == v for f in findings) for v in ("pass", "fail", "cannot_check")}
        click.echo(f"{counts['pass']} pass, {counts['fail']} fail, {counts['cannot_check']} cannot_check")
    if any(f.verdict == "fail" for f in findings):
        sys.exit(1)


def _echo_findings(findings: list) -> None:
    """One finding a block, fitted to the terminal (80 columns off a terminal): the verdict and
    the check's name on a line, the detail wrapped beneath it, never cut (a verdict must
    survive a look at its reasons; --format json has every number)."""
    import textwrap

    from analyzer.cli._human import terminal_width

    width = terminal_width()
    for f in findings:
        click.echo(f"{f.verdict.upper():<13} {f.check}")
        for line in textwrap.wrap(str(f.detail or ""), width - 4, break_long_words=True, break_on_hyphens=False):
            click.echo(f"    {line}")
