"""vLLM's nightly-benchmark summary table (``.buildkite`` ``benchmark_results.json``): a list
of rows keyed by column titles ("Tput (req/s)", "Mean TTFT (ms)", "P99 ITL (ms)" ...).

The table carries no arrays, so statistics cannot be recomputed from it; checks are internal
(percentile order, token rates per request, throughput ratios), and with ``--individual`` a
row is compared with the vLLM benchmark JSON it was built from (matched by its request
throughput).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import duckdb

from analyzer.audit.compare import CANNOT, FAIL, PASS, Finding, audit_query, compare_figure, create_table
from analyzer.audit.inputs import optional_number, read_json
from analyzer.errors import AuditInputError

__all__ = ["audit_vllm_nightly", "NIGHTLY_COLUMNS"]

# Column title -> key of the vLLM benchmark JSON it is copied from.
NIGHTLY_COLUMNS = {
    "# of req.": "completed", "Tput (req/s)": "request_throughput", "Output Tput (tok/s)": "output_throughput",
    "Total Tput (tok/s)": "total_token_throughput",
    **{f"{stat} {metric.upper()} (ms)": f"{stat.lower()}_{metric}_ms"
       for stat in ("Mean", "Median", "P99") for metric in ("ttft", "tpot", "itl", "e2el")},
}


def audit_vllm_nightly(path: Path, data: Any, con: duckdb.DuckDBPyConnection, rel_tol: float,
                       individual: str | Path | None) -> list[Finding]:
    """All checks of one nightly summary table."""
    if not isinstance(data, list) or not all(isinstance(r, dict) for r in data):
        raise AuditInputError(f"{path}: a vLLM nightly table is a JSON list of row objects")
    rows = []
    for i, row in enumerate(data):
        name = str(row.get("Test name", f"row {i}"))
        values = {col: optional_number(row, col, f"{path} [{name}]") for col in NIGHTLY_COLUMNS if col in row}
        rows.append((name, values))
    findings = [_order(rows), _tokens_per_request(rows, con)]
    if individual is None:
        findings.append(Finding("recompute_stats", CANNOT, "a summary table has no per-request arrays: pass "
                                "--individual with the vLLM benchmark JSON of a row to compare it", {}))
        return findings
    findings.append(_compare_source(Path(individual), rows, rel_tol))
    return findings


def _order(rows: list[tuple[str, dict[str, float | None]]]) -> Finding:
    problems = []
    for name, v in rows:
        for metric in ("TTFT", "TPOT", "ITL", "E2EL"):
            median, p99 = v.get(f"Median {metric} (ms)"), v.get(f"P99 {metric} (ms)")
            if median is not None and p99 is not None and median > p99:
                problems.append(f"{name}: median {metric} {median:g} > p99 {p99:g}")
        out, total = v.get("Output Tput (tok/s)"), v.get("Total Tput (tok/s)")
        if out is not None and total is not None and out > total:
            problems.append(f"{name}: output throughput {out:g} > total throughput {total:g}")
    if problems:
        return Finding("table_order", FAIL, "; ".join(problems), {"problems": problems})
    return Finding("table_order", PASS, f"in all {len(rows)} rows median <= p99 and output <= total throughput", {})


def _tokens_per_request(rows: list[tuple[str, dict[str, float | None]]], con: duckdb.DuckDBPyConnection) -> Finding:
    create_table(con, "nightly_rows", {"row_index": "INTEGER", "row_name": "VARCHAR", "request_throughput": "DOUBLE",
                                       "output_throughput": "DOUBLE"},
                 [(i, name, v.get("Tput (req/s)"), v.get("Output Tput (tok/s)")) for i, (name, v) in enumerate(rows)])
    result = audit_query(con, "nightly_tokens_per_request")
    names = [r["row_name"] for r in result]
    # A repeated test name keeps every row (suffixed with its index) instead of overwriting one.
    per_row = {(r["row_name"] if names.count(r["row_name"]) == 1 else f"{r['row_name']} [row {r['row_index']}]"):
               r["output_tokens_per_request"] for r in result}
    left_out = len(rows) - len(result)  # rows without Tput > 0 and an Output Tput: not compared, but counted
    if not per_row:
        return Finding("output_tokens_per_request", CANNOT, "needs Tput (req/s) and Output Tput (tok/s)",
                       {"rows_left_out": left_out})
    spread = result[0]["relative_spread"]
    if spread is None:
        return Finding("output_tokens_per_request", CANNOT, "Output Tput (tok/s) is 0 in every row: no tokens "
                       "per request to compare", {"output_tokens_per_request": per_row, "rows_left_out": left_out})
    numbers = {"output_tokens_per_request": per_row, "relative_spread": spread, "rows_left_out": left_out}
    # The same dataset and prompt count at every rate: tokens per request should barely move.
    verdict = PASS if spread < 0.05 else FAIL
    return Finding("output_tokens_per_request", verdict,
                   "output tokens per request (Output Tput / Tput) across rows: "
                   + ", ".join(f"{k} {x:.5g}" for k, x in per_row.items())
                   + (f" ({left_out} row(s) without Tput > 0 and Output Tput left out)" if left_out else "")
                   + ("" if verdict == PASS else ": rows of the same prompts differ by 5 % or more"), numbers)


def _compare_source(source: Path, rows: list[tuple[str, dict[str, float | None]]], rel_tol: float) -> Finding:
    result = read_json(source)
    if not isinstance(result, dict) or "request_throughput" not in result:
        raise AuditInputError(f"{source}: --individual for a nightly table must be a vLLM benchmark JSON "
                              "(key 'request_throughput' missing)")
    target = optional_number(result, "request_throughput", source)
    match = next(((n, v) for n, v in rows if compare_figure("", v.get("Tput (req/s)"), target, rel_tol,
                                                             what="", unit="").verdict == PASS), None)
    if match is None:
        return Finding("table_row_matches_source", FAIL, f"no row has Tput (req/s) = {target:g} of {source.name}", {})
    name, v = match
    problems, compared = [], 0
    for col, key in NIGHTLY_COLUMNS.items():
        if col not in v or key not in result:
            continue
        compared += 1
        f = compare_figure("", v[col], optional_number(result, key, source), rel_tol, what=col, unit="")
        if f.verdict == FAIL:
            problems.append(f.detail)
    numbers = {"row": name, "columns_compared": compared, "source": source.name}
    if problems:
        return Finding("table_row_matches_source", FAIL, f"{name}: " + "; ".join(problems), numbers)
    return Finding("table_row_matches_source", PASS, f"row {name}: {compared} columns equal {source.name}", numbers)


