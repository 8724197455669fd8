"""``Receiver``: an embedded OTLP trace receiver (gRPC and/or HTTP) writing OTLP/JSON lines
or a Parquet dump (``out_format="parquet"``).

Example::

    with Receiver("./traces", grpc_addr="127.0.0.1:0", http_addr="127.0.0.1:0") as rx:
        print(rx.grpc_port, rx.http_port)   # the bound (ephemeral) ports
        ...                                  # point OTLP exporters at them
    # stopped: in-flight requests finished, the current file flushed and closed
"""

from __future__ import annotations

import ipaddress
from pathlib import Path
from typing import Any

from analyzer.collect.sink import ReceiverStats, SpanWriter, TraceSink
from analyzer.collect.writer import DEFAULT_ROTATE_BYTES, FILE_PREFIX, FILE_SUFFIX, JsonlWriter

__all__ = [
    "DEFAULT_GRPC_ADDR",
    "DEFAULT_HTTP_ADDR",
    "DEFAULT_MAX_BODY_BYTES",
    "OUT_FORMATS",
    "Receiver",
    "format_address",
    "is_loopback",
    "parse_bind_address",
]

DEFAULT_GRPC_ADDR = "127.0.0.1:4317"
DEFAULT_HTTP_ADDR = "127.0.0.1:4318"
DEFAULT_MAX_BODY_BYTES = 64 * 1024 * 1024
DEFAULT_GRACE_S = 5.0
OFF = "off"
OUT_FORMATS: tuple[str, ...] = ("jsonl", "parquet")


def parse_bind_address(text: str | None, what: str = "address") -> tuple[str, int] | None:
    """``HOST:PORT`` / ``[IPv6]:PORT`` / ``:PORT`` (loopback) to ``(host, port)``; ``off``/None to None.

    HOST must be an IP literal or ``localhost`` (names are not resolved). PORT 0 asks for an
    ephemeral port. Raises ValueError with a one-line message naming ``what``.
    """
    if text is None or text.strip().lower() == OFF:
        return None
    raw = text.strip()
    if raw.startswith("["):
        host, sep, port_text = raw[1:].partition("]:")
        if not sep:
            raise ValueError(f"{what} {text!r}: expected [IPv6]:PORT")
    else:
        host, sep, port_text = raw.rpartition(":")
        if not sep:
            raise ValueError(f"{what} {text!r}: expected HOST:PORT (e.g. 127.0.0.1:4317) or 'off'")
        if ":" in host:
            raise ValueError(f"{what} {text!r}: write IPv6 hosts in brackets, e.g. [::1]:4317")
    host = host or "127.0.0.1"
    if host.lower() == "localhost":
        host = "127.0.0.1"
    try:
        ipaddress.ip_address(host)
    except ValueError:
        raise ValueError(f"{what} {text!r}: {host!r} is not an IP address (use 127.0.0.1, 0.0.0.0, [::1], ...)") from None
    if not port_text.isdigit() or not 0 <= int(port_text) <= 65535:
        raise ValueError(f"{what} {text!r}: port must be an integer 0..65535")
    return host, int(port_text)


def is_loopback(host: str) -> bool:
    return ipaddress.ip_address(host).is_loopback


def format_address(host: str, port: int) -> str:
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


def _check_out_dir(out: Path, out_format: str) -> None:
    """Refuse a folder holding the other format: ``tokentrace load DIR`` reads a folder with
    ``spans/`` as one Parquet dump and nothing else, so JSON lines there would be skipped."""
    if not out.is_dir():
        return
    if out_format == "parquet":
        jsonl = sorted(p.name for p in out.glob(f"{FILE_PREFIX}*{FILE_SUFFIX}"))
        if jsonl:
            raise ValueError(f"--out {str(out)!r} holds OTLP/JSON lines files ({jsonl[0]}, ...): "
                             "give --format parquet a folder of its own (tokentrace load would skip them)")
    elif (out / "spans").is_dir():
        raise ValueError(f"--out {str(out)!r} holds a Parquet dump (spans/): give --format jsonl a folder "
                         "of its own (tokentrace load would read only the Parquet)")


class Receiver:
    """OTLP trace receiver writing each accepted Export request into ``out_dir``: one OTLP/JSON
    line (``out_format="jsonl"``) or one Parquet part of a dump ``tokentrace load`` reads
    (``"parquet"``; see :mod:`analyzer.collect.parquet_layout`).

    ``grpc_addr`` / ``http_addr``: ``HOST:PORT`` (port 0 = ephemeral) or None/``"off"``.
    ``rotate_bytes``: jsonl: start a new file when the current one would pass this size;
    parquet: close the segment once its parts reach this size, then compact it (bytes).
    ``fsync``: fsync every line or part before acknowledging (slower, survives power loss).
    ``max_body_bytes``: largest request accepted, compressed or not (bytes).
    ``grace_s``: how long :meth:`stop` waits for in-flight requests (seconds).
    """

    def __init__(
        self,
        out_dir: str | Path,
        grpc_addr: str | None = DEFAULT_GRPC_ADDR,
        http_addr: str | None = DEFAULT_HTTP_ADDR,
        *,
        rotate_bytes: int = DEFAULT_ROTATE_BYTES,
        fsync: bool = False,
        out_format: str = "jsonl",
        max_body_bytes: int = DEFAULT_MAX_BODY_BYTES,
        grace_s: float = DEFAULT_GRACE_S,
    ) -> None:
        self.grpc_bind = parse_bind_address(grpc_addr, "--grpc")
        self.http_bind = parse_bind_address(http_addr, "--http")
        if self.grpc_bind is None and self.http_bind is None:
            raise ValueError("both --grpc and --http are off: nothing to receive on")
        if out_format not in OUT_FORMATS:
            raise ValueError(f"--format {out_format!r}: expected one of {', '.join(OUT_FORMATS)}")
        out = Path(out_dir)
        if out.exists() and not out.is_dir():
            raise ValueError(f"--out {str(out)!r} exists and is not a directory")
        _check_out_dir(out, out_format)
        self.out_dir = out
        self.out_format = out_format
        self.rotate_bytes = rotate_bytes
        self.fsync = fsync
        self.max_body_bytes = max_body_bytes
        self.grace_s = grace_s
        self.grpc_port: int | None = None
        self.http_port: int | None = None
        self._writer: SpanWriter | None = None
        self._sink: TraceSink | None = None
        self._grpc_server: Any = None
        self._http: Any = None

    @property
    def stats(self) -> ReceiverStats:
        return self._sink.stats if self._sink is not None else ReceiverStats()

    @property
    def files(self) -> list[Path]:
        """Files written since start, in order."""
        return list(self._writer.files) if self._writer is not None else []

    @property
    def grpc_address(self) -> str | None:
        if self.grpc_bind is None or self.grpc_port is None:
            return None
        return format_address(self.grpc_bind[0], self.grpc_port)

    @property
    def http_address(self) -> str | None:
        if self.http_bind is None or self.http_port is None:
            return None
        return format_address(self.http_bind[0], self.http_port)

    def start(self) -> Receiver:
        """Bind and serve; returns self. Raises OSError (bind), ImportError (no uvicorn for HTTP),
        ValueError (parquet: the folder is in use by another receiver)."""
        if self._sink is not None:
            raise RuntimeError("the receiver is already started")
        if self.out_format == "parquet":
            from analyzer.collect.parquet_writer import ParquetWriter

            self._writer = ParquetWriter(self.out_dir, rotate_bytes=self.rotate_bytes, fsync=self.fsync)
        else:
            self._writer = JsonlWriter(self.out_dir, rotate_bytes=self.rotate_bytes, fsync=self.fsync)
        self._sink = TraceSink(self._writer)
        try:
            if self.grpc_bind is not None:
                from analyzer.collect.grpc_service import start_grpc_server

                self._grpc_server, self.grpc_port = start_grpc_server(self._sink, *self.grpc_bind, self.max_body_bytes)
            if self.http_bind is not None:
                from analyzer.collect.http_app import start_http_server

                self._http = start_http_server(self._sink, *self.http_bind, self.max_body_bytes, self.grace_s)
                self.http_port = self._http.port
        except BaseException:
            self.stop()
            raise
        return self

    @property
    def writer(self) -> SpanWriter | None:
        """The writer (``JsonlWriter`` or ``ParquetWriter``) once started."""
        return self._writer

    def stop(self) -> None:
        """Stop accepting, finish in-flight requests (up to ``grace_s``), flush and close
        (parquet: compact the open segment too); idempotent."""
        if self._grpc_server is not None:
            self._grpc_server.stop(self.grace_s).wait(self.grace_s + 1.0)
            self._grpc_server = None
        if self._http is not None:
            self._http.stop(self.grace_s)
            self._http = None
        if self._writer is not None:
            self._writer.close()

    def __enter__(self) -> Receiver:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()
