"""Fixture traces written with the real OpenTelemetry SDK, in the span contract's shape.

Each request is planned on a "true" clock in milliseconds after ``ANCHOR_NS``; the client
process may run ``client_clock_ahead_ms`` ahead of it (a planted skew). Spans are made by
real ``TracerProvider``s (one per clock domain, each with its own resource) with explicit
start/end times and ``add_event(timestamp=...)``, exported to an ``InMemorySpanExporter``,
converted by :mod:`analyzer.formats.sdk_spans` and inserted into DuckDB.

Timeline of the default plan (the worked example's request, true clock, ms after the client send):
client send 0, gateway 5, tokenize 8-19, queue 20-45, prefill 45-185, server chunk i at
187 + 25 i, client chunk i at 190 + 25 i (i = 0..149): TTFT 190, E2E 3,915, TPOT 25.
Phases: network-in 5, gateway overhead 3, tokenize 11, queue 25, prefill 140, first-emit 2,
network-out 3; residual 1 (tokenize end 19 -> queue start 20).
"""

from __future__ import annotations

import itertools
from collections.abc import Sequence
from dataclasses import dataclass, field

import duckdb
from opentelemetry import trace
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import SpanLimits, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.sdk.trace.id_generator import IdGenerator
from opentelemetry.trace import SpanKind, Status, StatusCode

from analyzer.db.store import connect, insert_rows
from analyzer.formats.sdk_spans import rows_from_sdk_spans

ANCHOR_NS = 1_767_225_600_000_000_000  # 2026-01-01T00:00:00Z
KV_BYTES_PER_TOKEN = 327_680  # 2 x 80 layers x 8 kv heads x 128 x 2 bytes (the worked example's model)
CLIENT_RESOURCE = {"service.name": "client", "service.instance.id": "c-1", "host.name": "laptop"}
SERVER_RESOURCE = {"service.name": "server", "service.instance.id": "s-1", "host.name": "gpu-1"}
SKEWED_CLIENT_RESOURCE = {"service.name": "skewed-client", "service.instance.id": "c-2", "host.name": "far"}


def domain(resource: dict[str, str]) -> str:
    """The clock-domain string the store derives from a resource."""
    return "|".join(resource[k] for k in ("service.name", "service.instance.id", "host.name"))


class SequentialIds(IdGenerator):
    """Deterministic ids so golden files are stable: trace n -> 0x...n, span n -> 0x...n."""

    def __init__(self) -> None:
        self._traces = itertools.count(1)
        self._spans = itertools.count(1)

    def generate_trace_id(self) -> int:
        return 0x7700 << 112 | next(self._traces)

    def generate_span_id(self) -> int:
        return 0x5500 << 48 | next(self._spans)


@dataclass
class RequestPlan:
    """One request of the span contract; times in ms on the true clock after ``ANCHOR_NS``."""

    start_ms: float = 0.0
    input_tokens: int = 1025
    output_tokens: int = 150
    chunk_tokens: Sequence[int] | None = None  # tokens per visible chunk (default: 1 each)
    gap_ms: float = 25.0
    gaps_ms: Sequence[float] | None = None  # each chunk's gap to the one before (default: gap_ms each)
    network_in_ms: float = 5.0
    gateway_overhead_ms: float = 3.0
    tokenize_ms: float = 11.0
    tokenize_to_queue_ms: float = 1.0
    queue_ms: float = 25.0
    prefill_ms: float = 140.0
    first_emit_ms: float = 2.0
    network_out_ms: float = 3.0
    finish_reason: str = "length"
    error_type: str | None = None  # sets status ERROR on client and gateway
    with_client: bool = True
    client_resource: dict[str, str] = field(default_factory=lambda: dict(CLIENT_RESOURCE))
    client_clock_ahead_ms: float = 0.0
    max_events: int = 10_000  # SpanLimits.max_events of both processes (128 = SDK default)
    decode_overlap_ms: float = 0.0  # > 0 plants overlapping decode steps
    plant_breaks: bool = False  # a negative-duration span, an event outside its span, chunks 1/2 swapped

    def chunks(self) -> list[int]:
        if self.chunk_tokens is not None:
            assert sum(self.chunk_tokens) == self.output_tokens
            return list(self.chunk_tokens)
        return [1] * self.output_tokens


class TraceWorld:
    """Providers per clock domain sharing one exporter and one id generator."""

    def __init__(self) -> None:
        self.exporter = InMemorySpanExporter()
        self.ids = SequentialIds()
        self._providers: dict[tuple[tuple[tuple[str, str], ...], int], TracerProvider] = {}

    def tracer(self, resource: dict[str, str], max_events: int) -> trace.Tracer:
        key = (tuple(sorted(resource.items())), max_events)
        if key not in self._providers:
            provider = TracerProvider(
                resource=Resource.create(resource), id_generator=self.ids,
                span_limits=SpanLimits(max_events=max_events),
            )
            provider.add_span_processor(SimpleSpanProcessor(self.exporter))
            self._providers[key] = provider
        return self._providers[key].get_tracer("tokentrace", "1")

    def add(self, plan: RequestPlan) -> None:
        """Write one request's spans (client span optional) through the SDK."""
        add_request(self, plan)

    def load(self, con: duckdb.DuckDBPyConnection | None = None) -> duckdb.DuckDBPyConnection:
        """All finished spans converted to canonical rows, inserted into ``con`` (new in-memory DB when None)."""
        con = con if con is not None else connect(None)
        spans, events, links = rows_from_sdk_spans(self.exporter.get_finished_spans())
        insert_rows(con, spans, events, links)
        return con


def _ns(ms: float) -> int:
    return ANCHOR_NS + round(ms * 1_000_000)


def _chunk_attrs(index: int, tokens: int, visible: bool) -> dict[str, object]:
    return {"tokentrace.chunk.index": index, "tokentrace.chunk.tokens": tokens, "tokentrace.chunk.visible": visible}


def add_request(world: TraceWorld, p: RequestPlan) -> None:
    chunks = p.chunks()
    client_t = world.tracer(p.client_resource, p.max_events)
    server_t = world.tracer(SERVER_RESOURCE, p.max_events)
    skew = p.client_clock_ahead_ms
    s = p.start_ms
    gw_start = s + p.network_in_ms
    tok_start = gw_start + p.gateway_overhead_ms
    tok_end = tok_start + p.tokenize_ms
    q_start = tok_end + p.tokenize_to_queue_ms
    q_end = q_start + p.queue_ms
    pre_end = q_end + p.prefill_ms
    if p.gaps_ms is not None:
        assert len(p.gaps_ms) == max(0, len(chunks) - 1)
        server_chunks = list(itertools.accumulate(p.gaps_ms, initial=pre_end + p.first_emit_ms))
    else:
        server_chunks = [pre_end + p.first_emit_ms + i * p.gap_ms for i in range(len(chunks))]
    client_chunks = [t + p.network_out_ms for t in server_chunks]
    last_server = server_chunks[-1] if chunks else pre_end + p.first_emit_ms
    gw_end = last_server + 1.0  # trailing finish/usage chunk written after the last visible one
    client_end = gw_end + p.network_out_ms
    usage = {
        "gen_ai.operation.name": "chat", "gen_ai.request.model": "m",
        "gen_ai.usage.input_tokens": p.input_tokens, "gen_ai.usage.output_tokens": p.output_tokens,
        "gen_ai.response.finish_reasons": [p.finish_reason],
    }
    if p.error_type:
        usage["error.type"] = p.error_type
    status = Status(StatusCode.ERROR, p.error_type) if p.error_type else None

    parent_ctx = None
    client_span = None
    if p.with_client:
        client_span = client_t.start_span("chat m", kind=SpanKind.CLIENT, start_time=_ns(s + skew), attributes=usage)
        parent_ctx = trace.set_span_in_context(client_span)
    gw = server_t.start_span("gateway", context=parent_ctx, kind=SpanKind.SERVER, start_time=_ns(gw_start),
                             attributes={**usage, "gen_ai.response.id": "r", "tokentrace.generated_tokens": p.output_tokens})
    gctx = trace.set_span_in_context(gw)
    server_t.start_span("tokenize", context=gctx, start_time=_ns(tok_start)).end(end_time=_ns(tok_end))
    queue = server_t.start_span("queue", context=gctx, start_time=_ns(q_start))
    if p.plant_breaks:  # event 4 ms after its span ends; a span ending 2 ms before it starts
        queue.add_event("tokentrace.admitted", timestamp=_ns(q_end + 4))
        server_t.start_span("postprocess", context=gctx, start_time=_ns(q_start)).end(end_time=_ns(q_start - 2))
    queue.end(end_time=_ns(q_end))
    server_t.start_span(
        "prefill", context=gctx, start_time=_ns(q_end),
        attributes={"tokentrace.input_tokens": p.input_tokens, "tokentrace.kv.bytes_per_token": KV_BYTES_PER_TOKEN,
                    "tokentrace.kv.bytes": KV_BYTES_PER_TOKEN * p.input_tokens, "tokentrace.kv.layout": "gqa"},
    ).end(end_time=_ns(pre_end))
    produced = chunks[0] if chunks else 0
    for k in range(1, len(chunks)):  # decode step k yields chunk k, emitted at server_chunks[k]
        d_end = server_chunks[k] - 1.0
        d_start = server_chunks[k - 1] - 1.0 - p.decode_overlap_ms
        produced += chunks[k]
        server_t.start_span(
            "decode", context=gctx, start_time=_ns(d_start),
            attributes={"tokentrace.step": k, "tokentrace.context_tokens": p.input_tokens + k,
                        "tokentrace.kv.bytes_per_token": KV_BYTES_PER_TOKEN,
                        "tokentrace.kv.bytes": KV_BYTES_PER_TOKEN * (p.input_tokens + produced - 1)},
        ).end(end_time=_ns(d_end))
    sent = list(server_chunks)
    if p.plant_breaks:  # the gateway records chunk 1 at chunk 2's time and vice versa
        sent[1], sent[2] = sent[2], sent[1]
    for i, (t, n) in enumerate(zip(sent, chunks)):
        gw.add_event("tokentrace.chunk", _chunk_attrs(i, n, True), timestamp=_ns(t))
    gw.add_event("tokentrace.chunk", _chunk_attrs(len(chunks), 0, False), timestamp=_ns(gw_end))
    if status is not None:
        gw.set_status(status)
    gw.end(end_time=_ns(gw_end))
    if client_span is not None:
        for i, (t, n) in enumerate(zip(client_chunks, chunks)):
            client_span.add_event("tokentrace.chunk", _chunk_attrs(i, n, True), timestamp=_ns(t + skew))
        client_span.add_event("tokentrace.chunk", _chunk_attrs(len(chunks), 0, False), timestamp=_ns(client_end + skew))
        if status is not None:
            client_span.set_status(status)
        client_span.end(end_time=_ns(client_end + skew))


# --- named fixtures -------------------------------------------------------------------

#: Requests of the mixed fixture, in start order; the comment is what each plants.
MIXED_PLANS: dict[str, RequestPlan] = {
    "seed": RequestPlan(start_ms=0),  # the worked example: TTFT 190, E2E 3915, TPOT 25
    "failed": RequestPlan(start_ms=10_000, output_tokens=3, finish_reason="error", error_type="InternalError"),
    "cancelled": RequestPlan(start_ms=20_000, output_tokens=10, finish_reason="cancelled"),
    "one_token": RequestPlan(start_ms=30_000, output_tokens=1, finish_reason="length"),  # TPOT NULL
    "zero_tokens": RequestPlan(start_ms=40_000, output_tokens=0, finish_reason="stop"),  # no f, no e
    # speculative decoding: 4 chunks carrying 1, 3, 2, 4 tokens, 25 ms apart: O = 10
    "multi_token": RequestPlan(start_ms=50_000, output_tokens=10, chunk_tokens=[1, 3, 2, 4]),
    # 150 chunks + 1 finish chunk > 128: the SDK drops 23 events on both spans
    "dropped": RequestPlan(start_ms=60_000, max_events=128),
    # client clock 35 ms ahead; network in/out 5/3, 9/2, 6/4 ms: theta in [-37, -30]
    "skew_a": RequestPlan(start_ms=70_000, output_tokens=5, client_resource=dict(SKEWED_CLIENT_RESOURCE),
                          client_clock_ahead_ms=35),
    "skew_b": RequestPlan(start_ms=80_000, output_tokens=5, network_in_ms=9, network_out_ms=2,
                          client_resource=dict(SKEWED_CLIENT_RESOURCE), client_clock_ahead_ms=35),
    "skew_c": RequestPlan(start_ms=90_000, output_tokens=5, network_in_ms=6, network_out_ms=4,
                          client_resource=dict(SKEWED_CLIENT_RESOURCE), client_clock_ahead_ms=35),
    "server_only": RequestPlan(start_ms=100_000, output_tokens=4, with_client=False),
    "overlap": RequestPlan(start_ms=110_000, output_tokens=4, decode_overlap_ms=2),  # decode_steps_overlap x2
    # negative_duration 2 ms, event_outside_span 4 ms, chunks_out_of_order 25 ms (gateway chunk 2)
    "broken": RequestPlan(start_ms=120_000, output_tokens=4, plant_breaks=True),
}


def mixed_world() -> TraceWorld:
    """Every planted case of :data:`MIXED_PLANS` in one set of traces (trace n = n-th plan)."""
    world = TraceWorld()
    for plan in MIXED_PLANS.values():
        world.add(plan)
    return world


def mixed_trace_id(name: str) -> str:
    """Trace id (hex) of the named plan in :func:`mixed_world`."""
    n = list(MIXED_PLANS).index(name) + 1
    return f"{0x7700 << 112 | n:032x}"


def seed_db() -> duckdb.DuckDBPyConnection:
    """An in-memory database holding only the worked example's request (client + server)."""
    world = TraceWorld()
    world.add(RequestPlan())
    return world.load()


def mixed_db() -> duckdb.DuckDBPyConnection:
    """An in-memory database holding :func:`mixed_world`."""
    return mixed_world().load()


def write_parquet_dump(con: duckdb.DuckDBPyConnection, directory: str) -> None:
    """A ``tokentrace export``-shaped dump written with DuckDB's own COPY: folders spans/,
    span_events/, span_links/ of Parquet, Hive-partitioned by service_name and date (UTC day
    of the span's start; events and links follow their span)."""
    import os

    os.makedirs(directory, exist_ok=True)
    day = "strftime(make_timestamp(s.start_ns // 1000), '%Y-%m-%d')"
    con.execute(f"COPY (SELECT s.*, {day} AS date FROM spans s) TO '{directory}/spans' "
                "(FORMAT parquet, PARTITION_BY (service_name, date))")
    for table in ("span_events", "span_links"):
        con.execute(
            f"COPY (SELECT c.*, s.service_name, {day} AS date FROM {table} c JOIN spans s "
            f"ON s.trace_id = c.trace_id AND s.span_id = c.span_id) TO '{directory}/{table}' "
            "(FORMAT parquet, PARTITION_BY (service_name, date), OVERWRITE_OR_IGNORE true)"
        )
