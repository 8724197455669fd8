"""The audit over the real sample reports: what should pass passes, and a copy with one
planted error is caught by the right check and only that one. Expected numbers are computed
here with numpy, independently of the audit's SQL."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from analyzer.audit import audit_report, detect_kind
from analyzer.errors import AuditInputError
from data_paths import SAMPLES

VLLM = SAMPLES / "vllm_benchmark_serving_sharegpt_qps04_llm-k8s.json"
LLMPERF = SAMPLES / "llmperf_meta-llama-Llama-2-7b-chat-hf_550_150_summary.json"
LLMPERF_IND = SAMPLES / "llmperf_meta-llama-Llama-2-7b-chat-hf_550_150_individual_responses.json"
AIPERF_NEW = SAMPLES / "aiperf_0.10.0_profile_export_aiperf_chatbot_c8.json"
AIPERF_OLD = SAMPLES / "aiperf_2025-10_examples_run1_profile_export_aiperf.json"
AIPERF_RECORDS = SAMPLES / "aiperf_2025-10_examples_run1_profile_export_first_records.jsonl"
NIGHTLY = SAMPLES / "vllm_nightly_benchmark_results_llm-k8s.json"


def by_check(findings):
    return {f.check: f for f in findings}


def failed(findings):
    return sorted(f.check for f in findings if f.verdict == "fail")


@pytest.fixture(scope="module")
def vllm_data() -> dict:
    return json.loads(VLLM.read_text())


@pytest.fixture(scope="module")
def vllm_findings():
    return audit_report(VLLM)


def write(tmp_path: Path, name: str, data) -> Path:
    path = tmp_path / name
    path.write_text(json.dumps(data))
    return path


# --- facts about the real vLLM file, verified independently ---------------------------

def test_vllm_sample_facts(vllm_data) -> None:
    out = np.array(vllm_data["output_lens"])
    chunks = np.array([len(g) + 1 for g in vllm_data["itls"]])
    assert int((out == 1).sum()) == 14
    assert int((out == chunks + 1).sum()) == 25 and int((out > chunks).sum()) == 25


def test_vllm_real_file_passes(vllm_findings, vllm_data) -> None:
    assert failed(vllm_findings) == []
    f = by_check(vllm_findings)
    ttft = np.array(vllm_data["ttfts"]) * 1000
    fig = f["recompute_ttft_ms"].numbers["figures"]
    assert fig["mean_ttft_ms"]["recomputed"] == pytest.approx(ttft.mean(), rel=1e-12)
    assert fig["median_ttft_ms"]["recomputed"] == pytest.approx(np.median(ttft), rel=1e-12)
    assert fig["p99_ttft_ms"]["recomputed"] == pytest.approx(np.percentile(ttft, 99), rel=1e-12)
    assert fig["std_ttft_ms"]["recomputed"] == pytest.approx(ttft.std(), rel=1e-9)
    tpot = np.array([sum(g) / (o - 1) for g, o in zip(vllm_data["itls"], vllm_data["output_lens"]) if o > 1]) * 1000
    assert f["recompute_tpot_ms"].numbers["n_values"] == 186 == len(tpot)
    assert f["recompute_tpot_ms"].numbers["figures"]["mean_tpot_ms"]["recomputed"] == pytest.approx(tpot.mean())
    itl = np.concatenate([np.array(g) for g in vllm_data["itls"]]) * 1000
    assert f["recompute_itl_ms"].numbers["figures"]["p99_itl_ms"]["recomputed"] == pytest.approx(np.percentile(itl, 99))
    assert f["recompute_e2el_ms"].verdict == "cannot_check"
    assert f["count_failed"].verdict == "cannot_check"
    assert "mean_e2el_ms" in f["report_keys"].numbers["missing"] and f["report_keys"].numbers["legacy_goodput_key"]
    assert f["goodput_le_throughput"].verdict == "cannot_check"
    assert f["itl_vs_tpot_chunking"].numbers["multi_token_chunk_requests"] == 25
    assert f["itl_vs_tpot_chunking"].numbers["one_token_requests"] == 14
    assert f["count_output_throughput"].numbers["recomputed"] == pytest.approx(
        sum(vllm_data["output_lens"]) / vllm_data["duration"])


@pytest.mark.parametrize(
    "key, value_of, check, diagnosis",
    [
        # One-token requests counted as TPOT 0 (vLLM leaves them out).
        ("mean_tpot_ms", lambda d: 1000 * np.mean([sum(g) / (o - 1) if o > 1 else 0.0
                                                   for g, o in zip(d["itls"], d["output_lens"])]),
         "recompute_tpot_ms", "tpot_one_token_as_zero"),
        # Per-chunk ITL reported as per-token TPOT.
        ("mean_tpot_ms", lambda d: d["mean_itl_ms"], "recompute_tpot_ms", "itl"),
        # Sample std where vLLM uses the population std.
        ("std_ttft_ms", lambda d: 1000 * np.std(d["ttfts"], ddof=1), "recompute_ttft_ms", "std_sample_not_population"),
        # Seconds written into a _ms field.
        ("p99_ttft_ms", lambda d: np.percentile(d["ttfts"], 99), "recompute_ttft_ms", "unit_slip_div1000"),
        # Throughput over a longer denominator than the report's own duration.
        ("output_throughput", lambda d: d["total_output_tokens"] / (d["duration"] + 5), "count_output_throughput", None),
        # Goodput larger than throughput.
        ("request_goodput:", lambda d: d["request_throughput"] * 1.2, "goodput_le_throughput", None),
    ],
)
def test_vllm_planted_error_caught_by_one_check(tmp_path, vllm_data, key, value_of, check, diagnosis) -> None:
    data = dict(vllm_data)
    data[key] = float(value_of(vllm_data))
    findings = audit_report(write(tmp_path, "vllm.json", data), "vllm")
    assert failed(findings) == [check]
    if diagnosis is not None:
        assert by_check(findings)[check].numbers["diagnosis"] == diagnosis


def test_vllm_output_lens_all_max_tokens_cannot_be_judged_without_traces(tmp_path) -> None:
    """Equal output lengths: assumed from max_tokens, or every request ran to max_tokens (vLLM 0.32's
    real bench file: 64 each, usage-counted): the report alone cannot tell, so never a fail
    (tests/test_audit_real.py: with --db the traces confirm it)."""
    data = {"duration": 2.0, "completed": 3, "total_input_tokens": 30, "total_output_tokens": 30,
            "request_throughput": 1.5, "output_throughput": 15.0, "total_token_throughput": 30.0,
            "input_lens": [10, 10, 10], "output_lens": [10, 10, 10], "ttfts": [0.1, 0.2, 0.3],
            "itls": [[0.02] * 9, [0.02] * 9, [0.02] * 9], "errors": ["", "", ""]}
    findings = audit_report(write(tmp_path, "v.json", data))
    assert failed(findings) == []
    f = by_check(findings)["output_tokens_assumed_max_tokens"]
    assert f.verdict == "cannot_check" and "pass --db" in f.detail and "exactly 10 output tokens" in f.detail


def test_vllm_failed_requests_stored_as_zeros_are_left_out(tmp_path) -> None:
    data = {"duration": 2.0, "completed": 2, "failed": 1, "total_input_tokens": 20, "total_output_tokens": 7,
            "request_throughput": 1.0, "output_throughput": 3.5, "total_token_throughput": 13.5,
            "input_lens": [10, 10, 10], "output_lens": [3, 0, 4], "ttfts": [0.1, 0.0, 0.3],
            "itls": [[0.02, 0.03], [], [0.02, 0.02, 0.05]], "errors": ["", "timeout", ""],
            "mean_ttft_ms": 200.0}
    f = by_check(audit_report(write(tmp_path, "v.json", data)))
    assert f["recompute_ttft_ms"].verdict == "pass"
    assert f["failed_requests_as_zeros"].numbers["failed_stored_as_zeros"] == 1
    data["mean_ttft_ms"] = 1000 * np.mean([0.1, 0.0, 0.3])
    f = by_check(audit_report(write(tmp_path, "v.json", data)))
    assert f["recompute_ttft_ms"].numbers["diagnosis"] == "ttft_failed_as_zero"


# --- LLMPerf --------------------------------------------------------------------------

def test_llmperf_real_file_passes_with_its_own_method() -> None:
    findings = audit_report(LLMPERF)  # finds the sibling individual responses
    assert failed(findings) == []
    f = by_check(findings)
    ind = json.loads(LLMPERF_IND.read_text())
    ttft = np.array([r["ttft_s"] for r in ind])
    figs = f["recompute_ttft_s"].numbers["figures"]
    assert figs["results_ttft_s_stddev"]["recomputed"] == pytest.approx(ttft.std(ddof=1))
    assert figs["results_ttft_s_quantiles_p90"]["recomputed"] == pytest.approx(np.percentile(ttft, 90))
    tokens = f["recompute_number_input_tokens"].numbers["figures"]
    assert tokens["results_number_input_tokens_min"]["claimed"] == 538.0  # serialised as "538"
    assert "75.34 ms" in f["itl_definition"].detail
    assert f["throughput_denominator"].numbers["window_s_from_requests_per_min"] == pytest.approx(2 * 60 / 1.8215084860475033)


def test_llmperf_population_std_planted(tmp_path) -> None:
    data = json.loads(LLMPERF.read_text())
    ind = json.loads(LLMPERF_IND.read_text())
    data["results_ttft_s_stddev"] = float(np.std([r["ttft_s"] for r in ind]))
    findings = audit_report(write(tmp_path, "x_summary.json", data), individual=LLMPERF_IND)
    assert failed(findings) == ["recompute_ttft_s"]
    assert by_check(findings)["recompute_ttft_s"].numbers["diagnosis"] == "std_population_not_sample"


def test_llmperf_without_individual_cannot_recompute(tmp_path) -> None:
    findings = audit_report(write(tmp_path, "alone.json", json.loads(LLMPERF.read_text())))
    assert by_check(findings)["recompute_stats"].verdict == "cannot_check"


def test_llmperf_error_rate_recomputed_and_percentage_diagnosed(tmp_path) -> None:
    data = json.loads(LLMPERF.read_text())
    data.update({"results_num_requests_started": 4, "results_number_errors": 1, "results_error_rate": 0.25})
    f = by_check(audit_report(write(tmp_path, "s.json", data), individual=LLMPERF_IND))["error_rate"]
    assert f.verdict == "pass" and f.numbers["recomputed"] == pytest.approx(0.25)
    data["results_error_rate"] = 25.0
    f = by_check(audit_report(write(tmp_path, "p.json", data), individual=LLMPERF_IND))["error_rate"]
    assert f.verdict == "fail" and f.numbers["diagnosis"] == "error_rate_percent_as_fraction"


# --- AIPerf ---------------------------------------------------------------------------

def test_aiperf_both_layouts_pass() -> None:
    new = by_check(audit_report(AIPERF_NEW))
    old = by_check(audit_report(AIPERF_OLD, individual=AIPERF_RECORDS))
    assert failed(new.values()) == [] and failed(old.values()) == []
    assert new["request_throughput"].numbers["recomputed"] == pytest.approx(96 / 28.472207654)
    assert old["output_token_throughput"].numbers["recomputed"] == pytest.approx(21624 / 9.317788951)
    assert old["output_tokens_include_reasoning"].numbers["reasoning_share"] == pytest.approx(19792 / 21624)
    assert old["error_count"].numbers["error_rate"] == pytest.approx(11 / 100)
    assert old["mean_rate_vs_inverse_mean_itl"].numbers["inverse_mean_itl_per_second"] == pytest.approx(
        1000 / 27.763065454471807)
    assert old["record_identities"].numbers["identities_checked"] == 6


def test_aiperf_visible_only_throughput_planted(tmp_path) -> None:
    data = json.loads(AIPERF_OLD.read_text())
    data["records"]["output_token_throughput"]["avg"] = 1832 / 9.317788951
    findings = audit_report(write(tmp_path, "a.json", data))
    assert failed(findings) == ["output_token_throughput"]
    assert by_check(findings)["output_token_throughput"].numbers["diagnosis"] == "visible_tokens_only"


def test_aiperf_visible_rate_comes_from_report_rates_and_survives_no_duration(tmp_path) -> None:
    old = by_check(audit_report(AIPERF_OLD))["output_tokens_include_reasoning"]
    assert old.numbers["visible_tokens_per_s"] == pytest.approx(1832 / 9.317788951)
    data = json.loads(AIPERF_OLD.read_text())
    del data["records"]["benchmark_duration"]
    f = by_check(audit_report(write(tmp_path, "a.json", data)))["output_tokens_include_reasoning"]
    assert f.verdict == "pass" and f.numbers["visible_tokens_per_s"] is None and "unknown" in f.detail


def test_aiperf_error_rate_and_reasoning_share_come_from_sql_and_zero_requests_is_null(tmp_path) -> None:
    data = json.loads(AIPERF_NEW.read_text())
    data["request_count"]["avg"] = 0.0
    data["error_summary"] = []
    data.pop("error_request_count", None)
    data.get("input_config", {}).pop("phases", None)
    f = by_check(audit_report(write(tmp_path, "zero.json", data)))["error_count"]
    assert f.numbers["error_rate"] is None and "undefined" in f.detail
    old = json.loads(AIPERF_OLD.read_text())
    old["records"]["error_request_count"]["avg"] = 1
    old["error_summary"] = [{"code": 499, "count": 1}]
    old.get("input_config", {}).pop("phases", None)
    old.get("input_config", {}).pop("loadgen", None)
    f = by_check(audit_report(write(tmp_path, "one.json", old)))["error_count"]
    assert f.verdict == "pass" and f.numbers["error_rate"] == pytest.approx(1 / 90)


def test_aiperf_percentile_order_planted(tmp_path) -> None:
    data = json.loads(AIPERF_NEW.read_text())
    data["time_to_first_token"]["p90"] = 250.0  # above p95 = 200.5
    assert failed(audit_report(write(tmp_path, "a.json", data))) == ["summary_statistics_consistent"]


# --- errors ---------------------------------------------------------------------------

def test_unknown_shape_names_file_and_kinds(tmp_path) -> None:
    path = write(tmp_path, "odd.json", {"hello": 1})
    with pytest.raises(AuditInputError, match=r"odd\.json: unknown report shape.*vllm-nightly"):
        detect_kind(path)


def test_bad_array_value_names_key(tmp_path, vllm_data) -> None:
    data = dict(vllm_data)
    data["ttfts"] = ["fast"] + data["ttfts"][1:]
    with pytest.raises(AuditInputError, match=r"ttfts\[0\].*not a number"):
        audit_report(write(tmp_path, "v.json", data), "vllm")


# --- vLLM nightly table ------------------------------------------------------------------

def test_nightly_table_matches_its_source_json() -> None:
    f = by_check(audit_report(NIGHTLY, individual=VLLM))
    assert failed(f.values()) == []
    assert f["table_row_matches_source"].numbers["row"] == "tp8_pp1_qps_04"
    assert f["table_row_matches_source"].numbers["columns_compared"] == 13
    per_request = f["output_tokens_per_request"].numbers["output_tokens_per_request"]
    assert per_request["tp8_pp1_qps_04"] == pytest.approx(42449 / 200)


def test_nightly_planted_row_error(tmp_path) -> None:
    rows = json.loads(NIGHTLY.read_text())
    rows[1]["Mean TPOT (ms)"] = rows[1]["Mean ITL (ms)"]
    findings = audit_report(write(tmp_path, "n.json", rows), individual=VLLM)
    assert failed(findings) == ["table_row_matches_source"]
    assert "Mean TPOT (ms)" in by_check(findings)["table_row_matches_source"].detail


def test_audit_queries_run_from_their_subfolder() -> None:
    from analyzer.query.runner import list_queries, load_query

    names = list_queries("audit")
    assert "audit/distribution_stats" in names and "audit/vllm_values" in names
    assert "distribution_stats" not in list_queries()  # the top level is unchanged
    assert [p.name for p in load_query("audit/vllm_totals").params] == ["duration_s"]
    for bad in ("views/10_tokentrace_contract", "../requests", "audit/x/y"):
        with pytest.raises(ValueError, match="invalid query name"):
            load_query(bad)
    with pytest.raises(ValueError, match="known: audit/"):
        load_query("audit/nope")


def test_nightly_tokens_per_request_spread_fails_and_zero_output_cannot(tmp_path) -> None:
    rows = json.loads(NIGHTLY.read_text())
    rows[0]["Output Tput (tok/s)"] = rows[0]["Output Tput (tok/s)"] * 1.2  # 20 % more tokens per request
    f = by_check(audit_report(write(tmp_path, "n.json", rows)))["output_tokens_per_request"]
    assert f.verdict == "fail" and f.numbers["relative_spread"] > 0.05
    tpr = [r["Output Tput (tok/s)"] / r["Tput (req/s)"] for r in rows]
    assert f.numbers["relative_spread"] == pytest.approx((max(tpr) - min(tpr)) / max(tpr))
    assert f.numbers["rows_left_out"] == 0
    dup = [dict(r) for r in json.loads(NIGHTLY.read_text())]
    dup[1]["Test name"] = dup[0]["Test name"]
    dup[2]["Tput (req/s)"] = 0
    f = by_check(audit_report(write(tmp_path, "d.json", dup)))["output_tokens_per_request"]
    assert len(f.numbers["output_tokens_per_request"]) == len(dup) - 1 and f.numbers["rows_left_out"] == 1
    assert "1 row(s)" in f.detail
    for row in rows:
        row["Output Tput (tok/s)"] = 0
    f = by_check(audit_report(write(tmp_path, "z.json", rows)))["output_tokens_per_request"]
    assert f.verdict == "cannot_check"
