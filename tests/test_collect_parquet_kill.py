"""Crash safety of ``tokentrace collect --format parquet`` run as a real subprocess: with a tiny
rotation size segments close and are compacted all through the stream, so SIGKILL lands among
writes, renames and compactions. Every acknowledged batch loads before and after the restart;
the restart finishes what the kill left; SIGTERM compacts everything. Loopback, ephemeral
ports, bounded waits."""

from __future__ import annotations

import os
import signal
import threading
import time
from pathlib import Path

import httpx
from opentelemetry.exporter.otlp.proto.grpc.trace_exporter import OTLPSpanExporter as GrpcSpanExporter
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest
from opentelemetry.proto.common.v1.common_pb2 import AnyValue, KeyValue
from opentelemetry.proto.resource.v1.resource_pb2 import Resource as ProtoResource
from opentelemetry.proto.trace.v1.trace_pb2 import ResourceSpans, ScopeSpans, Span
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor

from analyzer.collect.parquet_layout import PART_NAME, WORKSPACE
from analyzer.db.store import connect
from analyzer.formats.load import load_paths
from collect_fixtures import start_collect

SEND_LIMIT = 3000  # requests at most while waiting for the kill
ACKS_BEFORE_KILL = 40
ROTATE_MB = "0.02"  # about every second request closes a segment


def _span_id(i: int) -> str:
    return (i + 1).to_bytes(8, "big").hex()


def _request(i: int) -> bytes:
    """Request i: one span with two events; services alternate, so requests touch several partitions."""
    start = 1_700_000_000_000_000_000 + i
    span = Span(trace_id=(i + 1).to_bytes(16, "big"), span_id=(i + 1).to_bytes(8, "big"), name=f"batch-{i}",
                start_time_unix_nano=start, end_time_unix_nano=start + 100,
                events=[Span.Event(time_unix_nano=start + k, name=f"chunk-{k}") for k in range(2)])
    resource = ProtoResource(attributes=[KeyValue(key="service.name", value=AnyValue(string_value=f"svc-{i % 3}"))])
    return ExportTraceServiceRequest(
        resource_spans=[ResourceSpans(resource=resource, scope_spans=[ScopeSpans(spans=[span])])]).SerializeToString()


def _loaded(out: Path) -> tuple[set[str], int, int]:
    """Span ids `tokentrace load` finds in ``out``, its identical-duplicate count, and the events."""
    con = connect(":memory:")
    report = load_paths(con, [str(out)]).files[0]
    ids = {r[0] for r in con.execute("SELECT span_id FROM spans").fetchall()}
    events = con.execute("SELECT count(*) FROM span_events").fetchone()[0]
    assert report.spans_loaded == len(ids) and report.rejected == 0
    return ids, report.duplicates_identical, events


def test_sigkill_among_compactions_loses_no_acknowledged_batch_and_restart_recovers(tmp_path: Path) -> None:
    out = tmp_path / "traces"
    proc, _grpc_port, http_port = start_collect(out, "--format", "parquet", "--rotate-mb", ROTATE_MB)
    acked: list[str] = []
    sent: list[str] = []
    stop_sending = threading.Event()

    def send() -> None:
        with httpx.Client(timeout=5.0) as client:
            for i in range(SEND_LIMIT):
                if stop_sending.is_set():
                    return
                sent.append(_span_id(i))
                try:
                    r = client.post(f"http://127.0.0.1:{http_port}/v1/traces", content=_request(i),
                                    headers={"Content-Type": "application/x-protobuf"})
                except httpx.HTTPError:
                    return  # the receiver is gone
                if r.status_code == 200:
                    acked.append(_span_id(i))

    sender = threading.Thread(target=send, daemon=True)
    sender.start()
    deadline = time.monotonic() + 30.0
    while len(acked) < ACKS_BEFORE_KILL and sender.is_alive() and time.monotonic() < deadline:
        time.sleep(0.01)
    os.kill(proc.pid, signal.SIGKILL)  # mid-stream: the sender is still posting, segments still compacting
    proc.wait(timeout=10)
    stop_sending.set()
    sender.join(timeout=10)
    assert len(acked) >= ACKS_BEFORE_KILL

    before, _duplicates, _events = _loaded(out)  # no restart needed to read what was acknowledged
    assert set(acked) <= before

    proc, grpc_port, _http_port = start_collect(out, "--format", "parquet", "--rotate-mb", ROTATE_MB)
    provider = TracerProvider(resource=Resource.create({"service.name": "after-restart"}))
    memory_ids: list[str] = []
    provider.add_span_processor(SimpleSpanProcessor(GrpcSpanExporter(endpoint=f"127.0.0.1:{grpc_port}", insecure=True, timeout=5)))
    tracer = provider.get_tracer("tokentrace", "1")
    for k in range(5):
        with tracer.start_as_current_span(f"after-restart-{k}") as span:
            span.add_event("tokentrace.chunk", {"tokentrace.chunk.index": k})
            memory_ids.append(f"{span.get_span_context().span_id:016x}")
    provider.shutdown()
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(timeout=60) == 0
    stderr = proc.stderr.read()  # type: ignore[union-attr]  # started with stderr=PIPE
    assert "stopped: 5 requests, 5 spans written" in stderr, stderr

    # SIGTERM compacted everything; the restart finished whatever the kill left
    assert not [p for p in out.rglob("*") if p.is_file() and (PART_NAME.match(p.name) or p.name.endswith(".tmp"))]
    assert not list((out / WORKSPACE / "incoming").iterdir())
    after, duplicates, events = _loaded(out)
    assert duplicates == 0 and events == 2 * len(after - set(memory_ids)) + len(memory_ids)
    assert set(acked) <= after and before | set(memory_ids) <= after
    assert after - before - set(memory_ids) <= set(sent) - set(acked)  # only unacknowledged requests completed by the restart
