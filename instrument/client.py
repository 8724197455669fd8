"""A traced streaming client for OpenAI-compatible servers and a load generator.

Each request is one CLIENT span ``chat {model}`` from client send (s) to the last byte
received, with one ``tokentrace.chunk`` event per received stream chunk (index, tokens,
visible) and the usage attributes of the final usage chunk. The W3C ``traceparent`` header
is injected, so the server's ``gateway`` span joins the same trace.

``clock_offset_ns`` shifts every client timestamp (simulates a skewed client clock).

Ids a user can find again: ``client_request_id`` (when given) is sent as the ``X-Request-ID``
header and recorded on the span as ``tokentrace.client_request_id`` (the gateway records the
same on its ``gateway`` span); ``gen_ai.response.id`` is the ``id`` of the response's chunks
(else the ``X-Request-ID`` the server answered with). queries/requests.sql shows both as
``response_id`` and ``client_request_id``.

Load: closed loop (``concurrency`` workers, each sends its next request when the previous
one ended) or open loop (Poisson arrivals at ``rate_per_s``, seeded; requests are sent on
schedule whatever the server does).
"""

from __future__ import annotations

import asyncio
import json
import random
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from opentelemetry import trace
from opentelemetry.trace import SpanKind, Status, StatusCode
from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

from instrument.clock import now_wall_ns
from instrument.otel.tracing import get_tracer

__all__ = ["SEED_PROMPT", "ClientResult", "chat_body", "stream_chat", "run_load", "run_load_sync",
           "poisson_arrival_offsets_s", "local_tracer_provider"]

SEED_PROMPT = "Show me wheelchair-accessible hotels in Kyoto under $200/night with onsen access."
CHUNK_EVENT = "tokentrace.chunk"
_PROPAGATOR = TraceContextTextMapPropagator()


@dataclass
class ClientResult:
    """What one request gave the client. ``status_code`` None: no HTTP response (network error)."""

    index: int
    status_code: int | None
    finish_reason: str | None = None
    request_id: str | None = None  # the X-Request-ID response header
    input_tokens: int | None = None
    output_tokens: int | None = None
    chunks: int = 0
    text: str = ""
    error: str | None = None
    retry_after_s: str | None = None
    trace_id: str | None = None
    response_id: str | None = None  # the response's id (its chunks' "id"), else the X-Request-ID answered
    client_request_id: str | None = None  # the X-Request-ID this client sent
    waited_s: float | None = None  # seconds from send to the end of the request (success or failure)

    @property
    def completed(self) -> bool:
        return self.status_code == 200 and self.finish_reason in ("stop", "length")


def chat_body(model: str, prompt: str = SEED_PROMPT, *, max_tokens: int = 16, temperature: float = 0.0,
              stream: bool = True, ignore_eos: bool = False) -> dict[str, Any]:
    """A chat-completions request body with one user message (usage requested when streaming;
    ``ignore_eos``: the vLLM extension that makes the answer run to ``max_tokens``)."""
    body: dict[str, Any] = {"model": model, "messages": [{"role": "user", "content": prompt}],
                            "max_tokens": max_tokens, "temperature": temperature, "stream": stream}
    if ignore_eos:
        body["ignore_eos"] = True
    if stream:
        body["stream_options"] = {"include_usage": True}
    return body


def local_tracer_provider(service_name: str, *, json_path: str | None = None, span_exporters: Sequence[Any] = (),
                           batch: bool = True, make_exporters: bool = True, sampler: Any = None) -> Any:
    """A provider for client spans: OTLP-JSON lines to ``json_path`` when given, OTLP when
    ``OTEL_EXPORTER_OTLP_ENDPOINT`` (or the traces endpoint) is set, plus ``span_exporters``.
    ``make_exporters=False``: the exporters are only named (``setup_tracing``), for a span
    exporter process to make (``serve --span-export process``). ``sampler``: the provider's
    (None: the one ``OTEL_TRACES_SAMPLER`` names)."""
    import os

    from instrument.otel.tracing import setup_tracing

    names = []
    if json_path is not None:
        names.append("otlp_json")
    if os.environ.get("OTEL_EXPORTER_OTLP_ENDPOINT") or os.environ.get("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT"):
        names.append("otlp")
    return setup_tracing(service_name, exporter=names or ["none"], json_path=json_path,
                         span_exporters=span_exporters, batch=batch, make_exporters=make_exporters, sampler=sampler)


def _chunk_content(payload: dict[str, Any]) -> tuple[str | None, str | None]:
    """(content delta or text, finish reason) of a chunk's first choice."""
    choices = payload.get("choices") or []
    if not choices:
        return None, None
    choice = choices[0]
    delta = choice.get("delta")
    content = delta.get("content") if isinstance(delta, dict) else choice.get("text")
    return (content if isinstance(content, str) else None), choice.get("finish_reason")


async def stream_chat(
    http: Any, base_url: str, body: dict[str, Any], *, tracer: trace.Tracer, api_key: str | None = None,
    clock_offset_ns: int = 0, index: int = 0, stop_after_chunks: int | None = None, path: str = "/v1/chat/completions",
    client_request_id: str | None = None, on_chunk: Callable[[bool], None] | None = None,
    on_cancelled: Callable[[ClientResult], None] | None = None,
) -> ClientResult:
    """Send one streaming request (``http``: an ``httpx.AsyncClient``) under a CLIENT span.

    ``stop_after_chunks``: close the connection after that many visible chunks (a client that
    disconnects mid-stream); the span's finish reason is then ``cancelled``.
    ``client_request_id``: sent as ``X-Request-ID`` and kept as ``tokentrace.client_request_id``.
    ``on_chunk(visible)``: called for every chunk received (progress displays).
    ``on_cancelled(result)``: called with the request's result (finish reason ``cancelled``)
    when the task is cancelled (a load generator stopping), before CancelledError goes on.
    """
    model = str(body.get("model", ""))
    operation = "chat" if "messages" in body else "text_completion"
    attrs: dict[str, Any] = {"gen_ai.operation.name": operation, "gen_ai.request.model": model}
    for key, attr in (("max_tokens", "gen_ai.request.max_tokens"), ("temperature", "gen_ai.request.temperature"),
                      ("top_p", "gen_ai.request.top_p")):
        if body.get(key) is not None:
            attrs[attr] = body[key]
    if client_request_id:
        attrs["tokentrace.client_request_id"] = client_request_id
    span = tracer.start_span(f"{operation} {model}", kind=SpanKind.CLIENT, attributes=attrs,
                             start_time=now_wall_ns() + clock_offset_ns)
    result = ClientResult(index, None, trace_id=f"{span.get_span_context().trace_id:032x}",
                          client_request_id=client_request_id)
    sent = time.monotonic()
    headers = {"content-type": "application/json"}
    if client_request_id:
        headers["x-request-id"] = client_request_id
    if api_key:
        headers["authorization"] = f"Bearer {api_key}"
    _PROPAGATOR.inject(headers, context=trace.set_span_in_context(span))
    visible_chunks = 0
    try:
        async with http.stream("POST", base_url.rstrip("/") + path, content=json.dumps(body), headers=headers) as resp:
            result.status_code = resp.status_code
            span.set_attribute("http.response.status_code", resp.status_code)
            result.request_id = resp.headers.get("x-request-id")
            if resp.status_code != 200:
                raw = await resp.aread()
                result.retry_after_s = resp.headers.get("retry-after")
                try:
                    result.error = json.loads(raw)["error"]["message"]
                except (ValueError, KeyError, TypeError):
                    result.error = raw.decode("utf-8", "replace")[:200]
            else:
                async for line in resp.aiter_lines():
                    if not line.startswith("data:"):
                        continue
                    data = line[5:].strip()
                    if data == "[DONE]":
                        break
                    received_ns = now_wall_ns() + clock_offset_ns
                    payload = json.loads(data)
                    if "error" in payload:
                        result.error = str(payload["error"].get("message"))
                        result.finish_reason = "error"
                        break
                    if result.response_id is None and isinstance(payload.get("id"), str):
                        result.response_id = payload["id"]
                    content, finish = _chunk_content(payload)
                    visible = bool(content)
                    if on_chunk is not None:
                        on_chunk(visible)
                    span.add_event(CHUNK_EVENT, {"tokentrace.chunk.index": result.chunks,
                                                 "tokentrace.chunk.tokens": 1 if visible else 0,
                                                 "tokentrace.chunk.visible": visible}, timestamp=received_ns)
                    result.chunks += 1
                    if visible:
                        result.text += content  # type: ignore[operator]  # text is a str once a visible chunk arrived
                        visible_chunks += 1
                    if finish:
                        result.finish_reason = finish
                    if payload.get("usage"):
                        result.input_tokens = payload["usage"].get("prompt_tokens")
                        result.output_tokens = payload["usage"].get("completion_tokens")
                    if stop_after_chunks is not None and visible_chunks >= stop_after_chunks:
                        result.finish_reason = "cancelled"
                        break
    except Exception as exc:  # noqa: BLE001 - network errors, timeouts: the request failed, the load goes on
        # Some exceptions carry no message (httpx's ReadTimeout): the name alone, never "Name: ".
        result.error = f"{type(exc).__name__}: {exc}" if str(exc).strip() else type(exc).__name__
        span.set_attribute("error.type", type(exc).__qualname__)
    except asyncio.CancelledError:  # the load generator is stopping: the span still ends
        result.finish_reason = "cancelled"
        result.error = "cancelled by the client (stopping)"
        _finish_span(span, result, clock_offset_ns, sent)
        if on_cancelled is not None:
            on_cancelled(result)
        raise
    _finish_span(span, result, clock_offset_ns, sent)
    return result


def _finish_span(span: trace.Span, result: ClientResult, clock_offset_ns: int, sent: float) -> None:
    result.waited_s = time.monotonic() - sent
    if result.response_id is None and result.request_id and result.request_id != result.client_request_id:
        result.response_id = result.request_id  # no chunk: the id the server answered with
    if result.response_id:
        span.set_attribute("gen_ai.response.id", result.response_id)
    if result.input_tokens is not None:
        span.set_attribute("gen_ai.usage.input_tokens", result.input_tokens)
    if result.output_tokens is not None:
        span.set_attribute("gen_ai.usage.output_tokens", result.output_tokens)
    if result.finish_reason:
        span.set_attribute("gen_ai.response.finish_reasons", (result.finish_reason,))
    if result.status_code is not None and result.status_code != 200:
        span.set_attribute("error.type", str(result.status_code))
    if result.error is not None or result.finish_reason == "cancelled" or result.status_code != 200:
        span.set_status(Status(StatusCode.ERROR, (result.error or result.finish_reason or "failed")[:500]))
    span.end(end_time=now_wall_ns() + clock_offset_ns)


def poisson_arrival_offsets_s(requests: int, rate_per_s: float, seed: int) -> list[float]:
    """Send times (seconds after start) of an open-loop Poisson process: exponential gaps, seeded."""
    rng = random.Random(seed)
    offsets, t = [], 0.0
    for _ in range(requests):
        offsets.append(t)
        t += rng.expovariate(rate_per_s)
    return offsets


async def run_load(
    base_url: str, body_for: Callable[[int], dict[str, Any]], *, requests: int, tracer_provider: Any,
    concurrency: int | None = None, rate_per_s: float | None = None, seed: int = 0, api_key: str | None = None,
    clock_offset_ns: int = 0, timeout_s: float = 120.0,
    on_result: Callable[[ClientResult], None] | None = None,
    stop: threading.Event | None = None, grace_s: float = 5.0,
    request_id_for: Callable[[int], str] | None = None,
    on_send: Callable[[int], None] | None = None, on_chunk: Callable[[bool], None] | None = None,
) -> list[ClientResult]:
    """Send ``requests`` streaming requests, closed-loop (``concurrency``) or open-loop
    (``rate_per_s`` Poisson arrivals); returns the results in request order.

    ``stop`` (set from a signal handler, say): send nothing more, let the requests in
    flight finish for ``grace_s`` seconds, then cancel them (their spans end ``cancelled``,
    and so do their results). Requests never sent have no result.

    ``request_id_for(i)``: the X-Request-ID of request ``i``. ``on_send(i)``, ``on_chunk(visible)``
    and ``on_result(result)`` are called from the event loop as requests go (progress displays).
    """
    import httpx

    if (concurrency is None) == (rate_per_s is None):
        raise ValueError("give exactly one of concurrency (closed loop) or rate_per_s (open loop)")
    tracer = get_tracer(tracer_provider)
    results: list[ClientResult | None] = [None] * requests
    limits = httpx.Limits(max_connections=max(concurrency or 0, 64), max_keepalive_connections=32)

    async with httpx.AsyncClient(timeout=httpx.Timeout(timeout_s), limits=limits) as http:

        def keep(i: int, res: ClientResult) -> None:
            results[i] = res
            if on_result is not None:
                on_result(res)

        async def one(i: int) -> None:
            if on_send is not None:
                on_send(i)
            res = await stream_chat(http, base_url, body_for(i), tracer=tracer, api_key=api_key,
                                    clock_offset_ns=clock_offset_ns, index=i, on_chunk=on_chunk,
                                    client_request_id=request_id_for(i) if request_id_for else None,
                                    on_cancelled=lambda cancelled: keep(i, cancelled))
            keep(i, res)

        def stopping() -> bool:
            return stop is not None and stop.is_set()

        if concurrency is not None:
            next_index = iter(range(requests))

            async def worker() -> None:
                for i in next_index:
                    if stopping():
                        return
                    await one(i)

            tasks = [asyncio.ensure_future(worker()) for _ in range(max(1, min(concurrency, requests)))]
        else:
            loop = asyncio.get_running_loop()
            start = loop.time()

            async def scheduled(i: int, at_s: float) -> None:
                deadline = start + at_s
                while loop.time() < deadline:  # wake at least every 50 ms to notice a stop
                    if stopping():
                        return
                    await asyncio.sleep(min(0.05, deadline - loop.time()))
                if not stopping():
                    await one(i)

            offsets = poisson_arrival_offsets_s(requests, float(rate_per_s), seed)  # type: ignore[arg-type]  # rate_per_s is set on this path (Poisson arrivals)
            tasks = [asyncio.ensure_future(scheduled(i, t)) for i, t in enumerate(offsets)]

        async def watch() -> None:
            while not stopping():
                await asyncio.sleep(0.05)
            await asyncio.sleep(grace_s)
            for task in tasks:
                task.cancel()

        watcher = asyncio.ensure_future(watch()) if stop is not None else None
        await asyncio.gather(*tasks, return_exceptions=True)
        if watcher is not None:
            watcher.cancel()
    return [r for r in results if r is not None]


def run_load_sync(*args: Any, **kwargs: Any) -> list[ClientResult]:
    """:func:`run_load` from synchronous code (runs its own event loop)."""
    return asyncio.run(run_load(*args, **kwargs))
