"""Adapters for other engines' spans (queries/views/2*_*.sql): each engine's real span shape,
written with the OpenTelemetry SDK (tests/engine_fixtures.py), gives the planted per-request
figures through the same metric queries as our own contract."""

from __future__ import annotations

import duckdb
import pytest

from analyzer.db.views import install_views
from analyzer.query.runner import run_query
from engine_fixtures import (
    ANCHOR_NS,
    EngineWorld,
    OpenllmetryPlan,
    SglangPlan,
    TgiPlan,
    VllmPlan,
    add_openllmetry_request,
    add_sglang_request,
    add_tgi_request,
    add_vllm_request,
    rust_duration_debug,
)
from trace_fixtures import RequestPlan, TraceWorld


def _requests(con: duckdb.DuckDBPyConnection, source: str) -> list[dict]:
    return [r for r in run_query(con, "requests").dicts() if r["source"] == source]


def _gaps(con: duckdb.DuckDBPyConnection, source: str) -> list[dict]:
    return [g for g in run_query(con, "itl").dicts() if g["source"] == source]


def _seed_figures(row: dict) -> None:
    assert row["ttft_ms"] == pytest.approx(190.0)
    assert row["e2e_ms"] == pytest.approx(3915.0)
    assert row["tpot_ms"] == pytest.approx(25.0)
    assert row["output_tokens"] == 150
    assert row["decode_output_tokens_per_second"] == pytest.approx(40.0)


# ---------------------------------------------------------------------------------- vLLM
def test_vllm_llm_request_span_gives_seed_figures_from_latency_attributes():
    world = EngineWorld()
    add_vllm_request(world, VllmPlan())
    con = world.load()
    [row] = _requests(con, "vllm")
    _seed_figures(row)
    assert row["perspective"] == "server"
    assert row["input_tokens"] == 1025
    assert row["finish_reason"] == "length"
    assert row["s_ns"] == ANCHOR_NS and row["f_ns"] == ANCHOR_NS + 190_000_000
    assert "f/e derived from gen_ai.latency" in row["null_reason"]
    assert "itl_ms unknown" in row["null_reason"]
    assert "mixed clocks" in row["null_reason"]
    assert _gaps(con, "vllm") == []  # no per-token times: no gaps, never zeros
    [phase] = run_query(con, "phases").dicts()
    assert phase["queue_ms"] == pytest.approx(25.0)
    assert phase["prefill_ms"] == pytest.approx(140.0)
    assert phase["first_emit_ms"] is None and phase["tokenize_ms"] is None


def test_vllm_abort_is_cancelled_and_one_token_has_no_tpot():
    world = EngineWorld()
    add_vllm_request(world, VllmPlan(finish_reason="abort", completion_tokens=1, e2e_s=0.19))
    [row] = _requests(world.load(), "vllm")
    assert row["finish_reason"] == "cancelled" and row["outcome"] == "cancelled"
    assert row["tpot_ms"] is None and row["ttft_ms"] == pytest.approx(190.0)


# ----------------------------------------------------------------------------------- TGI
def test_rust_duration_strings_match_rusts_debug_format():
    assert [rust_duration_debug(x) for x in (3.9155, 0.19, 0.00085, 1e-7, 2.0)] == \
        ["3.9155s", "190ms", "850µs", "100ns", "2s"]


def test_tgi_duration_strings_are_parsed_with_their_units():
    world = EngineWorld()
    add_tgi_request(world, TgiPlan())
    add_tgi_request(world, TgiPlan(start_ms=10_000, validation_ms=0.85, with_generations=False, tokens=20))
    con = world.load()
    install_views(con)
    parsed = dict(con.execute(
        "SELECT text, duration_ns FROM tgi_durations WHERE field IN ('validation_time', 'total_time')").fetchall())
    assert parsed["3ms"] == pytest.approx(3e6)
    assert parsed["850µs"] == pytest.approx(850e3)
    assert parsed["3.9155s"] == pytest.approx(3.9155e9)


def test_tgi_request_with_send_generation_spans_gives_seed_figures_and_itl():
    world = EngineWorld()
    add_tgi_request(world, TgiPlan())
    con = world.load()
    [row] = _requests(con, "tgi")
    _seed_figures(row)
    assert row["input_tokens"] is None and row["finish_reason"] is None
    gaps = _gaps(con, "tgi")
    assert len(gaps) == 149
    assert [g["itl_ms"] for g in gaps] == pytest.approx([25.0] * 149)
    facts = con.execute("SELECT decode_spans, prefill_start_ns, prefill_end_ns FROM request_facts "
                        "WHERE source = 'tgi'").fetchone()
    assert facts == (149, ANCHOR_NS + 28_000_000, ANCHOR_NS + 185_000_000)  # batch steps via links
    [phase] = run_query(con, "phases").dicts()
    assert (phase["tokenize_ms"], phase["queue_ms"], phase["prefill_ms"]) == (3.0, 25.0, 157.0)


def test_tgi_request_without_generations_derives_e_and_says_so():
    world = EngineWorld()
    add_tgi_request(world, TgiPlan(with_generations=False, tokens=20))
    [row] = _requests(world.load(), "tgi")
    assert row["ttft_ms"] is None and row["tpot_ms"] is None
    assert row["e2e_ms"] == pytest.approx(190 + 19 * 25 + 0.5)  # total_time
    assert row["output_tokens"] == 20  # inference_time / time_per_token
    assert "e = s + total_time" in row["null_reason"]


# -------------------------------------------------------------------------------- SGLang
def test_sglang_trace_with_149_decode_loops_gives_seed_figures_and_itl():
    world = EngineWorld()
    add_sglang_request(world, SglangPlan())
    con = world.load()
    [row] = _requests(con, "sglang")
    _seed_figures(row)
    assert row["trace_id"].startswith("0000000000000000")  # 64-bit trace id, left-padded
    gaps = _gaps(con, "sglang")
    assert [g["itl_ms"] for g in gaps] == pytest.approx([25.0] * 149)
    assert con.execute("SELECT decode_spans FROM request_facts WHERE source = 'sglang'").fetchone() == (149,)
    [phase] = run_query(con, "phases").dicts()
    assert (phase["tokenize_ms"], phase["queue_ms"], phase["prefill_ms"]) == (8.0, 25.0, 145.0)


def test_sglang_without_decode_loop_slices_leaves_e_and_tokens_null():
    world = EngineWorld()
    add_sglang_request(world, SglangPlan(decode_loop_spans=False, decode_steps=5))
    [row] = _requests(world.load(), "sglang")
    assert row["ttft_ms"] == pytest.approx(190.0)
    assert row["e2e_ms"] is None and row["output_tokens"] is None and row["tpot_ms"] is None
    assert "no decode_loop" in row["null_reason"]


# --------------------------------------------------------------------------- OpenLLMetry
@pytest.mark.parametrize("chunk_event", ["llm.content.completion.chunk", "gen_ai.completion.chunk",
                                         "gen_ai.content.completion.chunk"])
def test_openllmetry_client_span_with_old_usage_names(chunk_event):
    world = EngineWorld()
    add_openllmetry_request(world, OpenllmetryPlan(chunk_event=chunk_event))
    con = world.load()
    [row] = _requests(con, "openllmetry")
    _seed_figures(row)
    assert row["perspective"] == "client" and row["input_tokens"] == 1025
    assert row["finish_reason"] == "length"
    assert len(_gaps(con, "openllmetry")) == 149


def test_openllmetry_new_usage_names_and_counted_chunks():
    world = EngineWorld()
    add_openllmetry_request(world, OpenllmetryPlan(new_usage_names=True, completion_tokens=None, chunks=10))
    [row] = _requests(world.load(), "openllmetry")
    assert row["input_tokens"] == 1025 and row["output_tokens"] == 10


# ------------------------------------------------------------------------ claims, sources
def test_contract_and_every_engine_in_one_db_give_one_row_per_request_perspective():
    world = EngineWorld()
    add_vllm_request(world, VllmPlan())
    add_tgi_request(world, TgiPlan(start_ms=5_000))
    add_sglang_request(world, SglangPlan(start_ms=10_000))
    add_openllmetry_request(world, OpenllmetryPlan(start_ms=15_000))
    con = world.load()
    ours = TraceWorld()
    ours.add(RequestPlan(start_ms=20_000))  # client + gateway: two perspectives of one request
    ours.load(con)
    install_views(con)
    rows = con.execute(
        "SELECT source, perspective, count(*) FROM request_facts GROUP BY ALL ORDER BY ALL").fetchall()
    assert rows == [("openllmetry", "client", 1), ("sglang", "server", 1), ("tgi", "server", 1),
                    ("tokentrace", "client", 1), ("tokentrace", "server", 1), ("vllm", "server", 1)]
    double = con.execute("SELECT perspective_span_id FROM request_facts GROUP BY trace_id, perspective_span_id "
                         "HAVING count(*) > 1").fetchall()
    assert double == []
    sources = con.execute("SELECT source, count(*) FROM request_sources GROUP BY ALL ORDER BY ALL").fetchall()
    assert sources == [("openllmetry", 1), ("sglang", 1), ("tgi", 1), ("tokentrace", 2), ("vllm", 1)]
    assert con.execute("SELECT count(*) FROM request_sources WHERE signature IS NULL").fetchone() == (0,)
    # request_gap_times joins chunks to request_keys: no adapter's chunk may lack a request row
    orphans = con.execute(
        "SELECT count(*) FROM request_chunks c LEFT JOIN request_keys k ON k.trace_id = c.trace_id "
        "AND k.request_span_id = c.request_span_id AND k.perspective = c.perspective AND k.source = c.source "
        "WHERE k.request_key IS NULL").fetchone()
    assert orphans == (0,)
    chunks = con.execute("SELECT source, count(*) FROM request_chunks GROUP BY ALL ORDER BY ALL").fetchall()
    assert {s for s, n in chunks if n > 0} >= {"tgi", "sglang", "openllmetry", "tokentrace"}
    for r in run_query(con, "requests").dicts():  # our gateway starts 5 ms after the client send
        server_side_of_ours = r["source"] == "tokentrace" and r["perspective"] == "server"
        assert r["ttft_ms"] == pytest.approx(182.0 if server_side_of_ours else 190.0), r["source"]
        assert r["tpot_ms"] == pytest.approx(25.0), r["source"]


def test_request_sources_through_the_sql_verb(tmp_path):
    from click.testing import CliRunner

    from analyzer.cli._group import cli
    from analyzer.db.store import connect

    db = tmp_path / "t.duckdb"
    con = connect(str(db))
    world = EngineWorld()
    add_vllm_request(world, VllmPlan())
    world.load(con)
    con.close()
    result = CliRunner().invoke(cli, ["sql", "SELECT source, signature FROM request_sources", "--db", str(db)],
                                catch_exceptions=False)
    assert result.exit_code == 0, result.output
    assert "vllm" in result.output and "llm_request" in result.output
