"""``tokentrace bench`` against a real gateway on 127.0.0.1 (ephemeral port, tiny model)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Iterator

import pytest

pytest.importorskip("fastapi")
pytest.importorskip("torch")

from opentelemetry.sdk.trace import SpanLimits, TracerProvider  # noqa: E402
from opentelemetry.sdk.trace.export import SimpleSpanProcessor  # noqa: E402
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter  # noqa: E402

from analyzer.cli import cli  # noqa: E402
from instrument.client import poisson_arrival_offsets_s  # noqa: E402
from instrument.gateway.app import GatewaySettings, create_app  # noqa: E402
from instrument.gateway.server import ServerThread  # noqa: E402
from instrument.model_handle import load_model_handle  # noqa: E402


@pytest.fixture(scope="module")
def server() -> Iterator[tuple[ServerThread, InMemorySpanExporter]]:
    exporter = InMemorySpanExporter()
    provider = TracerProvider(span_limits=SpanLimits(max_events=2048))
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    srv = ServerThread(create_app(load_model_handle("tiny"), provider, GatewaySettings(api_keys=frozenset({"k"})))).start()
    yield srv, exporter
    srv.stop()


def test_bench_closed_loop_summary_from_sql(runner, server, tmp_path: Path) -> None:
    srv, exporter = server
    spans_file = tmp_path / "bench.jsonl"
    result = runner.invoke(cli, ["bench", "--url", srv.url, "--requests", "4", "--concurrency", "2", "--api-key", "k",
                                 "--max-tokens", "4", "--otlp-json", str(spans_file), "--clock-offset-ms", "-250"],
                           catch_exceptions=False)
    assert result.exit_code == 0, result.output
    assert "HTTP status: 200=4" in result.output
    assert "Window summary" in result.output and "attempted" in result.output
    client_spans = [s for line in spans_file.read_text().splitlines()
                    for rs in json.loads(line)["resourceSpans"] for ss in rs["scopeSpans"] for s in ss["spans"]]
    assert len(client_spans) == 4 and all(s["kind"] == 3 for s in client_spans)  # SPAN_KIND_CLIENT
    # traceparent join: every client trace has its gateway span on the server
    server_traces = {f"{s.context.trace_id:032x}" for s in exporter.get_finished_spans() if s.name == "gateway"}
    assert {s["traceId"] for s in client_spans} <= server_traces
    # the client clock was shifted back 250 ms: client start is before server arrival by more than that
    gw = {f"{s.context.trace_id:032x}": s.start_time for s in exporter.get_finished_spans() if s.name == "gateway"}
    assert all(gw[s["traceId"]] - int(s["startTimeUnixNano"]) > 250_000_000 for s in client_spans)


def test_bench_open_loop_and_errors(runner, server) -> None:
    srv, _ = server
    result = runner.invoke(cli, ["bench", "--url", srv.url, "--requests", "3", "--rate", "50", "--api-key", "k",
                                 "--max-tokens", "2"], catch_exceptions=False)
    assert result.exit_code == 0, result.output
    assert "Poisson rate 50/s" in result.output
    no_key = runner.invoke(cli, ["bench", "--url", srv.url, "--requests", "1", "--concurrency", "1"])
    assert no_key.exit_code == 1 and "401" in no_key.output
    both = runner.invoke(cli, ["bench", "--url", srv.url, "--requests", "1", "--concurrency", "1", "--rate", "1"])
    assert both.exit_code == 1 and "exactly one" in both.output


def test_poisson_arrivals_are_seeded() -> None:
    a = poisson_arrival_offsets_s(50, 10.0, seed=7)
    assert a == poisson_arrival_offsets_s(50, 10.0, seed=7) and a != poisson_arrival_offsets_s(50, 10.0, seed=8)
    assert a[0] == 0.0 and all(y > x for x, y in zip(a, a[1:]))
    assert 2.0 < a[-1] < 10.0  # 49 gaps of mean 0.1 s
