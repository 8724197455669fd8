"""The gateway's per-chunk path: pre-rendered chunk envelope, streaming
detokenizer, the worker -> event-loop hand-off, deferred chunk events, and the HTTP stack.

Real components: the tiny model's tokenizer (and SmolLM2's when its converted copy is
cached), a real event loop and thread, a real uvicorn server on 127.0.0.1.
"""

from __future__ import annotations

import asyncio
import json
import random
import threading
import time
from typing import Any

import pytest

pytest.importorskip("fastapi")
pytest.importorskip("torch")

import httpx
from opentelemetry.sdk.trace import SpanLimits, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from instrument.gateway import sse
from instrument.gateway.request_state import Detokenizer
from instrument.hf.model_handle import ModelHandle, load_model_handle

TIMEOUT_S = 30.0

TRICKY_TEXTS = [
    "", "plain", " leading space", 'quote " and backslash \\ and slash /', "new\nline\ttab\rcr",
    "\x00\x01\x1f control", "\u2028\u2029 separators", "日本語の温泉 🎌 ok", "</script><!--", "{\"not\": json}",
    "\ud7ff\ue000\uffff", "surrogate pair 𝄞",
]


@pytest.fixture(scope="module")
def handle() -> ModelHandle:
    return load_model_handle("tiny")


# --- the pre-rendered chunk envelope ----------------------------------------------------

@pytest.mark.parametrize("operation", ["chat", "text_completion"])
def test_content_chunks_are_byte_identical_to_json_dumps(operation: str) -> None:
    for request_id, model in [("chatcmpl-abc123", "tokentrace/tiny-llama-gqa-v1"),
                              ("cmpl-\"quoted\"", "model/with \\ and ünïcode")]:
        chunks = sse.ContentChunks(operation, request_id, 1_700_000_000, model)
        for text in TRICKY_TEXTS:
            expected = sse.sse_line(sse.content_chunk(operation, request_id, 1_700_000_000, model, text))
            got = chunks.render(text)
            assert got == expected, (operation, text)
            payload = json.loads(got[len(b"data: "):].decode("utf-8"))
            field = payload["choices"][0]["delta"]["content"] if operation == "chat" else payload["choices"][0]["text"]
            assert field == text and payload["id"] == request_id and payload["model"] == model


# --- the streaming detokenizer ------------------------------------------------------------

def _tokenizers(handle: ModelHandle) -> list[tuple[str, Any]]:
    out = [("tiny", handle.tokenizer)]
    try:
        from transformers import AutoTokenizer

        from instrument.hf.smollm2 import smollm2_cache_dir

        directory = smollm2_cache_dir()
        if (directory / "tokenizer.json").is_file():
            out.append(("smollm2", AutoTokenizer.from_pretrained(directory)))
    except (ImportError, ValueError, OSError):
        pass
    return out


def _sequences(tok: Any, rng: random.Random) -> list[list[int]]:
    texts = ["Kyoto の温泉 hotels — onsen 🎌 ok", "  two leading spaces\n\nand 𝄞 music", "plain ascii words"]
    seqs = [list(tok(t, add_special_tokens=False)["input_ids"]) for t in texts]
    specials = sorted(set(tok.all_special_ids))
    vocab = len(tok)
    for _ in range(60):
        seq = [rng.randrange(vocab) for _ in range(rng.randrange(1, 40))]
        for _ in range(rng.randrange(0, 3)):  # special tokens inside the output: skipped, counted later
            seq.insert(rng.randrange(len(seq) + 1), rng.choice(specials))
        seqs.append(seq)
    return seqs


def test_stream_detokenizer_gives_the_same_deltas_as_the_offset_one(handle: ModelHandle) -> None:
    rng = random.Random(6)
    for name, tok in _tokenizers(handle):
        eos = {tok.eos_token_id}
        for ids in _sequences(tok, rng):
            fast, slow = Detokenizer(tok, eos, stream=True), Detokenizer(tok, eos, stream=False)
            assert fast._stream is not None and slow._stream is None
            got = [fast.push(i) for i in ids]
            want = [slow.push(i) for i in ids]
            assert got == want, (name, ids)
            assert fast.text == slow.text and fast.generated_tokens == slow.generated_tokens == len(ids)
            shown = sum(n for d, n in got)
            assert shown <= sum(1 for i in ids if i not in eos)  # held-back tail tokens are not counted yet


def test_stream_detokenizer_needs_a_fast_tokenizer() -> None:
    class SlowTokenizer:  # no backend_tokenizer: the offset path is the only one
        def decode(self, ids: list[int], skip_special_tokens: bool = True) -> str:
            return "".join(chr(97 + i % 26) for i in ids)

    assert Detokenizer(SlowTokenizer(), set())._stream is None
    assert Detokenizer(SlowTokenizer(), set()).push(2) == ("c", 1)
    with pytest.raises(ValueError, match="fast tokenizer"):
        Detokenizer(SlowTokenizer(), set(), stream=True)


# --- the worker -> event loop hand-off --------------------------------------------------

def _state(handle: ModelHandle, loop: asyncio.AbstractEventLoop, *, waker: bool = False
           ) -> tuple[Any, InMemorySpanExporter]:
    from instrument.gateway.admission import AdmissionBudgets, AdmissionController
    from instrument.gateway.request_state import LoopWaker, RequestState
    from instrument.gateway.validation import validate_request
    from instrument.otel.tracing import get_tracer

    exporter = InMemorySpanExporter()
    provider = TracerProvider(span_limits=SpanLimits(max_events=4096))
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    tracer = get_tracer(provider)
    admission = AdmissionController(AdmissionBudgets(), None)
    gen = validate_request({"model": "tiny", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 8},
                           operation="chat", served_models=handle.served_models, max_tokens_limit=64,
                           default_max_tokens=16)
    state = RequestState("chatcmpl-test", tracer.start_span("gateway"), tracer, admission, admission.admit(3, 8),
                         gen, 3, loop, waker=LoopWaker(loop) if waker else None)
    return state, exporter


@pytest.mark.timing  # bounded waits (a 0.05 s timeout is timed, with a 5 s upper bound)
def test_hand_off_delivers_every_token_in_order_and_times_out(handle: ModelHandle) -> None:
    async def go() -> None:
        state, _ = _state(handle, asyncio.get_running_loop())
        sent = list(range(100, 160))

        def worker() -> None:
            for i, token in enumerate(sent):
                state.on_token_threadsafe(token)
                if i % 7 == 0:
                    time.sleep(0.001)  # sometimes the loop catches up, sometimes it lags

        thread = threading.Thread(target=worker)
        thread.start()
        got: list[int] = []
        for _ in range(len(sent)):  # bounded: at least one token per batch
            items = await state.next_items(TIMEOUT_S)
            assert items and all(kind == "token" for kind, _, _ in items)
            got.extend(v for _, v, _ in items)
            if len(got) == len(sent):
                break
        thread.join(TIMEOUT_S)
        assert got == sent
        assert state._waiter is None and not state.inbox
        # nothing more comes: TimeoutError after the timeout, and the waiter is cleared
        t0 = time.perf_counter()
        with pytest.raises(asyncio.TimeoutError):
            await state.next_items(0.05)
        assert 0.04 <= time.perf_counter() - t0 < 5.0 and state._waiter is None
        # a stale wake-up (its token already taken) is no item: the wait goes on to the timeout
        state.on_token_threadsafe(5)  # schedules a wake-up that runs only after the token is taken
        assert await state.next_items(TIMEOUT_S) == [("token", 5, None)]
        with pytest.raises(asyncio.TimeoutError):
            await state.next_items(0.05)
        # a cancelled wait (client gone) leaves no waiter behind; later tokens still arrive
        task = asyncio.ensure_future(state.next_items(TIMEOUT_S))
        await asyncio.sleep(0.01)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        assert state._waiter is None
        state.on_token_threadsafe(7)
        assert await state.next_items(TIMEOUT_S) == [("token", 7, None)]

    asyncio.run(go())


@pytest.mark.timing  # a lost wake-up shows as a 5 s timeout; a paused thread must not look like one
@pytest.mark.parametrize("waker", [False, True], ids=["own wake-ups", "shared LoopWaker"])
def test_hand_off_never_loses_a_wake_up_under_races(handle: ModelHandle, waker: bool) -> None:
    """A fast worker against a consumer that sometimes lags (as when a write takes long):
    every token arrives, in order, and no wait runs into its timeout (a lost wake-up would)."""
    async def go() -> None:
        state, _ = _state(handle, asyncio.get_running_loop(), waker=waker)
        sent = list(range(3000))
        rng = random.Random(1)
        pauses = [rng.random() < 0.01 for _ in sent]

        def worker() -> None:
            for token, pause in zip(sent, pauses):
                state.on_token_threadsafe(token)
                if pause:
                    time.sleep(0.0005)

        thread = threading.Thread(target=worker)
        thread.start()
        got: list[int] = []
        waits = 0
        while len(got) < len(sent) and waits < len(sent):  # bounded: every call returns >= 1 token
            waits += 1
            items = await state.next_items(5.0)
            got.extend(v for _, v, _ in items)
            if rng.random() < 0.3:
                await asyncio.sleep(0.0002)  # the consumer lags: tokens pile up without wake-ups
        thread.join(TIMEOUT_S)
        assert got == sent

    asyncio.run(go())


@pytest.mark.timing  # a lost wake-up shows as a 2 s timeout; a paused thread must not look like one
@pytest.mark.parametrize("waker", [False, True], ids=["own wake-ups", "shared LoopWaker"])
def test_hand_off_ping_pong_wakes_for_every_last_token(handle: ModelHandle, waker: bool) -> None:
    """The worker sends one token and waits until it is received: each token is the last one
    for a while, so a wake-up lost in the consumer's check-then-wait window would stall the
    stream (TimeoutError here) instead of being rescued by the next token."""
    async def go() -> None:
        state, _ = _state(handle, asyncio.get_running_loop(), waker=waker)
        received = threading.Event()
        rounds = 400

        def worker() -> None:
            for token in range(rounds):
                state.on_token_threadsafe(token)
                if not received.wait(TIMEOUT_S):
                    return
                received.clear()

        thread = threading.Thread(target=worker)
        thread.start()
        got: list[int] = []
        try:
            for _ in range(rounds):
                items = await state.next_items(2.0)
                got.extend(v for _, v, _ in items)
                received.set()
        finally:
            received.set()
            thread.join(TIMEOUT_S)
        assert got == list(range(rounds))

    asyncio.run(go())


def test_chunk_events_reach_the_span_in_order_before_the_cancel_event(handle: ModelHandle) -> None:
    async def go() -> None:
        state, exporter = _state(handle, asyncio.get_running_loop())
        base = time.time_ns()
        for k in range(5):
            state.chunk_written(k % 2, bool(k % 2), base + k * 1000)
        assert not state.span.events, "chunk events wait for the end of the request"
        state.abandon("cancelled")  # no job: only the events and the cancel flag
        events = list(state.span.events)
        assert [e.name for e in events] == ["tokentrace.chunk"] * 5 + ["tokentrace.cancel"]
        assert [e.attributes["tokentrace.chunk.index"] for e in events[:5]] == [0, 1, 2, 3, 4]
        assert [e.timestamp for e in events[:5]] == [base + k * 1000 for k in range(5)]
        assert [e.attributes["tokentrace.chunk.tokens"] for e in events[:5]] == [0, 1, 0, 1, 0]
        assert state.output_tokens == 2
        # The job's end then finalizes the request: the events are not added a second time.
        from instrument.engines.base import EngineResult

        state.on_job_done(EngineResult(admitted_ns=base, finish_reason="cancelled"))
        assert state.finished
        (span,) = [sp for sp in exporter.get_finished_spans() if sp.name == "gateway"]
        assert [e.name for e in span.events] == ["tokentrace.chunk"] * 5 + ["tokentrace.cancel"]

    asyncio.run(go())


# --- over HTTP ------------------------------------------------------------------------------

def test_server_uses_httptools_and_uvloop_when_installed(handle: ModelHandle) -> None:
    """The server extra installs httptools and uvloop; uvicorn's "auto" picks them (docs/gateway.md)."""
    pytest.importorskip("httptools")
    uvloop = pytest.importorskip("uvloop")
    from instrument.gateway.app import GatewaySettings, create_app
    from instrument.gateway.server import ServerThread

    provider = TracerProvider(span_limits=SpanLimits(max_events=4096))
    provider.add_span_processor(SimpleSpanProcessor(InMemorySpanExporter()))
    server = ServerThread(create_app(handle, provider, GatewaySettings(max_tokens_limit=64))).start()
    try:
        assert server.config.http_protocol_class.__name__ == "HttpToolsProtocol"
        loop = server.config.get_loop_factory()()
        try:
            assert isinstance(loop, uvloop.Loop)
        finally:
            loop.close()
        r = httpx.post(server.url + "/v1/chat/completions", timeout=TIMEOUT_S,
                       json={"model": "tiny", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 6,
                             "stream": True, "stream_options": {"include_usage": True}})
        lines = [line for line in r.text.splitlines() if line.startswith("data:")]
        assert r.status_code == 200 and lines[-1] == "data: [DONE]"
        usage = json.loads(lines[-2][5:])["usage"]
        text = "".join((json.loads(line[5:])["choices"] or [{}])[0].get("delta", {}).get("content") or ""
                       for line in lines[:-1])
        # completion_tokens counts a final stop token too (vLLM's rule): text implies tokens, not back
        assert usage["completion_tokens"] <= 6 and (text == "" or usage["completion_tokens"] > 0)
    finally:
        server.stop()
        provider.shutdown()
