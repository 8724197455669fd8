"""The continuous engine (transformers' own continuous batching) behind the real gateway.

A real uvicorn server on 127.0.0.1 with the tiny model, spans to an in-memory exporter. What
the span contract promises under batching (docs/spans.md, "Under continuous batching") is
checked against the engine's own objects: the paged cache's block tables and free pool.
"""

from __future__ import annotations

import asyncio
import math
import time
from collections import defaultdict
from typing import Any

import pytest

pytest.importorskip("fastapi")
torch = pytest.importorskip("torch")

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

TIMEOUT_S = 60.0
PROMPTS = ["hi", "Tell me about Kyoto hotels with onsen access. " * 3, "The quick brown fox", "KV cache " * 12]


@pytest.fixture(scope="module")
def handle() -> ModelHandle:
    return load_model_handle("tiny")


def _provider() -> tuple[TracerProvider, InMemorySpanExporter]:
    exporter = InMemorySpanExporter()
    provider = TracerProvider(span_limits=SpanLimits(max_events=4096))
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    return provider, exporter


class Served:
    def __init__(self, handle: ModelHandle, settings: GatewaySettings) -> None:
        self.provider, self.exporter = _provider()
        self.app = create_app(handle, self.provider, settings)
        self.server = ServerThread(self.app).start()
        self.url = self.server.url

    @property
    def engine(self) -> Any:
        return self.app.state.gateway.engine

    def spans(self, name: str | None = None) -> list[Any]:
        return [s for s in self.exporter.get_finished_spans() if name is None or s.name == name]

    def wait_idle(self) -> None:
        deadline = time.monotonic() + TIMEOUT_S
        admission = self.app.state.gateway.admission
        while admission.requests_in_flight and time.monotonic() < deadline:
            time.sleep(0.02)
        assert admission.requests_in_flight == 0
        # ... and the engine went idle after its last step: its open engine trace ended (the
        # gateway can finish the last request before the engine thread notices it is idle)
        while not self._engine_traces_closed() and time.monotonic() < deadline:
            time.sleep(0.02)
        assert self._engine_traces_closed(), "the engine trace never ended"

    def _engine_traces_closed(self) -> bool:
        """Every engine_step span exported is counted by an ended ``engine`` root."""
        roots = self.spans("engine")
        return bool(roots) and sum(r.attributes["tokentrace.engine.steps"] for r in roots) == len(
            self.spans("engine_step"))

    def stop(self) -> None:
        self.server.stop()


def _concurrent(url: str, bodies: list[dict[str, Any]], tracer: Any, **kwargs: Any) -> list[Any]:
    async def go() -> list[Any]:
        async with httpx.AsyncClient(timeout=TIMEOUT_S, limits=httpx.Limits(max_connections=len(bodies))) as http:
            return await asyncio.gather(*(stream_chat(http, url, body, tracer=tracer, index=i, **kwargs)
                                          for i, body in enumerate(bodies)))
    return asyncio.run(asyncio.wait_for(go(), TIMEOUT_S))


@pytest.fixture(scope="module")
def four_streams(handle: ModelHandle) -> Any:
    """Four concurrent streaming requests on --engine continuous, with client spans."""
    served = Served(handle, GatewaySettings(engine="continuous", max_tokens_limit=512))
    client_provider, client_exporter = _provider()
    try:
        bodies = [chat_body("tiny", prompt, max_tokens=24 + 4 * i) for i, prompt in enumerate(PROMPTS)]
        results = _concurrent(served.url, bodies, get_tracer(client_provider))
        served.wait_idle()
        yield served, results, client_exporter.get_finished_spans()
    finally:
        served.stop()


def test_every_request_has_its_whole_span_tree(four_streams: Any) -> None:
    served, results, client_spans = four_streams
    assert all(r.completed for r in results), [(r.status_code, r.error) for r in results]
    assert len(client_spans) == 4
    for client in client_spans:
        (gw,) = [s for s in served.spans("gateway") if s.parent and s.parent.span_id == client.context.span_id]
        children = [s for s in served.spans() if s.parent is not None and s.parent.span_id == gw.context.span_id]
        names = sorted(s.name for s in children)
        generated = gw.attributes["tokentrace.generated_tokens"]
        assert generated >= 1
        assert names.count("decode") == generated - 1
        assert names.count("prefill") >= 1 and names.count("queue") == 1 and names.count("tokenize") == 1
        decode_steps = sorted(s.attributes["tokentrace.step"] for s in children if s.name == "decode")
        assert decode_steps == list(range(1, generated))
        # every decode span lies inside the gateway span, after the prefill, in step order
        prefill_end = max(s.end_time for s in children if s.name == "prefill")
        decodes = sorted((s for s in children if s.name == "decode"), key=lambda s: s.attributes["tokentrace.step"])
        assert all(gw.start_time <= d.start_time <= d.end_time <= gw.end_time for d in decodes)
        assert all(d.start_time >= prefill_end for d in decodes)
        assert [d.attributes["tokentrace.engine.step"] for d in decodes] == sorted(
            d.attributes["tokentrace.engine.step"] for d in decodes)
        queue = next(s for s in children if s.name == "queue")
        first = min((s for s in children if s.name == "prefill"), key=lambda s: s.start_time)
        assert queue.end_time == first.start_time, "queue ends when the scheduler first runs the sequence"


def test_batching_is_visible_and_step_tokens_add_up(four_streams: Any) -> None:
    served, _, _ = four_streams
    steps = {s.attributes["tokentrace.engine.step"]: s for s in served.spans("engine_step")}
    request_spans = [s for s in served.spans() if s.name in ("prefill", "decode")]
    assert max(s.attributes["tokentrace.batch.size"] for s in request_spans if s.name == "decode") >= 2
    tokens_by_step: dict[int, int] = defaultdict(int)
    prefill_by_step: dict[int, int] = defaultdict(int)
    sequences_by_step: dict[int, int] = defaultdict(int)
    for s in request_spans:
        step = s.attributes["tokentrace.engine.step"]
        tokens = s.attributes["tokentrace.prefill.tokens"] if s.name == "prefill" else 1
        tokens_by_step[step] += tokens
        sequences_by_step[step] += 1
        if s.name == "prefill":
            prefill_by_step[step] += tokens
        assert steps[step].attributes["tokentrace.batch.size"] == s.attributes["tokentrace.batch.size"]
    assert set(tokens_by_step) == set(steps), "every step span is named by some request span and back"
    for step, span in steps.items():
        assert span.attributes["tokentrace.batch.tokens"] == tokens_by_step[step]
        assert span.attributes["tokentrace.batch.prefill_tokens"] == prefill_by_step[step]
        assert span.attributes["tokentrace.batch.size"] == sequences_by_step[step]
        assert span.kind.name == "INTERNAL"
    # engine_step spans live in traces of the engine's own, under an `engine` root
    roots = {s.context.span_id: s for s in served.spans("engine")}
    assert roots and all(s.parent.span_id in roots for s in steps.values())
    request_traces = {s.context.trace_id for s in served.spans("gateway")}
    assert not request_traces & {s.context.trace_id for s in steps.values()}
    assert sum(r.attributes["tokentrace.engine.steps"] for r in roots.values()) == len(steps)


def test_physical_kv_is_whole_blocks_and_matches_the_cache_accounting(four_streams: Any) -> None:
    served, _, _ = four_streams
    geometry = served.engine.geometry
    assert geometry.block_tokens == 16 and geometry.bytes_per_block == 16 * 256
    blocks_by_step: dict[int, int] = defaultdict(int)
    for s in served.spans():
        if s.name not in ("prefill", "decode"):
            continue
        physical = s.attributes["tokentrace.kv.physical_bytes"]
        logical = s.attributes["tokentrace.kv.bytes"]
        context = logical // 256
        assert physical == math.ceil(context / 16) * geometry.bytes_per_block
        assert physical >= logical
        blocks_by_step[s.attributes["tokentrace.engine.step"]] += physical // geometry.bytes_per_block
    # The step's own figure comes from the cache's free pool; the requests' from their block tables.
    for step in served.spans("engine_step"):
        assert step.attributes["tokentrace.kv.blocks_used"] == blocks_by_step[step.attributes["tokentrace.engine.step"]]
        assert step.attributes["tokentrace.kv.blocks_total"] == geometry.blocks_total
    for gw in served.spans("gateway"):
        last = max((s for s in served.spans("decode") if s.parent.span_id == gw.context.span_id),
                   key=lambda s: s.attributes["tokentrace.step"])
        assert gw.attributes["tokentrace.kv.physical_bytes"] == last.attributes["tokentrace.kv.physical_bytes"]
    assert served.engine.health()["kv_blocks_used"] == 0, "every block is back in the pool"


def test_disconnect_frees_the_sequence_within_one_step(handle: ModelHandle) -> None:
    served = Served(handle, GatewaySettings(engine="continuous", max_tokens_limit=512))
    client_provider, client_exporter = _provider()
    try:
        bodies = [chat_body("tiny", "keep going", max_tokens=400), chat_body("tiny", "stay", max_tokens=60)]

        async def go() -> list[Any]:
            async with httpx.AsyncClient(timeout=TIMEOUT_S) as http:
                tracer = get_tracer(client_provider)
                return await asyncio.gather(stream_chat(http, served.url, bodies[0], tracer=tracer, index=0,
                                                        stop_after_chunks=3),
                                            stream_chat(http, served.url, bodies[1], tracer=tracer, index=1))
        left, stayed = asyncio.run(asyncio.wait_for(go(), TIMEOUT_S))
        served.wait_idle()
        assert left.finish_reason == "cancelled" and stayed.completed
        (gw,) = [s for s in served.spans("gateway") if s.attributes["gen_ai.response.finish_reasons"] == ("cancelled",)]
        (cancel,) = [e for e in gw.events if e.name == "tokentrace.cancel"]
        mine = [s for s in served.spans("decode") if s.parent.span_id == gw.context.span_id]
        assert len([d for d in mine if d.start_time > cancel.timestamp]) <= 1
        assert gw.attributes["tokentrace.generated_tokens"] < 400
        # the engine steps after the cancel no longer hold its blocks: the pool is back to zero
        assert served.engine.health()["kv_blocks_used"] == 0
        assert not served.engine._live
    finally:
        served.stop()


def test_burst_over_the_kv_cache_waits_and_loses_nothing(handle: ModelHandle) -> None:
    per_block = 16 * handle.kv_bytes_per_token
    # 6 blocks of KV; each request can come to hold ceil((prompt + 32) / 16) = 3 blocks. Blocks
    # are allocated as sequences grow: what does not fit waits (or is preempted), none is refused.
    served = Served(handle, GatewaySettings(engine="continuous", budgets=AdmissionBudgets(kv_budget_bytes=6 * per_block)))
    client_provider, _ = _provider()
    try:
        results = _concurrent(served.url, [chat_body("tiny", "hi", max_tokens=32) for _ in range(8)],
                              get_tracer(client_provider))
        served.wait_idle()
        assert all(r.completed for r in results), [(r.status_code, r.error) for r in results]
        gateway = served.spans("gateway")
        assert len(gateway) == 8 and all(g.attributes["http.response.status_code"] == 200 for g in gateway)
        assert max(q.attributes["tokentrace.queue.depth"] for q in served.spans("queue")) > 0
        assert served.app.state.gateway.admission.kv_bytes_in_flight == 0
        assert served.engine.kv_capacity_bytes == 6 * per_block
    finally:
        served.stop()


def test_the_hooks_refuse_an_unchecked_transformers() -> None:
    """The continuous engine's hooks read transformers internals: pinned to the version they were read on."""
    import transformers

    from instrument.engines.continuous import hooks as cb_hooks

    assert transformers.__version__ == cb_hooks.TESTED_TRANSFORMERS
    cb_hooks.check_version()
    real = transformers.__version__
    transformers.__version__ = "5.99.0"
    try:
        with pytest.raises(ValueError, match="5.99.0 is installed"):
            cb_hooks.check_version()
    finally:
        transformers.__version__ = real


def test_the_install_pins_the_transformers_the_hooks_were_read_on() -> None:
    """A fresh install takes what pyproject allows: it must be the one version the hooks
    accept (transformers 5.25.0 appeared with the pin still open; the default engine then
    refused to start)."""
    from pathlib import Path

    try:
        import tomllib
    except ModuleNotFoundError:  # Python 3.10
        tomllib = pytest.importorskip("tomli")
    from instrument.engines.continuous import hooks as cb_hooks

    pyproject = tomllib.loads((Path(__file__).resolve().parents[1] / "pyproject.toml").read_text())
    hf = pyproject["project"]["optional-dependencies"]["hf"]
    assert [r for r in hf if r.startswith("transformers")] == [f"transformers=={cb_hooks.TESTED_TRANSFORMERS}"]


def test_a_process_that_never_closes_its_engine_still_exits() -> None:
    """The manager's loop thread is a daemon (cb_hooks.start_manager): apps built and never
    served, or scripts that forget close(), do not hang at exit."""
    import subprocess
    import sys

    code = ("from instrument.hf.model_handle import load_model_handle\n"
            "from instrument.engines.continuous import ContinuousEngine\n"
            "from opentelemetry.sdk.trace import TracerProvider\n"
            "engine = ContinuousEngine(load_model_handle('tiny'), TracerProvider())\n"
            "assert engine.manager.is_running()\n")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]


def test_a_prompt_longer_than_a_step_is_prefilled_in_chunks(handle: ModelHandle) -> None:
    """--max-batch-tokens 64: a ~200-token prompt takes several prefill steps, beside another
    request that decodes meanwhile; the answers are whole and the chunks add up to the prompt."""
    served = Served(handle, GatewaySettings(engine="continuous", max_tokens_limit=512,
                                            engine_options={"max_batch_tokens": 64}))
    client_provider, _ = _provider()
    try:
        bodies = [chat_body("tiny", "Tell me about the KV cache. " * 25, max_tokens=16),
                  chat_body("tiny", "hi", max_tokens=40)]
        results = _concurrent(served.url, bodies, get_tracer(client_provider))
        served.wait_idle()
        assert all(r.completed for r in results), [(r.status_code, r.error) for r in results]
        long_gw = max(served.spans("gateway"), key=lambda g: g.attributes["gen_ai.usage.input_tokens"])
        prompt = long_gw.attributes["gen_ai.usage.input_tokens"]
        assert prompt > 128
        chunks = sorted((s for s in served.spans("prefill") if s.parent.span_id == long_gw.context.span_id),
                        key=lambda s: s.attributes["tokentrace.prefill.chunk"])
        assert len(chunks) == math.ceil(prompt / 64) or len(chunks) > prompt // 64
        assert [c.attributes["tokentrace.prefill.chunk"] for c in chunks] == list(range(len(chunks)))
        assert sum(c.attributes["tokentrace.prefill.tokens"] for c in chunks) == prompt
        assert all(c.attributes["tokentrace.batch.tokens"] <= 64 for c in chunks)
        assert [c.attributes["tokentrace.kv.bytes"] for c in chunks] == sorted(c.attributes["tokentrace.kv.bytes"]
                                                                              for c in chunks)
        steps = [s for s in served.spans("engine_step")]
        assert max(s.attributes["tokentrace.batch.prefill_sequences"] for s in steps) >= 1
        assert any(s.attributes["tokentrace.batch.size"] == 2 and 0 < s.attributes["tokentrace.batch.prefill_tokens"]
                   for s in steps), "some step co-scheduled a prefill chunk with the other request's decode"
    finally:
        served.stop()
