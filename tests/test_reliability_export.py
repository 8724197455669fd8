"""Export faults: the OTLP endpoint down (closed port), answering 503, slow; a full batch queue;
recovery; the embedded receiver restarted; the same batch delivered twice.

Real loopback servers (benchmarks/reliability.py's FaultEndpoint, analyzer.collect.Receiver),
the real OTLP/HTTP exporter and the tiny model. Every wait is bounded by the exporter's
deadline (OTEL_EXPORTER_OTLP_TRACES_TIMEOUT, 1 s here) or an explicit timeout.
"""

from __future__ import annotations

import logging
import sys
import threading
from pathlib import Path

import httpx
import pytest

pytest.importorskip("torch")

from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest
from opentelemetry.proto.trace.v1.trace_pb2 import ResourceSpans, ScopeSpans, Span
from opentelemetry.sdk.trace.export import SpanExportResult
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from analyzer.collect import Receiver
from analyzer.db.store import connect
from analyzer.formats.load import load_paths
from instrument import setup_tracing, traced_generate
from instrument.otel.export_health import LOGGER_NAME, CountingSpanExporter, export_health

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))
import reliability

SLACK_S = 0.3  # absolute allowance for CPU noise on shared runners, per request
RECOVERY_DEADLINE_S = 5.0  # export deadline (retries included) where a test asserts the recovered batches succeed


def test_counting_exporter_counts_success_failure_and_exceptions() -> None:
    provider = setup_tracing(exporter="none", span_exporters=[InMemorySpanExporter()], batch=False)
    tracer = provider.get_tracer("t")
    for _ in range(3):
        tracer.start_span("ok").end()
    (processor,) = provider._active_span_processor._span_processors
    processor.exporter.inner.shutdown()  # an InMemorySpanExporter that is shut down answers FAILURE
    for _ in range(2):
        tracer.start_span("refused").end()
    (counts,) = export_health(provider)
    assert (counts.submitted, counts.exported, counts.failed, counts.dropped, counts.pending) == (5, 3, 2, 0, 0)
    assert counts.batches_failed == 2 and counts.lost == 2
    provider.shutdown()

    class Raising(InMemorySpanExporter):
        def export(self, spans):  # an exporter bug: must not escape into the export thread
            raise RuntimeError("boom")

    wrapped = CountingSpanExporter(Raising())
    assert wrapped.export([object()] * 4) is SpanExportResult.FAILURE  # type: ignore[list-item]  # any objects: the exporter under test fails first
    assert wrapped.failed == 4 and "RuntimeError: boom" in (wrapped.last_error or "")


def test_setup_tracing_count_exports_off_keeps_the_plain_processors() -> None:
    provider = setup_tracing(exporter="none", span_exporters=[InMemorySpanExporter()], batch=False, count_exports=False)
    assert export_health(provider) == []


FAULT_REQUESTS = 5


@pytest.mark.timing  # durations compared (with SLACK_S); the slow endpoint answers 0.5 s inside a 1 s deadline
def test_endpoint_down_503_or_slow_does_not_slow_generation_and_every_span_is_counted(
        caplog: pytest.LogCaptureFixture) -> None:  # fmt: skip
    import torch

    caplog.set_level(logging.INFO, logger=LOGGER_NAME)
    # five requests a mode, interleaved, on one torch thread: with two CPU hogs beside it, two
    # intra-op threads made one generation take 0.05-1.8 s (a parallel region waits for its
    # descheduled thread) and a mode's median crossed the bound in 1 of ~10 stressed runs;
    # on one thread the medians were 0.05-0.10 s and within 1.25x of each other (4 runs)
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        runs = reliability.export_fault_runs(requests=FAULT_REQUESTS, max_tokens=24, timeout_s=1.0)
    finally:
        torch.set_num_threads(threads)
    ok = runs["ok"]
    spans = FAULT_REQUESTS * (1 + 1 + 23) + (1 + 1 + 1)  # generate + prefill + decodes, + warm-up
    for mode, run in runs.items():
        c = run.counts
        assert c.submitted == spans, mode
        assert run.unaccounted == 0 and c.pending == 0, (mode, c)
        assert run.median_s <= 1.5 * ok.median_s + SLACK_S, (mode, run.per_request_s, ok.per_request_s)
        assert run.shutdown_s < 3.0, (mode, run.shutdown_s)  # bounded by the 1 s export deadline
    assert runs["ok"].counts.exported == runs["ok"].received_unique == runs["ok"].counts.submitted
    assert runs["slow"].counts.exported == runs["slow"].received_unique == runs["slow"].counts.submitted
    for mode in ("503", "down"):
        assert runs[mode].counts.failed == runs[mode].counts.submitted and runs[mode].received == 0
    records = [r for r in caplog.records if r.name == LOGGER_NAME]
    # the first failure of each failing exporter: at once, one warning naming where it sends
    first = [r.getMessage() for r in records if "could not export" in r.getMessage()]
    assert len(first) == 2 and all(r.levelno == logging.WARNING for r in records if "could not export" in r.getMessage())
    assert all(" to http/protobuf http://127.0.0.1:" in m and "/v1/traces" in m for m in first), first
    lines = [r for r in records if "could not export" not in r.getMessage()]  # one at each shutdown
    assert len(lines) == 4
    assert sum(r.levelno == logging.WARNING for r in lines) == 2  # 503 and down lost spans: said loudly
    assert any(f"failed={spans}" in r.getMessage() for r in lines)


@pytest.mark.timing  # a bounded wait: the held export must end inside the 60 s deadline
def test_full_batch_queue_drops_are_counted(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("OTEL_BSP_MAX_QUEUE_SIZE", "8")
    monkeypatch.setenv("OTEL_BSP_MAX_EXPORT_BATCH_SIZE", "8")
    model, tok = reliability.tiny()
    # The endpoint holds every export until the generation is over: one batch of 8 in export,
    # 8 queued, the other 25 of the 41 spans dropped, however fast the machine generates (a
    # fixed 0.3 s export dropped none when a busy machine generated slowly).
    with reliability.FaultEndpoint("slow") as ep:
        ep.hold = threading.Event()
        with reliability.export_timeout(60.0):
            provider = setup_tracing("drops", exporter="otlp", protocol="http/protobuf", endpoint=ep.url)
        traced_generate(model, tok, reliability.PROMPT, tracer_provider=provider, max_new_tokens=40, do_sample=False)
        ep.hold.set()
        provider.shutdown()
        received = len(set(ep.span_ids))
    (c,) = export_health(provider)
    assert c.submitted == 41 and c.dropped >= 41 - 16, c  # at most one batch in export and one queued
    assert c.submitted == c.exported + c.failed + c.dropped and c.pending == 0, c
    assert received == c.exported  # what was counted as exported is what arrived


@pytest.mark.timing  # a delivered batch must beat the 5 s deadline
def test_export_resumes_after_503_recovery() -> None:
    # A 5 s deadline: the recovered export must not fail on a pause of the (shared, 2-core) CI
    # machine; CI once saw a delivered batch counted failed under the 1 s deadline.
    run = reliability.recovery_503(requests=1, max_tokens=12, timeout_s=RECOVERY_DEADLINE_S)
    assert run.during_fault == run.after_recovery == 13
    assert run.arrived_after_recovery == run.after_recovery
    assert run.counts.failed == run.during_fault and run.counts.exported == run.after_recovery, run


@pytest.mark.timing  # a delivered batch must beat the 5 s deadline
def test_closed_port_then_receiver_started_and_restarted(tmp_path: Path) -> None:
    run = reliability.recovery_receiver_restart(tmp_path / "rx", requests=1, max_tokens=8,
                                                timeout_s=RECOVERY_DEADLINE_S)
    assert run.after_recovery == 2 * 9 and run.arrived_after_recovery == run.after_recovery
    assert run.counts.failed == run.during_fault == 9 and run.counts.exported == run.after_recovery, run
    assert len(list((tmp_path / "rx").glob("*.jsonl"))) >= 2  # the restart wrote beside, not over


def _request(n: int) -> bytes:
    spans = [Span(trace_id=(7).to_bytes(16, "big"), span_id=(i + 1).to_bytes(8, "big"), name=f"s{i}",
                  start_time_unix_nano=1_700_000_000_000_000_000 + i, end_time_unix_nano=1_700_000_000_000_000_900 + i)
             for i in range(n)]  # fmt: skip
    return ExportTraceServiceRequest(resource_spans=[ResourceSpans(scope_spans=[ScopeSpans(spans=spans)])]).SerializeToString()


def test_same_batch_delivered_twice_is_deduplicated_on_load(tmp_path: Path) -> None:
    body = _request(5)
    with Receiver(tmp_path / "rx", grpc_addr=None, http_addr="127.0.0.1:0") as rx:
        for _ in range(2):  # an exporter retry after a lost acknowledgement
            r = httpx.post(f"http://127.0.0.1:{rx.http_port}/v1/traces", content=body,
                           headers={"content-type": "application/x-protobuf"}, timeout=10)
            assert r.status_code == 200
    con = connect()
    report = load_paths(con, [str(tmp_path / "rx")])
    assert report.total("spans_read") == 10
    assert report.total("spans_loaded") == 5 and report.total("duplicates_identical") == 5
    row = con.execute("SELECT sum(records_read), sum(spans_loaded), sum(duplicates_identical) FROM loads").fetchone()
    assert row == (2, 5, 5)
