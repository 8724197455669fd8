"""Reliability scenarios: export faults, receiver restarts, duplicate deliveries, serving
overload, disconnects and slow clients, each with a count of what was tried and what was lost.

    .venv/bin/python benchmarks/reliability.py                 # default (larger) counts
    .venv/bin/python benchmarks/reliability.py --scale 0.25    # quicker
    TOKENTRACE_FUZZ_EXAMPLES=400 .venv/bin/python benchmarks/reliability.py --fuzz

Prints one Markdown table (benchmarks/RESULTS.md holds the last run). The tests in
tests/test_reliability_*.py call the same functions with small counts and assert that
nothing is unaccounted for. Everything runs on 127.0.0.1; every wait is bounded.

Definitions (one place, used by every row):
- ``tried``: the unit the scenario counts (spans submitted to the exporter, requests sent,
  batches delivered, corrupted files loaded).
- ``lost``: tried units that are in none of the accounted outcomes: for export, spans not
  counted as exported, failed or dropped (``instrument.otel.export_health``), or counted as
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
from collections.abc import Iterator
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

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
    ``503`` (Service Unavailable, nothing recorded), ``slow`` (sleeps ``slow_s`` then 200;
    with ``hold`` set to an Event, waits until it is set instead, at most 60 s).
    ``mode`` may be changed while running (recovery). ``down()`` gives a closed port."""

    def __init__(self, mode: str = "ok", slow_s: float = 0.5) -> None:
        self.mode = mode
        self.slow_s = slow_s
        self.hold: threading.Event | None = None
        self.requests = 0
        self.span_ids: list[bytes] = []  # every span received in a 200 answer (repeats kept)
        self._lock = threading.Lock()
        endpoint = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args: Any) -> None:  # quiet
                pass

            def do_POST(self) -> None:
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
                if mode == "slow" and endpoint.hold is not None:
                    endpoint.hold.wait(60.0)
                elif mode == "slow":
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
    counts: Any  # instrument.otel.export_health.ExportCounts
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
    from instrument.otel.export_health import export_health

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
    from instrument.otel.export_health import export_health

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
    from instrument.otel.export_health import export_health

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
    for _round in range(2):  # up, stop, up again on the same folder and port
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


# --------------------------------------------------------------------------------------
# Serving: overload with disconnects, slow clients, export faults while serving
# --------------------------------------------------------------------------------------
_HANDLE: Any = None


def tiny_handle() -> Any:
    global _HANDLE
    if _HANDLE is None:
        from instrument.hf.model_handle import load_model_handle

        _HANDLE = load_model_handle("tiny")
    return _HANDLE


def memory_provider(exporter: str | None = None, endpoint: str | None = None) -> tuple[Any, Any]:
    """A provider with an InMemorySpanExporter (plus an OTLP exporter to ``endpoint`` if given)."""
    from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

    from instrument import setup_tracing

    memory = InMemorySpanExporter()
    provider = setup_tracing("reliability-gw", exporter=exporter or "none", protocol="http/protobuf",
                             endpoint=endpoint, span_exporters=[memory], batch=exporter is not None)
    return provider, memory


@contextlib.contextmanager
def gateway(settings: Any = None, exporter: str | None = None, endpoint: str | None = None) -> Iterator[Any]:
    """A running gateway on 127.0.0.1 (tiny model); yields (server, provider, memory)."""
    from instrument.gateway.app import create_app
    from instrument.gateway.server import ServerThread

    provider, memory = memory_provider(exporter, endpoint)
    app = create_app(tiny_handle(), provider, settings)
    server = ServerThread(app).start()
    try:
        yield server, provider, memory
    finally:
        server.stop()


def wait_idle(server: Any, timeout_s: float = 30.0) -> int:
    """Wait (bounded) until the gateway has no admitted request; returns those still in flight."""
    adm = server.config.app.state.gateway.admission
    deadline = time.monotonic() + timeout_s
    while adm.requests_in_flight and time.monotonic() < deadline:
        time.sleep(0.02)
    return adm.requests_in_flight


@dataclass
class OverloadRun:
    sent: int
    completed: int
    refused_429: int
    cancelled_by_client: int
    other: list[tuple[Any, Any]]  # (status, error) of anything else: lost
    hung: int  # requests without an answer within the per-request timeout
    gateway_spans: int
    client_traces_without_one_gateway_span: int
    cancelled_gateway_spans: int
    decode_steps_after_cancel_max: int
    in_flight_after: int
    kv_bytes_after: int

    @property
    def lost(self) -> int:
        return len(self.other) + self.hung + self.client_traces_without_one_gateway_span + self.in_flight_after


def overload(burst: int = 16, max_queued: int = 3, max_tokens: int = 12, disconnect_every: int = 4,
             request_timeout_s: float = 60.0) -> OverloadRun:
    """``burst`` concurrent streaming requests at a gateway that admits ``max_queued``; every
    ``disconnect_every``-th client leaves after its second chunk. Every request must end as a
    completion, a 429 or a client-side cancel, with exactly one gateway span in its trace."""
    import asyncio

    from instrument.client import chat_body, stream_chat
    from instrument.gateway.admission import AdmissionBudgets
    from instrument.gateway.app import GatewaySettings
    from instrument.otel.tracing import get_tracer

    client_provider, client_memory = memory_provider()
    settings = GatewaySettings(budgets=AdmissionBudgets(max_queued_requests=max_queued), max_tokens_limit=512)
    with gateway(settings) as (server, _provider, memory):
        async def one(http: Any, i: int) -> Any:
            stop = 2 if disconnect_every and i % disconnect_every == disconnect_every - 1 else None
            long = stop is not None  # a leaving client asks for many tokens: it is still decoding when it goes
            body = chat_body("tiny", max_tokens=256 if long else max_tokens)
            try:
                return await asyncio.wait_for(stream_chat(http, server.url, body, tracer=get_tracer(client_provider),
                                                          index=i, stop_after_chunks=stop), request_timeout_s)
            except asyncio.TimeoutError:
                return None

        async def go() -> list[Any]:
            import httpx

            async with httpx.AsyncClient(timeout=request_timeout_s, limits=httpx.Limits(max_connections=burst)) as http:
                return await asyncio.gather(*(one(http, i) for i in range(burst)))

        results = asyncio.run(go())
        in_flight = wait_idle(server)
        kv_after = server.config.app.state.gateway.admission.kv_bytes_in_flight
        spans = memory.get_finished_spans()
    gw = [s for s in spans if s.name == "gateway"]
    by_trace: dict[int, list[Any]] = {}
    for s in gw:
        by_trace.setdefault(s.context.trace_id, []).append(s)
    client_traces = {s.context.trace_id for s in client_memory.get_finished_spans()}
    unjoined = sum(1 for t in client_traces if len(by_trace.get(t, [])) != 1)
    cancelled = [s for s in gw if s.attributes.get("gen_ai.response.finish_reasons") == ("cancelled",)]
    decodes: dict[int, list[Any]] = {}
    for s in spans:
        if s.name == "decode" and s.parent is not None:
            decodes.setdefault(s.parent.span_id, []).append(s)
    after_cancel = [0]
    for s in cancelled:
        marks = [e.timestamp for e in s.events if e.name == "tokentrace.cancel"]
        if marks:
            after_cancel.append(sum(1 for d in decodes.get(s.context.span_id, []) if d.start_time > marks[0]))
    done = [r for r in results if r is not None]
    completed = sum(1 for r in done if r.completed)
    refused = sum(1 for r in done if r.status_code == 429)
    left = sum(1 for r in done if not r.completed and r.status_code == 200 and r.finish_reason == "cancelled")
    other = [(r.status_code, r.error) for r in done if not r.completed and r.status_code != 429
             and not (r.status_code == 200 and r.finish_reason == "cancelled")]
    return OverloadRun(burst, completed, refused, left, other, burst - len(done), len(gw), unjoined, len(cancelled),
                       max(after_cancel), in_flight, kv_after)


@dataclass
class SlowClientRun:
    slow_clients: int
    normal_clients: int
    normal_e2e_alone_s: float  # median E2E of the normal clients when the first clients read at full speed
    normal_e2e_with_slow_s: float  # the same when those first clients are slow readers
    slow_e2e_s: float
    all_completed: bool


def slow_clients(slow: int = 2, normal: int = 4, max_tokens: int = 24, read_delay_s: float = 0.05) -> SlowClientRun:
    """``slow`` clients that read slowly (sleep ``read_delay_s`` per received line), then ``normal``
    clients, against the same arrival pattern with fast readers: the model thread runs jobs in
    arrival order (the normal clients wait for the first ones' generation either way) but never
    for a reader, so the normal clients' E2E must not grow with the readers' slowness."""
    import asyncio

    import httpx

    from instrument.client import chat_body

    async def read(http: Any, url: str, delay: float) -> tuple[float, bool]:
        t0 = time.perf_counter()
        done = False
        async with http.stream("POST", url + "/v1/chat/completions", json=chat_body("tiny", max_tokens=max_tokens)) as r:
            async for line in r.aiter_lines():
                if line.strip() == "data: [DONE]":
                    done = True
                if delay:
                    await asyncio.sleep(delay)
        return time.perf_counter() - t0, done and r.status_code == 200

    with gateway() as (server, _provider, _memory):
        async def run(delay: float) -> list[tuple[float, bool]]:
            async with httpx.AsyncClient(timeout=60) as http:
                slow_tasks = [asyncio.create_task(read(http, server.url, delay)) for _ in range(slow)]
                await asyncio.sleep(0.05)
                normal_res = await asyncio.gather(*(read(http, server.url, 0) for _ in range(normal)))
                return list(normal_res) + list(await asyncio.gather(*slow_tasks))

        asyncio.run(run(0))  # warm-up
        alone = asyncio.run(run(0))
        mixed = asyncio.run(run(read_delay_s))
        wait_idle(server)
    return SlowClientRun(slow, normal, statistics.median(t for t, _ in alone[:normal]),
                         statistics.median(t for t, _ in mixed[:normal]),
                         statistics.median(t for t, _ in mixed[normal:]) if slow else 0.0,
                         all(ok for _, ok in alone + mixed))


@dataclass
class ServingExportRun:
    requests: int
    e2e_healthy_s: float
    e2e_failing_s: float
    counts: Any  # the OTLP exporter's counts (all failed or dropped, none unaccounted)
    gateway_spans_in_memory: int


def serving_with_export_down(requests: int = 4, max_tokens: int = 12, timeout_s: float = 1.0) -> ServingExportRun:
    """The same sequential requests through a gateway whose OTLP endpoint is a closed port, and
    through one exporting to memory only: latency unchanged, every OTLP span counted failed."""
    import httpx

    from instrument.client import chat_body
    from instrument.otel.export_health import export_health

    def timed(url: str) -> list[float]:
        out = []
        with httpx.Client(timeout=60) as http:
            for _ in range(requests + 1):  # the first is a warm-up
                t0 = time.perf_counter()
                r = http.post(url + "/v1/chat/completions", json=chat_body("tiny", max_tokens=max_tokens, stream=False))
                assert r.status_code == 200, r.text
                out.append(time.perf_counter() - t0)
        return out[1:]

    with gateway() as (server, _p, _m):
        healthy = timed(server.url)
    with export_timeout(timeout_s):
        with gateway(exporter="otlp", endpoint=f"http://127.0.0.1:{closed_port()}/v1/traces") as (server, provider, memory):
            failing = timed(server.url)
            wait_idle(server)
    provider.shutdown()
    otlp = [c for c in export_health(provider) if c.name == "OTLPSpanExporter"][0]
    gw = sum(1 for s in memory.get_finished_spans() if s.name == "gateway")
    return ServingExportRun(requests, statistics.median(healthy), statistics.median(failing), otlp, gw)


# --------------------------------------------------------------------------------------
# The table
# --------------------------------------------------------------------------------------
def fuzz_rows(examples: int) -> list[tuple[str, str, str, str, str]]:
    """Run tests/test_fuzz_loaders.py in-process with ``examples`` cases per property."""
    import pytest

    os.environ["TOKENTRACE_FUZZ_EXAMPLES"] = str(examples)
    code = pytest.main(["-q", "-p", "no:cacheprovider", str(REPO / "tests" / "test_fuzz_loaders.py")])
    mod = sys.modules.get("test_fuzz_loaders")
    tried = getattr(mod, "TRIED", {})
    rows = []
    for name, n in sorted(tried.items()):
        outcome = ("second copy: every span an identical duplicate" if name == "duplicate_delivery"
                   else "LoadError or counted rejects; no hang")
        rows.append(("loader fuzz", name.replace("_", " "), f"{n} cases", outcome, "0" if code == 0 else "see pytest"))
    return rows


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--scale", type=float, default=1.0, help="multiply every count (default 1)")
    parser.add_argument("--fuzz", action="store_true", help="also run the loader fuzzers ($TOKENTRACE_FUZZ_EXAMPLES, default 200)")
    args = parser.parse_args(argv)
    n = lambda base: max(1, round(base * args.scale))  # noqa: E731 - a one-line scaling rule, named for the counts below
    import logging
    import tempfile

    logging.getLogger("opentelemetry").setLevel(logging.CRITICAL)  # the exporter's retry chatter
    rows: list[tuple[str, str, str, str, str]] = []
    runs = export_fault_runs(requests=n(8), max_tokens=64)
    ok = runs["ok"]
    for mode, run in runs.items():
        c = run.counts
        ratio = run.median_s / ok.median_s
        rows.append(("export", f"endpoint {mode} (HTTP/protobuf, {run.requests} generations)", f"{c.submitted} spans",
                     f"exported {c.exported}, failed {c.failed}, dropped {c.dropped}, arrived {run.received_unique}; "
                     f"E2E ×{ratio:.2f} of healthy; shutdown {run.shutdown_s:.1f} s",
                     str(run.unaccounted + (c.exported - run.received_unique))))
    rec = recovery_503(requests=n(4))
    rows.append(("export", f"recovery: {rec.how}", f"{rec.during_fault + rec.after_recovery} spans",
                 f"{rec.during_fault} failed (counted) while down; {rec.arrived_after_recovery}/{rec.after_recovery} arrived after",
                 str(rec.after_recovery - rec.arrived_after_recovery)))
    with tempfile.TemporaryDirectory() as tmp:
        rec = recovery_receiver_restart(Path(tmp) / "rx", requests=n(4))
    rows.append(("export", f"recovery: {rec.how}", f"{rec.during_fault + rec.after_recovery} spans",
                 f"{rec.during_fault} failed (counted) while down; {rec.arrived_after_recovery}/{rec.after_recovery} on disk",
                 str(rec.after_recovery - rec.arrived_after_recovery)))
    ov = overload(burst=n(48), max_queued=4, max_tokens=12, disconnect_every=4)
    rows.append(("serving", f"overload burst of {ov.sent} (capacity 4), every 4th client leaves mid-stream",
                 f"{ov.sent} requests",
                 f"{ov.completed} completed, {ov.refused_429} × 429, {ov.cancelled_by_client} cancelled; hung {ov.hung}; "
                 f"{ov.gateway_spans} gateway spans; decode steps after a cancel ≤ {ov.decode_steps_after_cancel_max}",
                 str(ov.lost)))
    sc = slow_clients(slow=n(3), normal=n(6), max_tokens=24)
    rows.append(("serving", f"{sc.slow_clients} slow readers ahead of {sc.normal_clients} normal clients",
                 f"{sc.slow_clients + sc.normal_clients} requests ×2",
                 f"normal E2E {sc.normal_e2e_with_slow_s:.2f} s vs {sc.normal_e2e_alone_s:.2f} s with fast readers ahead",
                 "0" if sc.all_completed else "incomplete"))
    se = serving_with_export_down(requests=n(8))
    c = se.counts
    rows.append(("serving", f"OTLP endpoint down while serving ({se.requests} requests)", f"{c.submitted} spans",
                 f"E2E {se.e2e_failing_s:.2f} s vs {se.e2e_healthy_s:.2f} s healthy; failed {c.failed}, dropped {c.dropped}",
                 str(c.submitted - c.exported - c.failed - c.dropped - c.pending)))
    if args.fuzz:
        rows += fuzz_rows(int(os.environ.get("TOKENTRACE_FUZZ_EXAMPLES", "200")))
    print("| area | scenario | tried | outcome | lost (unaccounted) |")
    print("|---|---|---|---|---|")
    for row in rows:
        print("| " + " | ".join(row) + " |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
