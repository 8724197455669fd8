"""Serving faults on a real gateway (uvicorn on 127.0.0.1, tiny model): an overload burst with
clients that leave mid-stream, slow readers beside normal clients, and an OTLP endpoint that is
down while serving. tests/test_gateway.py (helper-4) already covers a plain 429 burst and one
disconnect; here every request of a mixed burst is accounted for in the client *and* server
traces. Scenario code: benchmarks/reliability.py (the same functions with larger counts)."""

from __future__ import annotations

import sys
from pathlib import Path

import httpx
import pytest

pytest.importorskip("torch")
pytest.importorskip("fastapi")

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))
import reliability


@pytest.mark.timing  # a leaving client's decode must stop within one step of its disconnect
def test_overload_burst_with_leaving_clients_loses_nothing() -> None:
    run = reliability.overload(burst=12, max_queued=3, max_tokens=8, disconnect_every=4)
    assert run.hung == 0 and run.other == [], run
    assert run.completed + run.refused_429 + run.cancelled_by_client == run.sent, run
    assert run.completed >= 1 and run.refused_429 >= 1, run
    assert run.gateway_spans == run.sent  # one ended gateway span per request, rejected ones included
    assert run.client_traces_without_one_gateway_span == 0  # every client trace joins exactly one
    assert run.cancelled_gateway_spans == run.cancelled_by_client
    assert run.decode_steps_after_cancel_max <= 1  # a leaving client stops its decode within one step
    assert run.in_flight_after == 0 and run.kv_bytes_after == 0  # every budget released
    assert run.lost == 0


@pytest.mark.timing  # durations compared (1.5 x + 0.5 s)
def test_slow_readers_do_not_hold_back_other_clients() -> None:
    run = reliability.slow_clients(slow=2, normal=3, max_tokens=16, read_delay_s=0.05)
    assert run.all_completed
    # The model thread never waits for a reader: the normal clients' E2E is the same whether the
    # clients ahead of them read fast or slowly (bounds loose for shared CPUs).
    assert run.normal_e2e_with_slow_s <= 1.5 * run.normal_e2e_alone_s + 0.5, run


@pytest.mark.timing  # durations compared (1.5 x + 0.3 s)
def test_serving_with_the_otlp_endpoint_down_keeps_its_speed_and_counts_the_loss() -> None:
    run = reliability.serving_with_export_down(requests=3, max_tokens=8, timeout_s=1.0)
    assert run.e2e_failing_s <= 1.5 * run.e2e_healthy_s + 0.3, run
    c = run.counts
    assert c.submitted > 0 and c.exported == 0 and c.failed + c.dropped == c.submitted and c.pending == 0, c
    assert run.gateway_spans_in_memory == run.requests + 1  # the other exporter still got every span


def test_health_endpoint_reports_export_counts() -> None:
    with reliability.gateway() as (server, _provider, memory):
        r = httpx.post(server.url + "/v1/chat/completions", timeout=30,
                       json={"model": "tiny", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4})
        assert r.status_code == 200, r.text
        assert reliability.wait_idle(server) == 0
        health = httpx.get(server.url + "/health", timeout=10).json()
        spans = len(memory.get_finished_spans())
    # memory_provider() counts its one (in-memory, synchronous) exporter: instrument/otel/export_health.py
    (counts,) = health["export"]
    assert {"submitted", "exported", "failed", "dropped", "pending", "lost", "last_error"} <= set(counts)
    assert spans > 0 and counts["submitted"] == counts["exported"] == spans, (counts, spans)
    assert counts["failed"] == counts["dropped"] == counts["pending"] == counts["lost"] == 0
