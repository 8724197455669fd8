"""Claims files and tokentrace artifacts: the worked example's broken cases, and one planted error per
claims check, each caught by its own check only."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

from analyzer.audit import audit_report
from analyzer.errors import AuditInputError

SEED_MODEL = {"layers": 80, "q_heads": 64, "kv_heads": 8, "head_dim": 128, "kv_dtype": "bf16"}
SEED = {
    "measured": False, "model": SEED_MODEL, "input_tokens": 1025, "output_tokens": 150, "ttft_ms": 190,
    "tpot_ms": 25, "e2e_ms": 3915, "decode_output_tokens_per_second": 40,
    "whole_request_output_tokens_per_second": 38.31, "kv_bytes_per_token": 327680, "window_s": 10,
    "attempted": 100, "succeeded": 98, "slo_passing": 95, "request_throughput_rps": 9.8,
    "observed_goodput_rps": 9.5, "error_rate": 0.02,
}


def audit_claims(tmp_path: Path, claims: dict, **kwargs):
    path = tmp_path / "claims.yaml"
    path.write_text(yaml.safe_dump(claims))
    return audit_report(path, **kwargs)


def failed(findings):
    return sorted(f.check for f in findings if f.verdict == "fail")


def by_check(findings):
    return {f.check: f for f in findings}


def test_seed_worked_example_passes(tmp_path) -> None:
    findings = audit_claims(tmp_path, SEED)
    assert failed(findings) == []
    f = by_check(findings)
    assert f["e2e_gaps"].numbers["e2e_ms"] == 3915
    assert f["whole_request_output_tokens_per_second"].numbers["recomputed"] == pytest.approx(150 / 3.915)
    assert f["kv_physical_memory"].verdict == "cannot_check"
    assert f["labelling"].verdict == "pass"


def test_seed_broken_timing_denominator(tmp_path) -> None:
    findings = audit_claims(tmp_path, {**SEED, "e2e_ms": 3940, "decode_output_tokens_per_second": None,
                                       "whole_request_output_tokens_per_second": None})
    assert failed(findings) == ["e2e_o_gaps_for_o_tokens"]
    f = by_check(findings)["e2e_o_gaps_for_o_tokens"]
    assert f.numbers["e2e_ms"] == 190 + 25 * 149 == 3915 and f.numbers["e2e_ms_with_o_gaps"] == 3940


def test_seed_broken_architecture(tmp_path) -> None:
    findings = audit_claims(tmp_path, {**SEED, "kv_bytes_per_token": 2_621_440})
    assert failed(findings) == ["kv_query_heads_for_kv_heads"]
    f = by_check(findings)["kv_query_heads_for_kv_heads"]
    assert f.numbers["factor"] == 8 and f.numbers["kv_bytes_per_token"] == 2 * 80 * 8 * 128 * 2


@pytest.mark.parametrize(
    "changes, check, diagnosis",
    [
        ({"kv_bytes_per_token": 2 * 80 * 8 * 128 * 4}, "kv_dtype_bytes", None),
        ({"tpot_ms": 3915 / 150, "e2e_ms": 3915}, "tpot_definition", "tpot_includes_first_token"),
        ({"decode_output_tokens_per_second": 38.31}, "decode_output_tokens_per_second", "decode_whole_rates_swapped"),
        ({"decode_output_tokens_per_second": 150 / 3.725}, "decode_output_tokens_per_second",
         "decode_rate_counts_first_token"),
        ({"request_throughput_rps": 10.0}, "request_throughput_rps", "throughput_counts_attempted"),
        ({"error_rate": 2}, "error_rate", "error_rate_percent_as_fraction"),
        ({"observed_goodput_rps": 9.9, "slo_passing": 99}, "goodput_le_throughput", None),
        ({"ttft_ms": 0.19, "tpot_ms": 0.025, "e2e_ms": 3.915, "decode_output_tokens_per_second": None,
          "whole_request_output_tokens_per_second": None, "measured": False}, None, None),
    ],
)
def test_claims_planted_error(tmp_path, changes, check, diagnosis) -> None:
    claims = {k: v for k, v in {**SEED, **changes}.items() if v is not None}
    findings = audit_claims(tmp_path, claims)
    if check is None:  # consistent figures in other units still reconcile
        assert "e2e_gaps" in {f.check for f in findings if f.verdict == "pass"}
        return
    if check == "goodput_le_throughput":
        assert "goodput_le_throughput" in failed(findings) and "request_counts_order" in failed(findings)
        return
    assert failed(findings) == [check]
    if diagnosis:
        assert by_check(findings)[check].numbers["diagnosis"] == diagnosis


def test_rate_p99_and_mean_rate_vs_inverse_itl(tmp_path) -> None:
    findings = audit_claims(tmp_path, {"measured": True,
                                       "decode_output_tokens_per_second": {"value": 52.0, "stat": "p99"}})
    assert failed(findings) == ["rate_percentile_direction"]
    findings = audit_claims(tmp_path, {"measured": True, "stat": "mean", "itl_ms": 27.76,
                                       "decode_output_tokens_per_second": 1000 / 27.76})
    assert failed(findings) == ["mean_rate_vs_inverse_mean_itl"]
    findings = audit_claims(tmp_path, {"measured": True, "stat": "mean", "itl_ms": 27.763, "e2e_ms": 9059.65,
                                       "ttft_ms": 2343.2, "tpot_ms": 27.76, "output_tokens": 243,
                                       "decode_output_tokens_per_second": 36.684})
    assert failed(findings) == []
    assert by_check(findings)["e2e_gaps"].verdict == "cannot_check"
    assert "statistic of a sum" in by_check(findings)["e2e_gaps"].detail


def test_mean_rate_vs_inverse_itl_with_zero_itl_is_skipped_not_a_crash(tmp_path) -> None:
    findings = audit_claims(tmp_path, {"measured": True, "stat": "mean", "itl_ms": 0,
                                       "decode_output_tokens_per_second": 36.684})
    assert "mean_rate_vs_inverse_mean_itl" not in by_check(findings)
    findings = audit_claims(tmp_path, {"measured": True, "stat": "mean", "itl_ms": 25.0,
                                       "decode_output_tokens_per_second": 41.0})
    f = by_check(findings)["mean_rate_vs_inverse_mean_itl"]
    assert f.verdict == "pass" and f.numbers["inverse_mean_per_second"] == pytest.approx(40.0)


def test_synthetic_presented_as_measured(tmp_path) -> None:
    findings = audit_claims(tmp_path, {**SEED, "measured": True})
    assert failed(findings) == ["synthetic_presented_as_measured"]
    assert len(by_check(findings)["synthetic_presented_as_measured"].numbers["seed_synthetic_matches"]) == 15


def test_tokentrace_artifact(tmp_path, seed_csv) -> None:
    from analyzer.verbs.timeline import WindowCounts, compute_artifact, read_timeline_csv
    from instrument.kv.formula import explicit_layout

    artifact = compute_artifact(read_timeline_csv(seed_csv), input_tokens=1025, output_tokens=150,
                                kv=explicit_layout(80, 8, 128, "bf16", q_heads=64),
                                window=WindowCounts(10, 100, 98, 95))
    path = tmp_path / "artifact.json"
    path.write_text(json.dumps(artifact))
    findings = audit_report(path)
    assert failed(findings) == []
    assert by_check(findings)["labelling"].numbers["self_labelled_synthetic"] is True
    path.write_text(json.dumps({**artifact, "measured": True}))
    assert failed(audit_report(path)) == ["synthetic_presented_as_measured"]


def test_model_from_hf_config(tmp_path) -> None:
    config = tmp_path / "config.json"
    config.write_text(json.dumps({"model_type": "llama", "num_hidden_layers": 80, "num_attention_heads": 64,
                                  "num_key_value_heads": 8, "hidden_size": 8192, "torch_dtype": "bfloat16"}))
    claims = {"measured": True, "kv_bytes_per_token": 2_621_440, "model": {"config": "config.json"}}
    assert failed(audit_claims(tmp_path, claims)) == ["kv_query_heads_for_kv_heads"]


@pytest.mark.parametrize(
    "claims, message",
    [
        ({"ttft": 190}, r"claims\.yaml: unknown key\(s\) 'ttft'; known figures: input_tokens"),
        ({"ttft_ms": "fast"}, r"claims\.yaml: key 'ttft_ms' = 'fast' is not a number"),
        ({"ttft_ms": {"value": 1, "stat": "p42"}}, r"key 'ttft_ms': stat 'p42' is not one of mean, p50, p90, p99"),
        ({"kv_bytes_per_token": 1, "model": {"layers": 80}}, r"key 'model': missing kv_heads, head_dim"),
        ({"output_tokens": 1.5}, r"key 'output_tokens' = 1.5 must be a whole number"),
    ],
)
def test_bad_claims_file(tmp_path, claims, message) -> None:
    with pytest.raises(AuditInputError, match=message):
        audit_claims(tmp_path, claims)


def test_db_recomputation_from_traces(tmp_path, seed_csv) -> None:
    from analyzer.db.store import connect
    from analyzer.verbs.timeline import compute_artifact, read_timeline_csv

    db = tmp_path / "traces.duckdb"
    con = connect(db)
    compute_artifact(read_timeline_csv(seed_csv), input_tokens=1025, output_tokens=150, kv=None, con=con)
    con.close()
    claims = {"measured": False, "ttft_ms": 190, "e2e_ms": 3940, "output_tokens": 150,
              "whole_request_output_tokens_per_second": 38.31, "tpot_ms": {"value": 25, "stat": "mean"}}
    findings = audit_claims(tmp_path, claims, db=db)
    f = by_check(findings)
    assert f["traces:ttft_ms"].verdict == "pass" and f["traces:ttft_ms"].numbers["recomputed"] == 190
    assert f["traces:e2e_ms"].verdict == "fail" and f["traces:e2e_ms"].numbers["recomputed"] == 3915
    assert f["traces:whole_request_output_tokens_per_second"].verdict == "pass"
    assert f["traces:tpot_ms"].verdict == "pass" and f["traces:tpot_ms"].numbers["recomputed"] == pytest.approx(25)
    assert f["traces:output_tokens"].verdict == "pass"
    not_db = tmp_path / "not.duckdb"
    not_db.write_text("nope")
    with pytest.raises(AuditInputError, match=r"not\.duckdb: cannot open as a DuckDB database"):
        audit_claims(tmp_path, claims, db=not_db)


def test_the_shipped_sample_claims_file_flags_the_seeds_two_errors_and_matches_the_docs() -> None:
    """analyzer/examples/claims.yaml, the README's and docs/audit.md's example."""
    repo = Path(__file__).resolve().parents[1]
    sample = repo / "analyzer" / "examples" / "claims.yaml"
    findings = audit_report(sample)
    assert failed(findings) == ["e2e_o_gaps_for_o_tokens", "kv_query_heads_for_kv_heads"]
    assert by_check(findings)["kv_query_heads_for_kv_heads"].numbers["factor"] == 8
    figures = yaml.safe_load(sample.read_text())
    assert {k: figures[k] for k in ("output_tokens", "ttft_ms", "tpot_ms")} == {"output_tokens": 150, "ttft_ms": 190,
                                                                               "tpot_ms": 25}
    assert "tokentrace audit analyzer/examples/claims.yaml" in (repo / "README.md").read_text()
    docs_block = (repo / "docs" / "audit.md").read_text().split("```yaml\n", 1)[1].split("```", 1)[0]
    assert yaml.safe_load(docs_block) == figures  # the docs show the file itself
