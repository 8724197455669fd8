"""``tokentrace collect``: an embedded OTLP receiver writing OTLP/JSON lines files."""

from __future__ import annotations

import signal
import sys
import threading
from typing import Any

import click

from analyzer.cli.group import cli
from analyzer.cli.options import UserError

__all__ = ["collect_command"]

WAIT_SLICE_S = 0.5  # how often the main thread wakes while waiting for a signal


@cli.command("collect")
@click.option("--grpc", "grpc_addr", default="127.0.0.1:4317", show_default=True, metavar="HOST:PORT|off",
              help="OTLP/gRPC listen address (port 0 = ephemeral).")
@click.option("--http", "http_addr", default="127.0.0.1:4318", show_default=True, metavar="HOST:PORT|off",
              help="OTLP/HTTP listen address for POST /v1/traces (protobuf or JSON, gzip allowed).")
@click.option("--out", "out_dir", required=True, type=click.Path(file_okay=False), metavar="DIR",
              help="Folder for the OTLP/JSON lines files (created if missing).")
@click.option("--format", "out_format", type=click.Choice(["jsonl"]), default="jsonl", show_default=True,
              help="Output format: OTLP/JSON lines, one ExportTraceServiceRequest per line.")
@click.option("--rotate-mb", type=click.FloatRange(min=0.001), default=64.0, show_default=True,
              help="Start a new file when the current one would pass this size (MiB).")
@click.option("--fsync", is_flag=True, help="fsync every line before acknowledging (survives power loss).")
@click.option("--max-seconds", type=click.FloatRange(min=0), default=None,
              help="Stop by itself after this many seconds (default: run until SIGINT/SIGTERM).")
def collect_command(grpc_addr: str, http_addr: str, out_dir: str, out_format: str, rotate_mb: float,
                    fsync: bool, max_seconds: float | None) -> None:
    """Receive OTLP traces (gRPC and HTTP) and write them as OTLP/JSON lines.

    Every accepted Export request becomes one line, written and flushed before the sender
    is acknowledged. Files are named otlp-traces-<UTC time>-<counter>.jsonl inside DIR;
    a restart starts new files beside the old ones. Malformed requests get HTTP 400 /
    gRPC INVALID_ARGUMENT; spans with malformed ids are dropped and reported back as a
    partial success (rejected_spans). SIGINT or SIGTERM: finish in-flight requests, flush,
    close. Binds loopback by default: the receiver has no authentication.

    Prints one line 'listening grpc=HOST:PORT http=HOST:PORT out=DIR' when ready.

    \b
    Example:
      tokentrace collect --out ./traces
      OTEL_EXPORTER_OTLP_ENDPOINT=http://127.0.0.1:4318 python my_app.py
      tokentrace load ./traces && tokentrace requests
    """
    from analyzer.collect.receiver import Receiver, is_loopback

    try:
        receiver = Receiver(out_dir, grpc_addr, http_addr, rotate_bytes=int(rotate_mb * 1024 * 1024), fsync=fsync)
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
        try:
            receiver.start()
        except ImportError as exc:
            raise UserError(f"--http needs uvicorn and starlette ({exc.name} is missing)",
                            hint="pip install 'tokentrace[server]', or pass --http off") from None
        except OSError as exc:
            raise UserError(f"cannot listen: {exc}") from None
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
        for signum, handler in previous.items():
            signal.signal(signum, handler)
    s = receiver.stats
    click.echo(
        f"stopped: {s.requests_accepted} requests, {s.spans_written} spans written, {s.spans_rejected} rejected, "
        f"{s.requests_malformed} malformed requests, {len(receiver.files)} file(s)",
        err=True,
    )
