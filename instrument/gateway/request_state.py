"""One accepted request's life on the event loop: its gateway span, its chunk events, its
incremental detokenization, and exactly one ending (completed, failed or cancelled).

Every accepted request reaches :meth:`RequestState.finalize` exactly once: from the response
path when the result arrives, or, when the client went away or the server gave up waiting,
from the engine's done callback (:meth:`RequestState.on_job_done`). Finalize releases the
admission ticket (the request's KV budget), emits the queue span, ends the gateway span and
writes the structured log line.
"""

from __future__ import annotations

import asyncio
import json
import logging
from collections import deque
from dataclasses import dataclass, field
from typing import Any

from opentelemetry import trace
from opentelemetry.trace import SpanKind, Status, StatusCode

from instrument.clock import now_wall_ns
from instrument.engines.base import EngineRequest, EngineResult
from instrument.gateway.admission import AdmissionController, Ticket
from instrument.gateway.validation import GenerationRequest
from instrument.hf.token_sampling import TokenLogprobs

__all__ = ["CHUNK_EVENT", "CHUNK_KEYS", "Detokenizer", "LoopWaker", "RequestState", "log_request"]

CHUNK_EVENT = "tokentrace.chunk"
CHUNK_KEYS = ("tokentrace.chunk.index", "tokentrace.chunk.tokens", "tokentrace.chunk.visible")
ORPHAN_GRACE_S = 2.0  # after the job ends, how long a response that never started may take to start
LOGGER = logging.getLogger("tokentrace.gateway")


def log_request(record: dict[str, Any]) -> None:
    """One structured (JSON) log line per request at INFO on logger ``tokentrace.gateway``."""
    LOGGER.info(json.dumps(record, separators=(",", ":"), default=str))


class Detokenizer:
    """Turns generated token ids into text deltas; holds back tokens that end mid-character.

    ``push`` returns ``(delta, tokens)``: the new text and how many tokens it covers, or
    ``("", 0)`` while tokens are held back. Stop (EOS) tokens are counted but never shown;
    other special tokens are skipped (``skip_special_tokens``) and counted in the next delta.
    Incremental: with a fast (Rust) tokenizer, ``tokenizers.decoders.DecodeStream`` (about
    0.5 µs per token); otherwise prefix/read offsets as TGI and vLLM do (two ``decode`` calls
    of the last few tokens, about 4 µs per token). Both give the same deltas.
    """

    def __init__(self, tokenizer: Any, eos_ids: set[int], *, stream: bool | None = None) -> None:
        """``stream``: use DecodeStream (None: when the tokenizer has a Rust backend)."""
        self.tokenizer = tokenizer
        self.eos_ids = eos_ids
        self.content_ids: list[int] = []
        self.text = ""
        self.generated_tokens = 0
        self._prefix_offset = 0  # ids before this are settled context
        self._read_offset = 0  # ids before this have been sent as text
        backend = getattr(tokenizer, "backend_tokenizer", None) if stream is not False else None
        self._backend = backend
        self._stream: Any = None
        if backend is not None:
            try:
                from tokenizers.decoders import DecodeStream
            except ImportError:  # tokenizers < 0.21
                self._backend = None
            else:
                self._stream = DecodeStream(skip_special_tokens=True)
        if stream and self._stream is None:
            raise ValueError("DecodeStream needs a fast tokenizer and tokenizers >= 0.21")

    def push(self, token_id: int) -> tuple[str, int]:
        """Add one generated token; the text it completes (if any) and the tokens that text covers."""
        self.generated_tokens += 1
        if token_id in self.eos_ids:
            return "", 0
        ids = self.content_ids
        ids.append(token_id)
        if self._stream is not None:
            delta = self._stream.step(self._backend, token_id)
            if not delta:
                return "", 0
        else:
            decode = self.tokenizer.decode
            prefix_text = decode(ids[self._prefix_offset:self._read_offset], skip_special_tokens=True)
            new_text = decode(ids[self._prefix_offset:], skip_special_tokens=True)
            if len(new_text) <= len(prefix_text) or new_text.endswith("\ufffd"):
                return "", 0
            delta = new_text[len(prefix_text):]
            self._prefix_offset = self._read_offset
        tokens = len(ids) - self._read_offset
        self._read_offset = len(ids)
        self.text += delta
        return delta, tokens


class LoopWaker:
    """Wakes the response paths of many requests with one ``call_soon_threadsafe`` per engine step.

    An engine's thread hands each generated token to its request's inbox; a request whose
    response path is (about to be) blocked on an empty inbox needs a wake-up on the event
    loop. Each wake-up is an eventfd write (~20 µs on this machine) paid by the engine's
    thread: a batched step of 16 sequences would pay 16. Here the requests to wake are
    queued and one loop callback wakes all of them; a second one is scheduled only when the
    first has started running.
    """

    __slots__ = ("loop", "_pending", "_scheduled")

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self.loop = loop
        self._pending: deque = deque()
        self._scheduled = False

    def wake(self, state: RequestState) -> None:
        """From any thread: wake ``state``'s response path soon."""
        self._pending.append(state)
        if not self._scheduled:
            self._scheduled = True
            self.loop.call_soon_threadsafe(self._run)

    def _run(self) -> None:
        self._scheduled = False  # cleared before draining: a later append schedules another run
        pending = self._pending
        while pending:
            pending.popleft()._wake()


@dataclass
class RequestState:
    """Per-request bookkeeping shared by the response path and the worker callback."""

    request_id: str
    span: trace.Span
    tracer: trace.Tracer
    admission: AdmissionController
    ticket: Ticket
    gen: GenerationRequest
    input_tokens: int
    loop: asyncio.AbstractEventLoop
    waker: LoopWaker | None = None  # None: one call_soon_threadsafe per wake-up
    client_request_id: str | None = None  # the caller's X-Request-ID (None: it sent none)
    cancel_engine: Any = None  # () -> None: asks the engine to stop this sequence
    # ("token", id, TokenLogprobs | None) | ("done", EngineResult, None), engine thread -> loop
    inbox: deque = field(default_factory=deque)
    _waiter: asyncio.Future | None = None  # the response path's wait for the inbox (loop thread only)
    _loop_awake: bool = False  # the loop looks at the inbox before it blocks again: no wake-up needed
    _pending_chunks: list = field(default_factory=list)  # (index, tokens, visible, at_ns) not yet on the span
    job: EngineRequest | None = None
    stop_matched: bool = False  # generation was stopped because the text hit a stop sequence
    chunk_index: int = 0
    output_tokens: int = 0
    abandoned_reason: str | None = None  # "cancelled" (client gone) or "error" (server gave up)
    abandoned_error_type: str | None = None  # e.g. "timeout"
    finished: bool = False
    response_started: bool = False  # the response path is running (its finally guarantees an ending)
    metrics: Any = None  # ServerMetrics (instrument/gateway/metrics.py): request histograms at the end
    arrival_ns: int = 0  # the gateway span's start, ns since the epoch
    first_token_ns: int | None = None  # the first chunk with visible tokens was handed to the server
    last_token_ns: int | None = None  # the last one
    forwarder: Any = None  # span_forward.SpanForwarder (--span-export process): chunk events kept raw

    # --- engine thread -> loop -------------------------------------------------------
    def on_token_threadsafe(self, token_id: int, logprobs: TokenLogprobs | None = None) -> None:
        """Called on the engine's thread for each generated token.

        Wakes the loop only when the response path is (about to be) blocked on an empty
        inbox; while it is still writing earlier chunks, the token waits in the inbox for its
        next look (no wake-up, no delay). The first token always wakes it.
        """
        self.inbox.append(("token", token_id, logprobs))
        if not self._loop_awake:
            self._loop_awake = True
            if self.waker is not None:
                self.waker.wake(self)
            else:
                self.loop.call_soon_threadsafe(self._wake)

    def _wake(self) -> None:
        """On the loop: wake the response path if it waits (a bare future; no task, no Event)."""
        waiter = self._waiter
        if waiter is not None and not waiter.done():
            waiter.set_result(None)

    async def next_items(self, timeout_s: float) -> list[tuple[str, Any, Any]]:
        """Every item the engine has handed over, waiting up to ``timeout_s`` s for the first
        (TimeoutError after that)."""
        if not self.inbox:
            # The flag is cleared before the inbox is looked at again, and the worker reads it
            # after appending: an item the look misses always finds the flag clear and
            # schedules a wake-up. A stale wake-up (its items already taken) finds the inbox
            # empty: wait again.
            loop = self.loop
            timer = loop.call_later(timeout_s, self._expire)
            try:
                while True:
                    self._loop_awake = False
                    if self.inbox:
                        break
                    self._waiter = loop.create_future()
                    await self._waiter
            finally:
                timer.cancel()
                self._waiter = None
        self._loop_awake = True  # until the next call finds the inbox empty
        items = []
        while self.inbox:
            items.append(self.inbox.popleft())
        return items

    def _expire(self) -> None:
        waiter = self._waiter
        if waiter is not None and not waiter.done():
            waiter.set_exception(asyncio.TimeoutError())

    def on_done_threadsafe(self, result: EngineResult) -> None:
        """Called on the engine's thread when the sequence ends (always exactly once)."""
        self.loop.call_soon_threadsafe(self.on_job_done, result)

    def on_job_done(self, result: EngineResult) -> None:
        """On the loop: hand the result to the response path, or finish an abandoned request."""
        if self.abandoned_reason is not None:
            self.finalize(result, finish_reason=self.abandoned_reason, generated_tokens=result.generated_tokens)
        else:
            self.inbox.append(("done", result, None))
            self._wake()
            if not self.response_started:
                self.loop.call_later(ORPHAN_GRACE_S, self._finish_orphan, result)

    def _finish_orphan(self, result: EngineResult) -> None:
        """The response body never started (the client left before it did): end as cancelled."""
        if not self.finished and not self.response_started:
            self.abandon("cancelled")

    def abandon(self, reason: str, error_type: str | None = None) -> None:
        """The response path stops waiting (client disconnected or timeout): cancel generation.

        If the result is already queued, finish now; otherwise ``on_job_done`` will.
        """
        if self.finished or self.abandoned_reason is not None:
            return
        self.abandoned_reason = reason
        self.abandoned_error_type = error_type
        self.flush_chunk_events()
        self.span.add_event("tokentrace.cancel", {"tokentrace.cancel.reason": error_type or reason},
                            timestamp=now_wall_ns())
        if self.cancel_engine is not None:
            self.cancel_engine()
        while self.inbox:
            kind, value, _ = self.inbox.popleft()
            if kind == "done":
                self.finalize(value, finish_reason=reason, generated_tokens=value.generated_tokens)
                return

    def stop_generation(self) -> None:
        """The text reached a stop sequence: ask the engine to stop (the request ends ``stop``)."""
        if not self.stop_matched:
            self.stop_matched = True
            if self.cancel_engine is not None:
                self.cancel_engine()

    # --- chunk events --------------------------------------------------------------
    def chunk_written(self, tokens: int, visible: bool, at_ns: int | None = None) -> None:
        """Record one chunk written to the socket (``tokentrace.chunk`` on the gateway span), stamped
        ``at_ns`` (ns since the epoch) = when it was handed to the server for writing (never
        after the client got it).

        The event is kept here and put on the span by :meth:`flush_chunk_events` (at the end
        of the request, before any other event), so the span gets the same events, in order,
        with these timestamps, while the ~8 µs per event of the SDK stays off the stream.
        """
        self._pending_chunks.append((self.chunk_index, tokens, visible, at_ns if at_ns is not None else now_wall_ns()))
        self.chunk_index += 1
        if visible:
            self.output_tokens += tokens
            if tokens and self.gen.stream:  # whole responses stamp their tokens as they arrive
                at = self._pending_chunks[-1][3]
                if self.first_token_ns is None:
                    self.first_token_ns = at
                self.last_token_ns = at

    def flush_chunk_events(self) -> None:
        """Put the recorded ``tokentrace.chunk`` events on the gateway span (in chunk order).
        With a span forwarder they stay ``(index, tokens, visible, ns)`` tuples, built as events
        in the span exporter process (instrument/records/span_forward.py)."""
        pending, self._pending_chunks = self._pending_chunks, []
        if self.forwarder is not None and self.forwarder.defer_events(self.span, CHUNK_EVENT, CHUNK_KEYS, pending):
            return
        add_event = self.span.add_event
        index_key, tokens_key, visible_key = CHUNK_KEYS
        for index, tokens, visible, at_ns in pending:
            add_event(CHUNK_EVENT, {index_key: index, tokens_key: tokens, visible_key: visible}, timestamp=at_ns)

    def metric_attributes(self) -> dict[str, Any]:
        """The GenAI semconv attributes of the server metrics (low cardinality)."""
        return {"gen_ai.operation.name": self.gen.operation, "gen_ai.request.model": self.gen.model,
                "gen_ai.system": "tokentrace"}

    # --- the one ending --------------------------------------------------------------
    def finalize(
        self, result: EngineResult, *, finish_reason: str, generated_tokens: int, http_status: int = 200,
        end_ns: int | None = None,
    ) -> None:
        """End the request: queue span, usage, status, gateway span end, KV release, log line."""
        if self.finished:
            return
        self.finished = True
        try:
            self._end(result, finish_reason=finish_reason, generated_tokens=generated_tokens, http_status=http_status,
                      end_ns=end_ns)
        finally:
            # After the span ended: whoever sees the budget free sees the request's span ended too.
            self.admission.release(self.ticket)

    def _end(self, result: EngineResult, *, finish_reason: str, generated_tokens: int, http_status: int,
             end_ns: int | None) -> None:
        self.flush_chunk_events()
        end_ns = end_ns if end_ns is not None else now_wall_ns()
        job = self.job
        if job is not None:
            queue_span = self.tracer.start_span(
                "queue", context=trace.set_span_in_context(self.span), kind=SpanKind.INTERNAL,
                attributes={"tokentrace.queue.depth": self.ticket.queue_depth,
                            "tokentrace.queue.tokens_ahead": self.ticket.tokens_ahead,
                            "tokentrace.queue.requests_in_flight": self.ticket.requests_in_flight},
                start_time=job.enqueued_ns,
            )
            queue_span.end(end_time=max(result.admitted_ns, job.enqueued_ns))
        span = self.span
        span.set_attributes({
            "gen_ai.usage.input_tokens": self.input_tokens,
            "gen_ai.usage.output_tokens": self.output_tokens,
            "tokentrace.generated_tokens": generated_tokens,
            "gen_ai.response.finish_reasons": (finish_reason,),
            "http.response.status_code": http_status,
        })
        if result.kv_physical_bytes is not None:
            span.set_attribute("tokentrace.kv.physical_bytes", result.kv_physical_bytes)
        if result.kv_shared_bytes is not None:
            span.set_attribute("tokentrace.kv.shared_bytes", result.kv_shared_bytes)
        if result.cached_tokens is not None:
            span.set_attribute("gen_ai.usage.cache_read.input_tokens", result.cached_tokens)
        error_type = None
        if finish_reason == "cancelled":
            error_type = "cancelled"
            span.set_status(Status(StatusCode.ERROR, "cancelled: client disconnected"))
        elif finish_reason == "error":
            if self.abandoned_error_type is not None:
                error_type = self.abandoned_error_type
            else:
                error_type = type(result.error).__qualname__ if result.error is not None else "error"
            span.set_status(Status(StatusCode.ERROR, str(result.error or error_type)[:500]))
        if error_type is not None:
            span.set_attribute("error.type", error_type)
        span.end(end_time=end_ns)
        if self.metrics is not None:
            self.metrics.record_request(self.metric_attributes(), start_ns=self.arrival_ns,
                                        first_token_ns=self.first_token_ns, last_token_ns=self.last_token_ns,
                                        output_tokens=self.output_tokens, end_ns=end_ns, error_type=error_type)
        queue_wait_ms = (result.admitted_ns - job.enqueued_ns) / 1e6 if job is not None else None
        log_request({
            "event": "request", "id": self.request_id, "client_request_id": self.client_request_id,
            "model": self.gen.model, "status": finish_reason,
            "http_status": http_status, "input_tokens": self.input_tokens, "output_tokens": self.output_tokens,
            "generated_tokens": generated_tokens, "queue_wait_ms": queue_wait_ms,
            "error": str(result.error)[:200] if result.error is not None else None,
        })
