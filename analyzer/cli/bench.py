"""``tokentrace bench``: a traced load generator against an OpenAI-compatible server."""

from __future__ import annotations

import json
import secrets
import signal
import sys
import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import click

from analyzer.cli._group import cli
from analyzer.cli._options import db_option, format_option
from analyzer.errors import UserError

__all__ = ["bench_command"]


@cli.command("bench")
@click.option("--url", required=True, metavar="URL", help="Server base URL, e.g. http://127.0.0.1:8000.")
@click.option("--requests", "n_requests", type=click.IntRange(min=1, max=100_000), required=True,
              help="Requests to send.")
@click.option("--concurrency", type=click.IntRange(min=1, max=1024), default=None,
              help="Closed loop: this many requests in flight, each sent when the previous one ended.")
@click.option("--rate", "rate_per_s", type=click.FloatRange(min=0, min_open=True), default=None,
              help="Open loop: Poisson arrivals at this many requests per second (seeded by --seed).")
@click.option("--api-key", default=None, envvar="TOKENTRACE_API_KEY", help="Bearer key ($TOKENTRACE_API_KEY).")
@click.option("--model", default=None, help="Model id to request (default: the first of GET /v1/models).")
@click.option("--prompt", default=None, help="User message (default: the worked example's travel-copilot request).")
@click.option("--max-tokens", type=click.IntRange(min=1), default=64, show_default=True, help="max_tokens per request.")
@click.option("--temperature", type=click.FloatRange(min=0, max=2), default=0.0, show_default=True)
@click.option("--clock-offset-ms", type=float, default=0.0, show_default=True,
              help="Shift every client timestamp by this many ms (simulates a skewed client clock).")
@click.option("--seed", type=int, default=0, show_default=True, help="Seed of the Poisson arrivals.")
@click.option("--timeout-s", type=click.FloatRange(min=0, min_open=True), default=120.0, show_default=True,
              help="Per-request timeout in seconds.")
@click.option("--otlp-json", "otlp_json", default=None, metavar="PATH",
              help="Also append the client spans to this OTLP-JSON lines file.")
@db_option(optional="Keep the client spans in this DuckDB database (default: in memory only).")
@click.option("--service-name", default="tokentrace-bench", show_default=True, help="service.name of the client spans.")
@click.option("--ignore-eos", is_flag=True, help="Ask the server to run every answer to --max-tokens (the vLLM "
              "extension benchmarks use to fix output lengths; tokentrace serve implements it).")
@format_option(choices=("table", "json"),
               help="table: the run summary (requests, duration, throughput, mean/p50/p90/p99 of TTFT, TPOT, "
                    "ITL, E2E); json: the same figures as one object on stdout, for scripts.")
@click.option("--per-request", is_flag=True,
              help="table: also every request's row (queries/requests.sql), the window table and each "
                   "request's ids.")
@click.option("--shutdown-grace-s", type=click.FloatRange(min=0), default=5.0, show_default=True,
              help="On SIGTERM/SIGINT: send nothing more; requests in flight get this long, then are cancelled.")
@click.option("--request-id-prefix", default=None, metavar="TEXT",
              help="Request i is sent with X-Request-ID TEXT{i} (its client_request_id; default: "
                   "bench-<8 random hex digits>-, new for every run).")
@click.option("--allow-failures", is_flag=True,
              help="Exit 0 even when requests failed (default: exit 1 when any request failed).")
def bench_command(url, n_requests, concurrency, rate_per_s, api_key, model, prompt, max_tokens, temperature,
                  clock_offset_ms, seed, timeout_s, otlp_json, db_path, service_name, ignore_eos, output_format,
                  per_request, shutdown_grace_s, request_id_prefix, allow_failures) -> None:
    """Send streaming chat requests under traced CLIENT spans and summarize them with SQL.

    Each request is a `chat {model}` CLIENT span with a tokentrace.chunk event per received
    chunk; traceparent is propagated, so a traced server's spans join the same traces. It
    ends with one block: requests completed / failed, the duration, request and output
    token throughput, and mean / p50 / p90 / p99 of TTFT, TPOT, ITL and E2E in ms (from
    queries/window.sql and queries/summary.sql, client perspective, completed requests).
    --per-request adds every request's row and ids. --db PATH keeps the client spans, so
    `tokentrace summary`, `requests`, `itl` ... read the run afterwards.

    On a terminal, one line shows progress while it runs (done, failed, in flight, to send,
    tokens/s). Each request carries an X-Request-ID (--request-id-prefix); every failed
    request is named with its ids, HTTP status or exception, and the seconds it waited.

    Exit status: 0 when every request completed; 1 when any request failed (an HTTP status
    other than 200, a network error or timeout, a stream cut short), after the summary;
    --allow-failures exits 0 all the same.

    SIGTERM and SIGINT stop it: nothing more is sent, requests in flight get
    --shutdown-grace-s and are then cancelled, every span made is flushed; the summary
    counts what was sent (completed, failed, cancelled by the stop) and what was not, and
    the exit status is 128 + the signal's number (130 for Ctrl-C).

    \b
    Example:
      tokentrace bench --url http://127.0.0.1:8000 --requests 20 --concurrency 4
      tokentrace bench --url http://127.0.0.1:8000 --requests 50 --rate 5 \\
          --otlp-json bench.jsonl
      tokentrace bench --url http://127.0.0.1:8000 --requests 32 \\
          --concurrency 8 --ignore-eos --format json
      tokentrace bench --url http://127.0.0.1:8000 --requests 100 --rate 20 \\
          --allow-failures
    """
    from analyzer.cli._bench_progress import is_failed
    from instrument.client import SEED_PROMPT, chat_body

    _check_load_flags(url, concurrency, rate_per_s)
    if db_path is not None:  # refused before the run, not after it
        from analyzer.db.ownership import check_writable

        check_writable(db_path)
    if model is None:
        model = _first_model(url, api_key, timeout_s)
    text = prompt or SEED_PROMPT
    prefix = f"bench-{secrets.token_hex(4)}-" if request_id_prefix is None else request_id_prefix
    run = _run_traced_load(
        url, lambda _i: chat_body(model, text, max_tokens=max_tokens, temperature=temperature, ignore_eos=ignore_eos),
        n_requests, service_name=service_name, otlp_json=otlp_json, concurrency=concurrency, rate_per_s=rate_per_s,
        seed=seed, api_key=api_key, clock_offset_ns=round(clock_offset_ms * 1e6), timeout_s=timeout_s,
        grace_s=shutdown_grace_s, request_id_for=lambda i: f"{prefix}{i}")
    failed = [r for r in run.results if is_failed(r)]
    by_status = _http_status_counts(run.results)
    mode = f"concurrency {concurrency}" if concurrency else f"Poisson rate {rate_per_s:g}/s (seed {seed})"
    say = (lambda line: click.echo(line, err=True)) if output_format == "json" else click.echo
    _say_outcome(say, run, failed, by_status, f"{len(run.results)} requests to {url} ({model}), {mode}",
                 n_requests, timeout_s)
    json_fields = None
    if output_format == "json":
        json_fields = {"url": url, "model": model, "mode": mode, "requests_sent": len(run.results),
                       "requests_asked": n_requests, "stopped_by": run.stopped_by, "request_id_prefix": prefix,
                       **_json_ids(run.results, failed)}
    _print_summary(run, by_status, n_requests, db_path, json_fields, per_request)
    _say_where_the_spans_are(say, otlp_json, db_path)
    if run.stopped_by:
        sys.exit(128 + signal.Signals[run.stopped_by].value)
    if failed and not allow_failures:
        raise UserError(f"{len(failed)} of {len(run.results)} requests failed (listed above)",
                        hint="--allow-failures exits 0 when failures are expected")


@dataclass
class _BenchRun:
    """What the load left: the client's results in request order, the signal that stopped it
    (``SIGINT`` | ``SIGTERM``, None when none did), the exporters' span counts and the
    finished client spans."""

    results: list[Any]
    stopped_by: str | None
    export_counts: Any
    spans: Sequence[Any]


def _check_load_flags(url: str, concurrency: int | None, rate_per_s: float | None) -> None:
    """Exactly one of --concurrency and --rate, and an http(s) --url."""
    if (concurrency is None) == (rate_per_s is None):
        raise UserError("give exactly one of --concurrency (closed loop) or --rate (open loop)")
    if not url.startswith(("http://", "https://")):
        raise UserError(f"--url {url!r}: expected http://HOST:PORT")


def _first_model(url: str, api_key: str | None, timeout_s: float) -> str:
    """The id of the first model the server lists (GET /v1/models, waiting at most ``timeout_s`` s)."""
    import httpx

    headers = {"authorization": f"Bearer {api_key}"} if api_key else {}
    try:
        listing = httpx.get(url.rstrip("/") + "/v1/models", headers=headers, timeout=timeout_s)
    except httpx.HTTPError as exc:
        raise UserError(f"--url {url}: cannot reach the server ({type(exc).__name__}: {exc})") from None
    if listing.status_code != 200:
        raise UserError(f"--url {url}: GET /v1/models answered {listing.status_code}: {listing.text[:200]}")
    return listing.json()["data"][0]["id"]


def _run_traced_load(url: str, body_for: Callable[[int], dict[str, Any]], n_requests: int, *, service_name: str,
                     otlp_json: str | None, **load: Any) -> _BenchRun:
    """Send ``n_requests`` requests under traced CLIENT spans (kept in memory, also appended to
    --otlp-json), with the progress line on a terminal; SIGTERM and SIGINT stop the sending
    (``load``: the rest of run_load's keywords). The spans are flushed before it returns."""
    from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

    from analyzer.cli._bench_progress import BenchProgress
    from instrument.client import local_tracer_provider, run_load_sync
    from instrument.otel.shutdown import StopSignals, shutdown_tracing

    memory = InMemorySpanExporter()
    provider = local_tracer_provider(service_name, json_path=otlp_json, span_exporters=[memory])
    stop = threading.Event()
    progress = BenchProgress(n_requests, sys.stderr, enabled=sys.stderr.isatty())
    with StopSignals(lambda _name: stop.set()) as signals, progress:
        results = run_load_sync(url, body_for, requests=n_requests, tracer_provider=provider, stop=stop,
                                on_send=progress.on_send, on_chunk=progress.on_chunk, on_result=progress.on_result,
                                **load)
    counts = shutdown_tracing(provider, timeout_s=10.0)
    return _BenchRun(results, signals.received, counts, memory.get_finished_spans())


def _http_status_counts(results: Sequence[Any]) -> dict[str, int]:
    """Requests per HTTP status (``no response`` when none came)."""
    by_status: dict[str, int] = {}
    for r in results:
        key = str(r.status_code) if r.status_code is not None else "no response"
        by_status[key] = by_status.get(key, 0) + 1
    return by_status


def _say_outcome(say: Callable[[str], None], run: _BenchRun, failed: list[Any], by_status: dict[str, int],
                 headline: str, n_requests: int, timeout_s: float) -> None:
    """What was sent and how it ended: the stop (if a signal came), the counts by outcome and
    HTTP status, and the first 20 failed requests with their ids."""
    from analyzer.cli._bench_progress import describe_failure
    from instrument.otel.shutdown import export_summary

    results = run.results
    cancelled = sum(1 for r in results if r.finish_reason == "cancelled")
    completed = sum(1 for r in results if r.completed)
    if run.stopped_by:
        say(f"bench: stopped on {run.stopped_by}: sent {len(results)} of {n_requests} requests, "
            f"{n_requests - len(results)} not sent; {export_summary(run.export_counts)}")
    say(f"bench: {headline}")
    say(f"  {completed} completed, {len(failed)} failed" + (f", {cancelled} cancelled by the stop" if cancelled else "")
        + "; HTTP status: " + ", ".join(f"{k}={v}" for k, v in sorted(by_status.items())))
    shown = failed[:20]
    for r in shown:
        for line in describe_failure(r, timeout_s).splitlines():
            say(f"  {line}")
    if len(failed) > len(shown):
        say(f"  ... and {len(failed) - len(shown)} more failed requests (--format json lists every one)")


def _json_ids(results: Sequence[Any], failed: list[Any]) -> dict[str, Any]:
    """--format json: every request's ids, and every failed request with what failed."""
    return {"request_ids": [{"index": r.index, "client_request_id": r.client_request_id,
                             "response_id": r.response_id} for r in results],
            "failures": [{"index": r.index, "client_request_id": r.client_request_id,
                          "response_id": r.response_id, "http_status": r.status_code,
                          "error": r.error, "chunks": r.chunks, "waited_s": r.waited_s}
                         for r in failed]}


def _print_summary(run: _BenchRun, by_status: dict[str, int], n_requests: int, db_path: str | None,
                   json_fields: dict[str, Any] | None, per_request: bool) -> None:
    """Load the client spans into DuckDB (--db PATH, else in memory), derive as tokentrace load
    does and print the summary: one JSON object with ``json_fields`` added (--format json),
    else the summary block, after every request's row with --per-request."""
    from analyzer.cli._bench_block import summary_block
    from analyzer.cli._bench_json import bench_summary
    from analyzer.db.derived import build_derived
    from analyzer.db.store import connect, insert_rows
    from analyzer.formats.sdk_spans import rows_from_sdk_spans

    con = connect(db_path)
    try:
        spans, events, links = rows_from_sdk_spans(run.spans)
        insert_rows(con, spans, events, links)
        build_derived(con)  # as tokentrace load: the read verbs afterwards derive nothing
        summary = bench_summary(con, by_status)
        if json_fields is not None:
            summary.update(json_fields)
            click.echo(json.dumps(summary, indent=2))
        else:
            if per_request:
                _print_per_request(con)
            click.echo("")
            for line in summary_block(summary, sent=len(run.results), asked=n_requests, stopped_by=run.stopped_by):
                click.echo(line)
    finally:
        con.close()


def _say_where_the_spans_are(say: Callable[[str], None], otlp_json: str | None, db_path: str | None) -> None:
    """Where the client spans were written, and how to read the run again (or that they were not kept)."""
    from analyzer.cli._command_name import tokentrace_command

    say("")
    if otlp_json:
        say(f"client spans: {otlp_json}")
    if db_path:
        say(f"client spans: {db_path}; read the run again with {tokentrace_command()} summary --db {db_path} "
            f"(or requests, itl, window)")
    else:
        say("the client spans were not kept: --db PATH keeps them for tokentrace summary, requests, itl ...")


def _print_per_request(con) -> None:
    """--per-request: every request's row, the window table and each request's ids, under
    requests.sql's column names (what joins them to its csv/json and to itl's and stalls'):
    response_id, client_request_id, request_span_id and trace_id, the last left out (and
    named) where the terminal is too narrow for it."""
    from analyzer.cli._human import Col, View, render, terminal_width
    from analyzer.cli.demo import print_query_results
    from analyzer.verbs.demo import summary_queries

    results_by_query = summary_queries(con, perspective="client", skew=False)
    print_query_results(results_by_query)
    requests_result = results_by_query["requests"]
    ids = View(tuple(Col(name, name, rank=1 if name == "trace_id" else 0, cut=name != "request_span_id")
                     for name in ("response_id", "client_request_id", "request_span_id", "trace_id")))
    click.echo("\nRequest ids (queries/requests.sql; X-Request-ID = client_request_id)")
    for line in render(ids, requests_result.columns, requests_result.rows, width=terminal_width(),
                       columns_flag=False):
        click.echo(line)
