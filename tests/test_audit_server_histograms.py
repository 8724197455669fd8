"""Server /metrics histograms (real scrapes of tokentrace serve around a guidellm 0.8.1 run, with
the server's traces): the window between two scrapes, quantiles estimated as Prometheus'
histogram_quantile does (checked here against an independent implementation of its
algorithm), judged against the traced figures of the same requests; bad scrapes are one line."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from click.testing import CliRunner

from analyzer.audit import audit_report, detect_kind
from analyzer.cli import cli
from analyzer.errors import AuditInputError
from data_paths import CAPTURES

RUN = CAPTURES / "tokentrace-metrics-guidellm-0.8.1"
BEFORE, AFTER, SPANS = RUN / "before.prom", RUN / "after.prom", RUN / "server-spans.jsonl.gz"
TTFT = "gen_ai_server_time_to_first_token_seconds"


def by_check(findings):
    return {f.check: f for f in findings}


def buckets(path: Path, family: str) -> dict[float, float]:
    """le -> cumulative count summed over the family's series, read with a regex of its own."""
    out: dict[float, float] = {}
    for m in re.finditer(rf'^{family}_bucket{{[^}}]*le="([^"]+)"[^}}]*}} (\S+)$', path.read_text(), re.MULTILINE):
        out[float(m[1])] = out.get(float(m[1]), 0.0) + float(m[2])
    return out


def prometheus_quantile(q: float, cumulative: dict[float, float]) -> float:
    """promql bucketQuantile, transcribed: rank = q x count; interpolate in the first bucket whose
    cumulative count reaches it (lower bound 0 for the first); +Inf: the largest finite bound."""
    bounds = sorted(cumulative)
    counts = [cumulative[b] for b in bounds]
    rank = q * counts[-1]
    b = next((i for i in range(len(bounds) - 1) if counts[i] >= rank), len(bounds) - 1)
    if b == len(bounds) - 1:
        return bounds[-2]
    start, count = (0.0, counts[0]) if b == 0 else (bounds[b - 1], counts[b] - counts[b - 1])
    below = 0.0 if b == 0 else counts[b - 1]
    return start + (bounds[b] - start) * (rank - below) / count


@pytest.fixture(scope="module")
def db(tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("traces") / "traces.duckdb"
    assert CliRunner().invoke(cli, ["load", str(SPANS), "--db", str(path)]).exit_code == 0
    return path


@pytest.fixture(scope="module")
def findings(db):
    return audit_report(AFTER, baseline=BEFORE, db=db)


def test_detected_and_the_window_is_the_difference(findings) -> None:
    assert detect_kind(AFTER) == "prometheus"
    f = by_check(findings)
    window = f["scrape_window"]
    assert window.verdict == "pass" and window.numbers["window_counts"][TTFT] == 24  # guidellm's 24 requests
    assert window.numbers["baseline_counts"][TTFT] == 3  # the warm-up, left out


def test_estimates_are_prometheus_histogram_quantile(findings) -> None:
    window = {le: a - buckets(BEFORE, TTFT).get(le, 0.0) for le, a in buckets(AFTER, TTFT).items()}
    estimates = by_check(findings)[f"histogram:{TTFT}"].numbers["estimates"]
    for e in estimates:
        assert e["estimate"] == pytest.approx(prometheus_quantile(e["q"], window), rel=1e-12)
        assert e["bucket_lower"] <= e["estimate"] <= e["bucket_upper"]


def test_judged_against_the_traced_figures(findings) -> None:
    f = by_check(findings)
    ttft = f[f"histogram:{TTFT}"]
    assert ttft.numbers["traced"] == ttft.numbers["counted"] == 24 and ttft.numbers["skipped"] == 3
    by_q = {e["q"]: e for e in ttft.numbers["estimates"]}
    # every exact quantile lies in the bucket its estimate was interpolated in ...
    assert all(e["bucket_lower"] <= e["exact_nearest_rank"] <= e["bucket_upper"] for e in by_q.values())
    # ... but the tail estimates lie above the slowest request: coarse buckets, linear interpolation
    assert by_q[0.99]["estimate"] > by_q[0.99]["slowest"] and ttft.verdict == "fail"
    assert "above the slowest request" in ttft.detail
    tpot = f["histogram:gen_ai_server_time_per_output_token_seconds"]
    assert tpot.verdict == "fail" and tpot.numbers["estimates"][0]["bucket_upper"] == 0.01
    assert f["histogram:tokentrace_engine_batch_size"].verdict == "cannot_check"


def test_without_baseline_or_traces_says_what_the_buckets_allow() -> None:
    f = by_check(audit_report(AFTER))
    assert f["scrape_window"].verdict == "cannot_check" and "warm-up included" in f["scrape_window"].detail
    ttft = f[f"histogram:{TTFT}"]
    assert ttft.verdict == "cannot_check" and "27 observations" in ttft.detail and "in bucket (" in ttft.detail


def test_planted_histogram_that_contradicts_the_traces(tmp_path, db) -> None:
    # move every TTFT observation of the window into the (0.1, 0.25] bucket
    text = AFTER.read_text()
    model = 'gen_ai_request_model="tokentrace/tiny-llama-gqa-v1"'

    def moved(m: re.Match) -> str:
        le = float(m[2])
        return f"{m[1]}{0.0 if le <= 0.1 else 24.0}"

    text = re.sub(rf'^({TTFT}_bucket{{[^}}]*{re.escape(model)}[^}}]*le="([^"]+)"[^}}]*}} )\S+$', moved, text,
                  flags=re.MULTILINE)
    path = tmp_path / "after.prom"
    path.write_text(text)
    ttft = by_check(audit_report(path, baseline=BEFORE, db=db))[f"histogram:{TTFT}"]
    assert ttft.verdict == "fail" and "histogram and traces disagree" in ttft.detail


def _edited(tmp_path: Path, name: str, source: Path, old: str, new: str, count: int = 0) -> Path:
    path = tmp_path / name
    path.write_text(re.sub(old, new, source.read_text(), count=count, flags=re.MULTILINE))
    return path


def test_bad_scrapes_are_one_line(tmp_path) -> None:
    no_inf = _edited(tmp_path, "a.prom", AFTER, rf'^{TTFT}_bucket{{[^}}]*le="\+Inf".*\n', "", count=1)
    with pytest.raises(AuditInputError, match=r"a.prom: histogram gen_ai_server_time_to_first_token_seconds\{.*\} "
                                              "has no \\+Inf bucket"):
        audit_report(no_inf)
    other = _edited(tmp_path, "b.prom", BEFORE, 'gen_ai_system="tokentrace"', 'gen_ai_system="elsewhere"')
    with pytest.raises(AuditInputError, match="of the baseline .*b.prom is missing: scrapes of different servers"):
        audit_report(AFTER, baseline=other)
    reset = _edited(tmp_path, "c.prom", BEFORE, rf'^({TTFT}_bucket{{[^}}]*le="\+Inf"[^}}]*}}) \S+$', r"\1 99.0")
    with pytest.raises(AuditInputError, match=r"le=inf: 3 < 99 in .*c.prom: a counter reset"):
        audit_report(AFTER, baseline=reset)
    engine = _edited(tmp_path, "d.prom", AFTER, r'otel_scope_name="tokentrace"', 'engine="1",otel_scope_name="tokentrace"')
    engine0 = _edited(tmp_path, "e.prom", BEFORE, r'otel_scope_name="tokentrace"', 'engine="0",otel_scope_name="tokentrace"')
    with pytest.raises(AuditInputError, match="label engine=.* is in one scrape only"):
        audit_report(engine, baseline=engine0)
    result = CliRunner().invoke(cli, ["audit", str(no_inf)], catch_exceptions=False)
    assert result.exit_code == 1 and len(result.output.strip().splitlines()) == 1
    result = CliRunner().invoke(cli, ["audit", str(RUN.parent / "guidellm-0.8.1-tokentrace" / "benchmarks.json"),
                                      "--baseline", str(BEFORE)], catch_exceptions=False)
    assert result.exit_code == 1 and "--baseline" in result.output and "only for a Prometheus scrape" in result.output

