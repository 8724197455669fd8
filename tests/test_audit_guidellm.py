"""guidellm 0.8.1 reports (real captures against tokentrace serve): every summary figure
recomputed from the records with guidellm's method; expected numbers computed here with numpy
from the report's own records, independently of the audit's SQL; planted errors caught by the
right check; the run whose every request was refused fails; bad inputs are one line."""

from __future__ import annotations

import copy
import json
from pathlib import Path

import numpy as np
import pytest
from click.testing import CliRunner

from analyzer.audit import audit_report, detect_kind
from analyzer.cli import cli
from analyzer.errors import AuditInputError
from data_paths import CAPTURES, SAMPLES

RUN = CAPTURES / "guidellm-0.8.1-tokentrace"
REPORT, TWIN, SPANS = RUN / "benchmarks.json", RUN / "benchmarks.yaml", RUN / "server-spans.jsonl.gz"
REFUSED = CAPTURES / "guidellm-0.8.1-tokentrace-400" / "benchmarks.json"
POISSON = CAPTURES / "guidellm-0.8.1-tokentrace-poisson" / "benchmarks.json"


def by_check(findings):
    return {f.check: f for f in findings}


def failed(findings):
    return sorted(f.check for f in findings if f.verdict == "fail")


def invoke(*args: str):
    return CliRunner().invoke(cli, [*args], catch_exceptions=False)


@pytest.fixture(scope="module")
def data() -> dict:
    return json.loads(REPORT.read_text())


@pytest.fixture(scope="module")
def findings():
    return audit_report(REPORT)


def nearest_rank(values: np.ndarray, weights: np.ndarray, q: float) -> float:
    """guidellm's percentile, written here independently: sort, cumulative weight share, first
    value reaching q."""
    order = np.argsort(values)
    share = np.cumsum(weights[order]) / weights.sum()
    return float(values[order][np.searchsorted(share, q - 1e-12)])


def test_detected_and_every_figure_recomputes(findings, data) -> None:
    assert detect_kind(REPORT) == "guidellm" and detect_kind(TWIN) == "guidellm"
    assert failed(findings) == []
    f = by_check(findings)
    recomputed = [c for c in f if c.startswith("recompute_")]
    passed = [c for c in recomputed if f[c].verdict == "pass"]
    assert len(recomputed) == 23 and len(passed) == 19  # concurrent: no arrival schedule, no dispatch delays
    assert all("null: guidellm gives schedule-relative delays only" in f[c].detail for c in recomputed
               if c not in passed)
    assert f["request_totals"].numbers["records_in_window"] == {"successful": 24, "incomplete": 0, "errored": 0,
                                                                "total": 24}
    assert f["record_identities"].numbers["figures_checked"] == 240
    assert f["recompute_root_dispatch_delay"].numbers["figures"]["all.count"]["recomputed"] == 24
    conc = f["recompute_request_concurrency"].numbers["figures"]
    assert conc["successful.max"]["recomputed"] == 4 == conc["successful.max"]["claimed"]  # concurrent@4


def test_recomputed_values_match_numpy_from_the_records(findings, data) -> None:
    records = data["benchmarks"][0]["requests"]["successful"]
    timings = [r["info"]["timings"] for r in records]
    ttft = np.array([1000 * (t["first_token_iteration"] - t["request_start"]) for t in timings])
    out = np.array([r["output_metrics"]["total_tokens"] for r in records], dtype=float)
    tpot = np.array([1000 * (t["last_token_iteration"] - t["request_start"]) for t in timings]) / out
    figures = by_check(findings)["recompute_time_to_first_token_ms"].numbers["figures"]
    assert figures["successful.mean"]["recomputed"] == pytest.approx(ttft.mean(), rel=1e-12)
    assert figures["successful.p90"]["recomputed"] == pytest.approx(nearest_rank(ttft, np.ones(24), 0.90))
    assert figures["successful.p99"]["recomputed"] == pytest.approx(ttft.max())  # n = 24: p99 is the max
    assert figures["successful.variance"]["recomputed"] == pytest.approx(ttft.var(), rel=1e-9)
    assert figures["successful.p90"]["claimed"] == pytest.approx(98.51861000061035)
    tp = by_check(findings)["recompute_time_per_output_token_ms"].numbers["figures"]
    assert tp["successful.mean"]["recomputed"] == pytest.approx((tpot * out).sum() / out.sum(), rel=1e-12)
    assert tp["successful.count"]["recomputed"] == out.sum() == 768  # weighted by tokens
    rps = by_check(findings)["recompute_requests_per_second"].numbers["figures"]
    sched = data["benchmarks"][0]["scheduler_metrics"]
    start, end = sched["measure_start_time"], sched["measure_end_time"]
    ends = np.array([t["request_end"] for t in timings])
    in_window = int(((ends >= start) & (ends <= end)).sum())
    # the mean of guidellm's rate distribution is a throughput: events in the window / window
    assert rps["successful.mean"]["recomputed"] == pytest.approx(in_window / (end - start), rel=1e-9)
    assert rps["successful.count"]["recomputed"] == in_window


def test_arrival_schedule_delays_recompute(tmp_path) -> None:
    found = audit_report(POISSON)
    assert failed(found) == [] and not [x.check for x in found if x.verdict == "cannot_check"]
    data = json.loads(POISSON.read_text())
    records = data["benchmarks"][0]["requests"]["successful"]
    delays = np.array([r["info"]["timings"]["request_start"] - r["info"]["timings"]["targeted_start"]
                       for r in records])
    figures = by_check(found)["recompute_request_dispatch_delay"].numbers["figures"]
    assert figures["successful.mean"]["recomputed"] == pytest.approx(delays.mean(), rel=1e-9)
    data["benchmarks"][0]["metrics"]["request_dispatch_delay"]["successful"]["mean"] = float(np.median(delays))
    planted = failed(audit_report(write(tmp_path, data)))
    assert planted == ["recompute_request_dispatch_delay"]


def test_definitions_stated_with_the_reports_numbers(findings) -> None:
    f = by_check(findings)
    tpot = f["tpot_definition"].numbers
    assert tpot["tpot_mean_ms"] > tpot["decode_tpot_mean_ms"]  # TTFT inside guidellm's TPOT
    pm = f["percentile_method"]
    assert pm.numbers["n"] == 24 and pm.numbers["ttft_p99_nearest_rank_ms"] == pm.numbers["ttft_max_ms"]
    assert pm.numbers["ttft_p90_nearest_rank_ms"] == pytest.approx(98.51861000061035)
    assert pm.numbers["ttft_p90_interpolated_ms"] != pytest.approx(pm.numbers["ttft_p90_nearest_rank_ms"])
    rates = f["rate_definitions"].numbers
    assert rates["median_requests_per_s"] < rates["mean_requests_per_s"]
    assert "spaced evenly" in f["rate_definitions"].detail
    assert f["errored_in_totals"].verdict == "pass"


def test_yaml_twin_audits_the_same(findings) -> None:
    twin = audit_report(TWIN)
    assert [(f.check, f.verdict) for f in twin] == [(f.check, f.verdict) for f in findings]
    a = by_check(twin)["recompute_time_to_first_token_ms"].numbers["figures"]["successful.p90"]
    assert a == by_check(findings)["recompute_time_to_first_token_ms"].numbers["figures"]["successful.p90"]


def write(tmp_path: Path, data) -> Path:
    path = tmp_path / "benchmarks.json"
    path.write_text(json.dumps(data))
    return path


def test_planted_interpolated_percentile_is_caught(tmp_path, data) -> None:
    planted = copy.deepcopy(data)
    records = planted["benchmarks"][0]["requests"]["successful"]
    ttft = [1000 * (r["info"]["timings"]["first_token_iteration"] - r["info"]["timings"]["request_start"])
            for r in records]
    summary = planted["benchmarks"][0]["metrics"]["time_to_first_token_ms"]["successful"]
    summary["percentiles"]["p90"] = float(np.percentile(ttft, 90))  # numpy's linear, not guidellm's
    found = audit_report(write(tmp_path, planted))
    assert failed(found) == ["recompute_time_to_first_token_ms"]
    assert "successful.p90" in by_check(found)["recompute_time_to_first_token_ms"].detail


def test_planted_record_and_count_errors_are_caught(tmp_path, data) -> None:
    planted = copy.deepcopy(data)
    bench = planted["benchmarks"][0]
    bench["requests"]["successful"][5]["time_to_first_token_ms"] += 5.0
    bench["metrics"]["request_totals"]["successful"] = 25
    found = by_check(audit_report(write(tmp_path, planted)))
    assert found["record_identities"].verdict == "fail" and "successful[5].ttft_ms" in found["record_identities"].detail
    assert found["request_totals"].verdict == "fail" and "successful 25 vs 24" in found["request_totals"].detail


def test_several_benchmarks_are_checked_one_by_one(tmp_path, data) -> None:
    sweep = copy.deepcopy(data)
    second = copy.deepcopy(sweep["benchmarks"][0])
    second["metrics"]["inter_token_latency_ms"]["total"]["mean"] *= 1.01
    sweep["benchmarks"].append(second)
    found = audit_report(write(tmp_path, sweep))
    assert failed(found) == ["benchmark[1]:recompute_inter_token_latency_ms"]
    assert by_check(found)["benchmark[0]:recompute_inter_token_latency_ms"].verdict == "pass"


def test_every_request_refused_fails_every_figure() -> None:
    found = audit_report(REFUSED)
    f = by_check(found)
    assert f["successful_requests"].verdict == "fail"
    verdicts = {c: f[c].verdict for c in f if c.startswith("recompute_")}
    assert sum(v == "fail" for v in verdicts.values()) == 19  # every figure the report gives
    assert all(v == "fail" or "is null" in f[c].detail for c, v in verdicts.items())
    assert "no request succeeded" in f["recompute_prompt_tokens_per_second"].detail
    totals = f["errored_in_totals"]
    assert totals.verdict == "fail" and totals.numbers["total_prompt_tokens_per_s"] == pytest.approx(17845.2, abs=0.1)
    result = invoke("audit", str(REFUSED))
    assert result.exit_code == 1 and "17845 input tokens/s" in result.output


def test_records_join_their_traces_by_response_id(tmp_path) -> None:
    db = tmp_path / "traces.duckdb"
    assert invoke("load", str(SPANS), "--db", str(db)).exit_code == 0
    f = by_check(audit_report(REPORT, db=db))
    joined = f["traces:records_joined"]
    assert joined.verdict == "pass" and joined.numbers["joined"] == 24 == joined.numbers["records"]
    assert f["traces:output_tokens"].verdict == "pass" and f["traces:input_tokens"].verdict == "pass"
    assert f["traces:ttft_ms"].verdict == "pass" and f["traces:e2e_ms"].verdict == "pass"
    tpot = f["traces:tpot_ms"]
    g = f["traces:output_tokens"].numbers["equal_to_generated_tokens"]
    assert g > 0 and tpot.verdict == "pass" and tpot.numbers["left_out_usage_counts_g"] == g


def test_forced_kinds_and_individual(tmp_path) -> None:
    with pytest.raises(AuditInputError, match="not a guidellm report"):
        audit_report(SAMPLES / "vllm_benchmark_serving_sharegpt_qps04_llm-k8s.json", "guidellm")
    with pytest.raises(AuditInputError, match="carries its per-request records"):
        audit_report(REPORT, individual=REPORT)
    claims = tmp_path / "claims.yaml"
    claims.write_text("ttft_ms: 190\n")
    assert detect_kind(claims) == "claims"


@pytest.mark.parametrize(("edit", "says"), [
    (lambda d: d.pop("metadata"), "no 'metadata' object: a guidellm report from before 0.8"),
    (lambda d: d["metadata"].update(version=1), "metadata.version = 1"),
    (lambda d: d["benchmarks"][0]["requests"]["successful"][3]["info"]["timings"].update(request_start="soon"),
     "benchmarks[0].requests.successful[3].info.timings.request_start = 'soon' is not a number"),
    (lambda d: d["benchmarks"][0].pop("scheduler_metrics"), "benchmarks[0].scheduler_metrics is missing"),
    (lambda d: d.update(benchmarks=[]), "'benchmarks' is empty"),
])
def test_bad_reports_are_one_line(tmp_path, data, edit, says) -> None:
    bad = copy.deepcopy(data)
    edit(bad)
    path = write(tmp_path, bad)
    result = invoke("audit", str(path), "--kind", "guidellm")
    assert result.exit_code == 1 and says in result.output, result.output
    assert len(result.output.strip().splitlines()) == 1 and "Traceback" not in result.output


def test_truncated_report_is_one_line(tmp_path) -> None:
    path = tmp_path / "benchmarks.json"
    path.write_text(REPORT.read_text()[:5000])
    result = invoke("audit", str(path))
    assert result.exit_code == 1 and "benchmarks.json:" in result.output and "not valid JSON" in result.output
