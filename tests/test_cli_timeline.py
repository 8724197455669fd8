"""``tokentrace timeline`` and ``tokentrace kv`` through the real click entry point."""

from __future__ import annotations

import json

from analyzer.cli import cli

SEED_FLAGS = ["--layers", "80", "--kv-heads", "8", "--head-dim", "128", "--kv-dtype", "bf16",
              "--input-tokens", "1025", "--output-tokens", "150"]
WINDOW_FLAGS = ["--window-s", "10", "--attempted", "100", "--succeeded", "98", "--slo-passing", "95"]


def test_seed_json(runner, seed_csv) -> None:
    result = runner.invoke(cli, ["timeline", str(seed_csv), *SEED_FLAGS, *WINDOW_FLAGS, "--json"],
                           catch_exceptions=False)
    assert result.exit_code == 0, result.output
    art = json.loads(result.output)
    expected = {"kv_bytes_per_token": 327680, "prompt_kv_mib": 320.3125, "stop_kv_mib": 366.875, "ttft_ms": 190,
                "e2e_ms": 3915, "tpot_ms": 25, "decode_output_tokens_per_second": 40.0,
                "request_throughput_rps": 9.8, "observed_goodput_rps": 9.5, "error_rate": 0.02}
    for key, value in expected.items():
        assert abs(art[key] - value) < 1e-9, key
    assert round(art["whole_request_output_tokens_per_second"], 2) == 38.31
    assert "scope" in art


def test_no_window_flags_gives_null_window_keys(runner, seed_csv) -> None:
    result = runner.invoke(cli, ["timeline", str(seed_csv), *SEED_FLAGS, "--json"], catch_exceptions=False)
    art = json.loads(result.output)
    assert art["request_throughput_rps"] is None and art["observed_goodput_rps"] is None and art["error_rate"] is None


def test_model_config_flag(runner, seed_csv, tmp_path) -> None:
    cfg = tmp_path / "config.json"
    cfg.write_text(json.dumps({"num_hidden_layers": 48, "num_attention_heads": 32, "num_key_value_heads": 4,
                               "head_dim": 128, "torch_dtype": "bfloat16"}))
    result = runner.invoke(cli, ["timeline", str(seed_csv), "--model-config", str(cfg), "--kv-dtype", "fp8",
                                 "--input-tokens", "4096", "--output-tokens", "150", "--json"], catch_exceptions=False)
    art = json.loads(result.output)
    assert art["kv_bytes_per_token"] == 49152 and art["prompt_kv_mib"] == 192


def test_broken_cases_exit_non_zero(runner, seed_csv) -> None:
    result = runner.invoke(cli, ["timeline", str(seed_csv), *SEED_FLAGS, "--query-heads", "64",
                                 "--claim-kv-bytes-per-token", "2621440", "--json"], catch_exceptions=False)
    assert result.exit_code == 1
    assert "q_heads/kv_heads = 64/8 = 8x" in result.stderr
    result = runner.invoke(cli, ["timeline", str(seed_csv), *SEED_FLAGS, "--claim-e2e-ms", "3940", "--json"],
                           catch_exceptions=False)
    assert result.exit_code == 1
    assert "150 gaps for 150 tokens" in result.stderr
    ok = runner.invoke(cli, ["timeline", str(seed_csv), *SEED_FLAGS, "--claim-e2e-ms", "3915"], catch_exceptions=False)
    assert ok.exit_code == 0 and "e2e_gaps: pass" in ok.output


def test_user_errors_are_one_line(runner, tmp_path, seed_csv) -> None:
    bad = tmp_path / "dup.csv"
    bad.write_text("event,time_ms\nclient_send,0\nclient_send,1\n")
    result = runner.invoke(cli, ["timeline", str(bad), "--output-tokens", "3"], catch_exceptions=False)
    assert result.exit_code == 1
    assert "dup.csv:3: duplicate event 'client_send'" in result.output
    assert "Traceback" not in result.output
    partial = runner.invoke(cli, ["timeline", str(seed_csv), "--output-tokens", "3", "--window-s", "10"],
                            catch_exceptions=False)
    assert partial.exit_code == 1 and "--attempted" in partial.output
    counts = runner.invoke(cli, ["timeline", str(seed_csv), "--output-tokens", "3", "--window-s", "10",
                                 "--attempted", "5", "--succeeded", "6", "--slo-passing", "1"], catch_exceptions=False)
    assert counts.exit_code == 1 and "inconsistent request counts" in counts.output
    zero = runner.invoke(cli, ["timeline", str(seed_csv), "--output-tokens", "0"], catch_exceptions=False)
    assert zero.exit_code == 1 and ">= 1" in zero.output


def test_db_keeps_the_synthetic_trace(runner, seed_csv, tmp_path) -> None:
    import duckdb

    db = tmp_path / "t.duckdb"
    runner.invoke(cli, ["timeline", str(seed_csv), *SEED_FLAGS, "--db", str(db)], catch_exceptions=False)
    with duckdb.connect(str(db)) as con:
        assert con.execute("SELECT count(*) FROM span_events").fetchone()[0] == 2


def test_kv_verb(runner, tmp_path) -> None:
    result = runner.invoke(cli, ["kv", "--layers", "80", "--kv-heads", "8", "--query-heads", "64", "--head-dim", "128",
                                 "--kv-dtype", "bf16", "--tokens", "1025", "--json"], catch_exceptions=False)
    out = json.loads(result.output)
    assert out["kv_bytes_per_token"] == 327680 and out["kv_mib"] == 320.3125 and out["layout"] == "gqa"
    assert any("tensor-parallel" in item for item in out["limitations"])
    mla = tmp_path / "config.json"
    mla.write_text(json.dumps({"model_type": "deepseek_v3", "num_hidden_layers": 61, "num_attention_heads": 128,
                               "hidden_size": 7168, "kv_lora_rank": 512, "torch_dtype": "bfloat16"}))
    refused = runner.invoke(cli, ["kv", "--model-config", str(mla)], catch_exceptions=False)
    assert refused.exit_code != 0 and "multi-head latent attention" in refused.output


def test_table_output_keeps_the_figures_exact() -> None:
    """The table format must not round the worked example's figures (320.3125 MiB, 38.31... tok/s)."""
    import io

    from analyzer.cli._options import emit_rows

    buf = io.StringIO()
    emit_rows(["prompt_kv_mib", "whole_rate", "ttft_ms"], [(320.3125, 150 / 3.915, 190.0)], "table", out=buf)
    assert "320.3125" in buf.getvalue() and "38.31417625" in buf.getvalue() and "190" in buf.getvalue()


def test_seed_table_is_rounded_for_reading_and_fits_80_columns(runner, seed_csv) -> None:
    result = runner.invoke(cli, ["timeline", str(seed_csv), *SEED_FLAGS, *WINDOW_FLAGS], catch_exceptions=False,
                           env={"COLUMNS": "80"})
    assert result.exit_code == 0, result.output
    lines = result.stdout.splitlines()
    assert max(len(line) for line in lines) <= 80, max(lines, key=len)
    figures = dict(line.split(None, 1) for line in lines if line and not line.startswith((" ", "limitation")))
    assert figures["whole_request_output_tokens_per_second"] == "38.31"  # 38.31417625 in --json
    assert figures["prompt_kv_gib"] == "0.3128" and figures["kv_bytes_per_token"] == "327680"
    assert figures["ttft_ms"] == "190.0" and figures["e2e_ms"] == "3915.0" and figures["tpot_ms"] == "25.0"
