"""requests.sql's response_id / client_request_id from the real gateway: a
real uvicorn server on 127.0.0.1 with the tiny model; its spans go to an InMemorySpanExporter
and into DuckDB through the same converter the loaders use. Bounded: two requests, timeouts."""

from __future__ import annotations

import pytest

pytest.importorskip("fastapi")
pytest.importorskip("torch")

import httpx
from opentelemetry.sdk.trace import SpanLimits, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from analyzer.db.store import connect, insert_rows
from analyzer.formats.sdk_spans import rows_from_sdk_spans
from analyzer.query.runner import run_query
from instrument.gateway.app import GatewaySettings, create_app
from instrument.gateway.server import ServerThread
from instrument.hf.model_handle import load_model_handle

TIMEOUT_S = 30.0


def test_gateway_ids_reach_the_requests_columns() -> None:
    exporter = InMemorySpanExporter()
    provider = TracerProvider(span_limits=SpanLimits(max_events=256))
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    app = create_app(load_model_handle("tiny"), provider, GatewaySettings(engine="sequential", max_tokens_limit=64))
    server = ServerThread(app).start()
    try:
        body = {"model": "tiny", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4}
        sent = httpx.post(server.url + "/v1/chat/completions", json=body, timeout=TIMEOUT_S,
                          headers={"X-Request-ID": "bench-7"})
        bare = httpx.post(server.url + "/v1/chat/completions", json=body, timeout=TIMEOUT_S)
    finally:
        server.stop()
    assert sent.status_code == bare.status_code == 200
    con = connect()
    insert_rows(con, *rows_from_sdk_spans(exporter.get_finished_spans()))
    rows = {r["response_id"]: r for r in run_query(con, "requests", {"perspective": "server"}).dicts()}
    assert set(rows) == {sent.json()["id"], bare.json()["id"]}
    with_id, without = rows[sent.json()["id"]], rows[bare.json()["id"]]
    assert with_id["client_request_id"] == "bench-7" and with_id["request_id_note"] is None
    assert without["client_request_id"] is None
    assert without["request_id_note"] == ("client_request_id NULL: the gateway span has no "
                                          "tokentrace.client_request_id (the request carried no X-Request-ID header)")
    assert with_id["output_tokens_basis"] == "gen_ai.usage.output_tokens"
