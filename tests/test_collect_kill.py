"""Crash safety of ``tokentrace collect`` run as a real subprocess: every batch the receiver
acknowledged is on disk after SIGKILL, a restart on the same folder adds files beside the
old ones, and SIGTERM stops it cleanly. Loopback, ephemeral ports, bounded waits."""

from __future__ import annotations

import json
import os
import signal
import threading
import time
from pathlib import Path

import duckdb
import httpx
from click.testing import CliRunner
from opentelemetry.exporter.otlp.proto.grpc.trace_exporter import OTLPSpanExporter as GrpcSpanExporter
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest
from opentelemetry.proto.trace.v1.trace_pb2 import ResourceSpans, ScopeSpans, Span
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor

from analyzer.cli import cli
from collect_fixtures import start_collect

SEND_LIMIT = 3000  # requests at most while waiting for the kill
ACKS_BEFORE_KILL = 40


def _one_span_request(i: int) -> bytes:
    span = Span(trace_id=(i + 1).to_bytes(16, "big"), span_id=(i + 1).to_bytes(8, "big"), name=f"batch-{i}",
                start_time_unix_nano=1_700_000_000_000_000_000 + i, end_time_unix_nano=1_700_000_000_000_000_100 + i)
    return ExportTraceServiceRequest(resource_spans=[ResourceSpans(scope_spans=[ScopeSpans(spans=[span])])]).SerializeToString()


def _span_ids_on_disk(out_dir: Path) -> tuple[set[str], int]:
    """Span ids in complete lines; and how many files ended in a cut-off line."""
    ids: set[str] = set()
    cut = 0
    for path in sorted(out_dir.iterdir()):
        text = path.read_text(encoding="utf-8")
        lines = text.split("\n")
        if lines[-1]:  # no trailing newline: the last line was cut by the kill
            cut += 1
        for line in lines[:-1]:
            doc = json.loads(line)
            ids.update(sp["spanId"] for rs in doc["resourceSpans"] for ss in rs["scopeSpans"] for sp in ss["spans"])
    return ids, cut


def test_sigkill_loses_no_acknowledged_batch_and_restart_appends_beside(tmp_path: Path) -> None:
    out = tmp_path / "traces"
    proc, _grpc_port, http_port = start_collect(out)
    acked: list[str] = []
    stop_sending = threading.Event()

    def send() -> None:
        with httpx.Client(timeout=5.0) as client:
            for i in range(SEND_LIMIT):
                if stop_sending.is_set():
                    return
                try:
                    r = client.post(f"http://127.0.0.1:{http_port}/v1/traces", content=_one_span_request(i),
                                    headers={"Content-Type": "application/x-protobuf"})
                except httpx.HTTPError:
                    return  # the receiver is gone
                if r.status_code == 200:
                    acked.append((i + 1).to_bytes(8, "big").hex())

    sender = threading.Thread(target=send, daemon=True)
    sender.start()
    deadline = time.monotonic() + 15.0
    while len(acked) < ACKS_BEFORE_KILL and sender.is_alive() and time.monotonic() < deadline:
        time.sleep(0.01)
    os.kill(proc.pid, signal.SIGKILL)  # mid-stream: the sender is still posting
    proc.wait(timeout=10)
    stop_sending.set()
    sender.join(timeout=10)
    assert len(acked) >= ACKS_BEFORE_KILL
    on_disk, _ = _span_ids_on_disk(out)
    assert set(acked) <= on_disk
    first_files = set(out.iterdir())

    proc, grpc_port, _http_port = start_collect(out)
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(GrpcSpanExporter(endpoint=f"127.0.0.1:{grpc_port}", insecure=True, timeout=5)))
    tracer = provider.get_tracer("tokentrace", "1")
    for k in range(5):
        with tracer.start_as_current_span(f"after-restart-{k}"):
            pass
    provider.shutdown()
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(timeout=15) == 0
    assert "stopped: 5 requests, 5 spans written" in proc.stderr.read()  # type: ignore[union-attr]  # started with stderr=PIPE
    assert first_files < set(out.iterdir())  # old files kept, a new one beside them
    on_disk_after, _ = _span_ids_on_disk(out)
    assert set(acked) <= on_disk_after and len(on_disk_after) == len(on_disk) + 5

    db = tmp_path / "t.duckdb"
    result = CliRunner().invoke(cli, ["load", str(out), "--db", str(db), "--lenient", "-q"], catch_exceptions=False)
    assert result.exit_code == 0, result.output
    with duckdb.connect(str(db), read_only=True) as con:
        assert con.execute("SELECT count(*) FROM spans").fetchone()[0] == len(on_disk_after)
