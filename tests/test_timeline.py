"""The timeline calculator through the real pipeline: CSV -> spans -> DuckDB -> queries/*.sql."""

from __future__ import annotations

import pytest

from analyzer.audit.claims import check_e2e_claim, check_kv_claim
from analyzer.db.store import connect
from analyzer.errors import TimelineError
from analyzer.query.runner import run_query
from analyzer.verbs.timeline import WindowCounts, compute_artifact, read_timeline_csv, validate_request
from instrument.kv.formula import explicit_layout

SEED_KV = explicit_layout(80, 8, 128, "bf16", q_heads=64)


def test_seed_worked_example(seed_csv) -> None:
    art = compute_artifact(read_timeline_csv(seed_csv), input_tokens=1025, output_tokens=150, kv=SEED_KV,
                           window=WindowCounts(10, 100, 98, 95))
    assert art["kv_bytes_per_token"] == 327_680
    assert art["prompt_kv_mib"] == 320.3125
    assert art["stop_kv_mib"] == 366.875
    assert art["ttft_ms"] == 190
    assert art["e2e_ms"] == 3915
    assert art["tpot_ms"] == pytest.approx(25, abs=1e-9)
    assert art["decode_output_tokens_per_second"] == pytest.approx(40.0, abs=1e-9)
    assert round(art["whole_request_output_tokens_per_second"], 2) == 38.31
    assert art["request_throughput_rps"] == pytest.approx(9.8)
    assert art["observed_goodput_rps"] == pytest.approx(9.5)
    assert art["error_rate"] == pytest.approx(0.02)
    assert art["itl_ms"] is None and "endpoint-only" in art["limitations"][0]


def test_alt_exercise(alt_csv) -> None:
    kv = explicit_layout(48, 4, 128, "fp8", q_heads=32)
    art = compute_artifact(read_timeline_csv(alt_csv), input_tokens=4096, output_tokens=256, kv=kv)
    assert art["kv_bytes_per_token"] == 49_152
    assert art["kv_mib_per_token"] == 0.046875
    assert art["prompt_kv_mib"] == 192
    assert art["prompt_kv_gib"] == 0.1875
    assert art["e2e_ms"] == 5010
    assert round(art["decode_output_tokens_per_second"], 2) == 55.56
    assert round(art["whole_request_output_tokens_per_second"], 2) == 51.10
    assert art["request_throughput_rps"] is None and art["error_rate"] is None
    assert any("quantization scale" in item for item in art["limitations"])


def test_synthetic_trace_lands_in_the_tables(seed_csv) -> None:
    con = connect(None)
    compute_artifact(read_timeline_csv(seed_csv), input_tokens=1025, output_tokens=150, kv=SEED_KV, con=con)
    names = sorted(r[0] for r in con.execute("SELECT name FROM spans").fetchall())
    assert names == ["chat timeline", "gateway", "prefill"]
    rows = run_query(con, "requests").dicts()
    by_perspective = {r["perspective"]: r for r in rows}
    assert set(by_perspective) == {"client", "server"}
    # The server row has no chunk events in an endpoint CSV: NULL with a reason, never 0.
    assert by_perspective["server"]["ttft_ms"] is None
    assert by_perspective["server"]["null_reason"] == "no visible chunk events"
    assert by_perspective["client"]["prompt_kv_bytes"] == 335_872_000
    assert by_perspective["client"]["kv_bytes_per_token"] == 327_680


def _write(tmp_path, body: str):
    path = tmp_path / "t.csv"
    path.write_text("event,time_ms,detail\n" + body)
    return path


@pytest.mark.parametrize(
    "body, message",
    [
        ("client_send,0,\nfirst_visible_token,1,\nfirst_visible_token,2,\nlast_visible_token,3,\n",
         r"t.csv:4: duplicate event 'first_visible_token'"),
        ("client_send,0,\nlast_visible_token,3,\n", "missing required event.*first_visible_token"),
        ("client_send,0,\nfirst_visible_token,x,\nlast_visible_token,3,\n", r"t.csv:3: time_ms 'x' is not a number"),
        ("client_send,0,\nfirst_token,1,\nlast_visible_token,3,\n", r"t.csv:3: unknown event 'first_token'"),
    ],
)
def test_csv_errors_name_file_and_line(tmp_path, body, message) -> None:
    with pytest.raises(TimelineError, match=message):
        read_timeline_csv(_write(tmp_path, body))


def test_header_required(tmp_path) -> None:
    path = tmp_path / "t.csv"
    path.write_text("a,b\n1,2\n")
    with pytest.raises(TimelineError, match="t.csv:1: header must name"):
        read_timeline_csv(path)


@pytest.mark.parametrize(
    "times, output_tokens, message",
    [
        ({"client_send": 10, "first_visible_token": 5, "last_visible_token": 20}, 5, "client_send <= first"),
        ({"client_send": 0, "first_visible_token": 30, "last_visible_token": 20}, 5, "first_visible_token <= last"),
        ({"client_send": 0, "first_visible_token": 5, "last_visible_token": 20}, 0, "must be >= 1"),
        ({"client_send": 0, "first_visible_token": 5, "last_visible_token": 5}, 3, "positive decode duration"),
        ({"client_send": 0, "server_arrival": 9, "first_visible_token": 5, "last_visible_token": 7}, 2,
         "server_arrival at 9 ms is outside"),
    ],
)
def test_seed_validation_rules(times, output_tokens, message) -> None:
    with pytest.raises(TimelineError, match=message):
        validate_request(times, output_tokens)


def test_one_token_request_has_null_tpot() -> None:
    art = compute_artifact({"client_send": 0, "first_visible_token": 100, "last_visible_token": 100},
                           input_tokens=10, output_tokens=1, kv=None)
    assert art["tpot_ms"] is None and art["decode_output_tokens_per_second"] is None
    assert art["ttft_ms"] == 100 and art["whole_request_output_tokens_per_second"] == 10


@pytest.mark.parametrize(
    "counts, message",
    [
        (WindowCounts(0, 100, 98, 95), "window-s must be > 0"),
        (WindowCounts(10, 0, 0, 0), "attempted must be > 0"),
        (WindowCounts(10, 100, 98, 99), "inconsistent request counts"),
        (WindowCounts(10, 100, 101, 95), "inconsistent request counts"),
        (WindowCounts(10, 100, 98, -1), "inconsistent request counts"),
    ],
)
def test_window_validation(counts, message) -> None:
    with pytest.raises(TimelineError, match=message):
        counts.validate()


@pytest.mark.parametrize("attempted, succeeded, passing", [(100, 98, 95), (7, 7, 0), (3, 0, 0), (1, 1, 1)])
def test_window_sql_reproduces_any_counts(attempted, succeeded, passing) -> None:
    art = compute_artifact({"client_send": 0, "first_visible_token": 1, "last_visible_token": 2},
                           input_tokens=None, output_tokens=2, kv=None,
                           window=WindowCounts(2.5, attempted, succeeded, passing))
    assert art["attempted"] == attempted
    assert art["request_throughput_rps"] == pytest.approx(succeeded / 2.5)
    assert art["observed_goodput_rps"] == pytest.approx(passing / 2.5)
    assert art["error_rate"] == pytest.approx((attempted - succeeded) / attempted)


def test_broken_cases_are_flagged() -> None:
    kv_finding = check_kv_claim(2_621_440, SEED_KV)
    assert kv_finding.verdict == "fail" and kv_finding.check == "kv_query_heads_for_kv_heads"
    assert kv_finding.numbers["factor"] == 8
    assert check_kv_claim(327_680, SEED_KV).verdict == "pass"
    e2e = check_e2e_claim(3940, 190, 25, 150)
    assert e2e.verdict == "fail" and e2e.check == "e2e_o_gaps_for_o_tokens"
    assert e2e.numbers["e2e_ms"] == 3915
    assert check_e2e_claim(3915, 190, 25, 150).verdict == "pass"
    assert check_e2e_claim(5000, 190, 25, 150).check == "e2e_gaps"


def test_contract_spans_with_deprecated_usage_names() -> None:
    """Older GenAI names (prompt_tokens / completion_tokens) on contract spans still give I and O."""
    from analyzer.db.store import EventRow, SpanRow, insert_rows

    con = connect(None)
    tid, sid = "ab" * 16, "cd" * 8
    start = 1_767_225_600_000_000_000
    insert_rows(
        con,
        [SpanRow(tid, sid, "generate", start, start + 300_000_000, scope_name="tokentrace", scope_version="1",
                 attributes={"gen_ai.usage.prompt_tokens": 12, "gen_ai.usage.completion_tokens": 3})],
        [EventRow(tid, sid, i, start + (100 + 100 * i) * 1_000_000, "tokentrace.chunk",
                  {"tokentrace.chunk.index": i, "tokentrace.chunk.tokens": 1, "tokentrace.chunk.visible": True})
         for i in range(3)],
    )
    row = run_query(con, "requests").dicts()[0]
    assert (row["perspective"], row["input_tokens"], row["output_tokens"]) == ("engine", 12, 3)
    assert row["ttft_ms"] == 100 and row["tpot_ms"] == 100
