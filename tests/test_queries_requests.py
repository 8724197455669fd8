"""requests.sql and itl.sql over traces written by the real OpenTelemetry SDK."""

from __future__ import annotations

import pytest

from analyzer.formats.sdk_spans import rows_from_sdk_spans
from analyzer.query.runner import run_query
from trace_fixtures import (
    ANCHOR_NS,
    MIXED_PLANS,
    RequestPlan,
    TraceWorld,
    mixed_db,
    mixed_trace_id,
    mixed_world,
    seed_db,
)


@pytest.fixture(scope="module")
def mixed():
    con = mixed_db()
    yield con
    con.close()


def _row(con, name: str, perspective: str) -> dict:
    rows = run_query(con, "requests", {"trace_id": mixed_trace_id(name), "perspective": perspective}).dicts()
    assert len(rows) == 1
    return rows[0]


def test_converter_keeps_ids_times_scope_resource_and_dropped_counts() -> None:
    world = TraceWorld()
    world.add(RequestPlan(output_tokens=150, max_events=128))
    spans, events, links = rows_from_sdk_spans(world.exporter.get_finished_spans())
    client = next(s for s in spans if s.kind == "CLIENT")
    gateway = next(s for s in spans if s.name == "gateway")
    assert client.trace_id == "77000000000000000000000000000001" and len(client.span_id) == 16
    assert gateway.parent_span_id == client.span_id and client.parent_span_id is None
    assert (client.scope_name, client.scope_version) == ("tokentrace", "1")
    assert client.start_ns == ANCHOR_NS and client.resource["service.name"] == "client"
    assert client.dropped_events_count == 23 and gateway.dropped_events_count == 23  # 151 events, limit 128
    assert sum(1 for e in events if e.span_id == client.span_id) == 128
    assert client.attributes["gen_ai.response.finish_reasons"] == ("length",)
    assert links == []


def test_seed_request_client_perspective() -> None:
    con = seed_db()
    row = run_query(con, "requests", {"perspective": "client"}).dicts()[0]
    assert row["ttft_ms"] == 190
    assert row["e2e_ms"] == 3915
    assert row["tpot_ms"] == pytest.approx(25, abs=1e-12)
    assert f"{row['decode_output_tokens_per_second']:.2f}" == "40.00"
    assert f"{row['whole_request_output_tokens_per_second']:.2f}" == "38.31"
    assert (row["input_tokens"], row["output_tokens"]) == (1025, 150)
    assert row["kv_bytes_per_token"] == 327_680
    assert row["prompt_kv_mib"] == 320.3125 and row["stop_kv_mib"] == 366.875
    assert row["null_reason"] is None and row["outcome"] == "succeeded"


def test_seed_request_server_perspective_is_its_own_row() -> None:
    rows = run_query(seed_db(), "requests", {}).dicts()
    assert [r["perspective"] for r in rows] == ["client", "server"]
    server = rows[1]
    assert server["ttft_ms"] == 182 and server["e2e_ms"] == 3907  # gateway clock: 187 - 5, 3912 - 5
    assert server["clock_domain"] == "server|s-1|gpu-1"


def test_seed_itl_is_149_gaps_of_25_ms() -> None:
    gaps = run_query(seed_db(), "itl", {"perspective": "client"}).dicts()
    assert len(gaps) == 149
    assert {g["itl_ms"] for g in gaps} == {25.0}
    assert {g["itl_per_token_ms"] for g in gaps} == {25.0}
    assert [g["gap_index"] for g in gaps] == list(range(1, 150))


def test_failed_and_cancelled_outcomes(mixed) -> None:
    failed = _row(mixed, "failed", "client")
    assert failed["outcome"] == "failed" and failed["status_code"] == "ERROR" and failed["finish_reason"] == "error"
    assert failed["e2e_ms"] == 240  # 190 + 2 x 25
    cancelled = _row(mixed, "cancelled", "server")
    assert cancelled["outcome"] == "cancelled" and cancelled["output_tokens"] == 10


def test_one_output_token_has_null_tpot_with_reason(mixed) -> None:
    row = _row(mixed, "one_token", "client")
    assert row["ttft_ms"] == 190 and row["e2e_ms"] == 190
    assert row["tpot_ms"] is None and row["decode_output_tokens_per_second"] is None
    assert row["null_reason"] == "tpot_ms and decode rate need more than one output token"
    assert row["stop_kv_bytes"] == 327_680 * 1025  # no decode step: the prompt's KV


def test_zero_output_tokens_has_no_f_or_e(mixed) -> None:
    row = _row(mixed, "zero_tokens", "client")
    assert row["output_tokens"] == 0
    assert row["ttft_ms"] is None and row["e2e_ms"] is None and row["whole_request_output_tokens_per_second"] is None
    # every NULL metric's reason, none hidden behind the adapter's
    assert row["null_reason"] == "no visible chunk events; tpot_ms and decode rate need more than one output token"
    assert run_query(mixed, "itl", {"trace_id": mixed_trace_id("zero_tokens")}).rows == []


def test_dropped_events_make_f_and_e_unknown(mixed) -> None:
    for perspective in ("client", "server"):
        row = _row(mixed, "dropped", perspective)
        assert row["f_ns"] is None and row["e_ns"] is None
        assert row["ttft_ms"] is None and row["e2e_ms"] is None and row["tpot_ms"] is None
        assert row["null_reason"] == "f/e unknown: 23 events dropped by the span event limit"
        assert row["output_tokens"] == 150  # usage attribute, not a shorter request
    # the SDK kept the last 128 events: 127 visible chunks (+ the finish chunk), 126 gaps
    gaps = run_query(mixed, "itl", {"trace_id": mixed_trace_id("dropped"), "perspective": "client"}).dicts()
    assert len(gaps) == 126 and all(g["itl_ms"] is None for g in gaps)
    assert gaps[0]["null_reason"].startswith("gap unknown: 23 events dropped")


def test_multi_token_chunks_per_chunk_and_per_token(mixed) -> None:
    row = _row(mixed, "multi_token", "client")
    assert row["output_tokens"] == 10 and row["e2e_ms"] == 265
    assert row["tpot_ms"] == pytest.approx(75 / 9)  # (265 - 190) / (10 - 1)
    gaps = run_query(mixed, "itl", {"trace_id": mixed_trace_id("multi_token"), "perspective": "client"}).dicts()
    assert [g["chunk_tokens"] for g in gaps] == [3, 2, 4]
    assert [g["itl_ms"] for g in gaps] == [25.0, 25.0, 25.0]
    assert [g["itl_per_token_ms"] for g in gaps] == pytest.approx([25 / 3, 12.5, 6.25])


def test_server_only_request_has_no_client_row(mixed) -> None:
    rows = run_query(mixed, "requests", {"trace_id": mixed_trace_id("server_only")}).dicts()
    assert [r["perspective"] for r in rows] == ["server"]


def test_every_planted_request_is_reported(mixed) -> None:
    rows = run_query(mixed, "requests", {}).dicts()
    traces = {r["trace_id"] for r in rows}
    assert traces == {mixed_trace_id(n) for n in MIXED_PLANS}
    assert len(rows) == 2 * len(MIXED_PLANS) - 1  # server_only has no client row


def test_world_is_deterministic() -> None:
    a = run_query(mixed_world().load(), "requests", {}).rows
    b = run_query(mixed_world().load(), "requests", {}).rows
    assert a == b


def test_deprecated_genai_token_names_are_read_when_the_new_ones_are_absent() -> None:
    """gen_ai.usage.prompt_tokens / completion_tokens (older semconv) give the same I and O."""
    con = seed_db()
    expected = {(r["perspective"], r["input_tokens"], r["output_tokens"]) for r in run_query(seed_db(), "requests", {}).dicts()}
    con.execute("""
        UPDATE spans SET attr_int = map_from_entries(list_transform(map_entries(attr_int), lambda e: {
            'key': replace(replace(e.key, 'gen_ai.usage.input_tokens', 'gen_ai.usage.prompt_tokens'),
                           'gen_ai.usage.output_tokens', 'gen_ai.usage.completion_tokens'),
            'value': e.value}))""")
    renamed = con.execute("SELECT count(*) FROM spans WHERE attr_int['gen_ai.usage.prompt_tokens'] IS NOT NULL").fetchone()[0]
    assert renamed > 0 and con.execute(
        "SELECT count(*) FROM spans WHERE attr_int['gen_ai.usage.input_tokens'] IS NOT NULL").fetchone()[0] == 0
    got = {(r["perspective"], r["input_tokens"], r["output_tokens"]) for r in run_query(con, "requests", {}).dicts()}
    assert got == expected and {(i, o) for _, i, o in got} == {(1025, 150)}


@pytest.mark.parametrize(("every", "stop_kv_mib"), [(4, 366.875), (3, None)])
def test_stop_kv_needs_the_last_decode_step(every: int, stop_kv_mib: float | None) -> None:
    """decode_spans = every:N keeps steps 1, 1+N, ...: every:4 keeps step 149 = G - 1 (the
    worked example's stop KV), every:3 ends at step 148, whose KV is one token short: NULL, not that."""
    con = seed_db()
    con.execute("DELETE FROM spans WHERE name = 'decode' AND (attr_int['tokentrace.step'] - 1) % $n <> 0",
                {"n": every})
    for row in run_query(con, "requests", {}).dicts():
        assert row["stop_kv_mib"] == stop_kv_mib, row["perspective"]
        assert row["prompt_kv_mib"] == 320.3125 and row["tpot_ms"] == pytest.approx(25, abs=1e-12)


def test_a_rate_left_null_by_its_guard_says_why() -> None:
    """whole-request rate = O / (e - s) is NULL when e <= s (here: the client span starts after
    its last chunk), with a reason, never a silent NULL or a negative rate."""
    con = seed_db()
    last = con.execute("SELECT max(time_ns) FROM span_events").fetchone()[0]
    con.execute("UPDATE spans SET start_ns = $t WHERE kind = 'CLIENT'", {"t": last + 1_000_000})
    row = run_query(con, "requests", {"perspective": "client"}).dicts()[0]
    assert row["whole_request_output_tokens_per_second"] is None and row["e2e_ms"] < 0
    # the client TTFT (-3727 ms) is below the server's: NULL with that finding, first
    assert row["ttft_ms"] is None
    assert row["null_reason"] == (
        "skew_suspect: client TTFT -3727.0 ms below the server TTFT 182.0 ms of the same request (impossible: "
        "the client span encloses the server span): the client's s is not the send or its f not the first "
        "visible output; ttft_ms NULL; whole-request rate needs e > s")
    assert f"{row['decode_output_tokens_per_second']:.2f}" == "40.00"


def test_one_output_token_and_e_before_s_gives_both_reasons() -> None:
    """O = 1 leaves tpot and the decode rate NULL; e <= s (the client span starts after its
    only chunk) leaves the whole-request rate NULL too, and null_reason names both (the
    first reason used to hide the second)."""
    con = mixed_db()
    trace = mixed_trace_id("one_token")
    last = con.execute("SELECT max(time_ns) FROM span_events WHERE trace_id = $t", {"t": trace}).fetchone()[0]
    con.execute("UPDATE spans SET start_ns = $s WHERE kind = 'CLIENT' AND trace_id = $t",
                {"s": last + 1_000_000, "t": trace})
    row = run_query(con, "requests", {"perspective": "client", "trace_id": trace}).dicts()[0]
    assert row["output_tokens"] == 1 and row["tpot_ms"] is None and row["e2e_ms"] < 0
    assert row["whole_request_output_tokens_per_second"] is None
    assert row["null_reason"] == (
        "skew_suspect: client TTFT -2.0 ms below the server TTFT 182.0 ms of the same request (impossible: the "
        "client span encloses the server span): the client's s is not the send or its f not the first visible "
        "output; ttft_ms NULL; tpot_ms and decode rate need more than one output token;"
        " whole-request rate needs e > s")
