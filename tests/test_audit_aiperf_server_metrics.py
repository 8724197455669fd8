"""AIPerf 0.13's server_metrics_export.json (a real run against tokentrace serve, with the
server's traces): each histogram's estimates judged against the buckets that hold their
observations and, where the counts agree, against the traced requests; bad exports are one
line."""

from __future__ import annotations

import copy
import json
from pathlib import Path

import pytest
from click.testing import CliRunner

from analyzer.audit import audit_report, detect_kind
from analyzer.cli import cli
from analyzer.errors import AuditInputError
from data_paths import CAPTURES

RUN = CAPTURES / "aiperf-0.13.0-tokentrace-server-metrics"
EXPORT, SPANS = RUN / "server_metrics_export.json", RUN / "server-spans.jsonl.gz"
TTFT = "gen_ai_server_time_to_first_token_seconds"


def by_check(findings):
    return {f.check: f for f in findings}


@pytest.fixture(scope="module")
def db(tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("traces") / "traces.duckdb"
    assert CliRunner().invoke(cli, ["load", str(SPANS), "--db", str(path)]).exit_code == 0
    return path


def test_real_export_estimates_lie_in_their_buckets(db) -> None:
    assert detect_kind(EXPORT) == "aiperf-server-metrics"
    f = by_check(audit_report(EXPORT, db=db))
    assert f["report_layout"].verdict == "pass" and len(f["report_layout"].numbers["histograms"]) == 5
    ttft = f[f"histogram:{TTFT}"]
    # AIPerf's scrapes do not fall on the phase's edges: 20 observations, 24 traced requests
    assert ttft.verdict == "cannot_check" and ttft.numbers["count"] == 20 and ttft.numbers["exact"]["traced"] == 24
    p99 = ttft.numbers["figures"]["p99"]
    assert p99["rank_bucket"] == [0.04, 0.06] and 0.04 <= p99["aiperf_estimate"] <= 0.06
    # Prometheus' estimate beside it: rank 0.99 x 20 = 19.8 in (0.04, 0.06], 17 below, 3 inside
    assert p99["prometheus_estimate"] == pytest.approx(0.04 + 0.02 * (19.8 - 17) / 3)
    assert not [c for c, x in f.items() if x.verdict == "fail"]


def test_planted_estimate_outside_its_buckets(tmp_path) -> None:
    data = json.loads(EXPORT.read_text())
    data["metrics"][TTFT]["series"][0]["stats"]["p99_estimate"] = 0.5
    path = tmp_path / "server_metrics_export.json"
    path.write_text(json.dumps(data))
    ttft = by_check(audit_report(path))[f"histogram:{TTFT}"]
    assert ttft.verdict == "fail" and "p99 0.5 outside (0.04, 0.06]" in ttft.detail


@pytest.mark.parametrize(("edit", "says"), [
    (lambda d: d["metrics"][TTFT]["series"][0]["buckets"].pop("+Inf"), "buckets has no '+Inf' bucket"),
    (lambda d: d["metrics"][TTFT]["series"][0].pop("buckets"), "buckets is missing (a truncated export?)"),
    (lambda d: d["metrics"][TTFT]["series"][0]["buckets"].update({"0.02": "seven"}), "is not a count"),
])
def test_bad_exports_are_one_line(tmp_path, edit, says) -> None:
    data = copy.deepcopy(json.loads(EXPORT.read_text()))
    edit(data)
    path = tmp_path / "server_metrics_export.json"
    path.write_text(json.dumps(data))
    with pytest.raises(AuditInputError, match=r"server_metrics_export.json: metrics\." + TTFT):
        audit_report(path)
    result = CliRunner().invoke(cli, ["audit", str(path)], catch_exceptions=False)
    assert result.exit_code == 1 and says in result.output and len(result.output.strip().splitlines()) == 1
