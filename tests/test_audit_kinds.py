"""Verdicts a reader trusts: a forced --kind that finds none of its keys is a one-line user
error (never a pass), and a run with no successful request fails ``successful_requests``."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from click.testing import CliRunner

from analyzer.audit import audit_report
from analyzer.cli import cli
from analyzer.errors import AuditInputError
from data_paths import SAMPLES

VLLM = SAMPLES / "vllm_benchmark_serving_sharegpt_qps04_llm-k8s.json"
LLMPERF = SAMPLES / "llmperf_meta-llama-Llama-2-7b-chat-hf_550_150_summary.json"

# the top level of a guidellm 0.8 benchmarks.json: none of the other kinds' keys
GUIDELLM_SHAPE = {"metadata": {"version": 1, "guidellm_version": "0.8.1"}, "args": {"profile": "synchronous"},
                  "benchmarks": [{"type_": "generative_benchmark", "requests": {"successful": []}}]}


def invoke(*args: str):
    return CliRunner().invoke(cli, ["audit", *args], catch_exceptions=False)


def write(tmp_path: Path, name: str, data) -> Path:
    path = tmp_path / name
    path.write_text(json.dumps(data))
    return path


@pytest.mark.parametrize("kind", ["vllm", "llmperf", "vllm-nightly", "aiperf", "tokentrace", "claims"])
def test_forced_kind_on_a_foreign_report_is_a_user_error(tmp_path, kind) -> None:
    path = write(tmp_path, "benchmarks.json", GUIDELLM_SHAPE)
    result = invoke(str(path), "--kind", kind)
    assert result.exit_code == 1
    lines = result.output.strip().splitlines()
    assert len(lines) == 1 and "benchmarks.json" in lines[0], result.output
    expected = {"aiperf": "not an aiperf report", "claims": "unknown key(s) 'args', 'benchmarks', 'metadata'"}
    assert expected.get(kind, f"not a {kind} report") in lines[0]
    assert "PASS" not in result.output and "Traceback" not in result.output


def test_forced_kind_names_what_auto_would_pick(tmp_path) -> None:
    with pytest.raises(AuditInputError, match=r"not a llmperf report: .*looks like a vllm report: pass --kind vllm"):
        audit_report(VLLM, "llmperf")
    with pytest.raises(AuditInputError, match=r"not a vllm report: .*looks like a llmperf report"):
        audit_report(LLMPERF, "vllm")


def test_claims_file_without_a_figure_is_a_user_error(tmp_path) -> None:
    path = tmp_path / "claims.yaml"
    path.write_text("measured: true\ntitle: nothing claimed\n")
    result = invoke(str(path))
    assert result.exit_code == 1 and "claims.yaml: no figure to check" in result.output
    assert "PASS" not in result.output


def test_all_failed_vllm_run_fails(tmp_path) -> None:
    data = json.loads(VLLM.read_text())
    n = len(data["ttfts"])
    data.update(ttfts=[0.0] * n, itls=[[] for _ in range(n)], output_lens=[0] * n, errors=["HTTP 400"] * n,
                completed=0, failed=n, total_output_tokens=0, output_throughput=0.0, request_throughput=0.0)
    findings = {f.check: f for f in audit_report(write(tmp_path, "v.json", data))}
    f = findings["successful_requests"]
    assert f.verdict == "fail" and f.numbers == {"successful": 0, "failed": n}
    result = invoke(str(tmp_path / "v.json"))
    assert result.exit_code == 1 and "no request succeeded" in result.output


def test_successful_vllm_run_counts_its_requests() -> None:
    f = {f.check: f for f in audit_report(VLLM)}["successful_requests"]
    assert f.verdict == "pass" and f.numbers["successful"] == 200


def test_all_failed_llmperf_summary_fails(tmp_path) -> None:
    data = json.loads(LLMPERF.read_text())
    data["results_num_completed_requests"] = 0
    f = {f.check: f for f in audit_report(write(tmp_path, "x_summary.json", data), individual=None)}
    assert f["successful_requests"].verdict == "fail"


def test_all_failed_aiperf_report_fails(tmp_path) -> None:
    # AIPerf writes no request_count when nothing succeeded; its error count remains
    data = {"schema_version": "1.0", "aiperf_version": "0.13.0",
            "error_request_count": {"unit": "requests", "avg": 24.0},
            "error_summary": [{"error_details": {"code": 400}, "count": 24}]}
    findings = {f.check: f for f in audit_report(write(tmp_path, "profile_export_aiperf.json", data))}
    assert findings["successful_requests"].verdict == "fail"
    assert findings["successful_requests"].numbers == {"successful": 0.0, "failed": 24.0}
