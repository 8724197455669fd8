"""The keep policy behind the real gateway (continuous engine, span exporter process): a
planted stall (one engine step held while three requests decode) keeps exactly the requests
it slowed whole; every other request leaves its gateway span alone, with its figures.

Real uvicorn server on 127.0.0.1, the tiny model, spans to an OTLP-JSON lines file written by
the span exporter process (which gets TOKENTRACE_KEEP_GAP_MS in its environment through the
provider's ``exporter_env``, as under ``serve --keep-gap-ms``; this process's is unchanged).
"""

from __future__ import annotations

import asyncio
import json
import time
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("fastapi")
pytest.importorskip("torch")

import httpx
from opentelemetry.sdk.trace.sampling import ALWAYS_OFF
from opentelemetry.trace import NoOpTracer

from instrument.client import stream_chat
from instrument.gateway.app import GatewaySettings, create_app
from instrument.gateway.server import ServerThread
from instrument.hf.model_handle import load_model_handle
from instrument.otel.tracing import setup_tracing
from instrument.records.keep import HeadMarkingSampler
from instrument.records.span_forward import forward_spans

TIMEOUT_S = 60.0
STALL_S = 0.8  # the planted stall: one step held this long while three requests decode
KEEP_GAP_MS = 300  # the policy: a gap over this keeps the request whole
TOKENS = 32


def _value(value: dict[str, Any]) -> Any:
    """An OTLP/JSON AnyValue as Python (intValue is a string there)."""
    kind, raw = next(iter(value.items()))
    if kind == "intValue":
        return int(raw)
    if kind == "arrayValue":
        return [_value(v) for v in raw.get("values", [])]
    return raw


def _attrs(span: dict[str, Any]) -> dict[str, Any]:
    return {a["key"]: _value(a["value"]) for a in span.get("attributes", [])}


def _spans(path: Path) -> list[dict[str, Any]]:
    out = []
    for line in path.read_text(encoding="utf-8").splitlines():
        for rs in json.loads(line)["resourceSpans"]:
            for ss in rs["scopeSpans"]:
                for span in ss["spans"]:
                    span["_attrs"] = _attrs(span)
                    out.append(span)
    return out


@pytest.mark.timing
def test_a_planted_stall_keeps_exactly_the_requests_it_slowed(tmp_path: Path) -> None:
    path = tmp_path / "keep.jsonl"
    # the random sample takes nothing (always_off): every request kept whole is kept by the policy
    provider = setup_tracing("tokentrace-gateway", exporter=["otlp_json"], json_path=path, make_exporters=False,
                             sampler=HeadMarkingSampler(ALWAYS_OFF))
    provider.exporter_env["TOKENTRACE_KEEP_GAP_MS"] = str(KEEP_GAP_MS)
    provider.exporter_env["TOKENTRACE_KEEP_STEP_RATIO"] = "0"  # engine steps: only those of kept requests' gaps
    forward_spans(provider)
    app = create_app(load_model_handle("tiny"), provider, GatewaySettings(engine="continuous", max_tokens_limit=512))
    engine = app.state.gateway.engine
    plant = {"armed": True, "stalled_step": None}
    scheduled = engine.on_scheduled

    def stalling(start_ns: int, forward_start_ns: int, sequences: list[Any], *args: Any) -> None:
        # the first step in which three sequences decode (phase A) is held STALL_S
        if plant["armed"] and sum(1 for s in sequences if not s.prefill) >= 3:
            plant["armed"] = False
            plant["stalled_step"] = engine.health()["steps"] + 1
            time.sleep(STALL_S)
        scheduled(start_ns, forward_start_ns, sequences, *args)

    engine.on_scheduled = stalling
    server = ServerThread(app).start()
    body = {"model": "tiny", "messages": [{"role": "user", "content": "hello"}], "max_tokens": TOKENS,
            "stream": True, "ignore_eos": True}

    async def three() -> list[Any]:
        async with httpx.AsyncClient(timeout=TIMEOUT_S) as http:
            return await asyncio.gather(*(stream_chat(http, server.url, body, tracer=NoOpTracer(), index=i)
                                          for i in range(3)))

    try:
        stalled = asyncio.run(asyncio.wait_for(three(), TIMEOUT_S))
        assert not plant["armed"], "the three requests never decoded in one step"
        steady = asyncio.run(asyncio.wait_for(three(), TIMEOUT_S))
    finally:
        server.stop()
        provider.shutdown()
    results = [*stalled, *steady]
    assert all(r.completed for r in results), [(r.status_code, r.error) for r in results]
    spans = _spans(path)
    gateways = {s["_attrs"]["gen_ai.response.id"]: s for s in spans if s["name"] == "gateway"}
    assert sorted(gateways) == sorted(r.response_id for r in results), "every request left its gateway span"
    children: dict[str, list[dict[str, Any]]] = {}
    for s in spans:
        children.setdefault(s.get("parentSpanId", ""), []).append(s)
    for result in results:
        gw = gateways[result.response_id]
        a = gw["_attrs"]
        detail = {s["name"] for s in children.get(gw["spanId"], [])}
        chunks = [e for e in gw.get("events", []) if e["name"] == "tokentrace.chunk"]
        assert a["tokentrace.sampling.head"] is False
        assert a["gen_ai.latency.e2e"] >= a["gen_ai.latency.time_to_first_token"] > 0
        crossed = a["tokentrace.gap.max_ms"] > KEEP_GAP_MS
        if crossed:  # kept whole, for the rule it crossed
            assert a["tokentrace.sampling.reason"] == "gap", a
            assert a["tokentrace.sampling.rules"] == [f"gap {a['tokentrace.gap.max_ms']:.0f} ms > {KEEP_GAP_MS} ms"]
            assert detail == {"tokenize", "queue", "prefill", "decode"} and chunks, (detail, len(chunks))
            decodes = sorted(int(s["endTimeUnixNano"]) for s in children[gw["spanId"]] if s["name"] == "decode")
            prefill_end = max(int(s["endTimeUnixNano"]) for s in children[gw["spanId"]] if s["name"] == "prefill")
            emitted = [prefill_end, *decodes]
            gaps = [b - a for a, b in zip(emitted, emitted[1:])]
            assert a["tokentrace.gap.max_ms"] == pytest.approx(max(gaps) / 1e6), "the summary's gap is the spans'"
        else:  # the summary alone: no chunk events, no other span
            assert a["tokentrace.sampling.reason"] == "summary", a
            assert detail == set() and chunks == []
    reasons = [gateways[r.response_id]["_attrs"]["tokentrace.sampling.reason"] for r in results]
    decisions = provider.exporter_process.health()["keep"]  # the exporter process's last report
    steps_written = decisions.pop("engine_steps")
    assert decisions == {**{r: reasons.count(r) for r in set(reasons)}, "forced": 0}, decisions
    # engine_step spans: exactly the steps that ran during each kept request's 3 largest gaps
    wanted: set[int] = set()
    for gw in (g for g in gateways.values() if g["_attrs"]["tokentrace.sampling.reason"] == "gap"):
        kids = children[gw["spanId"]]
        first = max((s for s in kids if s["name"] == "prefill"), key=lambda s: int(s["endTimeUnixNano"]))
        emitted = sorted((int(s["endTimeUnixNano"]), s["_attrs"]["tokentrace.engine.step"])
                         for s in [first, *(k for k in kids if k["name"] == "decode")])
        gaps = sorted(((b[0] - a[0], a[1], b[1]) for a, b in zip(emitted, emitted[1:])), reverse=True)[:3]
        wanted |= {step for _, before, after in gaps for step in range(max(before + 1, after - 63), after + 1)}
    written = [s for s in spans if s["name"] == "engine_step"]
    assert sorted(s["_attrs"]["tokentrace.engine.step"] for s in written) == sorted(wanted)
    assert plant["stalled_step"] in wanted and steps_written == {"sampled": 0, "kept_for_gaps": len(wanted), "lost": 0}
    roots = {s["spanId"]: s for s in spans if s["name"] == "engine"}
    assert all(roots[s["parentSpanId"]]["_attrs"]["tokentrace.sampling.reason"] == "gap" for s in written)
    kept = {r.response_id for r in results if gateways[r.response_id]["_attrs"]["tokentrace.sampling.reason"] == "gap"}
    assert kept >= {r.response_id for r in stalled}, "every request the planted stall slowed is kept whole"
    for result in stalled:
        a = gateways[result.response_id]["_attrs"]
        assert a["tokentrace.gap.max_ms"] >= STALL_S * 1e3 and a["tokentrace.gap.engine_step"] == plant["stalled_step"]


def test_serve_carries_the_policy_to_the_exporter_process_and_leaves_its_own_environment() -> None:
    """The flags over the environment, checked, as the exporter process's variables; a refused
    policy changes nothing either."""
    import os

    import click

    from analyzer.cli.serve import _keep_policy
    from analyzer.errors import UserError

    before = dict(os.environ)
    policy, env = _keep_policy("process", {"ttft": None, "gap": 200.0, "tpot": None, "e2e": None, "slowest": 0.01})
    assert policy is not None and policy.describe() == "gap > 200 ms, slowest 1 %, errors, preempted"
    assert env == {"TOKENTRACE_KEEP_TTFT_MS": "", "TOKENTRACE_KEEP_GAP_MS": "200.0", "TOKENTRACE_KEEP_TPOT_MS": "",
                   "TOKENTRACE_KEEP_E2E_MS": "", "TOKENTRACE_KEEP_SLOWEST": "0.01"}
    assert _keep_policy("process", dict.fromkeys(("ttft", "gap", "tpot", "e2e", "slowest"))) == (None, {})
    with pytest.raises((UserError, click.ClickException), match="needs --engine continuous with --span-export process"):
        _keep_policy("inline", {"ttft": 500.0, "gap": None, "tpot": None, "e2e": None, "slowest": None})
    assert dict(os.environ) == before

