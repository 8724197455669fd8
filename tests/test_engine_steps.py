"""The engine-step analysis (view engine_steps; queries steps, steps_summary, stalls,
stalls_groups, stalls_slowest) over spans of the real gateway on both engines.

One continuous-engine run (tiny model, real uvicorn on 127.0.0.1): three streaming requests
decode while a 1,117-token prompt arrives, then a few-hundred-token one, so engine steps
co-schedule prefill with decode; and one sequential-engine run, in another clock domain.
Their SDK spans are loaded into one DuckDB database as `tokentrace bench` does. Every figure
is compared with an independent Python computation over the same SDK spans
(tests/step_reference.py), never with hand-written numbers.
"""

from __future__ import annotations

import asyncio
import time
from typing import Any

import pytest

pytest.importorskip("fastapi")
pytest.importorskip("torch")

import httpx
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import SpanLimits, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

import step_reference as ref
from analyzer.db.store import connect, insert_rows
from analyzer.db.views import install_views
from analyzer.formats.sdk_spans import rows_from_sdk_spans
from analyzer.query.runner import run_query
from instrument.client import chat_body, stream_chat
from instrument.gateway.app import GatewaySettings, create_app
from instrument.gateway.server import ServerThread
from instrument.hf.model_handle import load_model_handle
from instrument.otel.tracing import get_tracer

TIMEOUT_S = 60.0
CONTINUOUS = "tokentrace-gateway|continuous-1|test"
SEQUENTIAL = "tokentrace-gateway|sequential-1|test"
LONG_PROMPT = "long prompt words " * 100  # 1,117 prompt tokens with the chat template
MEDIUM_PROMPT = "medium prompt " * 60  # 557


def _provider(instance: str) -> tuple[TracerProvider, InMemorySpanExporter]:
    exporter = InMemorySpanExporter()
    resource = Resource.create({"service.name": "tokentrace-gateway", "service.instance.id": instance,
                                "host.name": "test"})
    provider = TracerProvider(resource=resource, span_limits=SpanLimits(max_events=4096))
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    return provider, exporter


def _serve(handle: Any, engine: str, go: Any) -> list[Any]:
    """Run ``go(url, engine)`` (a coroutine function) against a served gateway; its spans."""
    instance = f"{engine}-1"
    provider, exporter = _provider(instance)
    options = {"max_batch_tokens": 2048} if engine == "continuous" else {}
    app = create_app(handle, provider, GatewaySettings(engine=engine, max_tokens_limit=512, engine_options=options))
    server = ServerThread(app).start()
    try:
        results = asyncio.run(asyncio.wait_for(go(server.url, app.state.gateway.engine), TIMEOUT_S))
        assert all(r.completed for r in results), [(r.status_code, r.error) for r in results]
        admission = app.state.gateway.admission
        deadline = time.monotonic() + TIMEOUT_S
        while admission.requests_in_flight and time.monotonic() < deadline:
            time.sleep(0.02)
    finally:
        server.stop()
    return list(exporter.get_finished_spans())


async def _after_steps(engine: Any, steps: int) -> int:
    """Wait (bounded) until the engine has run ``steps`` more steps; the step count then."""
    start = engine.health()["steps"]
    deadline = time.monotonic() + TIMEOUT_S
    while engine.health()["steps"] < start + steps and time.monotonic() < deadline:
        await asyncio.sleep(0.002)
    return engine.health()["steps"]


async def _continuous_load(url: str, engine: Any) -> list[Any]:
    provider, _ = _provider("client-1")
    tracer = get_tracer(provider)
    async with httpx.AsyncClient(timeout=TIMEOUT_S) as http:
        short = [asyncio.create_task(stream_chat(http, url, chat_body("tiny", p, max_tokens=24), tracer=tracer, index=i))
                 for i, p in enumerate(["hi", "The quick brown fox", "KV cache " * 4])]
        await _after_steps(engine, 3)  # the three are decoding
        long = asyncio.create_task(stream_chat(http, url, chat_body("tiny", LONG_PROMPT, max_tokens=6), tracer=tracer,
                                               index=3))
        await _after_steps(engine, 4)  # the long prompt was prefilled beside their decodes
        medium = await stream_chat(http, url, chat_body("tiny", MEDIUM_PROMPT, max_tokens=6), tracer=tracer, index=4)
        return [*(await asyncio.gather(*short, long)), medium]


async def _sequential_load(url: str, engine: Any) -> list[Any]:
    provider, _ = _provider("client-2")
    async with httpx.AsyncClient(timeout=TIMEOUT_S) as http:
        return await asyncio.gather(*(stream_chat(http, url, chat_body("tiny", p, max_tokens=8),
                                                  tracer=get_tracer(provider), index=i)
                                      for i, p in enumerate(["hi", "sequential"])))


@pytest.fixture(scope="module")
def world() -> Any:
    """(DuckDB connection with both runs' spans, reference span records)."""
    handle = load_model_handle("tiny")
    sdk_spans = _serve(handle, "continuous", _continuous_load) + _serve(handle, "sequential", _sequential_load)
    con = connect()
    insert_rows(con, *rows_from_sdk_spans(sdk_spans))
    install_views(con)
    yield con, ref.from_sdk(sdk_spans)
    con.close()


def _rows(con: Any, name: str, **params: Any) -> list[dict[str, Any]]:
    return run_query(con, name, params).dicts()


def _same(got: dict[str, Any], want: dict[str, Any]) -> None:
    for key, value in want.items():
        if isinstance(value, float):
            assert got[key] == pytest.approx(value, rel=1e-9, abs=1e-9), key
        else:
            assert got[key] == value, key


def test_engine_steps_has_one_row_per_engine_step_span(world: Any) -> None:
    con, spans = world
    step_spans = [s for s in spans if s.name == "engine_step"]
    assert step_spans and all(s.domain == CONTINUOUS for s in step_spans)
    rows = con.execute("SELECT clock_domain, step, span_id FROM engine_steps").fetchall()
    assert sorted(rows) == sorted((s.domain, s.attrs["tokentrace.engine.step"], s.span_id) for s in step_spans)
    assert con.execute("SELECT max(step_spans) FROM engine_steps").fetchone()[0] == 1


def test_steps_rows_equal_python(world: Any) -> None:
    con, spans = world
    want = ref.steps(spans)
    got = _rows(con, "steps", clock_domain=CONTINUOUS)
    assert len(got) == len(want)
    for g, w in zip(got, want):
        _same(g, w)
        assert g["null_reason"] is None


def test_steps_summary_equals_python(world: Any) -> None:
    con, spans = world
    want = ref.step_summary(ref.steps(spans))
    got = {(r["grouping"], r["group_label"]): r for r in _rows(con, "steps_summary", clock_domain=CONTINUOUS)}
    assert {k for k, r in got.items() if r["steps"] > 0} == set(want)
    for key, w in want.items():
        _same(got[key], w)
    assert got[("all", "all")]["steps"] == len(ref.steps(spans))


def test_every_gap_maps_to_exactly_one_step_and_equals_python(world: Any) -> None:
    con, spans = world
    want = [g for g in ref.gaps(spans) if g["clock_domain"] == CONTINUOUS]
    got = _rows(con, "stalls", clock_domain=CONTINUOUS)
    generated = sum(s.attrs["tokentrace.generated_tokens"] - 1 for s in spans
                    if s.name == "gateway" and s.domain == CONTINUOUS)
    assert len(got) == len(want) == generated
    step_ends = {}
    for s in spans:
        if s.name == "engine_step":
            assert s.attrs["tokentrace.engine.step"] not in step_ends
            step_ends[s.attrs["tokentrace.engine.step"]] = s.end_ns
    for g, w in zip(got, want):
        _same(g, w)
        assert g["null_reason"] is None
        assert g["emit_ns"] == step_ends[g["step"]], "a token is emitted when its engine step ends"
        assert g["steps_in_gap"] >= 1


def test_some_steps_co_schedule_prefill_with_decode(world: Any) -> None:
    con, _ = world
    groups = {(r["grouping"], r["group_label"]): r for r in _rows(con, "stalls_groups", clock_domain=CONTINUOUS)}
    assert [k[1] for k in groups if k[0] == "prefill_tokens"] == ["0", "1-128", "129-1024", ">1024"]
    assert groups[("prefill_tokens", ">1024")]["gaps"] >= 1
    assert groups[("prefill_tokens", "129-1024")]["gaps"] >= 1
    mixed = con.execute("SELECT count(*) FROM engine_steps WHERE prefill_tokens > 1024 AND decode_tokens > 0").fetchone()
    assert mixed[0] >= 1


def test_stalls_groups_equal_python(world: Any) -> None:
    con, spans = world
    want = ref.stall_groups(ref.gaps(spans))
    got = _rows(con, "stalls_groups", clock_domain=CONTINUOUS)
    seen = {(r["grouping"], r["group_label"]): r for r in got if r["gaps"] > 0}
    assert set(seen) == set(want)
    for key, w in want.items():
        _same(seen[key], w)
    for r in got:
        if r["gaps"] == 0:
            assert r["null_reason"] == "no gap in this group" and r["itl_mean_ms"] is None


def test_stalls_slowest_equal_python(world: Any) -> None:
    con, spans = world
    gap_rows = [g for g in ref.gaps(spans) if g["clock_domain"] == CONTINUOUS]
    for per_request in (1, 3):
        want = ref.slowest(spans, gap_rows, per_request)
        got = _rows(con, "stalls_slowest", clock_domain=CONTINUOUS, per_request=per_request)
        assert len(got) == len(want)
        for g, w in zip(got, want):
            _same(g, {k: v for k, v in w.items() if k in g})
    assert any(r["shared_prefill_tokens"] > 1024 for r in _rows(con, "stalls_slowest", clock_domain=CONTINUOUS))


def test_a_sequential_trace_gives_null_with_its_reason(world: Any) -> None:
    con, spans = world
    (row,) = _rows(con, "steps", clock_domain=SEQUENTIAL)
    assert row["step"] is None and row["batch_size"] is None and row["step_ms"] is None
    assert row["null_reason"].startswith("no step data: 2 prefill span(s)")
    (summary,) = _rows(con, "steps_summary", clock_domain=SEQUENTIAL)
    assert summary["steps"] == 0 and summary["step_ms_mean"] is None
    assert summary["null_reason"].startswith("no engine_step spans")
    want = [g for g in ref.gaps(spans) if g["clock_domain"] == SEQUENTIAL]
    got = _rows(con, "stalls", clock_domain=SEQUENTIAL)
    assert len(got) == len(want) > 0
    for g, w in zip(got, want):
        assert g["itl_ms"] == pytest.approx(w["itl_ms"]), "the gap itself is known"
        assert g["step"] is None and g["prefill_tokens"] is None and g["prefill_tokens_bucket"] is None
        assert g["null_reason"].startswith("no step data")
    groups = _rows(con, "stalls_groups", clock_domain=SEQUENTIAL)
    assert [(r["grouping"], r["group_label"], r["gaps"]) for r in groups] == [
        ("prefill_tokens", None, len(want)), ("batch_size", None, len(want))]
    assert all(r["null_reason"].startswith("no step data") for r in groups)
    slow = _rows(con, "stalls_slowest", clock_domain=SEQUENTIAL)
    assert slow and all(r["shared_sequences"] is None and r["itl_ms"] is not None for r in slow)


def test_gateway_chunks_never_precede_the_engine_emission(world: Any) -> None:
    """The clock choice of docs/metrics.md: the gateway writes a token's chunk after the
    engine emitted it (same process, one clock), so the engine gap is the step's own."""
    con, _ = world
    lags = con.execute("""
        WITH chunks AS (
            SELECT e.span_id AS request_span_id, e.time_ns,
                   sum(e.attr_int['tokentrace.chunk.tokens']) OVER (
                       PARTITION BY e.trace_id, e.span_id ORDER BY e.attr_int['tokentrace.chunk.index']) AS tokens
            FROM span_events e JOIN spans s ON s.trace_id = e.trace_id AND s.span_id = e.span_id
            WHERE s.name = 'gateway' AND s.clock_domain = $d AND e.attr_bool['tokentrace.chunk.visible']
        )
        SELECT c.time_ns - g.emit_ns FROM chunks c
        JOIN request_step_gaps g ON g.request_span_id = c.request_span_id AND g.token_index = c.tokens
    """, {"d": CONTINUOUS}).fetchall()
    assert lags and min(lag for (lag,) in lags) >= 0
