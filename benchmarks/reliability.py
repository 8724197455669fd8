"""Reliability scenarios: export faults, receiver restarts, duplicate deliveries, serving
overload, disconnects and slow clients, each with a count of what was tried and what was lost.

    .venv/bin/python benchmarks/reliability.py                 # default (larger) counts
    .venv/bin/python benchmarks/reliability.py --scale 0.25    # quicker
    TOKENTRACE_FUZZ_EXAMPLES=400 .venv/bin/python benchmarks/reliability.py --fuzz

Prints one Markdown table (docs/reliability.md holds the last run). The tests in
tests/test_reliability_*.py call the same functions with small counts and assert that
nothing is unaccounted for. Everything runs on 127.0.0.1; every wait is bounded.

Definitions (one place, used by every row):
- ``tried``: the unit the scenario counts (spans submitted to the exporter, requests sent,
  batches delivered, corrupted files loaded).
- ``lost``: tried units that are in none of the accounted outcomes: for export, spans not
  counted as exported, failed or dropped (``instrument.export_health``), or counted as
  exported but absent at the endpoint; for serving, requests without a completion, a 429,
  or a cancelled/ended gateway span; for loads, records_read != loaded + duplicates + rejected.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import socket
import statistics
import sys
import threading
import time
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any, Iterator

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

PROMPT = "Show me wheelchair-accessible hotels in Kyoto under $200/night with onsen access."
EXPORT_TIMEOUT_ENV = "OTEL_EXPORTER_OTLP_TRACES_TIMEOUT"


# --------------------------------------------------------------------------------------
# A loopback OTLP/HTTP endpoint that can be healthy, answer 503, or be slow
# --------------------------------------------------------------------------------------
class FaultEndpoint:
    """OTLP/HTTP traces endpoint on 127.0.0.1. ``mode``: ``ok`` (200, spans recorded),
    ``503`` (Service Unavailable, nothing recorded), ``slow`` (sleeps ``slow_s`` then 200).
    ``mode`` may be changed while running (recovery). ``down()`` gives a closed port."""

    def __init__(self, mode: str = "ok", slow_s: float = 0.5) -> None:
        self.mode = mode
        self.slow_s = slow_s
        self.requests = 0
        self.span_ids: list[bytes] = []  # every span received in a 200 answer (repeats kept)
        self._lock = threading.Lock()
        endpoint = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args: Any) -> None:  # quiet
                pass

            def do_POST(self) -> None:  # noqa: N802
                from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
                    ExportTraceServiceRequest,
                    ExportTraceServiceResponse,
                )

                body = self.rfile.read(int(self.headers.get("content-length") or 0))
                with endpoint._lock:
                    endpoint.requests += 1
                mode = endpoint.mode
                if mode == "503":
                    self.send_response(503)
                    self.send_header("content-length", "0")
                    self.end_headers()
                    return
                if mode == "slow":
                    time.sleep(endpoint.slow_s)
                req = ExportTraceServiceRequest.FromString(body)
                ids = [s.span_id for rs in req.resource_spans for ss in rs.scope_spans for s in ss.spans]
                with endpoint._lock:
                    endpoint.span_ids.extend(ids)
                out = ExportTraceServiceResponse().SerializeToString()
                self.send_response(200)
                self.send_header("content-type", "application/x-protobuf")
                self.send_header("content-length", str(len(out)))
                self.end_headers()
                self.wfile.write(out)

        self._server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self._server.daemon_threads = True
        self.port = self._server.server_address[1]
        self._thread = threading.Thread(target=self._server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}/v1/traces"

    def __enter__(self) -> FaultEndpoint:
        self._thread.start()
        return self

    def __exit__(self, *exc: Any) -> None:
        self._server.shutdown()
        self._server.server_close()
        self._thread.join(5)


def closed_port() -> int:
    """A loopback port nothing listens on (bound, then closed)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@contextlib.contextmanager
def export_timeout(seconds: float) -> Iterator[None]:
    """The OTLP exporter's per-export deadline (retries included), restored afterwards."""
    old = os.environ.get(EXPORT_TIMEOUT_ENV)
    os.environ[EXPORT_TIMEOUT_ENV] = str(seconds)
    try:
        yield
    finally:
        if old is None:
            os.environ.pop(EXPORT_TIMEOUT_ENV, None)
        else:
            os.environ[EXPORT_TIMEOUT_ENV] = old


_TINY: tuple[Any, Any] | None = None


def tiny() -> tuple[Any, Any]:
    global _TINY
    if _TINY is None:
        from instrument import load_tiny_model

        _TINY = load_tiny_model()
    return _TINY


@dataclass
class ExportRun:
    """One export-fault run: generation timings and the exporter's span accounting."""

    mode: str
    requests: int
    per_request_s: list[float]
    shutdown_s: float
    counts: Any  # instrument.export_health.ExportCounts
    received: int  # spans the endpoint answered 200 for (repeats included)
    received_unique: int
    exported_ids: set[bytes] = field(default_factory=set)

    @property
    def median_s(self) -> float:
        return statistics.median(self.per_request_s)

    @property
    def unaccounted(self) -> int:
        c = self.counts
        return c.submitted - c.exported - c.failed - c.dropped - c.pending


def export_fault_runs(requests: int = 4, max_tokens: int = 32, timeout_s: float = 1.0) -> dict[str, ExportRun]:
    """The same traced generations (tiny model) with spans batched over OTLP/HTTP to a healthy
    endpoint, one answering 503, a slow one (answers after timeout_s / 2) and a closed port.

    Requests are interleaved across the four providers (round-robin), so CPU noise from
    other processes hits every mode alike; each provider is shut down (timed) at the end."""
    from instrument import setup_tracing, traced_generate
    from instrument.export_health import export_health

    model, tok = tiny()
    modes = ("ok", "503", "slow", "down")
    with contextlib.ExitStack() as stack:
        endpoints = {m: stack.enter_context(FaultEndpoint(m, slow_s=timeout_s / 2)) for m in modes[:3]}
        urls = {m: ep.url for m, ep in endpoints.items()}
        urls["down"] = f"http://127.0.0.1:{closed_port()}/v1/traces"
        with export_timeout(timeout_s):
            providers = {m: setup_tracing(f"reliability-{m}", exporter="otlp", protocol="http/protobuf",
                                          endpoint=urls[m]) for m in modes}
        for m in modes:  # warm-up: first call costs (not timed)
            traced_generate(model, tok, PROMPT, tracer_provider=providers[m], max_new_tokens=2, do_sample=False)
        times: dict[str, list[float]] = {m: [] for m in modes}
        for _ in range(requests):
            for m in modes:
                t0 = time.perf_counter()
                traced_generate(model, tok, PROMPT, tracer_provider=providers[m], max_new_tokens=max_tokens,
                                do_sample=False)
                times[m].append(time.perf_counter() - t0)
        runs = {}
        for m in modes:
            t0 = time.perf_counter()
            providers[m].shutdown()
            shutdown_s = time.perf_counter() - t0
            (counts,) = export_health(providers[m])
            ids = list(endpoints[m].span_ids) if m in endpoints else []
            runs[m] = ExportRun(m, requests, times[m], shutdown_s, counts, len(ids), len(set(ids)))
    return runs


@dataclass
class RecoveryRun:
    """Spans generated while the endpoint was failing, then after it came back."""

    how: str
    during_fault: int  # spans submitted while failing
    after_recovery: int  # spans submitted after it came back
    arrived_after_recovery: int  # of those, how many the endpoint has
    counts: Any


def recovery_503(requests: int = 2, max_tokens: int = 16, timeout_s: float = 1.0) -> RecoveryRun:
    """503 for a while, then 200: spans sent after recovery arrive, the earlier ones are failed (counted)."""
    from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

    from instrument import setup_tracing, traced_generate
    from instrument.export_health import export_health

    model, tok = tiny()
    memory = InMemorySpanExporter()
    with FaultEndpoint("503") as ep:
        with export_timeout(timeout_s):
            provider = setup_tracing("reliability", exporter="otlp", protocol="http/protobuf", endpoint=ep.url,
                                     span_exporters=[memory])
        for _ in range(requests):
            traced_generate(model, tok, PROMPT, tracer_provider=provider, max_new_tokens=max_tokens, do_sample=False)
        provider.force_flush()
        before = {s.context.span_id for s in memory.get_finished_spans()}
        ep.mode = "ok"
        for _ in range(requests):
            traced_generate(model, tok, PROMPT, tracer_provider=provider, max_new_tokens=max_tokens, do_sample=False)
        provider.shutdown()
        after = {s.context.span_id for s in memory.get_finished_spans()} - before
        got = {int.from_bytes(b, "big") for b in ep.span_ids}
    otlp = [c for c in export_health(provider) if c.name == "OTLPSpanExporter"][0]
    return RecoveryRun("503 then 200", len(before), len(after), len(after & got), otlp)


def recovery_receiver_restart(out_dir: Path, requests: int = 2, max_tokens: int = 16, timeout_s: float = 1.0) -> RecoveryRun:
    """The port closed (receiver not running), then the embedded receiver started on it, stopped
    (killed in-process) and restarted: every span submitted while it listened is on disk."""
    from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

    from analyzer.collect import Receiver
    from instrument import setup_tracing, traced_generate
    from instrument.export_health import export_health

    model, tok = tiny()
    port = closed_port()
    memory = InMemorySpanExporter()
    with export_timeout(timeout_s):
        provider = setup_tracing("reliability", exporter="otlp", protocol="http/protobuf",
                                 endpoint=f"http://127.0.0.1:{port}", span_exporters=[memory])
    for _ in range(requests):
        traced_generate(model, tok, PROMPT, tracer_provider=provider, max_new_tokens=max_tokens, do_sample=False)
    provider.force_flush()
    before = {s.context.span_id for s in memory.get_finished_spans()}
    for round_ in range(2):  # up, stop, up again on the same folder and port
        with Receiver(out_dir, grpc_addr=None, http_addr=f"127.0.0.1:{port}", grace_s=2.0):
            for _ in range(requests):
                traced_generate(model, tok, PROMPT, tracer_provider=provider, max_new_tokens=max_tokens, do_sample=False)
            provider.force_flush()
    provider.shutdown()
    after = {s.context.span_id for s in memory.get_finished_spans()} - before
    on_disk = {int(x, 16) for x in span_ids_in_folder(out_dir)}
    otlp = [c for c in export_health(provider) if c.name == "OTLPSpanExporter"][0]
    return RecoveryRun("closed port, then receiver up / restarted", len(before), len(after), len(after & on_disk), otlp)


def span_ids_in_folder(out_dir: Path) -> list[str]:
    """Span ids (hex) of every span in the receiver's OTLP/JSON lines files (repeats kept)."""
    import json

    ids = []
    for path in sorted(out_dir.glob("*.jsonl")):
        for line in path.read_text().splitlines():
            if line.strip():
                doc = json.loads(line)
                ids += [s["spanId"] for rs in doc.get("resourceSpans", []) for ss in rs.get("scopeSpans", [])
                        for s in ss.get("spans", [])]
    return ids
