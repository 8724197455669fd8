"""The continuous engine under KV pressure, with prefix caching, and its /metrics.

A real uvicorn server on 127.0.0.1 with the tiny model (256 KV bytes per token, 16-token
blocks), spans to an in-memory exporter, requests over real HTTP. Loads stay tiny.
"""

from __future__ import annotations

import asyncio
import time
from typing import Any

import pytest

pytest.importorskip("fastapi")
pytest.importorskip("torch")
pytest.importorskip("prometheus_client")

import httpx
from opentelemetry.sdk.trace import SpanLimits, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from prometheus_client.parser import text_string_to_metric_families

from analyzer.db.store import connect, insert_rows
from analyzer.db.views import install_views
from analyzer.formats.sdk_spans import rows_from_sdk_spans
from analyzer.query.runner import run_query
from instrument.client import chat_body, stream_chat
from instrument.gateway.admission import AdmissionBudgets
from instrument.gateway.app import GatewaySettings, create_app
from instrument.gateway.server import ServerThread
from instrument.hf.model_handle import ModelHandle, load_model_handle
from instrument.otel.tracing import get_tracer

TIMEOUT_S = 60.0
BLOCK = 16  # tokens per KV block
LONG_PROMPT = "The paged KV cache shares the blocks of a prompt prefix. " * 4


@pytest.fixture(scope="module")
def handle() -> ModelHandle:
    return load_model_handle("tiny")


class Served:
    def __init__(self, handle: ModelHandle, settings: GatewaySettings) -> None:
        self.exporter = InMemorySpanExporter()
        self.provider = TracerProvider(span_limits=SpanLimits(max_events=4096))
        self.provider.add_span_processor(SimpleSpanProcessor(self.exporter))
        self.app = create_app(handle, self.provider, settings)
        self.server = ServerThread(self.app).start()
        self.url = self.server.url

    @property
    def engine(self) -> Any:
        return self.app.state.gateway.engine

    def spans(self, name: str) -> list[Any]:
        return [s for s in self.exporter.get_finished_spans() if s.name == name]

    def children(self, gateway: Any, name: str) -> list[Any]:
        return sorted((s for s in self.spans(name) if s.parent is not None
                       and s.parent.span_id == gateway.context.span_id), key=lambda s: s.start_time)

    def wait_idle(self) -> None:
        deadline = time.monotonic() + TIMEOUT_S
        admission = self.app.state.gateway.admission
        while admission.requests_in_flight and time.monotonic() < deadline:
            time.sleep(0.02)
        assert admission.requests_in_flight == 0

    def __enter__(self) -> Served:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.server.stop()


def _run(url: str, bodies: list[dict[str, Any]], concurrency: int) -> list[Any]:
    """Streams ``bodies`` with at most ``concurrency`` in flight; results in body order."""
    async def go() -> list[Any]:
        gate = asyncio.Semaphore(concurrency)
        tracer = get_tracer(TracerProvider())

        async def one(http: httpx.AsyncClient, i: int, body: dict[str, Any]) -> Any:
            async with gate:
                return await stream_chat(http, url, body, tracer=tracer, index=i)

        async with httpx.AsyncClient(timeout=TIMEOUT_S, limits=httpx.Limits(max_connections=concurrency)) as http:
            return await asyncio.gather(*(one(http, i, b) for i, b in enumerate(bodies)))
    return asyncio.run(asyncio.wait_for(go(), TIMEOUT_S))


def _worst_case_blocks(handle: ModelHandle, prompt: str, max_tokens: int) -> int:
    ids = handle.tokenize([{"role": "user", "content": prompt}], None)
    return -(-(len(ids) + max_tokens) // BLOCK)


def test_kv_pressure_queues_instead_of_refusing(handle: ModelHandle) -> None:
    """A KV budget of three worst-case requests: 16 requests at concurrency 8 all succeed;
    the ones that waited show it in their queue span, with a queue depth > 0."""
    max_tokens = 24
    blocks = 3 * _worst_case_blocks(handle, "hi", max_tokens)
    per_block = BLOCK * handle.kv_bytes_per_token
    settings = GatewaySettings(engine="continuous", budgets=AdmissionBudgets(kv_budget_bytes=blocks * per_block),
                               engine_options={"prefix_caching": False})
    with Served(handle, settings) as served:
        results = _run(served.url, [chat_body("tiny", "hi", max_tokens=max_tokens, ignore_eos=True)
                                    for _ in range(16)], concurrency=8)
        served.wait_idle()
        assert all(r.completed for r in results), [(r.status_code, r.error) for r in results]
        assert all(r.output_tokens == max_tokens for r in results)
        queues = served.spans("queue")
        assert len(queues) == 16
        depths = [q.attributes["tokentrace.queue.depth"] for q in queues]
        assert max(depths) > 0, depths
        # some waited for blocks to free: their queue span spans the end of another request's
        # generation (its last decode step), and the scheduler was running others meanwhile
        last_decode_ends = [max(d.end_time for d in served.children(g, "decode")) for g in served.spans("gateway")]
        waited_for_blocks = [q for q in queues if any(q.start_time < end <= q.end_time for end in last_decode_ends)]
        assert len(waited_for_blocks) >= 4, [(q.end_time - q.start_time) / 1e6 for q in queues]
        assert all(q.attributes["tokentrace.queue.requests_in_flight"] >= q.attributes["tokentrace.queue.depth"]
                   for q in queues)
        # never more blocks in use than the cache has; all free at the end
        steps = served.spans("engine_step")
        assert max(s.attributes["tokentrace.kv.blocks_used"] for s in steps) <= blocks
        assert any(s.attributes["tokentrace.batch.waiting"] > 0 for s in steps)
        assert served.engine.health()["kv_blocks_used"] == 0
        assert served.engine.requests_waiting == 0 and served.engine.requests_running == 0


def _texts(served: Served, bodies: list[dict[str, Any]]) -> list[str]:
    results = _run(served.url, bodies, concurrency=len(bodies))
    served.wait_idle()
    assert all(r.completed for r in results), [(r.status_code, r.error) for r in results]
    return [r.text for r in results]


def test_a_full_cache_preempts_traces_it_and_the_text_is_unchanged(handle: ModelHandle) -> None:
    """Two sequences that each fit alone but outgrow the cache together: one is preempted
    (its blocks freed, recomputed later) and still returns the same greedy text."""
    prompts = ["Kyoto onsen hotels", "The quick brown fox"]
    max_tokens = 40
    need = max(_worst_case_blocks(handle, p, max_tokens) for p in prompts)
    bodies = [chat_body("tiny", p, max_tokens=max_tokens, ignore_eos=True) for p in prompts]
    roomy = GatewaySettings(engine="continuous", engine_options={"prefix_caching": False})
    with Served(handle, roomy) as served:
        expected = _texts(served, bodies)
        assert not any(e.name == "tokentrace.preemption" for g in served.spans("gateway") for e in g.events)
    per_block = BLOCK * handle.kv_bytes_per_token
    tight = GatewaySettings(engine="continuous", budgets=AdmissionBudgets(kv_budget_bytes=(need + 1) * per_block),
                            engine_options={"prefix_caching": False})
    with Served(handle, tight) as served:
        assert _texts(served, bodies) == expected, "a preempted greedy sequence returns the same text"
        assert served.engine.preemptions >= 1
        preempted = [g for g in served.spans("gateway") if any(e.name == "tokentrace.preemption" for e in g.events)]
        assert preempted
        for gw in preempted:
            (event, *_) = [e for e in gw.events if e.name == "tokentrace.preemption"]
            assert event.attributes["tokentrace.preemption.reason"] == "kv_cache_full"
            assert event.attributes["tokentrace.preemption.mode"] == "recompute"
            assert event.attributes["tokentrace.kv.blocks_freed"] >= 1
            prefills = served.children(gw, "prefill")
            recomputed = [p for p in prefills if p.attributes.get("tokentrace.prefill.recompute")]
            assert recomputed and all(p.start_time >= event.timestamp for p in recomputed)
            assert not prefills[0].attributes.get("tokentrace.prefill.recompute")
            # the recompute prefills the prompt and the tokens generated before the preemption
            assert recomputed[0].attributes["tokentrace.kv.bytes"] > prefills[0].attributes["tokentrace.kv.bytes"]
            assert gw.attributes["tokentrace.generated_tokens"] == max_tokens
            # decode step k keeps its token number: the steps a recompute prefill stood for
            # (it emitted their token) have no decode span, every other step has one
            steps = [d.attributes["tokentrace.step"] for d in served.children(gw, "decode")]
            assert len(steps) == len(set(steps)) and set(steps) < set(range(1, max_tokens))
            assert len(steps) == max_tokens - 1 - len(recomputed)
            # ... and the recompute chunk that emitted says which step it stood for (emitting token k + 1)
            stood_for = [p.attributes["tokentrace.step"] for p in recomputed if "tokentrace.step" in p.attributes]
            assert len(stood_for) == len(recomputed) and sorted(steps + stood_for) == list(range(1, max_tokens))
        assert served.engine.health()["kv_blocks_used"] == 0


def test_the_same_long_prompt_twice_reads_the_prefix_cache(handle: ModelHandle) -> None:
    with Served(handle, GatewaySettings(engine="continuous")) as served:
        body = chat_body("tiny", LONG_PROMPT, max_tokens=4, stream=False)
        first = httpx.post(served.url + "/v1/chat/completions", json=body, timeout=TIMEOUT_S).json()
        served.wait_idle()
        second = httpx.post(served.url + "/v1/chat/completions", json=body, timeout=TIMEOUT_S).json()
        stream = _run(served.url, [chat_body("tiny", LONG_PROMPT, max_tokens=4)], 1)[0]
        served.wait_idle()
        prompt_tokens = first["usage"]["prompt_tokens"]
        assert prompt_tokens > 2 * BLOCK
        assert first["usage"]["prompt_tokens_details"] == {"cached_tokens": 0}
        cached = second["usage"]["prompt_tokens_details"]["cached_tokens"]
        # every whole block of the prompt but the one holding its last token is shared
        shared_blocks = (prompt_tokens - 1) // BLOCK
        assert cached == shared_blocks * BLOCK > 0
        assert second["choices"][0]["message"]["content"] == first["choices"][0]["message"]["content"]
        gateways = {g.attributes["gen_ai.response.id"]: g for g in served.spans("gateway")}
        gw = gateways[second["id"]]
        assert gw.attributes["gen_ai.usage.cache_read.input_tokens"] == cached
        assert gw.attributes["tokentrace.kv.shared_bytes"] == shared_blocks * BLOCK * handle.kv_bytes_per_token
        first_prefill = served.children(gw, "prefill")[0]
        assert first_prefill.attributes["gen_ai.usage.cache_read.input_tokens"] == cached
        assert first_prefill.attributes["tokentrace.cached_tokens"] == cached
        assert first_prefill.attributes["tokentrace.prefill.tokens"] == prompt_tokens - cached
        assert served.children(gateways[first["id"]], "prefill")[0].attributes["tokentrace.cached_tokens"] == 0
        assert stream.completed and stream.input_tokens == prompt_tokens
        # cached blocks are not in use: a shared block counts once, an unreferenced cached one not at all
        health = served.engine.health()
        assert health["kv_blocks_used"] == 0 and health["kv_blocks_cached"] >= shared_blocks
        # /metrics: the prefix cache counters say the same
        families = _metrics(served)
        assert _value(families, "tokentrace_engine_prefix_cache_hits") == 2 * cached
        assert _value(families, "tokentrace_engine_prefix_cache_queries") == 3 * prompt_tokens
        # the analyzer: the token share of hits in summary and window, TTFT split by hit
        con = connect()
        try:
            insert_rows(con, *rows_from_sdk_spans(served.exporter.get_finished_spans()))
            install_views(con)
            summary = {r["metric"]: r for r in run_query(con, "summary", {"perspective": "server"}).dicts()}
            share = 2 * cached / (3 * prompt_tokens)
            assert summary["prefix_cache_hit_share"]["mean"] == pytest.approx(share)
            assert summary["prefix_cache_hit_share"]["count"] == 3
            assert summary["ttft_ms_prefix_cache_hit"]["count"] == 2
            assert summary["ttft_ms_prefix_cache_miss"]["count"] == 1
            (window,) = run_query(con, "window", {"perspective": "server"}).dicts()
            assert window["prefix_cache_hit_share"] == pytest.approx(share)
            assert window["prefix_cache_hit_requests"] == 2 and window["prefix_cache_note"] is None
        finally:
            con.close()


def test_no_prefix_caching_turns_it_off(handle: ModelHandle) -> None:
    settings = GatewaySettings(engine="continuous", engine_options={"prefix_caching": False})
    with Served(handle, settings) as served:
        body = chat_body("tiny", LONG_PROMPT, max_tokens=2, stream=False)
        for _ in range(2):
            r = httpx.post(served.url + "/v1/chat/completions", json=body, timeout=TIMEOUT_S).json()
        served.wait_idle()
        assert r["usage"]["prompt_tokens_details"] == {"cached_tokens": 0}
        assert served.engine.health()["kv_blocks_cached"] == 0


def _metrics(served: Served) -> dict[str, Any]:
    r = httpx.get(served.url + "/metrics", timeout=TIMEOUT_S)
    assert r.status_code == 200 and r.headers["content-type"].startswith("text/plain")
    return {f.name: f for f in text_string_to_metric_families(r.text)}


def _value(families: dict[str, Any], name: str, suffix: str = "_total") -> float:
    for family in families.values():
        for sample in family.samples:
            if sample.name == name + suffix:
                return sample.value
    raise AssertionError(f"{name}{suffix} not in /metrics: {sorted(families)}")


def test_metrics_parse_as_prometheus_text_and_count_the_requests(handle: ModelHandle) -> None:
    with Served(handle, GatewaySettings(engine="continuous")) as served:
        results = _run(served.url, [chat_body("tiny", p, max_tokens=6) for p in ("hi", "Kyoto", "fox")], 3)
        served.wait_idle()
        assert all(r.completed for r in results)
        families = _metrics(served)
        assert httpx.head(served.url + "/metrics", timeout=TIMEOUT_S).status_code == 200  # AIPerf's probe
        ttft = families["gen_ai_server_time_to_first_token_seconds"]
        assert ttft.type == "histogram"
        (count,) = [s for s in ttft.samples if s.name.endswith("_count")]
        assert count.value == 3
        assert count.labels["gen_ai_request_model"] == "tiny" and count.labels["gen_ai_operation_name"] == "chat"
        bounds = sorted(float(s.labels["le"]) for s in ttft.samples if s.name.endswith("_bucket"))
        assert bounds[:3] == [0.001, 0.005, 0.01] and bounds[-1] == float("inf")
        assert _value(families, "gen_ai_server_request_duration_seconds", "_count") == 3
        assert _value(families, "gen_ai_server_time_per_output_token_seconds", "_count") >= 1
        assert _value(families, "tokentrace_engine_requests_waiting", "") == 0
        assert _value(families, "tokentrace_engine_requests_running", "") == 0
        assert _value(families, "tokentrace_engine_kv_blocks_total", "") == served.engine.geometry.blocks_total
        assert _value(families, "tokentrace_engine_preemptions") == 0
        assert _value(families, "tokentrace_engine_batch_size", "_count") == \
            _value(families, "tokentrace_engine_step_duration_seconds", "_count") > 0


def test_a_full_queue_still_gets_429_with_retry_after(handle: ModelHandle) -> None:
    settings = GatewaySettings(engine="continuous", budgets=AdmissionBudgets(max_queued_requests=2))
    with Served(handle, settings) as served:
        results = _run(served.url, [chat_body("tiny", "hi", max_tokens=48, ignore_eos=True) for _ in range(6)], 6)
        served.wait_idle()
        refused = [r for r in results if r.status_code == 429]
        assert refused and all(r.retry_after_s is not None and int(r.retry_after_s) >= 1 for r in refused)
        assert sum(r.completed for r in results) + len(refused) == 6
        codes = {g.attributes.get("error.type") for g in served.spans("gateway")
                 if g.attributes["http.response.status_code"] == 429}
        assert codes == {"over_requests_budget"}


@pytest.mark.timing  # the long generation (400 tokens) must outlast --max-queue-wait-s (0.2 s)
def test_a_wait_past_max_queue_wait_s_gets_503_with_retry_after(handle: ModelHandle) -> None:
    """A long generation holds part of the cache; a longer prompt that fits the cache alone
    cannot be scheduled beside it and ends after --max-queue-wait-s with 503 + Retry-After
    (never half-run)."""
    per_block = BLOCK * handle.kv_bytes_per_token
    prompt, longer = LONG_PROMPT * 2, LONG_PROMPT * 4
    need = _worst_case_blocks(handle, prompt, 400)
    assert _worst_case_blocks(handle, prompt, 0) + _worst_case_blocks(handle, longer, 4) > need
    assert _worst_case_blocks(handle, longer, 4) <= need
    settings = GatewaySettings(engine="continuous", max_tokens_limit=512,
                               budgets=AdmissionBudgets(kv_budget_bytes=need * per_block),
                               engine_options={"max_queue_wait_s": 0.2, "prefix_caching": False})
    with Served(handle, settings) as served:
        async def go() -> list[httpx.Response]:
            async with httpx.AsyncClient(timeout=TIMEOUT_S) as http:
                long = http.post(served.url + "/v1/chat/completions",
                                 json=chat_body("tiny", prompt, max_tokens=400, stream=False, ignore_eos=True))
                task = asyncio.ensure_future(long)
                deadline = time.monotonic() + TIMEOUT_S
                while served.engine.requests_running == 0 and time.monotonic() < deadline:
                    await asyncio.sleep(0.005)
                waiting = await asyncio.gather(*(
                    http.post(served.url + "/v1/chat/completions", json=chat_body("tiny", longer, max_tokens=4,
                                                                                 stream=stream))
                    for stream in (False, True)))
                return [await task, *waiting]
        ran, *waited = asyncio.run(asyncio.wait_for(go(), TIMEOUT_S))
        served.wait_idle()
        assert ran.status_code == 200
        for response in waited:  # streamed too: its status line waits for the engine to schedule it
            assert response.status_code == 503 and int(response.headers["retry-after"]) >= 1
            assert response.json()["error"]["code"] == "queue_wait_exceeded"
        assert served.engine.requests_waiting == 0 and served.engine.health()["kv_blocks_used"] == 0
        refused = [g for g in served.spans("gateway") if g.attributes["http.response.status_code"] == 503]
        assert len(refused) == 2
        for gw in refused:
            assert gw.attributes["error.type"] == "QueueWaitExceeded"
            assert not served.children(gw, "prefill"), "it never ran"
            (queue,) = served.children(gw, "queue")
            assert (queue.end_time - queue.start_time) / 1e9 >= 0.2
        # a streamed request that is scheduled in time streams as usual
        (streamed,) = _run(served.url, [chat_body("tiny", "hi", max_tokens=4)], 1)
        assert streamed.completed and (streamed.output_tokens == 4 or streamed.finish_reason == "stop"), streamed
