"""``tokentrace pull``: fetch a service's traces from Jaeger into a file ``tokentrace load`` reads."""

from __future__ import annotations

import click

from analyzer.cli._group import cli
from analyzer.errors import UserError

__all__ = ["pull_command"]


@cli.command("pull")
@click.option("--jaeger", "jaeger_url", required=True, metavar="URL",
              help="Jaeger query service base URL, e.g. http://localhost:16686.")
@click.option("--service", required=True, metavar="NAME", help="service.name of the traces to fetch.")
@click.option("--since", default="1h", show_default=True, metavar="DURATION",
              help="How far back traces may start: 90s, 15m, 1h, 2d, 1h30m.")
@click.option("--limit", type=click.IntRange(min=1), default=1000, show_default=True, help="Most traces to fetch.")
@click.option("--page-size", type=click.IntRange(min=1), default=100, show_default=True,
              help="Traces asked for per request.")
@click.option("--api", type=click.Choice(["auto", "v3", "v1"]), default="auto", show_default=True,
              help="v3: /api/v3/traces (OTLP JSON); v1: /api/traces (Jaeger JSON); auto: v3, else v1.")
@click.option("--timeout", "timeout_s", type=click.FloatRange(min=0.1), default=30.0, show_default=True,
              help="Per-request timeout (seconds).")
@click.option("--out", "out_file", required=True, type=click.Path(dir_okay=False), metavar="FILE",
              help="Output file (replaced): OTLP/JSON lines for v3, one Jaeger JSON document for v1.")
def pull_command(jaeger_url: str, service: str, since: str, limit: int, page_size: int, api: str,
                 timeout_s: float, out_file: str) -> None:
    """Fetch the traces of one service from Jaeger and write them for `tokentrace load`.

    Pages walk back in time from now (each page ends where the previous one's earliest
    trace starts) until --limit traces, a page with nothing new, or the --since window
    is exhausted. What Jaeger sent is written as is: api_v3's OTLP JSON (one line per
    page) or the old API's {"data": [...]} document. Exits 1 when no trace matched.

    \b
    Example:
      tokentrace pull --jaeger http://localhost:16686 \\
          --service tokentrace-gateway --since 2h --out jaeger.jsonl
      tokentrace load jaeger.jsonl && tokentrace requests
    """
    from analyzer.collect.pull import parse_since, pull_traces
    from analyzer.errors import PullError

    try:
        since_s = parse_since(since)
        report = pull_traces(jaeger_url, service, out_file, since_s=since_s, limit=limit, page_size=page_size,
                             api=api, timeout_s=timeout_s)
    except (PullError, ValueError, OSError) as exc:
        raise UserError(str(exc)) from None
    for warning in report.warnings:
        click.echo(f"warning: {warning}", err=True)
    if not report.traces:
        raise UserError(f"no traces of service {service!r} in Jaeger ({report.api} API) in the last {since}",
                        hint="check --service (Jaeger UI's service list) and widen --since")
    click.echo(f"{report.traces} traces, {report.spans} spans from {report.pages} page(s) of Jaeger's {report.api} API "
               f"written to {report.out}")
