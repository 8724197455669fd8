"""The adapters on what real clients send to `tokentrace serve --model smollm2`:
openai-v2 2.4b0 stock (no traceparent) and with httpx2's instrumentor, and OpenLLMetry 0.62.4
(tests/data/real/openai-clients-tokentrace, provenance in its README.md). Exact values: the
server's 15 requests are the truth (14 succeeded, 1 cancelled, 184 output tokens in the
succeeded ones)."""

from __future__ import annotations

from collections import Counter
from pathlib import Path

import pytest

from analyzer.audit.records_traces import load_traced_requests
from analyzer.db.store import connect
from analyzer.formats.canonical import SPAN_COLUMNS
from analyzer.formats.load import load_paths
from analyzer.query.runner import run_query

CAPTURE = Path(__file__).resolve().parent / "data" / "real" / "openai-clients-tokentrace"
FILES = ("server.jsonl", "openai-v2-stock.jsonl", "openai-v2-httpx2.jsonl", "openllmetry.jsonl")
GATEWAY = "tokentrace-gateway|%"


def _db(*names: str, path: Path | None = None):
    con = connect(path)
    load_paths(con, [str(CAPTURE / n) for n in names])
    return con


@pytest.fixture(scope="module")
def capture():
    con = _db(*FILES)
    yield con, run_query(con, "requests").dicts()
    con.close()


def _client(rows, source=None):
    return [r for r in rows if r["perspective"] == "client" and (source is None or r["source"] == source)]


# --- item 2: one request, two perspectives, also across traces -----------------------------

def test_every_client_span_is_paired_with_its_server_span(capture) -> None:
    con, rows = capture
    server = {(r["trace_id"], r["request_span_id"]): r for r in rows if r["perspective"] == "server"}
    client = _client(rows)
    assert len(server) == 15 and Counter(r["source"] for r in client) == {"openai-v2": 11, "openllmetry": 4}
    paired = con.execute("SELECT source, paired_by, count(*) FROM genai_client_request_spans "
                         "GROUP BY ALL ORDER BY ALL").fetchall()
    assert paired == [("openai-v2", "gen_ai.response.id", 6), ("openai-v2", "trace", 5), ("openllmetry", "trace", 4)]
    for r in client:  # the server span's ids, its X-Request-ID, its response id
        s = server[(r["trace_id"], r["request_span_id"])]
        assert (r["response_id"], r["client_request_id"]) == (s["response_id"], s["client_request_id"])
    stock = [r for r in client if r["client_request_id"].startswith("stock-")]
    assert len(stock) == 6 and all(
        r["request_id_note"].startswith("openai-v2: the client span (trace ") and
        r["request_id_note"].endswith(") and the server span are in separate traces (no traceparent reached "
                                      "the server): paired by gen_ai.response.id") for r in stock)
    # the client span's own trace is kept
    own = con.execute("SELECT count(*) FROM genai_client_request_spans WHERE client_trace_id <> trace_id").fetchone()
    assert own == (6,)


def test_without_a_response_id_the_x_request_id_pairs_them() -> None:
    con = _db("server.jsonl", "openllmetry.jsonl")
    # as if no traceparent had been sent and the client had recorded no response id: the
    # OpenLLMetry spans (and their events) moved to traces of their own, gen_ai.response.id removed
    con.execute("CREATE TEMP TABLE moved AS SELECT trace_id, span_id, md5(span_id) AS new_trace FROM spans "
                "WHERE name = 'openai.chat'")
    con.execute("UPDATE span_events e SET trace_id = m.new_trace FROM moved m "
                "WHERE e.trace_id = m.trace_id AND e.span_id = m.span_id")
    con.execute("UPDATE spans s SET trace_id = m.new_trace, parent_span_id = NULL, "
                "attr_str = map_from_entries(list_filter(map_entries(s.attr_str), lambda x: x.key <> 'gen_ai.response.id')) "
                "FROM moved m WHERE s.trace_id = m.trace_id AND s.span_id = m.span_id")
    rows = run_query(con, "requests").dicts()
    paired = con.execute("SELECT paired_by, count(*) FROM genai_client_request_spans GROUP BY 1").fetchall()
    assert paired == [("X-Request-ID", 4)]
    server = {(r["trace_id"], r["request_span_id"]): r for r in rows if r["perspective"] == "server"}
    client = _client(rows)
    assert len(client) == 4 and all((r["trace_id"], r["request_span_id"]) in server for r in client)
    assert [r["client_request_id"] for r in client] == ["ollm-stream-0", "ollm-stream-1", "ollm-stream-2",
                                                         "ollm-whole-0"]
    assert all(r["request_id_note"].endswith("paired by X-Request-ID") for r in client)
    # matched against the server's chunk events across traces: the same TTFT as in one trace
    assert [r["ttft_ms"] for r in client[:3]] == pytest.approx([166.037703, 166.28143, 209.894107], abs=1e-6)
    assert run_query(con, "window").dicts()[0]["attempted"] == 15
    con.close()


def test_an_ambiguous_id_is_not_paired_and_the_note_says_why() -> None:
    """Two server spans in other traces with the client's response id (a replayed capture
    loaded twice under new trace ids, say): the stock client span is not paired, and its
    note says the id is ambiguous, not that no server span carries it."""
    con = _db("server.jsonl", "openai-v2-stock.jsonl")
    target = con.execute("SELECT min(c.attr_str['gen_ai.response.id']) FROM spans c JOIN spans s "
                         "ON s.kind = 'SERVER' AND s.attr_str['gen_ai.response.id'] = c.attr_str['gen_ai.response.id'] "
                         "AND s.trace_id <> c.trace_id WHERE c.kind = 'CLIENT'").fetchone()[0]
    stored = [*SPAN_COLUMNS, "load_id"]  # not the dedicated columns: generated from the maps
    values = ["md5(trace_id)" if c == "trace_id" else c for c in stored]
    con.execute(f"INSERT INTO spans ({', '.join(stored)}) SELECT {', '.join(values)} FROM spans "
                "WHERE kind = 'SERVER' AND attr_str['gen_ai.response.id'] = $id", {"id": target})
    rows = {r["response_id"]: r for r in _client(run_query(con, "requests").dicts())}
    note = rows[target]["request_id_note"]
    assert rows[target]["request_span_id"] == con.execute(
        "SELECT span_id FROM spans WHERE kind = 'CLIENT' AND attr_str['gen_ai.response.id'] = $id", {"id": target}
    ).fetchone()[0]  # its own request, not joined to either server span
    assert "its gen_ai.response.id is ambiguous across traces (2 server span(s) carry it" in note
    assert "none in another trace" not in note
    paired = con.execute("SELECT count(*) FILTER (WHERE paired_by = 'gen_ai.response.id') FROM "
                         "genai_client_request_spans").fetchone()
    assert paired == (5,)  # the other five stock spans stay paired
    con.close()


def test_window_counts_each_request_once(capture) -> None:
    con, _ = capture
    w = run_query(con, "window").dicts()[0]
    # before the gateway adopted client spans: attempted 21, succeeded 20 (each stock openai-v2 client span its own request)
    assert (w["attempted"], w["succeeded"], w["failed"], w["cancelled"], w["output_tokens"]) == (15, 14, 0, 1, 184)
    assert w["token_counting_rule"] == "output tokens (gen_ai.usage.output_tokens) of cohort requests that succeeded"
    for perspective in ("client", "server"):
        assert run_query(con, "window", {"perspective": perspective}).dicts()[0]["attempted"] == 15


def test_abandoned_stream_is_cancelled_from_the_server_span(capture) -> None:
    _, rows = capture
    [gone] = [r for r in _client(rows) if r["client_request_id"] == "stock-abandoned"]
    assert (gone["outcome"], gone["finish_reason"], gone["output_tokens"]) == ("cancelled", "cancelled", 2)
    assert gone["output_tokens_basis"] == "gen_ai.usage.output_tokens (server span)"


def test_audit_counts_traced_requests_once(tmp_path) -> None:
    db = tmp_path / "traces.duckdb"
    _db(*FILES, path=db).close()
    traced = load_traced_requests(db)
    assert len(traced) == 30 and len({(t["trace_id"], t["request_span_id"]) for t in traced}) == 15


def test_skew_offsets_have_one_pair_per_client_process(capture) -> None:
    con, _ = capture
    pairs = {p["client_domain"].split("|")[0]: p for p in run_query(con, "skew_offsets").dicts()}
    assert {k: (p["requests"], p["verdict"]) for k, p in pairs.items()} == {
        "openai-v2-stock": (6, "consistent"), "openai-v2-httpx2": (5, "consistent"), "openllmetry": (4, "consistent")}
    stock = pairs["openai-v2-stock"]  # paired across traces: bounds as for a joined trace
    assert (stock["offset_min_ms"], stock["offset_max_ms"]) == pytest.approx((-1.749313, 1.825007), abs=1e-6)


# --- item 1: client TTFT from the first visible chunk ----------------------------------------

def test_openllmetry_ttft_is_read_at_the_first_visible_chunk(capture) -> None:
    con, rows = capture
    server = {r["request_span_id"]: r for r in rows if r["perspective"] == "server"}
    streamed = [r for r in _client(rows, "openllmetry") if r["client_request_id"].startswith("ollm-stream-")]
    # 19 chunk events each (role, 16 tokens, finish, usage) matched to the gateway's 19
    assert con.execute("SELECT basis, count(*), sum(CAST(server_visible AS INT)) FROM genai_client_chunk_match "
                       "GROUP BY 1").fetchall() == [("matched", 57, 48)]
    assert [r["ttft_ms"] for r in streamed] == pytest.approx([166.037703, 166.28143, 209.894107], abs=1e-6)
    assert [server[r["request_span_id"]]["ttft_ms"] for r in streamed] == pytest.approx(
        [157.042866, 156.821846, 205.964902], abs=1e-6)
    # taking the first (role-only) event gave 20.039511, 18.641661 and 9.450697 ms
    assert [r["e2e_ms"] for r in streamed] == pytest.approx([1193.661318, 1149.876315, 1256.339541], abs=1e-6)
    assert all(r["null_reason"] is None and r["output_tokens"] == 16 for r in streamed)
    chunks = dict(con.execute("SELECT request_span_id, count(*) FROM request_chunks WHERE source = 'openllmetry' "
                              "GROUP BY 1").fetchall())
    assert sorted(chunks.values()) == [16, 16, 16]
    gaps = con.execute("SELECT count(*) FROM request_gaps WHERE source = 'openllmetry'").fetchone()
    assert gaps == (45,)


def test_openllmetry_without_server_spans_applies_the_role_only_rule() -> None:
    con = _db("openllmetry.jsonl")
    rows = _client(run_query(con, "requests").dicts())
    streamed = [r for r in rows if r["client_request_id"].startswith("ollm-stream-")]
    first_events = con.execute(
        "SELECT e.span_id, list(e.time_ns ORDER BY e.time_ns)[1:2] FROM span_events e "
        "WHERE e.name = 'gen_ai.content.completion.chunk' GROUP BY 1").fetchall()
    second = {span: times[1] for span, times in first_events}
    spans = dict(con.execute("SELECT request_span_id, span_id FROM genai_client_request_spans").fetchall())
    for r in streamed:  # f = the second chunk event: the first is the role-only chunk
        assert r["f_ns"] == second[spans[r["request_span_id"]]]
        assert r["null_reason"] == (
            "openllmetry: no server chunk events to match (19 chunk events received): the first is taken as the "
            "role-only chunk and skipped (docs/adapters.md); e is the last chunk event (may be the finish or "
            "usage chunk)")
    # the same first visible chunks as matched against the server (test above)
    assert [r["ttft_ms"] for r in streamed] == pytest.approx([166.037703, 166.28143, 209.894107], abs=1e-6)
    counted = con.execute("SELECT request_span_id, count(*) FROM request_chunks GROUP BY 1").fetchall()
    assert sorted(n for _, n in counted) == [18, 18, 18]
    con.close()


def test_client_ttft_below_the_server_ttft_is_never_a_figure() -> None:
    con = _db(*FILES)
    # plant the fault the issue saw: each streamed OpenLLMetry request's first visible chunk
    # event moved to 1 us after the role-only chunk's (the order of the events is kept)
    con.execute("""
        UPDATE span_events e SET time_ns = m.role_ns + 1000
        FROM (SELECT trace_id, span_id, min(time_ns) AS role_ns FROM span_events
              WHERE name = 'gen_ai.content.completion.chunk' GROUP BY ALL HAVING count(*) = 19) m
        WHERE e.trace_id = m.trace_id AND e.span_id = m.span_id AND e.event_index = 1""")
    rows = [r for r in _client(run_query(con, "requests").dicts(), "openllmetry") if r["output_tokens"] == 16]
    assert len(rows) == 3
    for r in rows:
        assert r["ttft_ms"] is None and r["e2e_ms"] is not None
        assert r["null_reason"].startswith("skew_suspect: client TTFT ")
        assert " ms below the server TTFT " in r["null_reason"]
    assert [r["null_reason"] for r in rows][0] == (
        "skew_suspect: client TTFT 20.041 ms below the server TTFT 157.043 ms of the same request "
        "(impossible: the client span encloses the server span): the client's s is not the send or its f not the "
        "first visible output; ttft_ms NULL; tpot_ms and decode rate NULL too: the client span lasts at least "
        "as long as the server span, so its s is not late and it is f (which they use) that comes too early")
    # f read at the role-only chunk: e - f would be too long by the TTFT, so TPOT is no figure either
    assert all(r["tpot_ms"] is None and r["decode_output_tokens_per_second"] is None for r in rows)
    con.close()


# --- item 3: an HTTP client span ends at the response headers ---------------------------------

def _shift_gateway(con, ms: float) -> None:
    """Plant a clock offset: every span and event of the gateway's process moves by ``ms``."""
    shift = int(ms * 1e6)
    con.execute("UPDATE span_events SET time_ns = time_ns + $d WHERE (trace_id, span_id) IN "
                "(SELECT trace_id, span_id FROM spans WHERE clock_domain LIKE $g)", {"d": shift, "g": GATEWAY})
    con.execute("UPDATE spans SET start_ns = start_ns + $d, end_ns = end_ns + $d WHERE clock_domain LIKE $g",
                {"d": shift, "g": GATEWAY})


def test_skew_does_not_take_header_time_http_spans_for_skew(capture) -> None:
    con, _ = capture
    # before the gateway adopted client spans: 6 child_ends_after_parent skew_suspect (gateway spans under POST spans)
    assert run_query(con, "skew_rules").dicts() == []
    posts = con.execute("SELECT count(*) FROM spans p JOIN spans c ON c.trace_id = p.trace_id "
                        "AND c.parent_span_id = p.span_id WHERE p.name = 'POST' AND c.end_ns > p.end_ns").fetchone()
    assert posts == (6,)  # the streamed ones: the body went on after the headers


@pytest.mark.parametrize(("offset_ms", "rule", "count"), [(3000.0, "child_ends_after_parent", 9),
                                                          (-3000.0, "child_starts_before_parent", 9)])
def test_planted_offsets_under_http_spans_are_still_caught(offset_ms, rule, count) -> None:
    con = _db(*FILES)
    _shift_gateway(con, offset_ms)
    found = run_query(con, "skew_rules").dicts()
    under_post = [v for v in found if v["span_name"] == "gateway"]
    assert Counter((v["rule"], v["finding"]) for v in under_post) == {(rule, "skew_suspect"): count}
    assert all(v["cross_domain"] for v in under_post)
    if offset_ms > 0:  # the magnitude is how long after the headers the server started
        assert all(v["detail"].endswith("ms after its HTTP client parent had its response headers: the server "
                                        "answered before it started") for v in under_post)
        assert min(v["magnitude_ms"] for v in under_post) > 3000.0 - 900.0
    verdicts = {p["client_domain"].split("|")[0]: p["verdict"] for p in run_query(con, "skew_offsets").dicts()}
    assert verdicts == {"openai-v2-stock": "skew_detected", "openai-v2-httpx2": "skew_detected",
                        "openllmetry": "skew_detected"}
    con.close()


# --- item 5: phases with the client span another instrumentation wrote ----------------------

def test_phases_use_the_client_spans_of_other_instrumentations(capture) -> None:
    con, _ = capture
    phases = run_query(con, "phases").dicts()
    assert len(phases) == 15 and all(p["client_domain"] is not None for p in phases)
    assert not any("no client span" in (p["null_reason"] or "") or "no client span" in (p["cross_clock_reason"] or "")
                   for p in phases)
    by = Counter(p["client_domain"].split("|")[0] for p in phases)
    assert by == {"openai-v2-stock": 6, "openai-v2-httpx2": 5, "openllmetry": 4}
    v2 = [p for p in phases if p["client_domain"].startswith("openai-v2")]
    assert [p["network_in_ms"] for p in v2] == pytest.approx(
        [3.8049, 2.286947, 2.150344, 2.385466, 2.467962, 1.825007, 3.28317, 2.813774, 3.970627, 2.514542, 5.827765],
        abs=1e-6)
    assert all(p["ttft_ms"] is None and p["network_out_ms"] is None and p["null_reason"].startswith(
        "client TTFT and network_out unknown (network_in is from the client span's start): openai-v2: no chunk "
        "events (openai-v2 writes none)") for p in v2)
    ollm = [p for p in phases if p["client_domain"].startswith("openllmetry")]
    assert [(p["ttft_ms"], p["network_in_ms"], p["network_out_ms"], p["network_round_trip_ms"]) for p in ollm] == [
        pytest.approx(t, abs=1e-6) for t in [(166.037703, 8.049778, 0.945059, 8.994837),
                                             (166.28143, 8.660558, 0.799026, 9.459584),
                                             (209.894107, 3.28632, 0.642885, 3.929205),
                                             (809.460466, 4.002965, 17.408734, 21.411699)]]
    for p in ollm:  # the parts sum to the client TTFT
        parts = (p["network_in_ms"], p["gateway_overhead_ms"], p["tokenize_ms"], p["queue_ms"], p["prefill_ms"],
                 p["first_emit_ms"], p["network_out_ms"], p["residual_ms"])
        assert sum(parts) == pytest.approx(p["ttft_ms"], abs=1e-6)
    # every TTFT part known; the non-streamed answer (one write, e = f) has no decode time
    assert [p["null_reason"] for p in ollm] == [None, None, None, (
        "decode_ms needs e > f (the output arrived in one write: no per-token timing)")]
    assert [p["decode_ms"] is None for p in ollm] == [False, False, False, True]
