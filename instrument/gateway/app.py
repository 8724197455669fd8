"""The FastAPI app: OpenAI-compatible endpoints with a traced ``gateway`` SERVER span per request.

Per request (docs/gateway.md): W3C traceparent extracted → ``gateway`` span from arrival →
auth (401) → body size (413) → JSON (400) → per-key rate limit (429) → validation (400) →
``tokenize`` span → admission (429 + Retry-After) → ``queue`` span → prefill/decode spans from
``traced_generate`` → one ``tokentrace.chunk`` event per chunk written → usage and finish
reason on the span and in the final chunk → one JSON log line.

The model runs behind an engine (instrument/engines: ``sequential`` or ``continuous``); the
gateway only submits sequences, reads their tokens and cancels them.
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import uuid
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, Response, StreamingResponse
from opentelemetry import trace
from opentelemetry.trace import SpanKind, Status, StatusCode
from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

from instrument.clock import now_wall_ns
from instrument.engines.base import EngineRequest, QueueWaitExceeded
from instrument.gateway import responses, sse
from instrument.gateway.admission import AdmissionBudgets, AdmissionController, AdmissionRefused, RateLimiter
from instrument.gateway.request_state import LoopWaker, RequestState, log_request
from instrument.gateway.validation import ValidationError, validate_request
from instrument.hf.model_handle import ModelHandle
from instrument.otel.tracing import get_tracer, span_event_limit_of
from instrument.records.span_forward import forwarder_of

__all__ = ["GatewaySettings", "create_app"]

_PROPAGATOR = TraceContextTextMapPropagator()
_EXTRA_CHUNKS = 4  # role chunk, finish chunk, usage chunk, error chunk


@dataclass(frozen=True)
class GatewaySettings:
    """Gateway limits. Sizes in bytes, times in seconds, rates in requests per second."""

    api_keys: frozenset[str] = frozenset()  # empty: no auth (allowed on loopback only)
    max_body_bytes: int = 1_048_576
    max_tokens_limit: int = 1024
    default_max_tokens: int = 16
    rate_limit_rps: float | None = None
    rate_limit_burst: int | None = None
    budgets: AdmissionBudgets = field(default_factory=AdmissionBudgets)
    decode_spans: str = "all"
    request_timeout_s: float = 300.0
    # The model thread holds the GIL through generate's Python loop; with CPython's default
    # 5 ms switch interval each chunk write can wait up to 5 ms for it. Process-wide; None
    # leaves it alone.
    gil_switch_interval_s: float | None = 0.0005
    # Move every object alive once the app is built (the model's ~10^5 Python objects) out of
    # the garbage collector's reach, so that its full passes — which the per-request spans
    # waiting in the export queue make more frequent — do not walk the model each time.
    # Process-wide (``gc.freeze``), as vLLM does after start-up; ``tokentrace serve`` turns it
    # on, the default leaves the collector alone (tests build many apps in one process).
    gc_freeze: bool = False
    # Which engine runs the model (instrument/engines) and its own options (e.g.
    # kv_block_tokens, max_batch_tokens for "continuous"); the KV budget is budgets.kv_budget_bytes.
    engine: str = "continuous"
    engine_options: dict[str, Any] = field(default_factory=dict)
    # At shutdown, how long the engine lets running sequences finish before cancelling them, s.
    shutdown_grace_s: float = 5.0
    # GET /metrics (Prometheus text) and, when OTEL_* asks, OTLP metrics (instrument/gateway/metrics.py).
    metrics: bool = True


class _Rejected(Exception):
    """A request refused before admission: HTTP status, OpenAI error fields, extra headers."""

    def __init__(self, status: int, message: str, error_type: str, *, param: str | None = None,
                 code: str | None = None, headers: dict[str, str] | None = None) -> None:
        super().__init__(message)
        self.status, self.error_type, self.param, self.code = status, error_type, param, code
        self.headers = headers or {}


class Gateway:
    """State shared by the routes: model, engine, tracer, admission and rate limits."""

    def __init__(self, handle: ModelHandle, tracer_provider: Any, settings: GatewaySettings,
                 engine: Any = None) -> None:
        self.handle = handle
        self.settings = settings
        if settings.gil_switch_interval_s is not None:
            import sys

            sys.setswitchinterval(settings.gil_switch_interval_s)
        if settings.gc_freeze:
            import gc

            gc.collect()
            gc.freeze()
        self.tracer = get_tracer(tracer_provider)
        self.forwarder = forwarder_of(tracer_provider)  # --span-export process: chunk events stay raw
        limit = span_event_limit_of(self.tracer)
        if limit is not None and limit < settings.max_tokens_limit + _EXTRA_CHUNKS:
            raise ValueError(
                f"max_tokens limit {settings.max_tokens_limit} needs a span event limit of at least "
                f"{settings.max_tokens_limit + _EXTRA_CHUNKS}; the tracer provider allows {limit}"
            )
        if engine is None:
            from instrument.engines import create_engine

            engine = create_engine(settings.engine, handle, tracer_provider, decode_spans=settings.decode_spans,
                                   kv_budget_bytes=settings.budgets.kv_budget_bytes, **settings.engine_options)
        self.engine = engine
        self.metrics = None
        self.metrics_off_reason = "metrics are off (GatewaySettings.metrics=False)"
        if settings.metrics:
            from instrument.gateway.metrics import ServerMetrics

            try:
                self.metrics = ServerMetrics(engine, resource=getattr(tracer_provider, "resource", None))
            except ImportError as exc:  # an install without the server extra's Prometheus exporter
                self.metrics_off_reason = f"metrics need pip install 'tokentrace[server]' ({exc})"
                import logging

                logging.getLogger("tokentrace.gateway").warning("GET /metrics disabled: %s", self.metrics_off_reason)
            if self.metrics is not None and hasattr(engine, "metrics"):
                engine.metrics = self.metrics
        budgets = dataclasses.replace(settings.budgets, kv_budget_bytes=engine.kv_capacity_bytes)
        self.admission = AdmissionController(
            budgets, handle.kv_bytes_per_token, kv_bytes_for=engine.kv_reservation_bytes,
            kv_reserve=getattr(engine, "kv_admission", "reserve") == "reserve",
            waiting=(lambda: engine.requests_waiting) if hasattr(engine, "requests_waiting") else None)
        self.rate_limiter = RateLimiter(settings.rate_limit_rps, settings.rate_limit_burst)
        self.eos_ids = set(handle.eos_ids)
        self._wakers: dict[Any, LoopWaker] = {}

    # --- checks before admission -------------------------------------------------------
    def authenticate(self, request: Request) -> str:
        """The caller's rate-limit key: its API key, or its address when auth is off."""
        if not self.settings.api_keys:
            return request.client.host if request.client else "anonymous"
        header = request.headers.get("authorization", "")
        scheme, _, key = header.partition(" ")
        if scheme.lower() != "bearer" or key.strip() not in self.settings.api_keys:
            raise _Rejected(401, "missing or invalid API key (Authorization: Bearer <key>)", "authentication_error",
                            code="invalid_api_key", headers={"WWW-Authenticate": "Bearer"})
        return key.strip()

    async def read_body(self, request: Request) -> bytes:
        limit = self.settings.max_body_bytes
        declared = request.headers.get("content-length")
        if declared is not None and declared.isdigit() and int(declared) > limit:
            raise _Rejected(413, f"request body of {declared} bytes exceeds the limit of {limit} bytes",
                            "invalid_request_error", code="payload_too_large")
        body = bytearray()
        async for part in request.stream():
            body += part
            if len(body) > limit:
                raise _Rejected(413, f"request body exceeds the limit of {limit} bytes", "invalid_request_error",
                                code="payload_too_large")
        return bytes(body)

    # --- the endpoint --------------------------------------------------------------------
    async def respond(self, request: Request, operation: str) -> Response:
        arrival_ns = now_wall_ns()
        prefix = "chatcmpl-" if operation == "chat" else "cmpl-"
        request_id = prefix + uuid.uuid4().hex[:24]
        parent = _PROPAGATOR.extract(dict(request.headers))
        attributes = {"gen_ai.operation.name": operation, "gen_ai.response.id": request_id,
                      "gen_ai.system": "tokentrace", "http.request.method": "POST", "url.path": request.url.path}
        client_request_id = request.headers.get("x-request-id", "")[:256] or None
        if client_request_id:
            # The caller's own id (AIPerf, load generators): what joins its records to this trace.
            attributes["tokentrace.client_request_id"] = client_request_id
        span = self.tracer.start_span("gateway", context=parent, kind=SpanKind.SERVER, start_time=arrival_ns,
                                      attributes=attributes)
        headers = {"x-request-id": client_request_id or request_id}
        try:
            key = self.authenticate(request)
            raw = await self.read_body(request)
            try:
                body = json.loads(raw)
            except ValueError as exc:
                raise _Rejected(400, f"body is not valid JSON: {exc}", "invalid_request_error", param="body") from None
            wait_s = self.rate_limiter.check(key)
            if wait_s is not None:
                retry = str(max(1, round(wait_s + 0.5)))
                raise _Rejected(429, "rate limit exceeded for this API key", "rate_limit_error",
                                code="rate_limit_exceeded", headers={"Retry-After": retry})
            try:
                gen = validate_request(body, operation=operation, served_models=self.handle.served_models,
                                       max_tokens_limit=self.settings.max_tokens_limit,
                                       default_max_tokens=self.settings.default_max_tokens)
            except ValidationError as exc:
                raise _Rejected(exc.status, str(exc), "invalid_request_error", param=exc.param, code=exc.code) from None
            span.set_attributes(gen.span_attributes())
            span.set_attribute("gen_ai.response.model", self.handle.model_id)
            input_ids = self._tokenize(span, gen)
            context = self.handle.max_context_tokens
            if context is not None and len(input_ids) + gen.max_tokens > context:
                raise _Rejected(400, f"prompt ({len(input_ids)} tokens) + max_tokens ({gen.max_tokens}) exceeds the "
                                f"model's context of {context} tokens", "invalid_request_error", param="max_tokens",
                                code="context_length_exceeded")
            try:
                ticket = self.admission.admit(len(input_ids), gen.max_tokens)
            except AdmissionRefused as exc:
                if exc.permanent:
                    raise _Rejected(400, str(exc), "invalid_request_error", param="max_tokens",
                                    code="context_budget_exceeded") from None
                raise _Rejected(429, str(exc), "server_overloaded", code=f"over_{exc.budget}_budget",
                                headers={"Retry-After": str(exc.retry_after_s)}) from None
        except _Rejected as rej:
            return self._reject(span, request_id, rej, headers, client_request_id)
        except BaseException as exc:  # a bug (or cancellation): the span still ends, then it raises
            self._reject(span, request_id, _Rejected(500, f"internal error: {type(exc).__name__}", "server_error",
                                                     code="internal_error"), headers, client_request_id)
            raise
        loop = asyncio.get_running_loop()
        state = RequestState(request_id, span, self.tracer, self.admission, ticket, gen, len(input_ids), loop,
                             waker=self._waker(loop), client_request_id=client_request_id,
                             metrics=self.metrics, arrival_ns=arrival_ns, forwarder=self.forwarder)
        engine = self.engine
        state.job = EngineRequest(request_id, input_ids, gen.sampling, trace.set_span_in_context(span),
                                  state.on_token_threadsafe, state.on_done_threadsafe)
        state.cancel_engine = lambda: engine.cancel(request_id)
        started = self._watch_start(state, loop) if gen.stream else None
        engine.submit(state.job)
        if started is not None:
            refused = await self._await_start(state, started, headers)
            if refused is not None:
                return refused
        if gen.stream:
            return StreamingResponse(self._stream(state), media_type="text/event-stream",
                                     headers={**headers, "Cache-Control": "no-cache"})
        return await self._whole(request, state, headers)

    def _watch_start(self, state: RequestState, loop: asyncio.AbstractEventLoop) -> asyncio.Future | None:
        """Under the engine's ``max_queue_wait_s``, a streamed request's status line waits until
        the engine schedules it (or ends it), so that a queue-wait timeout can still be a 503."""
        if getattr(self.engine, "max_queue_wait_s", None) is None:
            return None
        started: asyncio.Future = loop.create_future()

        def resolve() -> None:
            if not started.done():
                started.set_result(None)

        job = state.job
        assert job is not None, "the job is submitted before its start is watched"
        on_done = job.on_done

        def started_now() -> None:
            loop.call_soon_threadsafe(resolve)

        job.on_started = started_now

        def done(result: Any) -> None:
            on_done(result)
            loop.call_soon_threadsafe(resolve)

        job.on_done = done
        return started

    async def _await_start(self, state: RequestState, started: asyncio.Future,
                           headers: dict[str, str]) -> Response | None:
        """Wait for the engine to schedule the request; a 503 + Retry-After response when it
        ended waiting in the queue (QueueWaitExceeded), else None (stream as usual)."""
        try:
            await asyncio.wait_for(started, self.settings.request_timeout_s)
        except asyncio.TimeoutError:
            state.abandon("error", "timeout")
            return JSONResponse(sse.error_body("generation timed out", error_type="server_error"), 504, headers)
        except asyncio.CancelledError:
            state.abandon("cancelled")
            raise
        for i, (kind, value, _) in enumerate(state.inbox):
            if kind == "done" and isinstance(value.error, QueueWaitExceeded):
                del state.inbox[i]
                state.finalize(value, finish_reason="error", generated_tokens=value.generated_tokens,
                               http_status=503)
                return JSONResponse(sse.error_body(str(value.error), error_type="server_overloaded",
                                                   code="queue_wait_exceeded"), 503,
                                    {**headers, "Retry-After": str(value.error.retry_after_s)})
        return None

    def _waker(self, loop: asyncio.AbstractEventLoop) -> LoopWaker:
        waker = self._wakers.get(loop)
        if waker is None:
            waker = self._wakers[loop] = LoopWaker(loop)
        return waker

    def _tokenize(self, span: trace.Span, gen: Any) -> list[int]:
        start_ns = now_wall_ns()
        try:
            ids = self.handle.tokenize(gen.messages, gen.prompt)
        except Exception as exc:  # noqa: BLE001 - e.g. a template that rejects the message roles: a 400
            raise _Rejected(400, f"could not render/tokenize the prompt: {exc}", "invalid_request_error",
                            param="messages" if gen.messages is not None else "prompt") from None
        attrs: dict[str, Any] = {"tokentrace.input_tokens": len(ids)}
        if gen.messages is not None and self.handle.template_sha256:
            attrs["tokentrace.template.sha256"] = self.handle.template_sha256
        tok_span = self.tracer.start_span("tokenize", context=trace.set_span_in_context(span),
                                          kind=SpanKind.INTERNAL, attributes=attrs, start_time=start_ns)
        tok_span.end(end_time=now_wall_ns())
        return ids

    def _reject(self, span: trace.Span, request_id: str, rej: _Rejected, headers: dict[str, str],
                client_request_id: str | None) -> Response:
        span.set_attributes({"http.response.status_code": rej.status, "error.type": rej.code or rej.error_type})
        span.set_status(Status(StatusCode.ERROR, str(rej)[:500]))
        span.end(end_time=now_wall_ns())
        log_request({"event": "request", "id": request_id, "client_request_id": client_request_id,
                     "status": "rejected", "http_status": rej.status, "error": str(rej)[:200]})
        return JSONResponse(sse.error_body(str(rej), error_type=rej.error_type, param=rej.param, code=rej.code),
                            status_code=rej.status, headers={**headers, **rej.headers})

    async def _stream(self, state: RequestState) -> AsyncIterator[bytes]:
        async for part in responses.stream_body(self, state):
            yield part

    async def _whole(self, request: Request, state: RequestState, headers: dict[str, str]) -> Response:
        return await responses.whole_body(self, request, state, headers)


def create_app(handle: ModelHandle, tracer_provider: Any, settings: GatewaySettings | None = None,
               engine: Any = None) -> FastAPI:
    """The gateway app for one loaded model; spans go to ``tracer_provider`` (never the global one
    unless it is passed). ``engine``: an engine already built (instrument/engines), else the one
    ``settings.engine`` names. The engine stops when the app shuts down."""
    from contextlib import asynccontextmanager

    gateway = Gateway(handle, tracer_provider, settings or GatewaySettings(), engine=engine)

    @asynccontextmanager
    async def lifespan(_app: FastAPI) -> AsyncIterator[None]:
        yield
        gateway.engine.close(gateway.settings.shutdown_grace_s)
        if gateway.metrics is not None:
            gateway.metrics.shutdown()

    app = FastAPI(title="tokentrace gateway", lifespan=lifespan)
    app.state.gateway = gateway

    @app.post("/v1/chat/completions")
    async def chat_completions(request: Request) -> Response:
        return await gateway.respond(request, "chat")

    @app.post("/v1/completions")
    async def completions(request: Request) -> Response:
        return await gateway.respond(request, "text_completion")

    model_object = {"id": handle.model_id, "object": "model", "created": 0, "owned_by": "tokentrace"}

    @app.get("/v1/models")
    async def models(request: Request) -> Response:
        try:
            gateway.authenticate(request)
        except _Rejected as rej:
            return JSONResponse(sse.error_body(str(rej), error_type=rej.error_type, code=rej.code),
                                status_code=rej.status, headers=rej.headers)
        return JSONResponse({"object": "list", "data": [model_object]})

    @app.get("/v1/models/{model_id:path}")
    async def model(model_id: str, request: Request) -> Response:
        try:
            gateway.authenticate(request)
        except _Rejected as rej:
            return JSONResponse(sse.error_body(str(rej), error_type=rej.error_type, code=rej.code),
                                status_code=rej.status, headers=rej.headers)
        if model_id not in handle.served_models:
            return JSONResponse(sse.error_body(f"The model `{model_id}` does not exist; this server serves "
                                               f"`{handle.model_id}`", error_type="invalid_request_error",
                                               param="model", code="model_not_found"), status_code=404)
        return JSONResponse(model_object)

    from starlette.exceptions import HTTPException as StarletteHTTPException

    @app.exception_handler(StarletteHTTPException)
    async def http_error(request: Request, exc: StarletteHTTPException) -> Response:
        """Unknown routes (404) and wrong methods (405) in OpenAI's error shape."""
        if exc.status_code == 404:
            message, code = f"{request.method} {request.url.path}: no such route", "not_found"
        elif exc.status_code == 405:
            message, code = f"{request.method} is not allowed on {request.url.path}", "method_not_allowed"
        else:
            message, code = str(exc.detail), None
        return JSONResponse(sse.error_body(message, error_type="invalid_request_error", code=code),
                            status_code=exc.status_code, headers=getattr(exc, "headers", None))

    @app.api_route("/metrics", methods=["GET", "HEAD"])  # HEAD: AIPerf's reachability probe
    async def metrics() -> Response:
        """Prometheus text exposition of the server's metrics (docs/gateway.md, "Metrics")."""
        if gateway.metrics is None:
            return JSONResponse(sse.error_body(gateway.metrics_off_reason, error_type="invalid_request_error",
                                               code="not_found"), 404)
        from instrument.gateway.metrics import PROMETHEUS_CONTENT_TYPE

        return Response(gateway.metrics.prometheus_text(), media_type=PROMETHEUS_CONTENT_TYPE)

    @app.get("/health")
    async def health() -> dict[str, Any]:
        from instrument.otel.export_health import export_health

        adm = gateway.admission
        # Span export counts per exporter (submitted / exported / failed / dropped / lost):
        # a collector that is down shows here while serving goes on.
        return {"status": "ok", "model": handle.model_id, "requests_in_flight": adm.requests_in_flight,
                "tokens_in_flight": adm.tokens_in_flight, "kv_bytes_in_flight": adm.kv_bytes_in_flight,
                "engine": gateway.engine.health(),
                "export": [c.as_dict() for c in export_health(tracer_provider)]}

    return app
