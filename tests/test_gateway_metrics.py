"""Server metrics (instrument/gateway/metrics.py): which environment asks for OTLP, and the
same instruments over OTLP/HTTP to a real receiver on 127.0.0.1 as in Prometheus text."""

from __future__ import annotations

import gzip
import http.server
import threading
from typing import Any

import pytest

pytest.importorskip("prometheus_client")
pytest.importorskip("opentelemetry.exporter.prometheus")

from opentelemetry.proto.collector.metrics.v1 import metrics_service_pb2
from prometheus_client.parser import text_string_to_metric_families

from instrument.gateway.metrics import TTFT_BUCKETS_S, ServerMetrics, otlp_metrics_requested


class _Engine:
    """The figures the gauges read (an engine's public properties)."""

    requests_running = 3
    requests_waiting = 5
    kv_blocks_used = 7

    class geometry:
        blocks_total = 48


def test_which_environment_asks_for_otlp() -> None:
    assert not otlp_metrics_requested({})
    assert otlp_metrics_requested({"OTEL_EXPORTER_OTLP_ENDPOINT": "http://127.0.0.1:4318"})
    assert not otlp_metrics_requested({"OTEL_EXPORTER_OTLP_ENDPOINT": "http://x:4318", "OTEL_METRICS_EXPORTER": "none"})
    assert otlp_metrics_requested({"OTEL_METRICS_EXPORTER": "prometheus,otlp"})
    with pytest.raises(ValueError, match="OTEL_METRICS_EXPORTER: unsupported exporter 'statsd'"):
        otlp_metrics_requested({"OTEL_METRICS_EXPORTER": "statsd"})


@pytest.fixture()
def receiver() -> Any:
    bodies: list[bytes] = []

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            raw = self.rfile.read(int(self.headers["Content-Length"]))
            bodies.append(gzip.decompress(raw) if self.headers.get("Content-Encoding") == "gzip" else raw)
            self.send_response(200)
            self.send_header("Content-Type", "application/x-protobuf")
            self.end_headers()
            self.wfile.write(metrics_service_pb2.ExportMetricsServiceResponse().SerializeToString())

        def log_message(self, *args: Any) -> None:
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}", bodies
    finally:
        server.shutdown()


def test_the_same_instruments_in_prometheus_text_and_over_otlp(receiver: Any) -> None:
    base, bodies = receiver
    metrics = ServerMetrics(_Engine(), environ={"OTEL_EXPORTER_OTLP_ENDPOINT": base})
    try:
        assert metrics.otlp
        attrs = {"gen_ai.operation.name": "chat", "gen_ai.request.model": "tiny", "gen_ai.system": "tokentrace"}
        ms = 1_000_000
        metrics.record_request(attrs, start_ns=0, first_token_ns=190 * ms, last_token_ns=3915 * ms,
                               output_tokens=150, end_ns=3915 * ms, error_type=None)
        metrics.step_scheduled(8)
        metrics.step_done(0.28)
        metrics.preempted("recompute")
        metrics.prefix_cache_queried(100, 64)
        families = {f.name: f for f in text_string_to_metric_families(metrics.prometheus_text().decode())}
        assert metrics.force_flush()
    finally:
        metrics.shutdown()

    def sample(name: str, suffix: str = "") -> float:
        family = families[name]
        return sum(s.value for s in family.samples if s.name == name + suffix)

    # the worked example: TTFT 190 ms, E2E 3,915 ms, TPOT (3915 - 190) / 149 = 25 ms
    assert sample("gen_ai_server_time_to_first_token_seconds", "_sum") == pytest.approx(0.190)
    assert sample("gen_ai_server_request_duration_seconds", "_sum") == pytest.approx(3.915)
    assert sample("gen_ai_server_time_per_output_token_seconds", "_sum") == pytest.approx(0.025)
    assert sample("tokentrace_engine_requests_waiting") == 5 and sample("tokentrace_engine_requests_running") == 3
    assert sample("tokentrace_engine_kv_blocks_used") == 7 and sample("tokentrace_engine_kv_blocks_total") == 48
    assert sample("tokentrace_engine_preemptions", "_total") == 1
    assert sample("tokentrace_engine_prefix_cache_hits", "_total") == 64
    assert sample("tokentrace_engine_step_duration_seconds", "_sum") == pytest.approx(0.28)

    # OTLP: the same instruments, semconv names and bucket boundaries
    received: dict[str, Any] = {}
    for body in bodies:
        request = metrics_service_pb2.ExportMetricsServiceRequest.FromString(body)
        for rm in request.resource_metrics:
            for sm in rm.scope_metrics:
                assert sm.scope.name == "tokentrace"
                for metric in sm.metrics:
                    received[metric.name] = metric
    assert {"gen_ai.server.time_to_first_token", "gen_ai.server.time_per_output_token",
            "gen_ai.server.request.duration", "tokentrace.engine.requests.waiting",
            "tokentrace.engine.kv.blocks_used", "tokentrace.engine.preemptions",
            "tokentrace.engine.prefix_cache.hits", "tokentrace.engine.step.duration",
            "tokentrace.engine.batch.size"} <= set(received)
    ttft = received["gen_ai.server.time_to_first_token"]
    assert ttft.unit == "s"
    (point,) = ttft.histogram.data_points
    assert tuple(point.explicit_bounds) == TTFT_BUCKETS_S and point.count == 1
    assert point.sum == pytest.approx(0.190)
    assert {a.key: a.value.string_value for a in point.attributes} == attrs
