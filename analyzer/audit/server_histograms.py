"""The percentiles a dashboard draws from a server's ``/metrics`` histograms, audited:
``tokentrace audit AFTER.prom --baseline BEFORE.prom [--db traces.duckdb]``.

The window is AFTER - BEFORE (two Prometheus text scrapes: lifetime counts and warm-up drop
out), summed over each family's series (``sum by (le)``); each quantile is estimated as
Prometheus' ``histogram_quantile`` does (queries/audit/histogram_quantile.sql), with the
bucket it was interpolated in and the error that bucket allows. With ``--db``, the exact
figures of the same window come from the traces (queries/audit/histogram_exact.sql): the
server-perspective requests that have the figure, in the order they ended, the first
``baseline count`` of them left out (the requests the baseline scrape had already counted),
then as many as the window counts. Judged per quantile: an estimate above the slowest request
or below the fastest fails; an exact nearest-rank quantile outside the bucket the estimate was
interpolated in fails (histogram and traces disagree); else pass, with estimate, exact figure
and error. Without exact figures: ``cannot_check`` with the interval the bucket allows.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import duckdb

from analyzer.audit.compare import (
    CANNOT,
    FAIL,
    PASS,
    Finding,
    audit_query,
    create_table,
)
from analyzer.audit.prom_text import Histogram, read_histograms, window
from analyzer.errors import AuditInputError

__all__ = ["FAMILY_FIGURES", "audit_server_histograms"]

#: histogram family -> (requests.sql column, what it is); vLLM's names and tokentrace's own
FAMILY_FIGURES = {
    "gen_ai_server_time_to_first_token_seconds": ("ttft_ms", "TTFT"),
    "gen_ai_server_request_duration_seconds": ("e2e_ms", "E2E"),
    "gen_ai_server_time_per_output_token_seconds": ("tpot_ms", "TPOT"),
    "vllm:time_to_first_token_seconds": ("ttft_ms", "TTFT"),
    "vllm:e2e_request_latency_seconds": ("e2e_ms", "E2E"),
    "vllm:request_time_per_output_token_seconds": ("tpot_ms", "TPOT"),
}
#: the quantiles a dashboard draws (histogram_quantile.sql estimates more)
DASHBOARD_QUANTILES = (0.5, 0.9, 0.95, 0.99)
#: a histogram whose count differs from the traced requests' by more than this share is not judged
COUNT_SLACK = 0.05


def _summed(hist: Histogram) -> list[tuple[str, float, float]]:
    """(family, le, cumulative) rows, summed over the family's series."""
    total: dict[float, float] = {}
    for buckets in hist.buckets.values():
        for le, count in buckets.items():
            total[le] = total.get(le, 0.0) + count
    return [(hist.name, le, count) for le, count in sorted(total.items())]


def audit_server_histograms(path: Path, baseline: Path | None, con: duckdb.DuckDBPyConnection,
                            db: str | Path | None = None) -> list[Finding]:
    """All checks of one scrape (less its baseline)."""
    after = read_histograms(path)
    if not after:
        raise AuditInputError(f"{path}: no histogram in this scrape (no '# TYPE <name> histogram' family)")
    before = read_histograms(baseline) if baseline is not None else {}
    hists = window(after, before, path, baseline) if baseline is not None else after
    findings = [_window_finding(hists, before, baseline)]
    rows = [row for h in hists.values() for row in _summed(h)]
    create_table(con, "prom_buckets", {"family": "VARCHAR", "le": "DOUBLE", "cumulative": "DOUBLE"}, rows)
    estimates: dict[str, list[dict[str, Any]]] = {}
    for r in audit_query(con, "histogram_quantile"):
        if r["q"] in DASHBOARD_QUANTILES:
            estimates.setdefault(r["family"], []).append(r)
    exact = _exact(con, hists, before, db) if db is not None else {}
    for family in sorted(hists):
        findings.append(_family_finding(family, estimates.get(family, []), exact.get(family), db is not None))
    return findings


def _count(hist: Histogram | None) -> float:
    if hist is None:
        return 0.0
    return sum(b.get(math.inf, 0.0) for b in hist.buckets.values())


def _window_finding(hists: dict[str, Histogram], before: dict[str, Histogram], baseline: Path | None) -> Finding:
    counts = {name: _count(h) for name, h in hists.items()}
    numbers: dict[str, Any] = {"families": len(hists), "window_counts": counts,
               "baseline_counts": {name: _count(h) for name, h in before.items()}}
    if baseline is None:
        return Finding("scrape_window", CANNOT, f"{len(hists)} histogram families, lifetime counts since the server "
                       "started (warm-up included): pass --baseline BEFORE.prom, a scrape from before the run, to audit "
                       "the run's window", numbers)
    left = sum(numbers["baseline_counts"].values())
    return Finding("scrape_window", PASS, f"{len(hists)} histogram families, the window = this scrape - "
                   f"{baseline.name} ({left:g} observations of the baseline left out)", numbers)


def _exact(con: duckdb.DuckDBPyConnection, hists: dict[str, Histogram], before: dict[str, Histogram],
           db: str | Path) -> dict[str, dict[str, Any]]:
    """family -> {'rows': exact figures per q, 'traced': requests in the window, 'counted': the
    histogram's count, 'skipped': the baseline's} for the families FAMILY_FIGURES maps."""
    from analyzer.audit.records_traces import load_traced_requests

    traced = [r for r in load_traced_requests(db) if r["perspective"] == "server"]
    traced.sort(key=lambda r: (r.get("e_ns") or 0, r.get("s_ns") or 0))
    values: list[tuple[str, float]] = []
    out: dict[str, dict[str, Any]] = {}
    for family, hist in hists.items():
        if family not in FAMILY_FIGURES:
            continue
        column = FAMILY_FIGURES[family][0]
        having = [r for r in traced if r.get(column) is not None]
        skip, counted = int(_count(before.get(family))), int(_count(hist))
        chosen = having[skip: skip + counted]
        values += [(family, r[column]) for r in chosen]
        out[family] = {"traced": len(chosen), "counted": counted, "skipped": skip, "available": len(having)}
    create_table(con, "histogram_exact_values", {"family": "VARCHAR", "value_ms": "DOUBLE"}, values)
    for r in audit_query(con, "histogram_exact"):
        out[r["family"]].setdefault("rows", {})[r["q"]] = r
    return out


def _bucket(e: dict[str, Any]) -> str:
    upper = "+Inf" if e["bucket_upper"] is None else f"{e['bucket_upper']:g}"
    return f"({e['bucket_lower']:g}, {upper}]"


def _family_finding(family: str, estimates: list[dict[str, Any]], exact: dict[str, Any] | None,
                    with_db: bool) -> Finding:
    check = f"histogram:{family}"
    what = FAMILY_FIGURES.get(family, (None, family))[1]
    unit = " s" if family.endswith("_seconds") else ""  # else the family's own unit
    numbers: dict[str, Any] = {"estimates": estimates}
    live = [e for e in estimates if e["estimate"] is not None]
    if not live:
        return Finding(check, CANNOT, f"{family}: no observation in the window", numbers)
    n = live[0]["observations"]
    for e in live:
        e["allowed_error"] = (None if e["bucket_upper"] is None else
                              max(e["estimate"] - e["bucket_lower"], e["bucket_upper"] - e["estimate"]))
    intervals = "; ".join(f"p{e['q'] * 100:g} {e['estimate']:.4g}{unit} in bucket {_bucket(e)}"
                          + ("" if e["allowed_error"] is None else f" (+/- {e['allowed_error']:.3g}{unit})")
                          for e in live)
    if exact is None:
        why = ("no traced figure is mapped to this family" if with_db else
               "pass --db with the traces of the same window to compare with the exact figures")
        return Finding(check, CANNOT, f"{family} ({n:g} observations, histogram_quantile): {intervals}; {why}",
                       numbers)
    numbers.update({k: exact[k] for k in ("traced", "counted", "skipped", "available")})
    if exact["counted"] and abs(exact["traced"] - exact["counted"]) > COUNT_SLACK * exact["counted"]:
        return Finding(check, CANNOT, f"{family}: the window counts {exact['counted']} observations, the traces have "
                       f"{exact['traced']} requests with a server {what} after the baseline's {exact['skipped']} "
                       f"({exact['available']} in all): not the same requests; {intervals}", numbers)
    problems, said = [], []
    for e in live:
        x = exact["rows"][e["q"]]
        e.update({"exact_nearest_rank": x["exact_nearest_rank"], "exact_linear": x["exact_linear"],
                  "fastest": x["min_value"], "slowest": x["max_value"]})
        name = f"p{e['q'] * 100:g}"
        est, lo, hi = e["estimate"], e["bucket_lower"], e["bucket_upper"]
        if est > x["max_value"] + 1e-12:
            problems.append(f"{name} {est:.4g} s is above the slowest request ({x['max_value']:.4g} s)")
        elif est < x["min_value"] - 1e-12:
            problems.append(f"{name} {est:.4g} s is below the fastest request ({x['min_value']:.4g} s)")
        if not (lo - 1e-12 <= x["exact_nearest_rank"] <= (math.inf if hi is None else hi) + 1e-12):
            problems.append(f"{name}: the exact {x['exact_nearest_rank']:.4g} s lies outside the bucket {_bucket(e)} "
                            "the estimate was interpolated in: histogram and traces disagree")
        said.append(f"{name} {est:.4g} s vs exact {x['exact_nearest_rank']:.4g} s (error "
                    f"{est - x['exact_nearest_rank']:+.3g} s, bucket {_bucket(e)})")
    head = (f"{family} vs the traced server {what} of the same {exact['traced']} requests "
            f"(histogram count {exact['counted']})")
    if problems:
        return Finding(check, FAIL, f"{head}: " + "; ".join(problems), numbers)
    return Finding(check, PASS, f"{head}: " + "; ".join(said), numbers)
