"""``tokentrace demo``: the main job, offline: serve a model through the traced gateway, send the
worked example's travel-copilot request plus a small concurrent load, and analyze the spans."""

from __future__ import annotations

import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import click

from analyzer.cli._group import cli
from analyzer.cli._model_loading import quiet_model_loading
from analyzer.errors import UserError

__all__ = ["demo_command", "print_query_results"]


def print_query_results(results: dict[str, Any]) -> None:
    """Print the requests, window and skew_offsets results in each query's human view (the one
    ``tokentrace requests`` / ``window`` / ``skew`` print: fitted to the terminal, rounded,
    UTC times, the id a user can find again)."""
    from analyzer.cli._views import echo_human

    titles = {"requests": "Per-request metrics (queries/requests.sql)",
              "window": "Window summary (queries/window.sql, closed cohort)",
              "skew_offsets": "Clock skew check (queries/skew_offsets.sql: server clock - client clock)"}
    from analyzer.cli.skew import with_short_domains

    for name, result in results.items():
        click.echo(f"\n{titles.get(name, name)}")
        rows, legend = with_short_domains(result.columns, result.rows)  # clock names told apart, not cut
        echo_human(name, result.columns, rows, notes=legend, columns_flag=False)


def _command(line: str, width: int) -> str:
    """A shell command as printed (its indent kept): wider than ``width``, continued with
    `` \\`` on lines indented 4 more, cut only at spaces (it still runs when pasted)."""
    if len(line) <= width:
        return line
    indent = line[:len(line) - len(line.lstrip(" "))]
    out, current = [], indent
    for word in line.split():
        if current.strip() and len(current) + 1 + len(word) + 2 > width:
            out.append(current + " \\")
            current = indent + "    " + word
        else:
            current = f"{current} {word}" if current.strip() else current + word
    return "\n".join(out + [current])


@contextmanager
def _progress(quiet: bool) -> Iterator[Any]:
    """A callback (stage, done, total) drawing a rich progress display, or a no-op."""
    if quiet or not sys.stderr.isatty():
        yield None
        return
    try:
        from rich.progress import BarColumn, MofNCompleteColumn, Progress, SpinnerColumn, TextColumn
    except ImportError:
        yield None
        return
    bar = Progress(SpinnerColumn(), TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(),
                   transient=True)
    tasks: dict[str, Any] = {}

    def update(stage: str, done: int, total: int) -> None:
        if stage not in tasks:
            tasks[stage] = bar.add_task(stage, total=total)
        bar.update(tasks[stage], completed=done, total=total)

    with bar:
        yield update


@cli.command("demo")
@click.option("--out", "out_dir", default="tokentrace-demo", show_default=True, metavar="DIR",
              help="Folder for the OTLP-JSON lines files, the DuckDB database and report.html.")
@click.option("--tiny", is_flag=True, help="Serve the random tiny model instead of SmolLM2-135M-Instruct (fast).")
@click.option("--model", default=None, metavar="SPEC",
              help="smollm2 (default), tiny, or a local HuggingFace model folder.")
@click.option("--requests", "load_requests", type=click.IntRange(min=0), default=6, show_default=True,
              help="Requests in the concurrent load after the example request.")
@click.option("--concurrency", type=click.IntRange(min=1), default=3, show_default=True,
              help="Closed-loop concurrency of the load.")
@click.option("--max-tokens", type=click.IntRange(min=1, max=4096), default=48, show_default=True,
              help="max_tokens of every request.")
@click.option("--clock-offset-ms", type=float, default=0.0, show_default=True,
              help="Shift the client's timestamps by this many ms (a skewed client clock).")
@click.option("--shutdown-grace-s", type=click.FloatRange(min=0), default=5.0, show_default=True,
              help="On SIGINT/SIGTERM: seconds the requests in flight get to finish before they are cancelled.")
@click.option("--quiet", "-q", is_flag=True, help="No progress display.")
def demo_command(out_dir: str, tiny: bool, model: str | None, load_requests: int, concurrency: int, max_tokens: int,
                 clock_offset_ms: float, shutdown_grace_s: float, quiet: bool) -> None:
    """Serve a model through the traced gateway, send the worked example's request and a small load, and
    analyze every span, offline.

    The worked example's travel-copilot request ("Show me wheelchair-accessible hotels in Kyoto under
    $200/night with onsen access.") goes first, then --requests more at --concurrency.
    Client and server spans are written to DIR/client-spans.jsonl and DIR/server-spans.jsonl
    (OTLP-JSON lines; also sent over OTLP when OTEL_EXPORTER_OTLP_ENDPOINT is set), loaded
    into DIR/traces.duckdb, summarized by the metric queries, and drawn in DIR/report.html
    (with the report extra, matplotlib, installed).

    SIGINT or SIGTERM (docker stop) stops it before the load: no more requests are sent, those
    in flight get --shutdown-grace-s, both span files are flushed, and one line gives the
    export counts (exit status 130 / 143); `tokentrace load` reads the files as they are.

    \b
    Example:
      tokentrace demo
      tokentrace demo --tiny --out /tmp/tt --requests 4 --max-tokens 16
      tokentrace requests --db tokentrace-demo/traces.duckdb
    """
    import shlex
    import signal

    from analyzer.cli._command_name import tokentrace_command
    from analyzer.errors import LoadError
    from analyzer.verbs.demo import DemoOptions, DemoStopped, run_demo

    if tiny and model not in (None, "tiny"):
        raise UserError(f"--tiny and --model {model} contradict each other: give one")
    spec = "tiny" if tiny else (model or "smollm2")
    quiet_model_loading()  # the demo draws its own progress
    from analyzer.cli._human import terminal_width

    options = DemoOptions(out_dir=Path(out_dir), model=spec, load_requests=load_requests, concurrency=concurrency,
                          max_tokens=max_tokens, clock_offset_ms=clock_offset_ms, say_steps=not quiet,
                          shutdown_grace_s=shutdown_grace_s, width=terminal_width())
    try:
        with _progress(quiet) as progress:
            result = run_demo(options, progress)
    except (ValueError, OSError, LoadError) as exc:  # bad --model, missing package, unwritable --out
        raise UserError(f"demo: {exc}") from None
    except DemoStopped as stopped:
        files = " ".join(str(p) for p in stopped.paths)
        hint = f"; load what was written: {tokentrace_command()} load {files} --db DB" if stopped.sent else ""
        click.echo(f"tokentrace demo: {stopped}{hint}", err=True)
        sys.exit(128 + signal.Signals[stopped.signal_name].value)
    ok = sum(1 for r in result.client_results if r.completed)
    import textwrap

    width = options.width
    served = f"tokentrace demo: {result.model_id} served at {result.url}"
    click.echo(served if len(served) <= width else f"tokentrace demo: {result.model_id}\n  served at {result.url}")
    click.echo(f"{len(result.client_results)} requests sent, {ok} completed; {result.spans_loaded} spans loaded")
    seed = result.client_results[0] if result.client_results else None
    if seed is not None and seed.text:
        answer = " ".join(seed.text[:300].split())  # on one line: no literal \n in it
        click.echo(textwrap.fill(f"example request's answer ({seed.output_tokens} tokens): \"{answer}\"",
                                 width, subsequent_indent="  "))
    print_query_results(result.queries)
    db = result.db_path
    click.echo("\nFiles:")
    click.echo(f"  client spans  {result.client_spans_path}")
    click.echo(f"  server spans  {result.server_spans_path}")
    click.echo(f"  database      {db}")
    if result.report_path is not None:
        click.echo(f"  HTML report   {result.report_path}")
    tt = tokentrace_command()  # runs as printed: .venv/bin/tokentrace unless the venv is on PATH
    click.echo("Query them:")
    q = shlex.quote
    for verb in ("summary", "requests", "phases", "itl", "window", "skew"):
        click.echo(f"  {tt} {verb} --db {q(str(db))}")
    click.echo(_command(f"  {tt} report --db {q(str(db))} --html {q(str(db.parent / 'report.html'))}", width))
    click.echo("View them in Jaeger (OTLP over HTTP on :4318, UI on :16686):")
    click.echo("  docker run --rm -p 16686:16686 -p 4318:4318 jaegertracing/jaeger:2.14.1")
    click.echo("  (or: docker compose up; docs/jaeger.md), then")
    # Jaeger takes traces only: OTEL_METRICS_EXPORTER=none keeps the gateway's metrics off OTLP
    click.echo(_command(f"  OTEL_EXPORTER_OTLP_ENDPOINT=http://localhost:4318 OTEL_METRICS_EXPORTER=none {tt} demo "
                        f"--out {q(str(result.db_path.parent))}", width))
