"""LLMPerf (ray-project/llmperf ``token_benchmark_ray.py``) summary and individual responses.

LLMPerf's method: values in seconds; errored requests dropped; quantiles by pandas
``Series.quantile`` (linear interpolation, = DuckDB quantile_cont), std by pandas
``Series.std`` (sample, n - 1). Its ``inter_token_latency_s`` is E2E / O (the first token's
TTFT included), its ``request_output_throughput_token_per_s`` is O / E2E (whole request).
Some counts are serialised as strings ("538"); they are parsed.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import duckdb

from analyzer.audit.compare import (
    CANNOT,
    DEFINITION_REL_TOL,
    FAIL,
    PASS,
    Finding,
    agree,
    audit_query,
    compare_figure,
    create_table,
    distribution_stats,
    load_values,
)
from analyzer.audit.inputs import optional_number, read_json
from analyzer.audit.readable import successful_requests
from analyzer.errors import AuditInputError

__all__ = ["audit_llmperf", "LLMPERF_METRICS"]

LLMPERF_METRICS = ("inter_token_latency_s", "ttft_s", "end_to_end_latency_s", "request_output_throughput_token_per_s",
                   "number_input_tokens", "number_output_tokens")
_STATS = {"mean": "mean_value", "min": "min_value", "max": "max_value", "stddev": "std_samp",
          "quantiles_p25": "p25", "quantiles_p50": "p50", "quantiles_p75": "p75", "quantiles_p90": "p90",
          "quantiles_p95": "p95", "quantiles_p99": "p99"}
_RESPONSE_KEYS = ("inter_token_latency_s", "ttft_s", "end_to_end_latency_s", "request_output_throughput_token_per_s",
                  "number_input_tokens", "number_output_tokens")


def _individual_path(path: Path, individual: str | Path | None) -> Path | None:
    if individual is not None:
        return Path(individual)
    if path.name.endswith("_summary.json"):
        sibling = path.with_name(path.name[: -len("_summary.json")] + "_individual_responses.json")
        if sibling.is_file():
            return sibling
    return None


def _load_responses(path: Path, con: duckdb.DuckDBPyConnection) -> int:
    data = read_json(path)
    if not isinstance(data, list):
        raise AuditInputError(f"{path}: LLMPerf individual responses are a JSON list of objects")
    rows = []
    for i, item in enumerate(data):
        if not isinstance(item, dict):
            raise AuditInputError(f"{path}: entry [{i}] is not an object")
        where = f"{path} [entry {i}]"
        values = [optional_number(item, k, where) for k in _RESPONSE_KEYS]
        code = item.get("error_code")
        rows.append((i, None if code in (None, "") else str(code), *values))
    create_table(con, "llmperf_responses", {"response_index": "INTEGER", "error_code": "VARCHAR",
                                            **{k: "DOUBLE" for k in _RESPONSE_KEYS}}, rows)
    return len(rows)


def audit_llmperf(path: Path, data: Any, con: duckdb.DuckDBPyConnection, rel_tol: float,
                  individual: str | Path | None) -> list[Finding]:
    """All checks of one LLMPerf summary (and its individual responses when found)."""
    if not isinstance(data, dict):
        raise AuditInputError(f"{path}: an LLMPerf summary is a JSON object")
    s = {k: optional_number(data, k, path) for k in data
         if k.startswith("results_") and k != "results_error_code_frequency"}
    findings = [_counts(s, con, rel_tol), _window(s, rel_tol),
                successful_requests(s.get("results_num_completed_requests"), what="results_num_completed_requests",
                                    failed=s.get("results_number_errors"))]
    ind = _individual_path(path, individual)
    if ind is None:
        findings.append(Finding("recompute_stats", CANNOT, "no individual responses: pass --individual "
                                "*_individual_responses.json (looked for the sibling of the summary)", {}))
        return findings
    _load_responses(ind, con)
    load_values(con, ((r["metric"], r["value"]) for r in audit_query(con, "llmperf_values")))
    stats = distribution_stats(con)
    completed = s.get("results_num_completed_requests")
    n = stats.get("ttft_s", {}).get("n_values", 0)
    findings.append(compare_figure("count_completed_vs_individual", completed, float(n), rel_tol,
                                   what=f"results_num_completed_requests vs successful responses in {ind.name}",
                                   unit="requests"))
    for metric in LLMPERF_METRICS:
        findings.append(_stat_check(path, s, metric, stats.get(metric), rel_tol))
    findings += _definitions(con, rel_tol)
    findings.append(_assumed_max_tokens(data, stats.get("number_output_tokens"), path))
    return findings


def _counts(s: dict[str, float | None], con: duckdb.DuckDBPyConnection, rel_tol: float) -> Finding:
    started, done, errors = (s.get(k) for k in ("results_num_requests_started", "results_num_completed_requests",
                                                 "results_number_errors"))
    rate = s.get("results_error_rate")
    numbers = {"started": started, "completed": done, "errors": errors, "error_rate": rate}
    if None in (started, errors, rate):
        return Finding("error_rate", CANNOT, "needs results_num_requests_started, results_number_errors and "
                       "results_error_rate", numbers)
    assert started is not None and errors is not None and rate is not None
    # failed / attempted and its percentage: window_identities.sql (NULL when nothing was started)
    ident = audit_query(con, "window_identities", {"attempted": started, "failed": errors})[0]
    f = compare_figure("error_rate", rate, ident["error_rate"], rel_tol,
                       what="results_error_rate vs number_errors / num_requests_started", unit="fraction",
                       wrong={"error_rate_percent_as_fraction": ident["error_rate_as_percent"]},
                       explain={"error_rate_percent_as_fraction": "it is a percentage where a fraction belongs"})
    f.numbers.update(numbers)
    return f


def _window(s: dict[str, float | None], rel_tol: float) -> Finding:
    per_s, per_min = s.get("results_mean_output_throughput_token_per_s"), s.get("results_num_completed_requests_per_min")
    done, mean_out = s.get("results_num_completed_requests"), s.get("results_number_output_tokens_mean")
    if None in (per_s, per_min, done, mean_out) or not per_s or not per_min:
        return Finding("throughput_denominator", CANNOT, "needs results_mean_output_throughput_token_per_s, "
                       "results_num_completed_requests_per_min, results_num_completed_requests and "
                       "results_number_output_tokens_mean", {})
    assert per_s and per_min and done is not None and mean_out is not None
    window_from_tokens = done * mean_out / per_s
    window_from_requests = 60 * done / per_min
    f = compare_figure("throughput_denominator", window_from_tokens, window_from_requests, rel_tol,
                       what="benchmark window implied by output throughput (s) vs by completed requests per minute",
                       unit="s")
    f.numbers.update({"window_s_from_output_throughput": window_from_tokens,
                      "window_s_from_requests_per_min": window_from_requests,
                      "rule": "LLMPerf: total output tokens of completed requests / (benchmark end - start)"})
    if f.verdict == PASS:
        f.detail = (f"both throughputs use the same {window_from_requests:.4g} s window (benchmark start to end), "
                    "not the sum of request latencies")
    return f


def _stat_check(path: Path, s: dict[str, float | None], metric: str, row: dict[str, Any] | None,
                rel_tol: float) -> Finding:
    check = f"recompute_{metric}"
    keys = {stat: f"results_{metric}_{stat}" for stat in _STATS if f"results_{metric}_{stat}" in s}
    if not keys:
        return Finding(check, CANNOT, f"the summary gives no results_{metric}_* statistics", {})
    if row is None or not row["n_values"]:
        return Finding(check, CANNOT, f"the individual responses hold no {metric} values", {})
    unit = "s" if metric.endswith("_s") else ("tokens/s" if "per_s" in metric else "tokens")
    figures: dict[str, Any] = {}
    failures: list[Finding] = []
    for stat, key in keys.items():
        column = _STATS[stat]
        wrong = {"std_population_not_sample": row["std_pop"]} if stat == "stddev" else {}
        explain = {"std_population_not_sample": "it is the population std; LLMPerf (pandas) uses the sample std"}
        f = compare_figure(check, s[key], row[column], rel_tol, what=key, unit=unit, wrong=wrong, explain=explain)
        figures[key] = {"claimed": s[key], "recomputed": row[column], "verdict": f.verdict}
        if f.verdict == FAIL:
            failures.append(f)
    numbers = {"n_values": row["n_values"], "method": "LLMPerf/pandas: linear quantiles, sample std", "figures": figures}
    if failures:
        numbers["diagnosis"] = failures[0].numbers.get("diagnosis")
        return Finding(check, FAIL, "; ".join(f.detail for f in failures), numbers)
    return Finding(check, PASS, f"{len(figures)} statistics recomputed from {row['n_values']} responses (LLMPerf's "
                   "method: pandas linear quantiles, sample std) match", numbers)


def _definitions(con: duckdb.DuckDBPyConnection, rel_tol: float) -> list[Finding]:
    rows = audit_query(con, "llmperf_definitions")
    if not rows:
        return [Finding("itl_definition", CANNOT, "no successful responses", {})]
    itl_first = all(agree(r["inter_token_latency_s"], r["e2e_over_output_tokens_s"], DEFINITION_REL_TOL) for r in rows)
    itl_decode = all(agree(r["inter_token_latency_s"], r["decode_tpot_s"], DEFINITION_REL_TOL) for r in rows)
    numbers = {"responses": [{k: r[k] for k in ("output_tokens", "inter_token_latency_s", "e2e_over_output_tokens_s",
                                                 "decode_tpot_s")} for r in rows]}
    if itl_first and not itl_decode:
        itl = Finding("itl_definition", PASS, "inter_token_latency_s follows LLMPerf's definition, E2E / O with the "
                      "first token's TTFT included: not comparable with vLLM's TPOT/ITL (decode-only TPOT of these "
                      "responses: " + ", ".join(f"{r['decode_tpot_s'] * 1000:.4g} ms" for r in rows) + ")", numbers)
    elif itl_decode:
        itl = Finding("itl_definition", PASS, "inter_token_latency_s equals the decode-only TPOT", numbers)
    else:
        itl = Finding("itl_definition", FAIL, "inter_token_latency_s matches neither E2E / O (LLMPerf's definition) "
                      "nor (E2E - TTFT) / (O - 1)", numbers)
    whole = all(agree(r["request_output_throughput_token_per_s"], r["whole_request_output_tokens_per_s"], rel_tol)
                for r in rows)
    swapped = all(agree(r["request_output_throughput_token_per_s"], r["decode_output_tokens_per_s"], rel_tol)
                  for r in rows)
    rate_numbers = {"responses": [{k: r[k] for k in ("request_output_throughput_token_per_s",
                                                      "whole_request_output_tokens_per_s", "decode_output_tokens_per_s")}
                                  for r in rows]}
    if whole:
        rate = Finding("output_rate_definition", PASS, "request_output_throughput_token_per_s is the whole-request "
                       "rate O / E2E (TTFT included), not a decode-only rate", rate_numbers)
    elif swapped:
        rate = Finding("output_rate_definition", FAIL, "request_output_throughput_token_per_s is the decode-only rate "
                       "(O - 1) / (E2E - TTFT), not LLMPerf's whole-request O / E2E", rate_numbers)
    else:
        rate = Finding("output_rate_definition", FAIL, "request_output_throughput_token_per_s matches neither O / E2E "
                       "nor (O - 1) / (E2E - TTFT)", rate_numbers)
    return [itl, rate]


def _assumed_max_tokens(data: dict[str, Any], row: dict[str, Any] | None, path: Path) -> Finding:
    requested = optional_number(data, "mean_output_tokens", path)
    if row is None or not row["n_values"]:
        return Finding("output_tokens_assumed_max_tokens", CANNOT, "no output token counts", {})
    numbers = {"requested_mean_output_tokens": requested, "min": row["min_value"], "max": row["max_value"],
               "n_values": row["n_values"]}
    if row["n_values"] > 1 and row["min_value"] == row["max_value"] and requested == row["min_value"]:
        return Finding("output_tokens_assumed_max_tokens", FAIL, f"every response has exactly the requested "
                       f"{requested:g} output tokens: counts look assumed from max_tokens, not measured", numbers)
    return Finding("output_tokens_assumed_max_tokens", PASS, f"output tokens vary ({row['min_value']:g} to "
                   f"{row['max_value']:g}; requested mean {requested}): counted, not assumed", numbers)
