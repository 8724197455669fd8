"""The ``tokentrace`` click group. Verbs live one module each beside this file and are
discovered by ``analyzer.cli`` at start-up, so adding a verb never edits a shared file."""

from __future__ import annotations

import click

__all__ = ["cli"]


@click.group(context_settings={"help_option_names": ["-h", "--help"], "max_content_width": 100})
@click.version_option(package_name="tokentrace")
def cli() -> None:
    """tokentrace: trace LLM inference requests with OpenTelemetry and analyze the traces.

    \b
    Instrument:  serve, bench, demo (trace a model and its gateway)
    Load:        load, export, collect, pull (traces into DuckDB / Parquet)
    Query:       requests, itl, phases, summary, window, skew, steps, stalls, sql
    Check:       timeline, kv, audit
    Report:      report (one self-contained HTML file)
    """
