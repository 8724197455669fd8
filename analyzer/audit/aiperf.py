"""AIPerf / GenAI-Perf exports: the flat layout (``schema_version``, metrics at top level) and
the older ``records{}`` layout (tags ``ttft``/``ttst``), and ``profile_export.jsonl`` records.

AIPerf's method: numpy linear percentiles and population std over per-request values;
ITL per request = (latency - TTFT) / (OSL - 1) over all output tokens (reasoning tokens
included); per-user rate = 1000 / that ITL; throughputs = totals / benchmark duration
(first request send to last response).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import duckdb

from analyzer.audit.aiperf_records import (
    check_aiperf_records,
    osl_against_server,
    read_aiperf_records,
    records_against_traces,
)
from analyzer.audit.compare import CANNOT, DEFINITION_REL_TOL, FAIL, PASS, Finding, agree, audit_query, compare_figure
from analyzer.audit.readable import successful_requests
from analyzer.errors import AuditInputError

__all__ = ["audit_aiperf", "normalize_aiperf"]

# Older tag -> flat-layout name.
_RENAMES = {"ttft": "time_to_first_token", "ttst": "time_to_second_token"}
_ORDER = ("min", "p1", "p5", "p10", "p25", "p50", "p75", "p90", "p95", "p99", "max")
# a metric with any of these has statistics (one with only avg and unit is a single value)
_STAT_KEYS = (*_ORDER, "std", "count", "sum")


def normalize_aiperf(path: Path, data: Any) -> dict[str, dict[str, Any]]:
    """Metric name -> its statistics dict (avg, min, max, pN, std, count, sum, unit), either layout."""
    if not isinstance(data, dict):
        raise AuditInputError(f"{path}: an AIPerf export is a JSON object")
    source = data["records"] if isinstance(data.get("records"), dict) else data
    out: dict[str, dict[str, Any]] = {}
    for key, value in source.items():
        if isinstance(value, dict) and ("avg" in value or "unit" in value):
            out[_RENAMES.get(str(value.get("tag", key)), str(value.get("tag", key)))] = value
    if not {"request_count", "time_to_first_token", "error_request_count"} & set(out):
        raise AuditInputError(f"{path}: not an aiperf report: no AIPerf metrics found (expected 'records' or "
                              "top-level metric objects such as 'request_count', 'time_to_first_token', "
                              "'error_request_count')")
    return out


def _avg(m: dict[str, dict[str, Any]], name: str) -> float | None:
    value = m.get(name, {}).get("avg")
    return float(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else None


def audit_aiperf(path: Path, data: Any, con: duckdb.DuckDBPyConnection, rel_tol: float,
                 individual: str | Path | None, db: str | Path | None = None) -> list[Finding]:
    """All checks of one AIPerf export (and its profile_export.jsonl records when given; with
    ``db`` too, each record against its traced request, joined by x_request_id)."""
    m = normalize_aiperf(path, data)
    layout = "records{} (older)" if isinstance(data.get("records"), dict) else f"flat (schema {data.get('schema_version')})"
    findings = [Finding("report_layout", PASS, f"AIPerf export, {layout} layout, {len(m)} metrics", {"layout": layout})]
    findings.append(_statistics_order(m))
    records = read_aiperf_records(Path(individual)) if individual is not None else None
    rates = _report_rates(m, con)
    findings += _rates(m, data, con, rel_tol, records.window_s if records is not None else None)
    findings.append(_errors(data, m, con))
    errors = _avg(m, "error_request_count")
    ok = _avg(m, "request_count")
    # AIPerf writes no request_count when no request succeeded: its error count says how many failed
    findings.append(successful_requests(0.0 if ok is None and errors else ok, what="request_count", failed=errors))
    findings.append(_reasoning(m, rates))
    findings.append(_rate_vs_itl(m, con, rel_tol))
    if records is not None:
        findings += check_aiperf_records(records, m, con, rel_tol)
    else:
        findings.append(Finding("recompute_stats", CANNOT, "summary statistics need every request's values: pass "
                                "--individual profile_export.jsonl", {}))
    joined: list[dict[str, Any]] = []
    if db is not None:
        if records is None:
            findings.append(Finding("traces:records_joined", CANNOT, "joining AIPerf's requests to the traces needs "
                                    "their ids: pass --individual profile_export.jsonl (metadata.x_request_id)", {}))
        else:
            traced, joined = records_against_traces(records, con, db, rel_tol, _avg(m, "total_isl"))
            findings += traced
    findings.append(osl_against_server(records, m, con, joined))
    return findings


def _statistics_order(m: dict[str, dict[str, Any]]) -> Finding:
    """min <= percentiles <= max, min <= avg <= max, sum = avg x count: each over the metrics
    that give the figures it needs; the detail counts them (a metric with a single value, e.g.
    request_throughput's avg, has no statistics and is not counted as checked)."""
    problems: list[str] = []
    ordered = bracketed = summed = 0
    for name, s in m.items():
        chain = [(k, s[k]) for k in _ORDER if isinstance(s.get(k), (int, float))]
        ordered += len(chain) >= 2
        for (ka, a), (kb, b) in zip(chain, chain[1:]):
            # a tolerance of the values' size, the same for negative values (b * (1 + eps) is
            # below b when b < 0: equal values -3.125 and -3.125 failed)
            if a - b > 1e-12 * max(1.0, abs(a), abs(b)):
                problems.append(f"{name}: {ka} {a:g} > {kb} {b:g}")
        avg, lo, hi = s.get("avg"), s.get("min"), s.get("max")
        if isinstance(avg, (int, float)) and isinstance(lo, (int, float)) and isinstance(hi, (int, float)):
            bracketed += 1
            if not (lo <= avg <= hi):
                problems.append(f"{name}: avg {avg:g} outside [{lo:g}, {hi:g}]")
        total, count = s.get("sum"), s.get("count")
        if all(isinstance(v, (int, float)) for v in (avg, total, count)) and count:
            summed += 1
            if not agree(total, avg * count, 1e-6):
                problems.append(f"{name}: sum {total:g} != avg x count {avg * count:g}")
    with_stats = sum(1 for s in m.values() if any(isinstance(s.get(k), (int, float)) for k in _STAT_KEYS))
    numbers: dict[str, Any] = {"metrics": len(m), "with_statistics": with_stats, "single_values": len(m) - with_stats,
               "order_checked": ordered, "avg_in_range_checked": bracketed, "sum_checked": summed}
    if problems:
        numbers["problems"] = problems
        return Finding("summary_statistics_consistent", FAIL, "; ".join(problems), numbers)
    if not (ordered or bracketed or summed):
        return Finding("summary_statistics_consistent", CANNOT, f"none of the {len(m)} metrics gives statistics "
                       "(min, max, percentiles, std, sum, count): nothing to check", numbers)
    return Finding("summary_statistics_consistent", PASS,
                   f"{with_stats} of the {len(m)} metrics have statistics ({len(m) - with_stats} are single "
                   f"values): min <= percentiles <= max on {ordered}, min <= avg <= max on {bracketed}, "
                   f"sum = avg x count on {summed}", numbers)


def _report_rates(m: dict[str, dict[str, Any]], con: duckdb.DuckDBPyConnection,
                  duration_s: float | None = None) -> dict[str, Any]:
    """The row of queries/audit/report_rates.sql for the report's totals over ``duration_s``
    (default: its benchmark_duration)."""
    osl = _avg(m, "total_osl")
    visible = _avg(m, "total_output_tokens")
    return audit_query(con, "report_rates", {
        "duration_s": _avg(m, "benchmark_duration") if duration_s is None else duration_s,
        "requests": _avg(m, "request_count"),
        "output_tokens": osl if osl is not None else visible, "visible_output_tokens": visible,
        "input_tokens": _avg(m, "total_isl"), "reasoning_tokens": _avg(m, "total_reasoning_tokens"),
        "first_request_ns": _avg(m, "min_request_timestamp"),
        "last_response_ns": _avg(m, "max_response_timestamp"),
    })[0]


def profiling_window_s(data: dict[str, Any]) -> float | None:
    """end_time - start_time of the report (ISO timestamps, microseconds), in seconds: the
    window AIPerf 0.13 divides its throughputs by; None when the report does not give both."""
    import datetime as dt

    start, end = data.get("start_time"), data.get("end_time")
    if not isinstance(start, str) or not isinstance(end, str):
        return None
    try:
        seconds = (dt.datetime.fromisoformat(end) - dt.datetime.fromisoformat(start)).total_seconds()
    except ValueError:
        return None
    return seconds if seconds > 0 else None


# (check, figure, recomputed column of report_rates.sql, formula); the numerator of each
_RATES = (("request_throughput", "request_throughput", "request_throughput", "request_count"),
          ("output_token_throughput", "output_token_throughput", "output_token_throughput", "total_osl"),
          ("total_token_throughput", "total_token_throughput", "total_token_throughput", "(total_isl + total_osl)"))


def _rates(m: dict[str, dict[str, Any]], data: dict[str, Any], con: duckdb.DuckDBPyConnection, rel_tol: float,
           records_window_s: float | None) -> list[Finding]:
    """Each throughput against AIPerf's own definitions: totals / benchmark_duration (AIPerf <=
    0.10), totals / (end_time - start_time) (0.13: its profiling window, slightly longer than
    the exported benchmark_duration); pass when one reproduces the figure (named in the detail);
    without the window in the report, the records' first request start -> last request end;
    cannot_check when the figure is off by less than 1 % and the window to recompute it is
    missing; fail otherwise."""
    window = profiling_window_s(data)
    duration = _avg(m, "benchmark_duration")
    definitions: list[tuple[str, float]] = []
    if duration is not None:
        definitions.append(("benchmark_duration", duration))
    if window is not None:
        definitions.append(("end_time - start_time: AIPerf 0.13's profiling window", window))
    elif records_window_s is not None:
        definitions.append(("first request start -> last request end of the records", records_window_s))
    # a report whose start/end are given but whose figures follow neither definition fails;
    # one without them (and off by < 1 %) cannot be judged without the records
    by_window = {name: _report_rates(m, con, seconds) for name, seconds in definitions}
    base = by_window.get("benchmark_duration") or _report_rates(m, con)
    osl, visible = _avg(m, "total_osl"), _avg(m, "total_output_tokens")
    out: list[Finding] = []
    for check, figure, column, numerator in _RATES:
        claimed = _avg(m, figure)
        if check == "total_token_throughput" and claimed is None:
            continue
        what = f"{figure} = {numerator} / window"
        if claimed is None or not definitions:
            out.append(compare_figure(check, claimed, base[column], rel_tol, what=what, unit=_UNITS[check],
                                      missing=f"needs {figure}, {numerator} and benchmark_duration"))
            continue
        tried = [(name, seconds, by_window[name][column]) for name, seconds in definitions]
        agreeing = [(abs(claimed - v), k) for k, (n, s, v) in enumerate(tried) if v is not None and agree(claimed, v, rel_tol)]
        match = tried[min(agreeing)[1]] if agreeing else None  # the closest definition that reproduces it
        numbers: dict[str, Any] = {"claimed": claimed, "unit": _UNITS[check], "rel_tol": rel_tol,
                                   "definitions": {n: {"window_s": s, "recomputed": v} for n, s, v in tried}}
        if match is not None:
            name, seconds, value = match
            numbers.update({"recomputed": value, "definition": name, "window_s": seconds})
            note = ""
            if duration is not None and name != "benchmark_duration":
                note = (f"; AIPerf divides by its own window, {seconds - duration:+.6g} s from the exported "
                        f"benchmark_duration {duration:.6g} s (over that: {base[column]:.6g})")
            out.append(Finding(check, PASS, f"{figure}: {claimed:.6g} {_UNITS[check]} = {numerator} / {seconds:.9g} s "
                               f"({name}) = {value:.6g}{note}", numbers))
            continue
        finding = compare_figure(check, claimed, tried[0][2], rel_tol, what=f"{figure} = {numerator} / {tried[0][0]}",
                                 unit=_UNITS[check], wrong={"visible_tokens_only": base["visible_output_token_throughput"]
                                                            if check == "output_token_throughput" and visible != osl
                                                            else None},
                                 explain={"visible_tokens_only": "it counts visible tokens only, AIPerf counts total_osl"})
        near = tried[0][2] is not None and abs(claimed - tried[0][2]) <= DEFINITION_REL_TOL * abs(tried[0][2])
        if window is None and near and "diagnosis" not in finding.numbers:
            numbers["recomputed"] = tried[0][2]
            out.append(Finding(check, CANNOT, f"{figure}: {claimed:.6g} {_UNITS[check]} is within 1 % of {numerator} / "
                               f"benchmark_duration = {tried[0][2]:.6g} but not equal: AIPerf 0.13 divides by its "
                               "profiling window (end_time - start_time), which this report does not give; pass "
                               "--individual profile_export.jsonl to recompute it from the records", numbers))
            continue
        finding.numbers.update(numbers)
        out.append(finding)
    if base["duration_from_timestamps_s"] is not None:
        out.append(compare_figure("benchmark_duration", duration, base["duration_from_timestamps_s"],
                                  max(rel_tol, 1e-6), what="benchmark_duration vs max_response_timestamp - "
                                  "min_request_timestamp (first send to last response)", unit="s"))
    return out


_UNITS = {"request_throughput": "requests/s", "output_token_throughput": "tokens/s",
          "total_token_throughput": "tokens/s"}


def _errors(data: dict[str, Any], m: dict[str, dict[str, Any]], con: duckdb.DuckDBPyConnection) -> Finding:
    ok, errors = _avg(m, "request_count"), _avg(m, "error_request_count") or 0.0
    summary = data.get("error_summary") or []
    listed = sum(float(e.get("count", 0)) for e in summary if isinstance(e, dict))
    cfg = data.get("input_config", {}) if isinstance(data.get("input_config"), dict) else {}
    configured = (cfg.get("loadgen") or {}).get("request_count")
    for phase in cfg.get("phases") or []:
        if isinstance(phase, dict) and phase.get("name") == "profiling":
            configured = phase.get("requests", configured)
    numbers = {"request_count": ok, "error_request_count": errors, "error_summary_count": listed,
               "configured_requests": configured}
    if ok is None:
        return Finding("error_count", CANNOT, "no request_count", numbers)
    problems = []
    if listed != errors:
        problems.append(f"error_summary lists {listed:g} errors, error_request_count is {errors:g}")
    if isinstance(configured, (int, float)) and ok + errors != configured:
        problems.append(f"request_count {ok:g} + errors {errors:g} != {configured} configured requests")
    # failed / attempted: window_identities.sql's error_rate (NULL when nothing was attempted)
    rate = audit_query(con, "window_identities", {"attempted": ok + errors, "succeeded": ok,
                                                   "failed": errors})[0]["error_rate"]
    numbers["error_rate"] = rate
    if problems:
        return Finding("error_count", FAIL, "; ".join(problems), numbers)
    return Finding("error_count", PASS, f"{ok:g} succeeded + {errors:g} failed"
                   + (f" = {configured} configured" if configured is not None else "")
                   + (f"; error rate {rate:.4g}" if rate is not None else "; error rate undefined (no requests)")
                   + (" (failed requests are excluded from every latency statistic)" if errors else ""), numbers)


def _reasoning(m: dict[str, dict[str, Any]], rates: dict[str, Any]) -> Finding:
    osl, visible, reasoning = _avg(m, "total_osl"), _avg(m, "total_output_tokens"), _avg(m, "total_reasoning_tokens")
    numbers = {"total_osl": osl, "total_output_tokens": visible, "total_reasoning_tokens": reasoning}
    if not reasoning:
        return Finding("output_tokens_include_reasoning", PASS, "no reasoning tokens reported: output-token figures "
                       "count visible tokens", numbers)
    if osl is None or visible is None:
        return Finding("output_tokens_include_reasoning", CANNOT, "needs total_osl and total_output_tokens", numbers)
    share = rates["reasoning_share"]  # reasoning / total_osl (report_rates.sql)
    visible_rate = rates["visible_output_token_throughput"]  # visible / duration (report_rates.sql)
    numbers.update({"reasoning_share": share, "visible_tokens_per_s": visible_rate})
    if not agree(osl, visible + reasoning, 1e-9):
        return Finding("output_tokens_include_reasoning", FAIL, f"total_osl {osl:g} != total_output_tokens {visible:g} "
                       f"+ total_reasoning_tokens {reasoning:g}", numbers)
    return Finding("output_tokens_include_reasoning", PASS,
                   f"{reasoning:g} of {osl:g} output tokens ({share:.1%}) are reasoning tokens: output_token_throughput, "
                   "ITL and per-user rates count them, so they are not visible-token rates (visible: "
                   + (f"{visible_rate:.4g} tokens/s" if visible_rate is not None else "unknown: no benchmark_duration")
                   + "); TTFT is to the first token of any kind", numbers)


def _rate_vs_itl(m: dict[str, dict[str, Any]], con: duckdb.DuckDBPyConnection, rel_tol: float) -> Finding:
    rate, itl = _avg(m, "output_token_throughput_per_user"), _avg(m, "inter_token_latency")
    # 1000 / mean ITL: request_identities.sql's rate from a per-token gap (NULL unless ITL > 0)
    inverse = audit_query(con, "request_identities", {"tpot_ms": itl})[0]["decode_output_tokens_per_second_from_tpot"]
    if rate is None or inverse is None:
        return Finding("mean_rate_vs_inverse_mean_itl", CANNOT, "needs output_token_throughput_per_user and "
                       "inter_token_latency > 0", {})
    numbers = {"mean_rate": rate, "mean_itl_ms": itl, "inverse_mean_itl_per_second": inverse}
    if rate + max(rel_tol * inverse, 1e-9) < inverse:
        return Finding("mean_rate_vs_inverse_mean_itl", FAIL, f"mean per-user rate {rate:.6g} < 1000 / mean ITL "
                       f"{inverse:.6g}: impossible for a mean of 1000 / ITL per request (Jensen)", numbers)
    return Finding("mean_rate_vs_inverse_mean_itl", PASS, f"mean per-user rate {rate:.6g} tokens/s vs 1000 / mean "
                   f"ITL = {inverse:.6g}: they differ by definition (mean of inverses >= inverse of mean); the report "
                   "gives both, not one for the other", numbers)
