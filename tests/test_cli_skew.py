"""`tokentrace skew` through the real entry point."""

from __future__ import annotations

import json

from click.testing import CliRunner

from analyzer.cli import cli
from analyzer.db.store import connect
from trace_fixtures import mixed_world


def test_skew_json_reports_rules_offsets_and_the_assumption(tmp_path) -> None:
    connect_db = tmp_path / "t.duckdb"
    mixed_world().load(connect(connect_db)).close()
    result = CliRunner().invoke(cli, ["skew", "--db", str(connect_db), "--format", "json",
                                      "--assume-offset", "skewed-client=35"], catch_exceptions=False)
    assert result.exit_code == 0
    doc = json.loads(result.output)
    assert sorted({r["rule"] for r in doc["rules"]}) == [
        "child_starts_before_parent", "chunks_out_of_order", "decode_steps_overlap", "event_outside_span",
        "negative_duration"]
    skewed = next(o for o in doc["offsets"] if o["client_domain"].startswith("skewed-client"))
    assert (skewed["offset_min_ms"], skewed["offset_max_ms"], skewed["verdict"]) == (-37.0, -30.0, "skew_detected")
    assert skewed["assumed_offset_ms"] == -35.0 and skewed["assumed_offset_within_bounds"] is True
    assert doc["assumed_offsets"] == {"skewed-client": 35.0} and "shifted by -35 ms" in doc["notes"][0]


def test_skew_table_and_csv_print_both_parts(tmp_path) -> None:
    db = tmp_path / "t.duckdb"
    mixed_world().load(connect(db)).close()
    table = CliRunner().invoke(cli, ["skew", "--db", str(db), "--tolerance-ms", "100"], catch_exceptions=False)
    assert "skew_rules: 2 row(s)" in table.output  # negative_duration, chunks_out_of_order: not tolerance-gated and "skew_offsets: 2 row(s)" in table.output
    csv = CliRunner().invoke(cli, ["skew", "--db", str(db), "--format", "csv"], catch_exceptions=False).output
    assert "# skew_rules\nrule,trace_id" in csv and "# skew_offsets\nclient_domain,server_domain,requests" in csv


def test_skew_table_says_no_rule_is_broken_and_names_clocks_apart() -> None:
    """No empty rules table; clock domains shortened only as far as they stay apart, each
    spelled out in full below the table."""
    from analyzer.cli.skew import short_domain_names

    names = short_domain_names({"bench|4e53dae9-0bff|vm", "bench|4e5f1111-aaaa|vm", "tokentrace-gateway|77aa|vm"})
    assert names == {"bench|4e53dae9-0bff|vm": "bench|4e53", "bench|4e5f1111-aaaa|vm": "bench|4e5f",
                     "tokentrace-gateway|77aa|vm": "tokentrace-gateway"}
    assert short_domain_names({"a||", "a||h"}) == {"a||": "a||", "a||h": "a||h"}  # nothing tells them apart


def test_skew_table_on_a_real_client_and_gateway(tmp_path) -> None:
    from pathlib import Path

    real = Path(__file__).parent / "data" / "real" / "openai-clients-tokentrace"
    db = tmp_path / "t.duckdb"
    loaded = CliRunner().invoke(cli, ["load", str(real / "openai-v2-stock.jsonl"), str(real / "server.jsonl"),
                                      "--db", str(db), "-q"], catch_exceptions=False)
    assert loaded.exit_code == 0, loaded.output
    out = CliRunner().invoke(cli, ["skew", "--db", str(db)], catch_exceptions=False, env={"COLUMNS": "80"}).stdout
    lines = out.splitlines()
    assert lines[:2] == ["skew_rules: 0 row(s)",
                         "no span breaks a rule (child_starts_before_parent, child_ends_after_parent,"], out
    row = next(line for line in lines if line.startswith("openai-v2-stock "))
    assert row.split()[:2] == ["openai-v2-stock", "tokentrace-gateway"] and row.split()[-1] == "consistent", out
    assert "note: clock openai-v2-stock:" in out and max(len(line) for line in lines) <= 80
