"""``tokentrace audit`` through the real click entry point."""

from __future__ import annotations

import json

from click.testing import CliRunner

from analyzer.cli import cli
from data_paths import SAMPLES

VLLM = SAMPLES / "vllm_benchmark_serving_sharegpt_qps04_llm-k8s.json"

SEED_BROKEN = """\
measured: false
model: {layers: 80, q_heads: 64, kv_heads: 8, head_dim: 128, kv_dtype: bf16}
output_tokens: 150
ttft_ms: 190
tpot_ms: 25
e2e_ms: 3940
kv_bytes_per_token: 2621440
"""


def invoke(*args: str):
    return CliRunner().invoke(cli, ["audit", *args], catch_exceptions=False)


def test_seed_broken_claims_exit_1_json(tmp_path) -> None:
    path = tmp_path / "claims.yaml"
    path.write_text(SEED_BROKEN)
    result = invoke(str(path), "--format", "json")
    assert result.exit_code == 1
    rows = json.loads(result.output)
    verdicts = {r["check"]: r["verdict"] for r in rows}
    assert verdicts["e2e_o_gaps_for_o_tokens"] == "fail" and verdicts["kv_query_heads_for_kv_heads"] == "fail"
    kv = next(r for r in rows if r["check"] == "kv_query_heads_for_kv_heads")
    assert kv["factor"] == 8 and kv["kv_bytes_per_token"] == 327680 and "detail" in kv


def test_real_vllm_report_exit_0_table() -> None:
    result = invoke(str(VLLM))
    assert result.exit_code == 0, result.output
    assert "recompute_tpot_ms" in result.output and "0 fail" in result.output


def test_rel_tol_flag_changes_verdicts(tmp_path) -> None:
    data = json.loads(VLLM.read_text())
    data["mean_ttft_ms"] *= 1.0005  # 0.05 % off
    path = tmp_path / "v.json"
    path.write_text(json.dumps(data))
    assert invoke(str(path)).exit_code == 1
    assert invoke(str(path), "--rel-tol", "1e-3").exit_code == 0


def test_bad_inputs_one_line_errors(tmp_path) -> None:
    odd = tmp_path / "odd.json"
    odd.write_text('{"x": 1}')
    result = invoke(str(odd))
    assert result.exit_code == 1 and "odd.json: unknown report shape" in result.output
    assert "Traceback" not in result.output
    result = invoke(str(tmp_path / "missing.json"))
    assert result.exit_code == 1 and "missing.json: no such file" in result.output
    result = invoke(str(odd), "--kind", "nope")
    assert result.exit_code == 2 and "'nope' is not one of" in result.output
    broken = tmp_path / "broken.json"
    broken.write_text("{")
    result = invoke(str(broken))
    assert result.exit_code == 1 and "broken.json:1: not valid JSON" in result.output
