"""The two response bodies of a completion request: Server-Sent Events or one JSON object.

Both read the engine's tokens from the request's inbox (:class:`RequestState`), turn them
into text through :class:`ChoiceText` (detokenization, stop sequences, logprobs), record one
``tokentrace.chunk`` event per chunk handed to the server, and end the request exactly once.
A stop-sequence match asks the engine to stop and ends the request with ``stop``.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator
from typing import Any

from fastapi import Request
from fastapi.responses import JSONResponse, Response

from instrument.clock import now_wall_ns
from instrument.engines.base import EngineResult, QueueWaitExceeded
from instrument.gateway import sse
from instrument.gateway.choice_text import ChoiceText, completion_logprobs
from instrument.gateway.request_state import RequestState

__all__ = ["stream_body", "whole_body"]


def _choice_text(gateway: Any, gen: Any) -> ChoiceText:
    return ChoiceText(gateway.handle.tokenizer, gateway.eos_ids, stops=gen.stop, min_tokens=gen.min_tokens,
                      logprobs=gen.logprobs, top_logprobs=gen.top_logprobs, chat=gen.operation == "chat")


def _finish_reason(choice: ChoiceText, result: EngineResult) -> str:
    """``stop`` when a stop sequence ended the text (the engine was cancelled for it)."""
    return "stop" if choice.matched and result.finish_reason != "error" else result.finish_reason


async def stream_body(gateway: Any, state: RequestState) -> AsyncIterator[bytes]:
    """SSE body. A disconnect (cancellation of this generator) cancels generation.

    Tokens that arrived together (the loop lagged behind the model) are written in one
    send, each still its own SSE chunk with its own ``tokentrace.chunk`` event.
    """
    gen, model, rid, created = state.gen, gateway.handle.model_id, state.request_id, int(time.time())
    choice = _choice_text(gateway, gen)
    plain = sse.ContentChunks(gen.operation, rid, created, model).render
    chat = gen.operation == "chat"
    continuous = gen.continuous_usage

    def so_far() -> dict[str, Any] | None:
        """The usage up to now (tokens generated so far, vLLM's count) under continuous usage stats."""
        return sse.usage(state.input_tokens, choice.completion_tokens) if continuous else None

    def render(delta: str, entries: Any) -> bytes:
        if entries is None and not continuous:
            return plain(delta)
        logprobs = None if entries is None else ({"content": entries} if chat
                                                 else completion_logprobs(entries, len(choice.text) - len(delta)))
        return sse.sse_line(sse.content_chunk(gen.operation, rid, created, model, delta, logprobs=logprobs,
                                              usage_so_far=so_far()))

    push = choice.push
    state.response_started = True
    try:
        if chat:
            sent_ns = now_wall_ns()
            yield sse.sse_line(sse.content_chunk("chat", rid, created, model, "", role=True, usage_so_far=so_far()))
            state.chunk_written(0, False, sent_ns)
        result: EngineResult | None = None
        while result is None:
            try:
                items = await state.next_items(gateway.settings.request_timeout_s)
            except asyncio.TimeoutError:
                state.abandon("error", "timeout")
                yield sse.sse_line(sse.error_body("generation timed out", error_type="server_error"))
                yield sse.DONE
                return
            out, chunk_tokens = bytearray(), []
            for kind, value, logprobs in items:
                if kind == "done":
                    result = value
                    delta, tokens, entries = choice.finish()
                else:
                    delta, tokens, entries = push(value, logprobs)
                if delta:
                    out += render(delta, entries)
                    chunk_tokens.append(tokens)
                if kind == "done":
                    break
            if choice.matched:
                state.stop_generation()
            if out:
                sent_ns = now_wall_ns()
                yield bytes(out)
                for tokens in chunk_tokens:
                    state.chunk_written(tokens, True, sent_ns)
        generated = result.generated_tokens
        finish = _finish_reason(choice, result)
        sent_ns = now_wall_ns()
        if finish == "error":
            yield sse.sse_line(sse.error_body(f"generation failed: {result.error}", error_type="server_error"))
            state.chunk_written(0, False, sent_ns)
        else:
            yield sse.sse_line(sse.finish_chunk(gen.operation, rid, created, model, finish, usage_so_far=so_far()))
            state.chunk_written(0, False, sent_ns)
            if gen.include_usage:
                sent_ns = now_wall_ns()
                yield sse.sse_line(sse.usage_chunk(gen.operation, rid, created, model,
                                                   sse.usage(state.input_tokens, choice.completion_tokens,
                                                             result.cached_tokens)))
                state.chunk_written(0, False, sent_ns)
        # The response is complete when the last bytes are handed to the server: stamped
        # before the write, so server times never pass the client's receipt of them.
        done_ns = now_wall_ns()
        yield sse.DONE
        state.finalize(result, finish_reason=finish, generated_tokens=generated, end_ns=done_ns)
    finally:
        if not state.finished:  # client disconnected (or the server is shutting down)
            state.abandon("cancelled")


async def whole_body(gateway: Any, request: Request, state: RequestState, headers: dict[str, str]) -> Response:
    """Non-streaming: wait for the result, polling for a client disconnect (cancels generation)."""
    state.response_started = True
    try:
        return await _whole_body(gateway, request, state, headers)
    finally:
        if not state.finished:  # the handler was cancelled (server shutdown)
            state.abandon("cancelled")


async def _whole_body(gateway: Any, request: Request, state: RequestState, headers: dict[str, str]) -> Response:
    gen = state.gen
    choice = _choice_text(gateway, gen)
    deadline = time.monotonic() + gateway.settings.request_timeout_s
    tokens = 0
    entries: list[Any] = []
    result: EngineResult | None = None
    while result is None:
        if time.monotonic() > deadline:
            state.abandon("error", "timeout")
            return JSONResponse(sse.error_body("generation timed out", error_type="server_error"), 504, headers)
        try:
            items = await state.next_items(0.25)
        except asyncio.TimeoutError:
            if await request.is_disconnected():
                state.abandon("cancelled")
                return Response(status_code=499, headers=headers)
            continue
        if items[0][0] == "token":  # token times for the server metrics (TTFT, TPOT), once per batch
            state.last_token_ns = now_wall_ns()
            if state.first_token_ns is None:
                state.first_token_ns = state.last_token_ns
        for kind, value, logprobs in items:
            if kind == "done":
                result = value
                _, covered, more = choice.finish()
            else:
                _, covered, more = choice.push(value, logprobs)
            tokens += covered
            entries.extend(more or ())
            if kind == "done":
                break
        if choice.matched:
            state.stop_generation()
    generated = result.generated_tokens
    finish = _finish_reason(choice, result)
    if finish == "error" and isinstance(result.error, QueueWaitExceeded):
        state.finalize(result, finish_reason="error", generated_tokens=generated, http_status=503)
        return JSONResponse(sse.error_body(str(result.error), error_type="server_overloaded",
                                           code="queue_wait_exceeded"), 503,
                            {**headers, "Retry-After": str(result.error.retry_after_s)})
    if finish == "error":
        state.finalize(result, finish_reason="error", generated_tokens=generated, http_status=500)
        return JSONResponse(sse.error_body(f"generation failed: {result.error}", error_type="server_error"),
                            500, headers)
    if tokens:
        state.chunk_written(tokens, True)
    logprobs_obj = None
    if gen.logprobs:
        logprobs_obj = {"content": entries} if gen.operation == "chat" else completion_logprobs(entries, 0)
    body = sse.full_response(gen.operation, state.request_id, int(time.time()), gateway.handle.model_id,
                             choice.text, finish, sse.usage(state.input_tokens, choice.completion_tokens,
                                                            result.cached_tokens),
                             logprobs=logprobs_obj)
    state.finalize(result, finish_reason=finish, generated_tokens=generated)
    return JSONResponse(body, headers=headers)
