"""guidellm >= 0.8 reports (``benchmarks.json`` / ``.yaml``): every summary figure recomputed
from the report's own per-request records with guidellm's own methods.

guidellm's methods (guidellm 0.8.1 ``GenerativeMetrics.compile``, ``DistributionSummary``):
percentiles are **weighted nearest-rank** (the first value whose cumulative weight reaches q;
never interpolated: at 24 requests p99 is the maximum); variance is the weighted population
variance; ``time_per_output_token_ms`` is (last token - request start) / O, **TTFT included**,
weighted by O tokens; ``inter_token_latency_ms`` is (last - first token) / (O - 1), weighted by
O - 1; the rate distributions (``requests_per_second``, ``*_tokens_per_second``) weight local
rates by their intervals, so their mean is a throughput and their median and percentiles are
not; output token times are spaced evenly between each request's first and last token. The
SQL: ``queries/audit/guidellm_*.sql``; the checks and the real failures they catch:
docs/audit.md.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import duckdb

from analyzer.audit.compare import (
    CANNOT,
    FAIL,
    PASS,
    Finding,
    agree,
    audit_query,
    tolerance,
)
from analyzer.audit.guidellm_definitions import definition_findings
from analyzer.audit.guidellm_report import STATUSES, GuidellmReport, load_guidellm
from analyzer.audit.readable import successful_requests
from analyzer.query.runner import load_query

__all__ = ["GUIDELLM_METRICS", "audit_guidellm"]

#: Summary metrics recomputed (metrics.<name>.<status>), in report order; the unit of each.
GUIDELLM_METRICS = {
    "requests_per_second": "requests/s", "request_concurrency": "requests", "request_latency": "s", "request_streaming_iterations_count": "iterations",
    "prompt_token_count": "tokens", "output_token_count": "tokens", "total_token_count": "tokens",
    "time_to_first_token_ms": "ms", "time_to_first_output_token_ms": "ms", "time_per_output_token_ms": "ms",
    "inter_token_latency_ms": "ms", "time_to_last_round_trip_ms": "ms", "avg_round_trip_time_ms": "ms",
    "prompt_tokens_per_second": "tokens/s", "output_tokens_per_second": "tokens/s", "tokens_per_second": "tokens/s",
    "output_tokens_per_iteration": "tokens", "iter_tokens_per_iteration": "tokens",
    "request_dispatch_delay": "s", "request_scheduled_latency": "s", "turn_predecessor_delay": "s",
    "turn_scheduling_delay": "s", "root_dispatch_delay": "s",
}
#: guidellm writes these only for strategies with an arrival schedule (constant, poisson, trace)
_SCHEDULE_RELATIVE = ("request_dispatch_delay", "request_scheduled_latency", "turn_predecessor_delay",
                      "turn_scheduling_delay", "root_dispatch_delay")
_RATES = ("requests_per_second", "prompt_tokens_per_second", "output_tokens_per_second", "tokens_per_second")
_SCALARS = ("mean", "mode", "variance", "std_dev", "min", "max", "count", "total_sum")
_PERCENTILES = ("p001", "p01", "p05", "p10", "p25", "p50", "p75", "p90", "p95", "p99", "p999")
#: per-request figures guidellm stores in each record: (stored column, recomputed column, unit)
_RECORD_FIGURES = (("stored_request_latency_s", "request_latency_s", "s"), ("stored_ttft_ms", "ttft_ms", "ms"),
                   ("stored_ttfot_ms", "ttfot_ms", "ms"), ("stored_tpot_ms", "tpot_ms", "ms"),
                   ("stored_itl_ms", "itl_ms", "ms"), ("stored_tokens_per_second", "tokens_per_second", "tokens/s"),
                   ("stored_output_tokens_per_second", "output_tokens_per_second", "tokens/s"),
                   ("stored_prompt_tokens", "prompt_tokens", "tokens"),
                   ("stored_output_tokens", "output_tokens", "tokens"),
                   ("stored_total_tokens", "total_tokens", "tokens"))


def _materialize(con: duckdb.DuckDBPyConnection, table: str, query: str) -> None:
    """``table`` := the rows of ``queries/audit/<query>.sql`` (its defaults bound)."""
    q = load_query(f"audit/{query}")
    con.execute(f"CREATE OR REPLACE TEMP TABLE {table} AS {q.sql.strip().rstrip(';')}", q.bind(None))


def _recompute(con: duckdb.DuckDBPyConnection) -> dict[tuple[int, str, str], dict[str, Any]]:
    """(benchmark, metric, status) -> guidellm's summary recomputed (audit/guidellm_stats.sql)."""
    _materialize(con, "guidellm_request_rows", "guidellm_requests")
    _materialize(con, "guidellm_values_loaded", "guidellm_values")
    _materialize(con, "guidellm_rate_events", "guidellm_rate_events")
    _materialize(con, "guidellm_rate_rows", "guidellm_rates")
    _materialize(con, "guidellm_value_count_rows", "guidellm_value_counts")
    _materialize(con, "guidellm_concurrency_rows", "guidellm_concurrency")
    con.execute("CREATE OR REPLACE TEMP TABLE guidellm_weighted AS "
                "SELECT benchmark, metric, status, value, weight FROM guidellm_values_loaded "
                "UNION ALL SELECT benchmark, metric, status, value, weight FROM guidellm_rate_rows "
                "UNION ALL SELECT benchmark, 'request_concurrency', status, value, weight "
                "FROM guidellm_concurrency_rows")
    con.execute("CREATE OR REPLACE TEMP TABLE guidellm_counts AS "
                "SELECT benchmark, metric, status, count FROM guidellm_value_count_rows "
                "UNION ALL SELECT DISTINCT benchmark, metric, status, event_count FROM guidellm_rate_rows "
                "UNION ALL SELECT DISTINCT benchmark, 'request_concurrency', status, n_intervals "
                "FROM guidellm_concurrency_rows")
    return {(r["benchmark"], r["metric"], r["status"]): r for r in audit_query(con, "guidellm_stats")}


def audit_guidellm(path: Path, data: Any, con: duckdb.DuckDBPyConnection, rel_tol: float,
                   db: str | Path | None = None) -> list[Finding]:
    """All checks of one guidellm report, per benchmark (check names prefixed ``benchmark[i]:``
    when the report holds several); with ``db``, each record against its traced request,
    joined by ``response_id``."""
    report = load_guidellm(path, data, con)
    stats = _recompute(con)
    cur = con.execute("SELECT * FROM guidellm_request_rows ORDER BY benchmark, status, record_index")
    columns = [d[0] for d in cur.description]
    rows = [dict(zip(columns, r)) for r in cur.fetchall()]
    several = len(report.benchmarks) > 1
    findings: list[Finding] = []
    for b, bench in enumerate(report.benchmarks):
        prefix = f"benchmark[{b}]:" if several else ""
        own = [r for r in rows if r["benchmark"] == b]
        found = _benchmark_findings(report, b, bench, own, stats, rel_tol)
        if db is not None:
            from analyzer.audit.guidellm_traces import records_against_traces

            found += records_against_traces(own, con, db, rel_tol)
        for f in found:
            f.check = prefix + f.check
        findings += found
    return findings


def _benchmark_findings(report: GuidellmReport, b: int, bench: dict[str, Any], rows: list[dict[str, Any]],
                        stats: dict[tuple[int, str, str], dict[str, Any]], rel_tol: float) -> list[Finding]:
    metrics = bench["metrics"]
    totals = metrics.get("request_totals") if isinstance(metrics.get("request_totals"), dict) else {}
    windowed = {s: sum(1 for r in rows if r["status"] == s and r["in_by_request"]) for s in STATUSES}
    strategy = (bench.get("config") or {}).get("strategy") or {}
    out = [Finding("report_layout", PASS,
                   f"guidellm {report.guidellm_version} report (schema 2), benchmark {b + 1} of "
                   f"{len(report.benchmarks)}: strategy {strategy.get('type_', '?')}, records "
                   + ", ".join(f"{report.records[b][s]} {s}" for s in STATUSES),
                   {"guidellm_version": report.guidellm_version, "records": report.records[b],
                    "strategy": strategy.get("type_")})]
    out.append(_request_totals(totals, windowed, report.records[b], bench))
    ok = totals.get("successful") if isinstance(totals.get("successful"), (int, float)) else None
    out.append(successful_requests(None if ok is None else float(ok), what="request_totals.successful",
                                   failed=totals.get("errored")))
    sampled = (bench.get("config") or {}).get("sample_size") is not None and any(
        report.records[b][s] < (totals.get(s) or 0) for s in STATUSES)
    out.append(_record_identities(rows, rel_tol))
    no_success = not windowed["successful"]
    for metric, unit in GUIDELLM_METRICS.items():
        out.append(_metric_check(b, metric, unit, metrics.get(metric), stats, rel_tol, sampled, no_success,
                                 windowed))
    out += definition_findings(b, metrics, stats, windowed, bench)
    return out


def _request_totals(totals: dict[str, Any], windowed: dict[str, int], in_file: dict[str, int],
                    bench: dict[str, Any]) -> Finding:
    claimed = {s: totals.get(s) for s in (*STATUSES, "total")}
    recomputed = {**windowed, "total": sum(windowed.values())}
    numbers = {"claimed": claimed, "records_in_window": recomputed, "records_in_file": in_file}
    if not totals:
        return Finding("request_totals", CANNOT, "the report gives no metrics.request_totals", numbers)
    wrong = [f"{s} {claimed[s]} vs {recomputed[s]} records" for s in recomputed if claimed[s] != recomputed[s]]
    if wrong and (bench.get("config") or {}).get("sample_size") is not None:
        return Finding("request_totals", CANNOT, f"the records are a sample (config.sample_size "
                       f"{bench['config']['sample_size']}): {'; '.join(wrong)}", numbers)
    if wrong:
        return Finding("request_totals", FAIL, "request_totals against the records in the measured window: "
                       + "; ".join(wrong), numbers)
    return Finding("request_totals", PASS, "request_totals = the records in the measured window: "
                   + ", ".join(f"{recomputed[s]} {s}" for s in STATUSES), numbers)


def _record_identities(rows: list[dict[str, Any]], rel_tol: float) -> Finding:
    """Each record's stored figures against the same figures recomputed from its timings."""
    checked = 0
    problems: list[str] = []
    for r in rows:
        for stored, column, unit in _RECORD_FIGURES:
            claimed, value = r[stored], r[column]
            if claimed is None and value is None:
                continue
            checked += 1
            if claimed is None or value is None or not agree(claimed, value, rel_tol):
                problems.append(f"{r['status']}[{r['record_index']}].{stored[len('stored_'):]} {claimed!r} vs "
                                f"recomputed {value!r} {unit}")
    numbers = {"records": len(rows), "figures_checked": checked, "problems": problems[:20]}
    if not rows:
        return Finding("record_identities", CANNOT, "the report holds no per-request record", numbers)
    if problems:
        return Finding("record_identities", FAIL, f"{len(problems)} of {checked} per-request figures do not follow "
                       f"from the record's timings: {'; '.join(problems[:3])}", numbers)
    return Finding("record_identities", PASS, f"{checked} per-request figures of {len(rows)} records recomputed from "
                   "their timings match (latency = end - start; TTFT = first token - start; TPOT = (last token - "
                   "start) / O; ITL = (last - first token) / (O - 1); rates over the latency)", numbers)


def _claimed(summary: Any, stat: str) -> float | None:
    if not isinstance(summary, dict):
        return None
    value = summary.get("percentiles", {}).get(stat) if stat in _PERCENTILES else summary.get(
        "median" if stat == "median" else stat)
    return float(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else None


def _metric_check(b: int, metric: str, unit: str, claimed: Any, stats: dict[tuple[int, str, str], dict[str, Any]],
                  rel_tol: float, sampled: bool, no_success: bool, windowed: dict[str, int]) -> Finding:
    check = f"recompute_{metric}"
    if claimed is None and metric in _SCHEDULE_RELATIVE:
        return Finding(check, CANNOT, f"metrics.{metric} is null: guidellm gives schedule-relative delays only for "
                       "strategies with an arrival schedule (constant, poisson, trace) and requests that have one", {})
    if not isinstance(claimed, dict):
        return Finding(check, CANNOT, f"metrics.{metric} is absent from the report", {})
    if metric == "root_dispatch_delay":  # one summary, not per status
        claimed = {"all": claimed}
    if sampled:
        return Finding(check, CANNOT, f"metrics.{metric}: the records are a sample (config.sample_size), "
                       "the summary was computed over every request", {})
    figures: dict[str, Any] = {}
    failures: list[str] = []
    boundary: list[str] = []
    for status in (*STATUSES, "total", "all"):
        row = stats.get((b, metric, status))
        summary = claimed.get(status)
        if row is None or not isinstance(summary, dict):
            continue
        for stat in ("mean", "median", *_SCALARS[1:], *_PERCENTILES):
            value = _claimed(summary, stat)
            if value is None:
                continue
            if stat in ("median", *_PERCENTILES):
                key = "p50" if stat == "median" else stat
                low, high = (row.get(f"{key}_low"), row.get(f"{key}_high"))
                low = 0.0 if low is None else low
                high = 0.0 if high is None else high
                candidates = [low] if low == high else [low, high]
            else:
                candidates = [row[stat]]
            good = next((c for c in candidates if agree(value, c, rel_tol)), None)
            name = f"{status}.{stat}"
            figures[name] = {"claimed": value, "recomputed": candidates[0] if good is None else good}
            if len(candidates) > 1:
                figures[name]["rank_boundary"] = candidates
                boundary.append(name)
            if good is None:
                tol = tolerance(value, candidates[0], rel_tol)
                failures.append(f"{name} {value:.6g} vs recomputed {candidates[0]:.6g} {unit} (tolerance {tol:.3g})")
    numbers: dict[str, Any] = {"unit": unit, "rel_tol": rel_tol, "figures": figures,
                               "method": "guidellm 0.8: weighted nearest-rank percentiles, weighted population "
                                         "variance" + (", rates weighted by local interval" if metric in _RATES
                                                       else "")}
    if boundary:
        numbers["rank_boundaries"] = boundary
    if failures:
        numbers["failed"] = failures
        return Finding(check, FAIL, f"{metric}: {len(failures)} of {len(figures)} figures differ: "
                       + "; ".join(failures[:3]), numbers)
    if not figures:
        return Finding(check, CANNOT, f"metrics.{metric} gives no statistics", numbers)
    if no_success:
        return Finding(check, FAIL, f"{metric}: the {len(figures)} figures recompute, but no request succeeded: the "
                       "successful figures are guidellm's zeros for an empty distribution and the total ones describe "
                       f"{windowed['errored']} errored and {windowed['incomplete']} incomplete requests, not a served "
                       "request", numbers)
    n = (stats.get((b, metric, "successful")) or stats[(b, metric, "all")])["count"]
    where = (f" ({len(boundary)} at a rank boundary, where guidellm's float cumulative sum picks one of two "
             "neighbours: both accepted)" if boundary else "")
    statuses = len({name.split(".")[0] for name in figures})
    return Finding(check, PASS, f"{metric}: {len(figures)} figures ({statuses} status{'es' if statuses > 1 else ''}) "
                   f"recomputed with guidellm's method match; {'successful ' if statuses > 1 else ''}count {n:g}"
                   f"{where}", numbers)
