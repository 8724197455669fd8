"""The traced gateway on a real uvicorn server (127.0.0.1, ephemeral port) with the tiny model.

Spans go to a local TracerProvider with an InMemorySpanExporter (never the global provider).
Every network call has a timeout and every loop is bounded.
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import time
from collections.abc import Iterator
from typing import Any

import pytest

pytest.importorskip("fastapi")
pytest.importorskip("torch")

import httpx
from opentelemetry.sdk.trace import SpanLimits, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from instrument.client import chat_body, stream_chat
from instrument.gateway.admission import AdmissionBudgets
from instrument.gateway.app import GatewaySettings, create_app
from instrument.gateway.server import ServerThread
from instrument.hf.model_handle import ModelHandle, load_model_handle
from instrument.otel.tracing import get_tracer

TIMEOUT_S = 30.0


@pytest.fixture(scope="module")
def handle() -> ModelHandle:
    return load_model_handle("tiny")


@pytest.fixture(scope="module", params=["sequential", "continuous"])
def engine(request: pytest.FixtureRequest) -> str:
    """Every gateway test runs on both engines (instrument/engines)."""
    return request.param


def _provider() -> tuple[TracerProvider, InMemorySpanExporter]:
    exporter = InMemorySpanExporter()
    provider = TracerProvider(span_limits=SpanLimits(max_events=4096))
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    return provider, exporter


class Served:
    """A running gateway with its span exporter."""

    def __init__(self, handle: ModelHandle, settings: GatewaySettings, engine: str) -> None:
        self.provider, self.exporter = _provider()
        self.app = create_app(handle, self.provider, dataclasses.replace(settings, engine=engine))
        self.server = ServerThread(self.app).start()
        self.url = self.server.url

    @property
    def gateway(self) -> Any:
        return self.app.state.gateway

    def spans(self, name: str | None = None) -> list[Any]:
        return [s for s in self.exporter.get_finished_spans() if name is None or s.name == name]

    def wait_idle(self, timeout_s: float = TIMEOUT_S) -> None:
        """Until every admitted request has finished (admission back to zero)."""
        deadline = time.monotonic() + timeout_s
        while self.gateway.admission.requests_in_flight and time.monotonic() < deadline:
            time.sleep(0.02)
        assert self.gateway.admission.requests_in_flight == 0

    def stop(self) -> None:
        self.server.stop()


@pytest.fixture(scope="module")
def served(handle: ModelHandle, engine: str) -> Iterator[Served]:
    s = Served(handle, GatewaySettings(max_tokens_limit=512, max_body_bytes=4096), engine)
    yield s
    s.stop()


def _post(url: str, body: Any, **kwargs: Any) -> httpx.Response:
    return httpx.post(url + "/v1/chat/completions", json=body, timeout=TIMEOUT_S, **kwargs)


def test_span_tree_and_traceparent_join(served: Served) -> None:
    client_provider, client_exporter = _provider()

    async def go() -> Any:
        async with httpx.AsyncClient(timeout=TIMEOUT_S) as http:
            return await stream_chat(http, served.url, chat_body("tiny", max_tokens=8),
                                     tracer=get_tracer(client_provider))

    result = asyncio.run(go())
    served.wait_idle()
    assert result.status_code == 200 and result.finish_reason in ("stop", "length")
    (client_span,) = client_exporter.get_finished_spans()
    assert client_span.name == "chat tiny" and client_span.kind.name == "CLIENT"
    trace_id = client_span.context.trace_id
    gateway = [s for s in served.spans("gateway") if s.context.trace_id == trace_id]
    assert len(gateway) == 1, "the gateway span joins the client's trace through traceparent"
    gw = gateway[0]
    assert gw.kind.name == "SERVER" and gw.parent.span_id == client_span.context.span_id
    children = [s for s in served.spans() if s.parent is not None and s.parent.span_id == gw.context.span_id]
    names = sorted(s.name for s in children)
    generated = gw.attributes["tokentrace.generated_tokens"]
    assert names.count("decode") == generated - 1
    assert [n for n in names if n != "decode"] == ["prefill", "queue", "tokenize"]
    tokenize = next(s for s in children if s.name == "tokenize")
    assert len(tokenize.attributes["tokentrace.template.sha256"]) == 64
    assert tokenize.attributes["tokentrace.input_tokens"] == gw.attributes["gen_ai.usage.input_tokens"]
    assert gw.attributes["gen_ai.response.id"] == result.request_id
    # usage agrees on both sides: the client records the usage it received, whose
    # completion_tokens counts a final stop token as vLLM's does (G; no stop sequences here);
    # chunk events on both spans
    assert client_span.attributes["gen_ai.usage.output_tokens"] == gw.attributes["tokentrace.generated_tokens"]
    server_chunks = [e for e in gw.events if e.name == "tokentrace.chunk"]
    client_chunks = [e for e in client_span.events if e.name == "tokentrace.chunk"]
    assert len(server_chunks) == len(client_chunks) == result.chunks
    visible_tokens = sum(e.attributes["tokentrace.chunk.tokens"] for e in server_chunks
                         if e.attributes["tokentrace.chunk.visible"])
    assert visible_tokens == gw.attributes["gen_ai.usage.output_tokens"]
    assert [e.attributes["tokentrace.chunk.index"] for e in server_chunks] == list(range(len(server_chunks)))


def test_non_streaming_and_completions_and_models(served: Served) -> None:
    r = _post(served.url, chat_body("tiny", max_tokens=4, stream=False))
    assert r.status_code == 200 and r.headers["x-request-id"] == r.json()["id"]
    assert r.json()["usage"]["completion_tokens"] <= 4
    r = httpx.post(served.url + "/v1/completions", json={"model": "tiny", "prompt": "Kyoto", "max_tokens": 4,
                                                         "stream": True}, timeout=TIMEOUT_S)
    lines = [line for line in r.text.splitlines() if line.startswith("data:")]
    assert r.status_code == 200 and lines[-1] == "data: [DONE]"
    assert json.loads(lines[0][5:])["object"] == "text_completion"
    models = httpx.get(served.url + "/v1/models", timeout=TIMEOUT_S).json()
    assert models["data"][0]["id"] == "tokentrace/tiny-llama-gqa-v1"
    assert httpx.get(served.url + "/health", timeout=TIMEOUT_S).json()["status"] == "ok"


@pytest.mark.parametrize(
    "patch, param",
    [
        ({"max_tokens": 0}, "max_tokens"),
        ({"max_tokens": 100_000}, "max_tokens"),
        ({"temperature": 2.5}, "temperature"),
        ({"top_p": 0}, "top_p"),
        ({"messages": [{"role": "wizard", "content": "hi"}]}, "messages[0].role"),
        ({"messages": "hi"}, "messages"),
    ],
)
def test_validation_400_names_the_field(served: Served, patch: dict[str, Any], param: str) -> None:
    body = {**chat_body("tiny", max_tokens=4, stream=False), **patch}
    r = _post(served.url, body)
    assert r.status_code == 400
    assert r.json()["error"]["param"] == param
    assert param.split("[")[0] in r.json()["error"]["message"]


def test_unknown_model_is_404_model_not_found(served: Served) -> None:
    r = _post(served.url, {**chat_body("tiny", max_tokens=4, stream=False), "model": "gpt-9"})
    assert r.status_code == 404
    error = r.json()["error"]
    assert error["code"] == "model_not_found" and error["param"] == "model" and "gpt-9" in error["message"]


def test_413_body_too_large_and_400_bad_json(served: Served) -> None:
    r = _post(served.url, chat_body("tiny", prompt="x" * 10_000, stream=False))
    assert r.status_code == 413 and r.json()["error"]["code"] == "payload_too_large"
    r = httpx.post(served.url + "/v1/chat/completions", content=b"{nope", timeout=TIMEOUT_S)
    assert r.status_code == 400 and r.json()["error"]["param"] == "body"
    rejected = [s for s in served.spans("gateway") if s.attributes.get("http.response.status_code") == 413]
    assert rejected and rejected[-1].status.status_code.name == "ERROR"


def test_401_api_keys_and_429_rate_limit(handle: ModelHandle, engine: str) -> None:
    s = Served(handle, GatewaySettings(api_keys=frozenset({"k1"}), rate_limit_rps=0.5, rate_limit_burst=1), engine)
    try:
        body = chat_body("tiny", max_tokens=2, stream=False)
        assert _post(s.url, body).status_code == 401
        wrong = _post(s.url, body, headers={"authorization": "Bearer nope"})
        assert wrong.status_code == 401 and wrong.headers["www-authenticate"] == "Bearer"
        assert httpx.get(s.url + "/v1/models", timeout=TIMEOUT_S).status_code == 401
        ok = _post(s.url, body, headers={"authorization": "Bearer k1"})
        assert ok.status_code == 200
        limited = _post(s.url, body, headers={"authorization": "Bearer k1"})
        assert limited.status_code == 429 and int(limited.headers["retry-after"]) >= 1
        codes = sorted(sp.attributes["http.response.status_code"] for sp in s.spans("gateway"))
        assert codes == [200, 401, 401, 429]
    finally:
        s.stop()


def test_overload_burst_every_request_completes_or_gets_429(handle: ModelHandle, engine: str) -> None:
    s = Served(handle, GatewaySettings(budgets=AdmissionBudgets(max_queued_requests=2)), engine)
    client_provider, _ = _provider()
    burst = 10

    async def go() -> list[Any]:
        async with httpx.AsyncClient(timeout=TIMEOUT_S, limits=httpx.Limits(max_connections=burst)) as http:
            tracer = get_tracer(client_provider)
            return await asyncio.gather(*(stream_chat(http, s.url, chat_body("tiny", max_tokens=8), tracer=tracer,
                                                      index=i) for i in range(burst)))

    try:
        results = asyncio.wait_for(go(), TIMEOUT_S)
        results = asyncio.run(results)
        s.wait_idle()
        completed = [r for r in results if r.completed]
        refused = [r for r in results if r.status_code == 429]
        assert len(completed) + len(refused) == burst, [(r.status_code, r.error) for r in results]
        assert completed and refused
        assert all(r.retry_after_s is not None for r in refused)
        gateway = s.spans("gateway")
        assert len(gateway) == burst  # none lost: every request has exactly one ended gateway span
        assert s.gateway.admission.kv_bytes_in_flight == 0
    finally:
        s.stop()


def test_disconnect_mid_stream_stops_decoding(served: Served) -> None:
    client_provider, client_exporter = _provider()
    max_tokens = 512  # long enough that generation is still running when the client leaves

    async def go() -> Any:
        async with httpx.AsyncClient(timeout=TIMEOUT_S) as http:
            return await stream_chat(http, served.url, chat_body("tiny", max_tokens=max_tokens),
                                     tracer=get_tracer(client_provider), stop_after_chunks=2)

    result = asyncio.run(go())
    assert result.finish_reason == "cancelled"
    served.wait_idle()
    trace_id = client_exporter.get_finished_spans()[0].context.trace_id
    (gw,) = [sp for sp in served.spans("gateway") if sp.context.trace_id == trace_id]
    assert gw.attributes["gen_ai.response.finish_reasons"] == ("cancelled",)
    assert gw.status.status_code.name == "ERROR"
    generated = gw.attributes["tokentrace.generated_tokens"]
    assert generated < max_tokens
    decodes = [sp for sp in served.spans("decode") if sp.parent.span_id == gw.context.span_id]
    assert len(decodes) == generated - 1
    (cancel,) = [e for e in gw.events if e.name == "tokentrace.cancel"]
    after_cancel = [d for d in decodes if d.start_time > cancel.timestamp]
    assert len(after_cancel) <= 1, "generation stops within one decode step of the disconnect"
    # The chunk events written before the disconnect reach the cancelled span exactly once,
    # in order, before the cancel event (they are held until the request ends).
    names = [e.name for e in gw.events]
    chunks = [e for e in gw.events if e.name == "tokentrace.chunk"]
    assert len(chunks) >= 2, "the client read two chunks, so the server wrote at least two"
    assert [e.attributes["tokentrace.chunk.index"] for e in chunks] == list(range(len(chunks)))
    assert names.index("tokentrace.cancel") == len(chunks) and names[:len(chunks)] == ["tokentrace.chunk"] * len(chunks)
    assert sum(e.attributes["tokentrace.chunk.tokens"] for e in chunks
               if e.attributes["tokentrace.chunk.visible"]) == gw.attributes["gen_ai.usage.output_tokens"]


def test_admission_budgets_fail_fast_and_release() -> None:
    from instrument.gateway.admission import AdmissionController, AdmissionRefused

    adm = AdmissionController(AdmissionBudgets(max_queued_requests=3, max_queued_tokens=100, kv_budget_bytes=256 * 60),
                              kv_bytes_per_token=256)
    first = adm.admit(20, 10)  # 30 tokens, 7,680 KV bytes
    assert (first.queue_depth, first.tokens_ahead) == (0, 0)
    with pytest.raises(AdmissionRefused) as kv_full:
        adm.admit(20, 20)  # 40 more tokens: 70 x 256 bytes > the KV budget of 60 tokens
    assert kv_full.value.budget == "kv" and not kv_full.value.permanent
    with pytest.raises(AdmissionRefused) as never:
        adm.admit(90, 20)  # could never fit the token budget: answered 400, not 429
    assert never.value.permanent
    adm.release(first)
    adm.release(first)  # idempotent
    assert (adm.requests_in_flight, adm.tokens_in_flight, adm.kv_bytes_in_flight) == (0, 0, 0)
    assert adm.admit(20, 20).kv_bytes == 40 * 256


def test_kv_budget_over_http(handle: ModelHandle, engine: str) -> None:
    per_token = handle.kv_bytes_per_token
    assert per_token == 256  # tiny model: 2 x 2 layers x 2 kv heads x 8 head_dim x 4 bytes
    # 40 tokens of KV: the sequential engine admits by the logical figure (40 tokens); the
    # continuous engine sizes its paged cache to whole 16-token blocks (2 blocks, 32 tokens).
    s = Served(handle, GatewaySettings(budgets=AdmissionBudgets(kv_budget_bytes=per_token * 40)), engine)
    try:
        r = _post(s.url, chat_body("tiny", max_tokens=64, stream=False))
        assert r.status_code == 400 and r.json()["error"]["code"] == "context_budget_exceeded"
        assert _post(s.url, chat_body("tiny", prompt="hi", max_tokens=4, stream=False)).status_code == 200
    finally:
        s.stop()


def test_detokenizer_holds_back_split_characters(handle: ModelHandle) -> None:
    from instrument.gateway.request_state import Detokenizer

    tok = handle.tokenizer
    text = "Kyoto の温泉 hotels — onsen 🎌 ok"
    ids = tok(text)["input_ids"]
    assert len(ids) > len(text.split())  # the tiny BPE splits the multi-byte characters into bytes
    eos = tok.eos_token_id
    detok = Detokenizer(tok, {eos})
    pieces = [detok.push(i) for i in ids + [eos]]
    assert detok.text == text and "".join(d for d, _ in pieces) == text
    assert all("\ufffd" not in d for d, _ in pieces)
    assert sum(n for _, n in pieces) == len(ids) and detok.generated_tokens == len(ids) + 1


def test_structured_log_line_per_request(served: Served, caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level("INFO", logger="tokentrace.gateway"):
        r = _post(served.url, chat_body("tiny", max_tokens=3, stream=False))
        served.wait_idle()
    records = [json.loads(rec.getMessage()) for rec in caplog.records if rec.name == "tokentrace.gateway"]
    (line,) = [rec for rec in records if rec["id"] == r.json()["id"]]
    assert line["status"] in ("stop", "length") and line["http_status"] == 200
    # usage counts a final stop token (vLLM's rule): the generated tokens G, without stop sequences
    assert line["generated_tokens"] == r.json()["usage"]["completion_tokens"] and line["queue_wait_ms"] >= 0
    assert "client_request_id" in line and line["client_request_id"] is None  # no X-Request-ID sent


def test_gc_freeze_setting_moves_the_loaded_model_out_of_the_collectors_reach(handle: ModelHandle) -> None:
    """``gc_freeze=True`` (what ``tokentrace serve`` sets) freezes what is alive when the app is
    built; the default leaves the collector alone."""
    import gc

    provider, _ = _provider()
    gc.unfreeze()
    apps = []
    try:
        apps.append(create_app(handle, provider, GatewaySettings()))
        assert gc.get_freeze_count() == 0
        apps.append(create_app(handle, provider, GatewaySettings(gc_freeze=True)))
        assert gc.get_freeze_count() > 10_000  # the model and everything loaded with it
    finally:
        gc.unfreeze()
        # never served, so no lifespan stops them: each app's engine (the continuous
        # manager's generation thread is not a daemon) is closed here, or pytest cannot exit
        for app in apps:
            app.state.gateway.engine.close()
        provider.shutdown()
