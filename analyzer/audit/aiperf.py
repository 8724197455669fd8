"""AIPerf / GenAI-Perf exports: the flat layout (``schema_version``, metrics at top level) and
the older ``records{}`` layout (tags ``ttft``/``ttst``), and ``profile_export.jsonl`` records.

AIPerf's method: numpy linear percentiles and population std over per-request values;
ITL per request = (latency - TTFT) / (OSL - 1) over all output tokens (reasoning tokens
included); per-user rate = 1000 / that ITL; throughputs = totals / benchmark duration
(first request send to last response).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import duckdb

from analyzer.audit.compare import CANNOT, DEFINITION_REL_TOL, FAIL, PASS, Finding, agree, audit_query, compare_figure, create_table
from analyzer.audit.inputs import AuditInputError

__all__ = ["audit_aiperf", "normalize_aiperf"]

# Older tag -> flat-layout name.
_RENAMES = {"ttft": "time_to_first_token", "ttst": "time_to_second_token"}
_ORDER = ("min", "p1", "p5", "p10", "p25", "p50", "p75", "p90", "p95", "p99", "max")


def normalize_aiperf(path: Path, data: Any) -> dict[str, dict[str, Any]]:
    """Metric name -> its statistics dict (avg, min, max, pN, std, count, sum, unit), either layout."""
    if not isinstance(data, dict):
        raise AuditInputError(f"{path}: an AIPerf export is a JSON object")
    source = data["records"] if isinstance(data.get("records"), dict) else data
    out: dict[str, dict[str, Any]] = {}
    for key, value in source.items():
        if isinstance(value, dict) and ("avg" in value or "unit" in value):
            out[_RENAMES.get(str(value.get("tag", key)), str(value.get("tag", key)))] = value
    if "request_count" not in out and "time_to_first_token" not in out:
        raise AuditInputError(f"{path}: no AIPerf metrics found (expected 'records' or top-level metric objects such "
                              "as 'request_count', 'time_to_first_token')")
    return out


def _avg(m: dict[str, dict[str, Any]], name: str) -> float | None:
    value = m.get(name, {}).get("avg")
    return float(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else None


def audit_aiperf(path: Path, data: Any, con: duckdb.DuckDBPyConnection, rel_tol: float,
                 individual: str | Path | None) -> list[Finding]:
    """All checks of one AIPerf export (and its profile_export.jsonl records when given)."""
    m = normalize_aiperf(path, data)
    layout = "records{} (older)" if isinstance(data.get("records"), dict) else f"flat (schema {data.get('schema_version')})"
    findings = [Finding("report_layout", PASS, f"AIPerf export, {layout} layout, {len(m)} metrics", {"layout": layout})]
    findings.append(_statistics_order(m))
    rates = _report_rates(m, con)
    findings += _rates(m, rates, rel_tol)
    findings.append(_errors(data, m, con))
    findings.append(_reasoning(m, rates))
    findings.append(_rate_vs_itl(m, con, rel_tol))
    if individual is not None:
        findings += _records(Path(individual), m, con, rel_tol)
    else:
        findings.append(Finding("recompute_stats", CANNOT, "summary statistics need every request's values: pass "
                                "--individual profile_export.jsonl", {}))
    return findings


def _statistics_order(m: dict[str, dict[str, Any]]) -> Finding:
    problems: list[str] = []
    for name, s in m.items():
        chain = [(k, s[k]) for k in _ORDER if isinstance(s.get(k), (int, float))]
        for (ka, a), (kb, b) in zip(chain, chain[1:]):
            if a > b * (1 + 1e-12) + 1e-12:
                problems.append(f"{name}: {ka} {a:g} > {kb} {b:g}")
        avg, lo, hi = s.get("avg"), s.get("min"), s.get("max")
        if all(isinstance(v, (int, float)) for v in (avg, lo, hi)) and not (lo <= avg <= hi):
            problems.append(f"{name}: avg {avg:g} outside [{lo:g}, {hi:g}]")
        total, count = s.get("sum"), s.get("count")
        if all(isinstance(v, (int, float)) for v in (avg, total, count)) and count and not agree(total, avg * count, 1e-6):
            problems.append(f"{name}: sum {total:g} != avg x count {avg * count:g}")
    if problems:
        return Finding("summary_statistics_consistent", FAIL, "; ".join(problems), {"problems": problems})
    return Finding("summary_statistics_consistent", PASS, f"every metric's min <= percentiles <= max, min <= avg <= "
                   f"max, and sum = avg x count where given ({len(m)} metrics)", {})


def _report_rates(m: dict[str, dict[str, Any]], con: duckdb.DuckDBPyConnection) -> dict[str, Any]:
    """The row of queries/audit/report_rates.sql for the report's totals and duration."""
    osl = _avg(m, "total_osl")
    visible = _avg(m, "total_output_tokens")
    return audit_query(con, "report_rates", {
        "duration_s": _avg(m, "benchmark_duration"), "requests": _avg(m, "request_count"),
        "output_tokens": osl if osl is not None else visible, "visible_output_tokens": visible,
        "input_tokens": _avg(m, "total_isl"), "reasoning_tokens": _avg(m, "total_reasoning_tokens"),
        "first_request_ns": _avg(m, "min_request_timestamp"),
        "last_response_ns": _avg(m, "max_response_timestamp"),
    })[0]


def _rates(m: dict[str, dict[str, Any]], r: dict[str, Any], rel_tol: float) -> list[Finding]:
    osl = _avg(m, "total_osl")
    visible = _avg(m, "total_output_tokens")
    out = [
        compare_figure("request_throughput", _avg(m, "request_throughput"), r["request_throughput"], rel_tol,
                       what="request_throughput = request_count / benchmark_duration", unit="requests/s",
                       missing="needs request_throughput, request_count and benchmark_duration"),
        compare_figure("output_token_throughput", _avg(m, "output_token_throughput"), r["output_token_throughput"],
                       rel_tol, what="output_token_throughput = total_osl / benchmark_duration", unit="tokens/s",
                       wrong={"visible_tokens_only": r["visible_output_token_throughput"]
                              if visible != osl else None},
                       explain={"visible_tokens_only": "it counts visible tokens only, AIPerf counts total_osl"},
                       missing="needs output_token_throughput, total_osl and benchmark_duration"),
    ]
    if _avg(m, "total_token_throughput") is not None:
        out.append(compare_figure("total_token_throughput", _avg(m, "total_token_throughput"),
                                  r["total_token_throughput"], rel_tol,
                                  what="total_token_throughput = (total_isl + total_osl) / benchmark_duration",
                                  unit="tokens/s"))
    if r["duration_from_timestamps_s"] is not None:
        out.append(compare_figure("benchmark_duration", _avg(m, "benchmark_duration"), r["duration_from_timestamps_s"],
                                  max(rel_tol, 1e-6), what="benchmark_duration vs max_response_timestamp - "
                                  "min_request_timestamp (first send to last response)", unit="s"))
    return out


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


def _metric_value(rec: dict[str, Any], name: str, where: str) -> Any:
    metrics = rec.get("metrics") or {}
    item = metrics.get(name)
    if item is None:
        return None
    if not isinstance(item, dict) or "value" not in item:
        raise AuditInputError(f"{where}: metrics.{name} has no 'value'")
    return item["value"]


def _num(value: Any) -> float | int | None:
    """A record value for a numeric column: None stays None; ints (counts, ns) and floats pass."""
    if value is None or isinstance(value, bool):
        return None
    if isinstance(value, (int, float)):
        return value
    raise AuditInputError(f"record value {value!r} is not a number")


def _records(path: Path, m: dict[str, dict[str, Any]], con: duckdb.DuckDBPyConnection, rel_tol: float) -> list[Finding]:
    try:
        lines = path.read_text().splitlines()
    except FileNotFoundError:
        raise AuditInputError(f"{path}: no such file") from None
    rows = []
    for i, line in enumerate(lines):
        if not line.strip():
            continue
        try:
            rec = json.loads(line)
        except json.JSONDecodeError as exc:
            raise AuditInputError(f"{path}:{i + 1}: not valid JSON ({exc.msg})") from None
        where = f"{path}:{i + 1}"
        err = rec.get("error")
        gaps = _metric_value(rec, "inter_chunk_latency", where) or []
        if not isinstance(gaps, list):
            gaps = [gaps]
        meta = rec.get("metadata") or {}
        vals = [_metric_value(rec, k, where) for k in ("ttft", "request_latency", "output_sequence_length",
                                                      "output_token_count", "reasoning_token_count",
                                                      "inter_token_latency", "output_token_throughput_per_user", "ttst")]
        if vals[0] is None:
            vals[0] = _metric_value(rec, "time_to_first_token", where)
        if vals[7] is None:
            vals[7] = _metric_value(rec, "time_to_second_token", where)
        rows.append((i, None if err is None else str(err.get("code", "error")) if isinstance(err, dict) else str(err),
                     *vals, len(gaps), float(sum(gaps)) if gaps else None, gaps[0] if gaps else None,
                     _metric_value(rec, "min_request_timestamp", where) or meta.get("timestamp_ns"),
                     _metric_value(rec, "max_response_timestamp", where)))
    columns = {"record_index": "INTEGER", "error_code": "VARCHAR", "ttft_ms": "DOUBLE", "request_latency_ms": "DOUBLE",
               "output_sequence_length": "DOUBLE", "output_token_count": "DOUBLE", "reasoning_token_count": "DOUBLE",
               "inter_token_latency_ms": "DOUBLE", "output_token_throughput_per_user": "DOUBLE", "ttst_ms": "DOUBLE",
               "chunk_gaps": "INTEGER", "chunk_gap_sum_ms": "DOUBLE", "first_chunk_gap_ms": "DOUBLE",
               "request_start_ns": "BIGINT", "response_end_ns": "BIGINT"}
    create_table(con, "aiperf_records", columns, [tuple(_num(v) if i > 1 else v for i, v in enumerate(r)) for r in rows])
    ident = audit_query(con, "aiperf_record_identities")
    failed = sum(r[1] is not None for r in rows)
    pairs = (("inter_token_latency_ms", "itl_ms_expected", "ITL = (latency - TTFT) / (OSL - 1)"),
             ("output_token_throughput_per_user", "per_user_expected", "per-user rate = 1000 / ITL"),
             ("request_latency_ms", "latency_ms_from_chunks", "latency = TTFT + sum(inter-chunk gaps)"),
             ("request_latency_ms", "latency_ms_from_timestamps", "latency = last response - request start"),
             ("output_sequence_length", "osl_expected", "OSL = visible + reasoning tokens"),
             ("ttst_ms", "first_chunk_gap_ms", "TTST = first inter-chunk gap"))
    problems, checked = [], 0
    for r in ident:
        for got, want, what in pairs:
            if r[got] is None or r[want] is None:
                continue
            checked += 1
            if not agree(r[got], r[want], max(rel_tol, 1e-6)):
                problems.append(f"record {r['record_index'] + 1}: {what}: {r[got]:.6g} vs {r[want]:.6g}")
    numbers = {"records": len(rows), "failed_records": failed, "successful_records": len(ident),
               "identities_checked": checked}
    out = [Finding("record_identities", FAIL if problems else PASS,
                   "; ".join(problems) if problems else f"{checked} per-record identities hold over {len(ident)} "
                   f"successful record(s) ({failed} error record(s)): " + "; ".join(p[2] for p in pairs), numbers)]
    count = m.get("time_to_first_token", {}).get("count")
    if count is not None and len(ident) != count:
        out.append(Finding("recompute_stats", CANNOT, f"{path.name} holds {len(ident)} successful record(s), the "
                           f"report summarises {count:g}: a partial records file cannot reproduce the statistics",
                           numbers))
    else:
        out.append(Finding("recompute_stats", CANNOT, "summary recomputation from profile_export.jsonl is not "
                           "implemented yet; per-record identities only", numbers))
    return out
