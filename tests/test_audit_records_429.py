"""What the AIPerf audit claims, checked on real captures of AIPerf 0.13.0
against tokentrace's gateway (tests/data/real/, provenance in each folder's README.md):

- record_identities lists only identities it evaluated, and evaluates 0.13's request end
  (metadata.request_end_ns: 0.13 writes no last-response timestamp);
- summary_statistics_consistent counts the metrics that have statistics (49 of 65);
- with --db: AIPerf's ISL against the input tokens the server processed, and the error
  records (429s) joined to their gateway spans;
- item 4 and 8 on the same real run: non-streamed answers have no TPOT, and the usage AIPerf
  received counts the stop token (the traces' G).
"""

from __future__ import annotations

from pathlib import Path

import pytest

from analyzer.audit import audit_report
from analyzer.db.store import connect
from analyzer.formats.load import load_paths
from analyzer.query.runner import run_query

DATA = Path(__file__).resolve().parent / "data" / "real"
STREAMED = DATA / "aiperf-0.13.0-tokentrace"  # 12 streamed requests, no error
REJECTED = DATA / "aiperf-0.13.0-tokentrace-429"  # 10 non-streamed: 6 answered, 4 rejected with 429
NOT_EVALUATED = "latency = last response - request start (max_response_timestamp)"
REQUEST_END = "latency <= request end - request start (0.13's metadata.request_end_ns)"


def _db(tmp_path: Path, traces: Path) -> Path:
    tmp_path.mkdir(parents=True, exist_ok=True)
    path = tmp_path / "traces.duckdb"
    con = connect(path)
    load_paths(con, [str(traces)])
    con.close()
    return path


def _audit(folder: Path, db: Path | None = None) -> dict:
    findings = audit_report(folder / "profile_export_aiperf.json", individual=folder / "profile_export.jsonl", db=db)
    # AIPerf's re-tokenized OSL is not the server's count in these runs
    # (tests/test_audit_osl.py): the only finding
    assert [f.check for f in findings if f.verdict == "fail"] == ["output_tokens_vs_osl"]
    return {f.check: f for f in findings}


def test_record_identities_list_only_what_they_evaluated() -> None:
    f = _audit(STREAMED)["record_identities"]
    assert f.verdict == "pass"
    assert f.numbers["evaluated"] == {
        "ITL = (latency - TTFT) / (OSL - 1)": 12, "per-user rate = 1000 / ITL": 12,
        "latency = TTFT + sum(inter-chunk gaps)": 12, NOT_EVALUATED: 0, "OSL = visible + reasoning tokens": 12,
        "TTST = first inter-chunk gap": 12, REQUEST_END: 12}
    assert f.numbers["identities_checked"] == 72 and f.numbers["not_evaluated"] == [NOT_EVALUATED]
    # end - start - latency per record: 0 on two records, 94.67097 ms at most (record 10)
    assert f.numbers["request_tail_min_ms"] == 0.0
    assert f.numbers["request_tail_max_ms"] == pytest.approx(94.67097, abs=1e-6)
    holding, _, absent = f.detail.partition("; not evaluated, their fields absent from these records: ")
    assert NOT_EVALUATED not in holding and absent == NOT_EVALUATED
    assert f"{REQUEST_END} (12) (request end - start - latency: 0.000 to 94.671 ms)" in holding


def test_record_identities_on_non_streamed_records_with_errors() -> None:
    f = _audit(REJECTED)["record_identities"]
    # non-streamed: no TTFT, no chunk gaps; only OSL and the request end can be evaluated
    assert {k: v for k, v in f.numbers["evaluated"].items() if v} == {"OSL = visible + reasoning tokens": 6,
                                                                       REQUEST_END: 6}
    assert (f.numbers["successful_records"], f.numbers["failed_records"], f.numbers["identities_checked"]) == (6, 4, 12)
    assert f.numbers["request_tail_min_ms"] == 0.0 and f.numbers["request_tail_max_ms"] < 1e-9
    holding = f.detail.partition("; not evaluated")[0]
    assert all(what not in holding for what in f.numbers["not_evaluated"])
    assert len(f.numbers["not_evaluated"]) == 5


def test_summary_statistics_count_the_metrics_that_have_statistics() -> None:
    f = _audit(STREAMED)["summary_statistics_consistent"]
    assert f.verdict == "pass"
    assert f.numbers == {"metrics": 65, "with_statistics": 49, "single_values": 16, "order_checked": 49,
                         "avg_in_range_checked": 49, "sum_checked": 35}
    assert f.detail.startswith("49 of the 65 metrics have statistics (16 are single values)")
    g = _audit(REJECTED)["summary_statistics_consistent"]
    assert (g.numbers["metrics"], g.numbers["with_statistics"], g.numbers["single_values"]) == (62, 43, 19)


def test_isl_against_the_input_tokens_the_server_processed(tmp_path) -> None:
    for folder, requests, isl, served in ((STREAMED, 12, 1200, 1392), (REJECTED, 6, 600, 696)):
        f = _audit(folder, _db(tmp_path / folder.name, folder / "traces.jsonl"))["traces:input_tokens_vs_isl"]
        assert f.verdict == "pass"
        assert f.numbers == {"requests": requests, "aiperf_isl_tokens": isl, "server_input_tokens": served,
                             "server_minus_isl_share": pytest.approx(0.16, rel=1e-12), "total_isl": isl}
        assert (f"AIPerf's input_sequence_length totals {isl} tokens over {requests} joined requests (the report's "
                f"total_isl {isl}); the server processed {served} (+16.0%)") in f.detail


def test_error_records_join_their_gateway_spans(tmp_path) -> None:
    findings = _audit(REJECTED, _db(tmp_path, REJECTED / "traces.jsonl"))
    joined = findings["traces:records_joined"]
    assert (joined.numbers["records"], joined.numbers["joined"]) == (6, 6)
    assert joined.detail.startswith("6 of 6 successful records joined")
    errors = findings["traces:error_records_joined"]
    assert errors.verdict == "pass"
    assert errors.numbers == {"error_records": 4, "joined": 4, "record_error_codes": ["429"],
                              "trace_outcomes": ["failed"], "succeeded_in_traces": [], "without_trace": []}
    # non-streamed: neither side has a TPOT (AIPerf gives no TTFT, the traces one body write)
    tpot = findings["traces:tpot_ms"]
    assert tpot.verdict == "cannot_check" and "non-streamed ones (one body write: no per-token timing)" in tpot.detail
    # the streamed run had no error record: no such finding
    assert "traces:error_records_joined" not in _audit(STREAMED, _db(tmp_path / "s", STREAMED / "traces.jsonl"))


def test_usage_with_the_stop_token_equals_the_traces_generated_tokens(tmp_path) -> None:
    db = _db(tmp_path, REJECTED / "traces.jsonl")
    f = _audit(REJECTED, db)["traces:output_tokens"]
    # usage 10 (O 9 + the stop token), 5 (O 3, a trailing token without text, the stop token),
    # 16 x 4 (O 15 + a trailing token without text): all the traces' G
    assert f.verdict == "pass" and f.numbers["equal_to_generated_tokens"] == 6 and f.numbers["differ"] == 0
    con = connect(db)
    try:
        rows = [r for r in run_query(con, "requests", {"perspective": "server"}).dicts() if r["outcome"] == "succeeded"]
    finally:
        con.close()
    assert sorted((r["output_tokens"], r["generated_tokens"], r["finish_reason"]) for r in rows) == \
        [(3, 5, "stop"), (9, 10, "stop")] + [(15, 16, "length")] * 4
    # item 4 on the same run: every answer was one body write: no TPOT, with the reason
    assert all(r["tpot_ms"] is None and r["f_ns"] == r["e_ns"] for r in rows)
    assert all(r["null_reason"] == "tpot_ms and decode rate need e > f (the output arrived in one write: no "
               "per-token timing)" for r in rows)
