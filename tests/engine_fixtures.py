"""Other engines' spans, written with the real OpenTelemetry SDK in each engine's shape.

Each builder reproduces the span names, kinds, attributes (with the engine's own types and
units), nesting and links that the engine's source writes, with explicit timestamps on the
true clock (ms after ``ANCHOR_NS``), so the adapters in ``queries/views/2*_*.sql`` can be
checked against planted values. The engine file and commit each builder follows is named in
its docstring. The default plan is the worked example's request: arrival 0, first token 190 ms,
150 output tokens 25 ms apart -> TTFT 190, E2E 3,915, TPOT 25.
"""

from __future__ import annotations

import itertools
import json
from dataclasses import dataclass

import duckdb
from opentelemetry import trace
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import SpanLimits, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.sdk.trace.id_generator import IdGenerator
from opentelemetry.trace import Link, SpanKind

from analyzer.db.store import connect, insert_rows
from analyzer.formats.sdk_spans import rows_from_sdk_spans

ANCHOR_NS = 1_767_225_600_000_000_000  # 2026-01-01T00:00:00Z, as in trace_fixtures


def ns(ms: float) -> int:
    return ANCHOR_NS + round(ms * 1_000_000)


class EngineIds(IdGenerator):
    """Deterministic ids. ``short_trace_ids`` gives 64-bit trace ids, as SGLang's
    SglangTraceCustomIdGenerator does (``getrandbits(64)``)."""

    def __init__(self, prefix: int, short_trace_ids: bool = False) -> None:
        self._prefix = prefix
        self._short = short_trace_ids
        self._traces = itertools.count(1)
        self._spans = itertools.count(1)

    def generate_trace_id(self) -> int:
        n = next(self._traces)
        return (self._prefix << 48 | n) if self._short else (self._prefix << 112 | n)

    def generate_span_id(self) -> int:
        return self._prefix << 48 | next(self._spans)


class EngineWorld:
    """One in-memory exporter; a provider per (engine resource, id scheme)."""

    def __init__(self) -> None:
        self.exporter = InMemorySpanExporter()
        self._providers: dict[str, TracerProvider] = {}

    def tracer(self, key: str, resource: dict[str, str], scope: str, ids: IdGenerator) -> trace.Tracer:
        if key not in self._providers:
            provider = TracerProvider(resource=Resource.create(resource), id_generator=ids,
                                      span_limits=SpanLimits(max_events=10_000, max_links=1_000))
            provider.add_span_processor(SimpleSpanProcessor(self.exporter))
            self._providers[key] = provider
        return self._providers[key].get_tracer(scope)

    def load(self, con: duckdb.DuckDBPyConnection | None = None) -> duckdb.DuckDBPyConnection:
        con = con if con is not None else connect(None)
        spans, events, links = rows_from_sdk_spans(self.exporter.get_finished_spans())
        insert_rows(con, spans, events, links)
        return con


# ---------------------------------------------------------------------------------- vLLM
VLLM_RESOURCE = {"service.name": "vllm", "service.instance.id": "v-1", "host.name": "gpu-v"}


@dataclass
class VllmPlan:
    start_ms: float = 0.0
    ttft_s: float = 0.19
    e2e_s: float = 3.915
    queue_s: float = 0.025
    prefill_s: float = 0.14
    prompt_tokens: int = 1025
    completion_tokens: int = 150
    finish_reason: str = "length"
    request_id: str = "cmpl-1"


def add_vllm_request(world: EngineWorld, p: VllmPlan, parent: trace.Span | None = None) -> trace.Span:
    """vLLM's per-request span as written by ``OutputProcessor.do_tracing``
    (vllm/v1/engine/output_processor.py, attribute names from vllm/tracing/utils.py
    ``SpanAttributes``; vllm-project/vllm commit d07822605346): span ``llm_request``, kind
    SERVER, start = arrival time, ended when the request finishes; latencies are float
    seconds; token counts under the deprecated ``gen_ai.usage.prompt_tokens`` /
    ``completion_tokens``; finish reasons ``json.dumps([...])`` (a string). Scope:
    ``vllm.llm_engine`` (``init_tracer("vllm.llm_engine", ...)`` in the engine)."""
    tracer = world.tracer("vllm", VLLM_RESOURCE, "vllm.llm_engine", EngineIds(0x7111))
    decode_s = p.e2e_s - p.ttft_s
    attributes = {
        "gen_ai.latency.time_to_first_token": p.ttft_s,
        "gen_ai.latency.e2e": p.e2e_s,
        "gen_ai.latency.time_in_queue": p.queue_s,
        "gen_ai.usage.prompt_tokens": p.prompt_tokens,
        "gen_ai.usage.completion_tokens": p.completion_tokens,
        "gen_ai.latency.time_in_model_prefill": p.prefill_s,
        "gen_ai.latency.time_in_model_decode": decode_s,
        "gen_ai.latency.time_in_model_inference": p.prefill_s + decode_s,
        "gen_ai.request.id": p.request_id,
        "gen_ai.response.finish_reasons": json.dumps([p.finish_reason]),
        "gen_ai.request.max_tokens": p.completion_tokens,
        "gen_ai.request.n": 1,
    }
    ctx = trace.set_span_in_context(parent) if parent is not None else None
    span = tracer.start_span("llm_request", context=ctx, kind=SpanKind.SERVER, start_time=ns(p.start_ms),
                             attributes=attributes)
    span.end(end_time=ns(p.start_ms + p.e2e_s * 1000 + 0.4))  # span ends after the last output is processed
    return span


# ----------------------------------------------------------------------------------- TGI
TGI_RESOURCE = {"service.name": "text-generation-inference.router", "service.instance.id": "t-1", "host.name": "gpu-t"}


def rust_duration_debug(seconds: float) -> str:
    """A duration as Rust's ``format!("{:?}", Duration)`` writes it: "3.9155s", "25ms",
    "850µs", "100ns" (the unit chosen by magnitude, trailing zeros dropped)."""
    nanos = round(seconds * 1e9)
    for unit, size in (("s", 1_000_000_000), ("ms", 1_000_000), ("µs", 1_000)):
        if nanos >= size:
            whole, frac = divmod(nanos, size)
            digits = len(str(size)) - 1
            text = f"{whole}.{frac:0{digits}d}".rstrip("0").rstrip(".")
            return text + unit
    return f"{nanos}ns"


@dataclass
class TgiPlan:
    start_ms: float = 0.0
    validation_ms: float = 3.0
    queue_ms: float = 25.0
    prefill_ms: float = 157.0      # batch prefill forward, starts when the queue ends
    first_token_ms: float = 190.0  # first send_generation, ms after the request span starts
    gap_ms: float = 25.0
    tokens: int = 150
    with_generations: bool = True  # False: send_generation/infer spans sampled out
    span_name: str = "generate_stream"


def add_tgi_request(world: EngineWorld, p: TgiPlan) -> trace.Span:
    """TGI's router spans for one streamed request, as tracing-opentelemetry exports them.

    Follows huggingface/text-generation-inference router/src/server.rs (commit d957e32601a9:
    ``#[instrument(skip_all, fields(parameters = ?req.parameters, total_time,
    validation_time, queue_time, inference_time, time_per_token, seed))]`` on
    ``generate_stream``; ``span.record("total_time", format!("{total_time:?}"))``) and
    backends/v3/src/backend.rs + queue.rs (commit 1d0847a90e6b: ``info_span!(parent: None,
    "batch", batch_size)`` per step, ``info_span!(parent: &entry.span, "infer")`` with
    ``follows_from`` both ways, ``send_generation`` under the entry's ``infer`` span).
    Nesting: ``POST /generate_stream`` (SERVER, axum layer) -> ``generate_stream`` (timings)
    -> ``async_stream`` -> ``generate_stream`` (infer, no fields) -> ``schedule`` ->
    ``infer`` per step -> ``send_generation``; step k's ``batch`` -> ``prefill``/``decode``
    is a root span of its own trace."""
    tracer = world.tracer("tgi", TGI_RESOURCE, "text_generation_router", EngineIds(0x7222))
    s = p.start_ms
    last_token = s + p.first_token_ms + (p.tokens - 1) * p.gap_ms
    end = last_token + 0.5
    queued = s + p.validation_ms
    started = queued + p.queue_ms
    inference_s = (end - started) / 1000
    http = tracer.start_span("POST /generate_stream", kind=SpanKind.SERVER, start_time=ns(s - 0.2),
                             attributes={"http.method": "POST", "http.route": "/generate_stream"})
    req = tracer.start_span(p.span_name, context=trace.set_span_in_context(http), start_time=ns(s), attributes={
        "parameters": "GenerateParameters { best_of: None, temperature: None, max_new_tokens: Some(150), .. }",
    })
    stream = tracer.start_span("async_stream", context=trace.set_span_in_context(req), start_time=ns(s + 0.1))
    infer_gs = tracer.start_span("generate_stream", context=trace.set_span_in_context(stream), start_time=ns(s + 0.2))
    schedule = tracer.start_span("schedule", context=trace.set_span_in_context(infer_gs), start_time=ns(queued))
    schedule_ctx = trace.set_span_in_context(schedule)
    for k in range(p.tokens):
        token_at = s + p.first_token_ms + k * p.gap_ms
        step_start = started if k == 0 else token_at - p.gap_ms + 1.0
        step_end = started + p.prefill_ms if k == 0 else token_at - 0.5
        infer = tracer.start_span("infer", context=schedule_ctx, start_time=ns(step_start)) if p.with_generations else None
        batch = tracer.start_span("batch", context=trace.set_span_in_context(trace.INVALID_SPAN),
                                  start_time=ns(step_start), attributes={"batch_size": 1},
                                  links=[Link(infer.get_span_context())] if infer is not None else None)
        tracer.start_span("prefill" if k == 0 else "decode", context=trace.set_span_in_context(batch),
                          start_time=ns(step_start)).end(end_time=ns(step_end))
        batch.end(end_time=ns(step_end + 0.1))
        if infer is not None:
            infer.add_link(batch.get_span_context())
            tracer.start_span("send_generation", context=trace.set_span_in_context(infer), start_time=ns(token_at),
                              attributes={"generation": f"Generation {{ request_id: 0, tokens: Some(Tokens {{ ids: [{k}] }}) }}"}
                              ).end(end_time=ns(token_at + 0.05))
            infer.end(end_time=ns(token_at + 0.1))
    schedule.end(end_time=ns(end))
    infer_gs.end(end_time=ns(end))
    stream.end(end_time=ns(end + 0.1))
    req.set_attributes({
        "total_time": rust_duration_debug((end - s) / 1000),
        "validation_time": rust_duration_debug(p.validation_ms / 1000),
        "queue_time": rust_duration_debug(p.queue_ms / 1000),
        "inference_time": rust_duration_debug(inference_s),
        "time_per_token": rust_duration_debug(inference_s / p.tokens),
        "seed": "None",
    })
    req.end(end_time=ns(end + 0.2))
    http.end(end_time=ns(end + 0.3))
    return req


# -------------------------------------------------------------------------------- SGLang
SGLANG_RESOURCE = {"service.name": "sglang", "service.instance.id": "g-1", "host.name": "gpu-g"}


@dataclass
class SglangPlan:
    start_ms: float = 0.0
    rid: str = "9f2c4e7a1b3d4c5e8f60718293a4b5c6"
    first_token_ms: float = 190.0  # end of prefill_forward
    gap_ms: float = 25.0
    decode_steps: int = 149        # decode_loop slices (trace level 3); tokens = 1 + steps
    decode_loop_spans: bool = True  # False: trace level 2, decode_forward only


def add_sglang_request(world: EngineWorld, p: SglangPlan) -> trace.Span:
    """SGLang's request trace as python/sglang/srt/tracing/trace.py writes it
    (sgl-project/sglang commit bad7b92eb043): ``trace_req_start`` opens the root span
    ``Req {rid[:8]}`` (attrs ``rid``, ``bootstrap_room``) and a thread span per thread
    (``"{thread_label} [TP {tp_rank}] (host:{host_id[:8]} | pid:{pid})"`` with attrs
    host_id, pid, thread_label, tp_rank); ``trace_slice_start/end`` open stage slices under
    the thread span, linked to the previous slice; the scheduler's per-step
    ``trace_slice_batch(RequestStage.DECODE_LOOP, reqs)`` gives one ``decode_loop`` slice per
    decode step with attr ``decode_ct`` (observability/req_time_stats.py). Tracer scope
    ``sglang server``; 64-bit trace ids (SglangTraceCustomIdGenerator)."""
    tracer = world.tracer("sglang", SGLANG_RESOURCE, "sglang server", EngineIds(0x7333, short_trace_ids=True))
    s = p.start_ms
    prefill_end = s + p.first_token_ms
    last = prefill_end + p.decode_steps * p.gap_ms
    finish = last + 1.0
    root = tracer.start_span(f"Req {p.rid[:8]}", start_time=ns(s), attributes={"rid": p.rid, "bootstrap_room": "None"})
    rctx = trace.set_span_in_context(root)
    tok_thread = tracer.start_span("Tokenizer (host:1a2b3c4d | pid:7)", context=rctx, start_time=ns(s),
                                   attributes={"host_id": "1a2b3c4d5e6f", "pid": 7, "thread_label": "Tokenizer"})
    tctx = trace.set_span_in_context(tok_thread)
    tokenize = tracer.start_span("tokenize", context=tctx, start_time=ns(s + 1))
    tokenize.end(end_time=ns(s + 9))
    tracer.start_span("dispatch", context=tctx, start_time=ns(s + 9),
                      links=[Link(tokenize.get_span_context())]).end(end_time=ns(s + 10))
    sched = tracer.start_span("Scheduler [TP 0] (host:1a2b3c4d | pid:9)", context=rctx, start_time=ns(s),
                              attributes={"host_id": "1a2b3c4d5e6f", "pid": 9, "thread_label": "Scheduler", "tp_rank": 0})
    sctx = trace.set_span_in_context(sched)
    previous = None

    def slice_(name: str, start: float, end: float, attrs: dict | None = None) -> None:
        nonlocal previous
        span = tracer.start_span(name, context=sctx, start_time=ns(start), attributes=attrs,
                                 links=[Link(previous.get_span_context())] if previous is not None else None)
        span.end(end_time=ns(end))
        previous = span

    slice_("request_process", s + 11, s + 20)
    slice_("prefill_waiting", s + 20, s + 45)
    slice_("prefill_forward", s + 45, prefill_end)
    for k in range(p.decode_steps):
        start, end = prefill_end + k * p.gap_ms, prefill_end + (k + 1) * p.gap_ms
        if p.decode_loop_spans:
            slice_("decode_loop", start, end, {"decode_ct": k})
        else:
            slice_("decode_forward", start, end)
    sched.end(end_time=ns(finish))
    tok_thread.end(end_time=ns(finish))
    root.end(end_time=ns(finish))
    return root


# --------------------------------------------------------------------------- OpenLLMetry
OPENLLMETRY_RESOURCE = {"service.name": "agent", "service.instance.id": "a-1", "host.name": "laptop-a"}


@dataclass
class OpenllmetryPlan:
    start_ms: float = 0.0
    first_chunk_ms: float = 190.0
    gap_ms: float = 25.0
    chunks: int = 150
    prompt_tokens: int = 1025
    completion_tokens: int | None = 150  # None: not reported (count chunk events)
    chunk_event: str = "llm.content.completion.chunk"
    new_usage_names: bool = False  # gen_ai.usage.input_tokens / output_tokens
    role_chunk_ms: float | None = 5.0  # the role-only first chunk's event (None: no such event)


def add_openllmetry_request(world: EngineWorld, p: OpenllmetryPlan) -> trace.Span:
    """An OpenLLMetry-instrumented streaming chat call, as traceloop/openllmetry
    packages/opentelemetry-instrumentation-openai (shared/chat_wrappers.py ``ChatStream``,
    v0.33-era ``SpanAttributes`` of opentelemetry-semantic-conventions-ai) writes it: span
    ``openai.chat``, kind CLIENT, ``llm.request.type = "chat"``, ``gen_ai.system``,
    ``gen_ai.request.model``, usage under ``gen_ai.usage.prompt_tokens`` /
    ``completion_tokens``, ``gen_ai.completion.0.finish_reason``, and one attribute-less
    event ``llm.content.completion.chunk`` per received chunk (``_process_item``); newer
    releases name the event ``gen_ai.completion.chunk``. Scope
    ``opentelemetry.instrumentation.openai.v1``. The first event is the role-only chunk an
    OpenAI-compatible server sends before the first token (``role_chunk_ms`` after s; the real
    0.62.4 capture in tests/data/real has it), then ``chunks`` chunks of one token each."""
    tracer = world.tracer("openllmetry", OPENLLMETRY_RESOURCE, "opentelemetry.instrumentation.openai.v1",
                          EngineIds(0x7444))
    s = p.start_ms
    last = s + p.first_chunk_ms + (p.chunks - 1) * p.gap_ms
    attributes: dict[str, object] = {
        "llm.request.type": "chat", "gen_ai.system": "OpenAI", "gen_ai.request.model": "m",
        "llm.is_streaming": True, "gen_ai.completion.0.finish_reason": "length",
    }
    in_key, out_key = (("gen_ai.usage.input_tokens", "gen_ai.usage.output_tokens") if p.new_usage_names
                       else ("gen_ai.usage.prompt_tokens", "gen_ai.usage.completion_tokens"))
    attributes[in_key] = p.prompt_tokens
    if p.completion_tokens is not None:
        attributes[out_key] = p.completion_tokens
    span = tracer.start_span("openai.chat", kind=SpanKind.CLIENT, start_time=ns(s), attributes=attributes)
    if p.role_chunk_ms is not None:
        span.add_event(p.chunk_event, timestamp=ns(s + p.role_chunk_ms))
    for i in range(p.chunks):
        span.add_event(p.chunk_event, timestamp=ns(s + p.first_chunk_ms + i * p.gap_ms))
    span.end(end_time=ns(last + 2.0))
    return span
