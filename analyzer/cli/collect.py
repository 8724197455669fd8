"""``tokentrace collect``: an embedded OTLP receiver writing OTLP/JSON lines files or a Parquet dump."""

from __future__ import annotations

import signal
import sys
import threading
from typing import Any

import click

from analyzer.cli._group import cli
from analyzer.errors import UserError

__all__ = ["collect_command"]

WAIT_SLICE_S = 0.5  # how often the main thread wakes while waiting for a signal


@cli.command("collect")
@click.option("--grpc", "grpc_addr", default="127.0.0.1:4317", show_default=True, metavar="HOST:PORT|off",
              help="OTLP/gRPC listen address (port 0 = ephemeral).")
@click.option("--http", "http_addr", default="127.0.0.1:4318", show_default=True, metavar="HOST:PORT|off",
              help="OTLP/HTTP listen address for POST /v1/traces (protobuf or JSON, gzip allowed).")
@click.option("--out", "out_dir", required=True, type=click.Path(file_okay=False), metavar="DIR",
              help="Output folder (created if missing); one format per folder.")
@click.option("--format", "out_format", type=click.Choice(["jsonl", "parquet"]), default="jsonl", show_default=True,
              help="jsonl: OTLP/JSON lines, one ExportTraceServiceRequest per line. parquet: the Hive-partitioned "
                   "dump `tokentrace export` writes (spans/, span_events/, span_links/), one part file per request.")
@click.option("--rotate-mb", type=click.FloatRange(min=0.001), default=64.0, show_default=True,
              help="jsonl: start a new file when the current one would pass this size. parquet: close the "
                   "segment once its part files reach this size and compact them, one file per partition (MiB).")
@click.option("--fsync", is_flag=True, help="fsync every line (part file) before acknowledging (survives power loss).")
@click.option("--max-seconds", type=click.FloatRange(min=0), default=None,
              help="Stop by itself after this many seconds (default: run until SIGINT/SIGTERM).")
def collect_command(grpc_addr: str, http_addr: str, out_dir: str, out_format: str, rotate_mb: float,
                    fsync: bool, max_seconds: float | None) -> None:
    """Receive OTLP traces (gRPC and HTTP) and write them as OTLP/JSON lines or Parquet.

    Every accepted Export request is written before the sender is acknowledged.
    jsonl: one line per request, in otlp-traces-<UTC time>-<counter>.jsonl files inside
    DIR; a restart starts new files beside the old ones. parquet: one part file per
    request and partition, moved into DIR/spans/service_name=.../date=.../ (and
    span_events/, span_links/) by an atomic rename; closed segments and the last one at
    SIGINT/SIGTERM are compacted into seg-<segment>.parquet; a restart finishes what a
    crash left (docs/jaeger.md). Malformed requests get HTTP 400 / gRPC
    INVALID_ARGUMENT; spans with malformed ids (parquet: any span the loader would
    reject) are dropped and reported back as a partial success (rejected_spans).
    SIGINT or SIGTERM: finish in-flight requests, flush, close. Binds loopback by
    default: the receiver has no authentication.

    Prints one line 'listening grpc=HOST:PORT http=HOST:PORT out=DIR' when ready.

    \b
    Example:
      tokentrace collect --out ./traces
      OTEL_EXPORTER_OTLP_ENDPOINT=http://127.0.0.1:4318 python my_app.py
      tokentrace load ./traces && tokentrace requests
      tokentrace collect --out ./traces-pq --format parquet --rotate-mb 16
      tokentrace load ./traces-pq
      tokentrace requests --parquet ./traces-pq   # or read the Parquet directly
    """
    from analyzer.collect.receiver import Receiver, is_loopback

    try:
        receiver = Receiver(out_dir, grpc_addr, http_addr, rotate_bytes=int(rotate_mb * 1024 * 1024), fsync=fsync,
                            out_format=out_format)
    except ValueError as exc:
        raise UserError(str(exc)) from None
    for bind, flag in ((receiver.grpc_bind, "--grpc"), (receiver.http_bind, "--http")):
        if bind is not None and not is_loopback(bind[0]):
            click.echo(f"warning: {flag} {bind[0]} accepts unauthenticated spans from the network", err=True)
    stop = threading.Event()
    previous: dict[int, Any] = {}

    def request_stop(signum: int, _frame: Any) -> None:
        stop.set()

    for signum in (signal.SIGINT, signal.SIGTERM):
        previous[signum] = signal.signal(signum, request_stop)
    try:
        _start(receiver)
        click.echo(
            f"listening grpc={receiver.grpc_address or 'off'} http={receiver.http_address or 'off'} out={receiver.out_dir}"
        )
        sys.stdout.flush()
        waited = 0.0
        while not stop.wait(WAIT_SLICE_S):
            waited += WAIT_SLICE_S
            if max_seconds is not None and waited >= max_seconds:
                break
    finally:
        receiver.stop()
        for number, handler in previous.items():
            signal.signal(number, handler)
    _say_stopped(receiver)


def _start(receiver: Any) -> None:
    """Start the receiver's listeners (a start error as one Error line) and say what a restart recovered."""
    try:
        receiver.start()
    except ImportError as exc:
        raise UserError(f"--http needs uvicorn and starlette ({exc.name} is missing)",
                        hint="pip install 'tokentrace[server]', or pass --http off") from None
    except ValueError as exc:
        raise UserError(str(exc)) from None
    except OSError as exc:
        raise UserError(f"cannot listen: {exc}") from None
    recovery = getattr(receiver.writer, "recovery", None)
    if recovery is not None and recovery.anything:
        click.echo(f"recovered {receiver.out_dir}: {recovery.summary()}", err=True)


def _say_stopped(receiver: Any) -> None:
    """The closing line on stderr: requests accepted, spans written / rejected, files, segments compacted."""
    s = receiver.stats
    compacted = getattr(receiver.writer, "segments_compacted", None)
    repeats = getattr(receiver.writer, "spans_repeated_identical", 0)  # parquet: counted in spans written, stored once
    click.echo(
        f"stopped: {s.requests_accepted} requests, {s.spans_written} spans written"
        + (f" ({repeats} of them identical repeats within a request, stored once)" if repeats else "")
        + f", {s.spans_rejected} rejected, {s.requests_malformed} malformed requests, {len(receiver.files)} file(s)"
        + (f", {compacted} segment(s) compacted" if compacted is not None else ""),
        err=True,
    )
