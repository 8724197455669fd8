"""Usage counts and TPOT on the real gateway: a real uvicorn server on 127.0.0.1 with the tiny
model (sequential engine, seeded sampling), its spans through the loaders' converter into
DuckDB, the analyzer's own views. Bounded: five requests, timeouts on every call.

- item 4: a non-streamed answer is one body write (f = e on the gateway span): its TPOT is
  NULL with its reason, and summary's server TPOT is the mean over the streamed requests only;
- item 8: usage.completion_tokens on a natural stop counts the stop token, as vLLM's does
  (tokentrace.generated_tokens G = O + 1);
- item 9: the per-request log line names the caller's X-Request-ID beside the response id.
"""

from __future__ import annotations

import json
from typing import Any

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
# "Kyoto", seed 21, max_tokens 64 on the tiny model (sequential engine): sampling ends on the
# stop token after 17 visible tokens (G = 18). Found by trying seeds 0..23; the others run to 64.
NATURAL_STOP = {"messages": [{"role": "user", "content": "Kyoto"}], "max_tokens": 64, "seed": 21}


def _body(stream: bool, **extra: Any) -> dict[str, Any]:
    body: dict[str, Any] = {"model": "tiny", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 8,
                            "ignore_eos": True, "seed": 1, "stream": stream, **extra}
    if stream:
        body["stream_options"] = {"include_usage": True}
    return body


@pytest.fixture(scope="module")
def run(request: pytest.FixtureRequest) -> dict[str, Any]:
    """Two streamed and two non-streamed answers of 8 tokens, one natural stop of each kind;
    each with its own X-Request-ID. Returns the responses, the gateway spans, log lines, and a
    DuckDB connection holding the spans."""
    import logging

    exporter = InMemorySpanExporter()
    provider = TracerProvider(span_limits=SpanLimits(max_events=256))
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    app = create_app(load_model_handle("tiny"), provider, GatewaySettings(engine="sequential", max_tokens_limit=64))
    lines: list[str] = []

    class Keep(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            lines.append(record.getMessage())

    logger, keep = logging.getLogger("tokentrace.gateway"), Keep()
    old_level = logger.level
    logger.addHandler(keep)
    logger.setLevel(logging.INFO)
    server = ServerThread(app).start()
    sent: dict[str, httpx.Response] = {}
    try:
        plan = [("stream-1", _body(True)), ("whole-1", _body(False)), ("stream-2", _body(True, seed=2)),
                ("whole-2", _body(False, seed=2)), ("natural-stop", {"model": "tiny", "stream": False, **NATURAL_STOP}),
                ("natural-stop-stream", {"model": "tiny", "stream": True, "stream_options": {"include_usage": True},
                                         **NATURAL_STOP})]
        for rid, body in plan:
            sent[rid] = httpx.post(server.url + "/v1/chat/completions", json=body, timeout=TIMEOUT_S,
                                   headers={"X-Request-ID": rid})
    finally:
        server.stop()
        logger.removeHandler(keep)
        logger.setLevel(old_level)
    assert all(r.status_code == 200 for r in sent.values())
    spans = {s.attributes["tokentrace.client_request_id"]: s for s in exporter.get_finished_spans()
             if s.name == "gateway"}
    con = connect()
    insert_rows(con, *rows_from_sdk_spans(exporter.get_finished_spans()))
    request.addfinalizer(con.close)
    return {"sent": sent, "spans": spans, "lines": [json.loads(x) for x in lines], "con": con}


def _usage(response: httpx.Response) -> dict[str, int]:
    if response.headers["content-type"].startswith("text/event-stream"):
        data = [json.loads(x[5:]) for x in response.text.splitlines() if x.startswith("data: {")]
        return next(d["usage"] for d in data if d.get("usage"))
    return response.json()["usage"]


def _tpot_from_span(span: Any) -> float:
    """(e - f) / 1e6 / (O - 1) from the gateway span's own visible chunk events (ms)."""
    times = [e.timestamp for e in span.events
             if e.name == "tokentrace.chunk" and e.attributes["tokentrace.chunk.visible"]]
    return (max(times) - min(times)) / 1e6 / (span.attributes["gen_ai.usage.output_tokens"] - 1)


def test_non_streamed_answer_has_null_tpot_with_its_reason(run: dict[str, Any]) -> None:
    rows = {r["client_request_id"]: r for r in run_query(run["con"], "requests", {"perspective": "server"}).dicts()}
    for rid in ("whole-1", "whole-2"):
        row, span = rows[rid], run["spans"][rid]
        visible = [e for e in span.events if e.name == "tokentrace.chunk" and e.attributes["tokentrace.chunk.visible"]]
        assert len(visible) == 1 and visible[0].attributes["tokentrace.chunk.tokens"] == 8  # one body write
        assert row["output_tokens"] == 8 and row["f_ns"] == row["e_ns"] == visible[0].timestamp
        assert row["tpot_ms"] is None and row["decode_output_tokens_per_second"] is None
        assert row["null_reason"] == ("tpot_ms and decode rate need e > f (the output arrived in one write: "
                                      "no per-token timing)")
        assert row["ttft_ms"] == row["e2e_ms"] == (visible[0].timestamp - span.start_time) / 1e6
    for rid in ("stream-1", "stream-2"):
        row = rows[rid]
        assert row["output_tokens"] == 8 and row["null_reason"] is None
        assert row["tpot_ms"] == pytest.approx(_tpot_from_span(run["spans"][rid]), rel=1e-12)


def test_summary_tpot_counts_only_streamed_requests(run: dict[str, Any]) -> None:
    summary = {r["metric"]: r for r in run_query(run["con"], "summary", {"perspective": "server"}).dicts()}
    tpot = summary["tpot_ms"]
    streamed = [_tpot_from_span(run["spans"][rid]) for rid in ("stream-1", "stream-2", "natural-stop-stream")]
    # 6 requests: the three streamed have a TPOT; the three non-streamed (natural stop included) none
    assert (tpot["count"], tpot["null_count"]) == (3, 3)
    assert tpot["mean"] == pytest.approx(sum(streamed) / 3, rel=1e-12)
    assert tpot["min"] == pytest.approx(min(streamed), rel=1e-12) and tpot["min"] > 0
    decode = summary["decode_output_tokens_per_second"]
    assert (decode["count"], decode["null_count"]) == (3, 3)


def test_usage_counts_the_stop_token_on_a_natural_stop(run: dict[str, Any]) -> None:
    answer = run["sent"]["natural-stop"].json()
    span = run["spans"]["natural-stop"]
    assert answer["choices"][0]["finish_reason"] == "stop"
    visible, generated = span.attributes["gen_ai.usage.output_tokens"], span.attributes["tokentrace.generated_tokens"]
    assert (visible, generated) == (17, 18)  # G = O + 1: the stop token is generated, not shown
    # vLLM's rule (docs/adapters.md): completion_tokens counts the stop token
    assert answer["usage"] == {"prompt_tokens": 19, "completion_tokens": 18, "total_tokens": 37}
    # the same answer streamed (same seed, same tokens): the usage chunk says the same
    streamed = run["spans"]["natural-stop-stream"]
    assert (streamed.attributes["gen_ai.usage.output_tokens"], streamed.attributes["tokentrace.generated_tokens"]) == \
        (17, 18)
    assert _usage(run["sent"]["natural-stop-stream"]) == answer["usage"]
    # a length stop has no stop token: usage = O = G on both bodies
    for rid in ("stream-1", "whole-1"):
        assert _usage(run["sent"][rid])["completion_tokens"] == 8
        assert run["spans"][rid].attributes["tokentrace.generated_tokens"] == 8


def test_log_line_names_the_callers_request_id(run: dict[str, Any]) -> None:
    by_id = {line["id"]: line for line in run["lines"] if line.get("event") == "request"}
    for rid, response in run["sent"].items():
        response_id = run["spans"][rid].attributes["gen_ai.response.id"]
        assert response.headers["x-request-id"] == rid
        line = by_id[response_id]
        assert line["client_request_id"] == rid
    stop = by_id[run["spans"]["natural-stop"].attributes["gen_ai.response.id"]]
    assert (stop["status"], stop["output_tokens"], stop["generated_tokens"]) == ("stop", 17, 18)
