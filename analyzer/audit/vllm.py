"""vLLM ``benchmark_serving.py --save-result`` JSON: statistics recomputed from its raw arrays.

vLLM's own method (benchmarks/benchmark_serving.py ``calculate_metrics``): successful
requests only; TPOT = (latency - ttft) / (output_len - 1) over requests with output_len > 1
(one-token requests are left out of the TPOT statistics); ITL = every chunk gap (per chunk);
mean = numpy mean, median = numpy median, std = numpy population std, pN = numpy linear
percentile. Older files lack keys (``*_e2el_ms``, ``failed``, goodput): each absent figure
is reported as ``cannot_check``, never guessed.
"""

from __future__ import annotations

import re
from collections import Counter
from pathlib import Path
from typing import Any

import duckdb

from analyzer.audit.compare import (
    CANNOT,
    FAIL,
    PASS,
    Finding,
    audit_query,
    compare_figure,
    create_table,
    distribution_stats,
    load_values,
)
from analyzer.audit.inputs import optional_number
from analyzer.audit.readable import successful_requests
from analyzer.audit.records_traces import RequestRecord, compare_records_with_traces, load_traced_requests
from analyzer.errors import AuditInputError

__all__ = ["audit_vllm", "load_vllm_arrays", "VLLM_METRICS"]

VLLM_METRICS = ("ttft", "tpot", "itl", "e2el")
_STAT_KEY = re.compile(r"^(mean|median|std|p\d+(?:\.\d+)?)_(ttft|tpot|itl|e2el)_ms$")
_STAT_COLUMN = {"mean": "mean_value", "median": "median_value", "std": "std_pop", "p1": "p1", "p5": "p5",
                "p10": "p10", "p25": "p25", "p50": "p50", "p75": "p75", "p90": "p90", "p95": "p95", "p99": "p99",
                "p99.9": "p99_9"}
_EXPECTED_KEYS = ("duration", "completed", "failed", "total_input_tokens", "total_output_tokens",
                  "request_throughput", "output_throughput", "total_token_throughput", "request_goodput",
                  "mean_ttft_ms", "mean_tpot_ms", "mean_itl_ms", "mean_e2el_ms",
                  "input_lens", "output_lens", "ttfts", "itls", "errors")
_WRONG_STAT = {
    "tpot": {"tpot_one_token_as_zero": "it is the mean with the one-token requests counted as TPOT 0 (vLLM leaves "
                                       "them out)",
             "itl": "it is the per-chunk ITL statistic: with multi-token chunks ITL (per chunk) and TPOT (per token) "
                    "differ",
             "tpot_including_first_token": "it is E2E / O, a per-token latency that includes TTFT"},
    "ttft": {"ttft_failed_as_zero": "it includes the failed requests' zeros stored in the ttfts array"},
    "itl": {"tpot": "it is the TPOT statistic, not the per-chunk ITL"},
}


def load_vllm_arrays(path: Path, data: dict[str, Any], con: duckdb.DuckDBPyConnection) -> int:
    """Create ``vllm_requests`` and ``vllm_itls`` from the saved arrays; returns the request count.

    AuditInputError naming the key when an array is missing, of the wrong length or type.
    """
    for key in ("ttfts", "itls", "output_lens"):
        if not isinstance(data.get(key), list):
            raise AuditInputError(f"{path}: key {key!r} is missing or not a list (save with --save-detailed)")
    n = len(data["ttfts"])
    for key in ("itls", "output_lens", "input_lens", "errors"):
        if key in data and (not isinstance(data[key], list) or len(data[key]) != n):
            raise AuditInputError(f"{path}: key {key!r} has {len(data[key]) if isinstance(data[key], list) else '?'} "
                                  f"entries, 'ttfts' has {n}")
    inputs = data.get("input_lens") or [None] * n
    errors = data.get("errors") or [""] * n
    requests, gaps = [], []
    for i in range(n):
        row = {"ttfts": data["ttfts"][i], "output_lens": data["output_lens"][i], "input_lens": inputs[i]}
        values = {k: optional_number(row, k, f"{path} [{k}[{i}]]") for k in row}
        requests.append((i, values["ttfts"], values["input_lens"], values["output_lens"], str(errors[i] or "")))
        itl = data["itls"][i]
        if not isinstance(itl, list):
            raise AuditInputError(f"{path}: key 'itls'[{i}] is not a list")
        for j, gap in enumerate(itl):
            gaps.append((i, j, optional_number({"itl": gap}, "itl", f"{path} [itls[{i}][{j}]]")))
    create_table(con, "vllm_requests", {"request_index": "INTEGER", "ttft_s": "DOUBLE", "input_len": "DOUBLE",
                                        "output_len": "DOUBLE", "error": "VARCHAR"}, requests)
    create_table(con, "vllm_itls", {"request_index": "INTEGER", "gap_index": "INTEGER", "itl_s": "DOUBLE"}, gaps)
    return n


def audit_vllm(path: Path, data: Any, con: duckdb.DuckDBPyConnection, rel_tol: float,
               db: str | Path | None = None) -> list[Finding]:
    """All checks of one vLLM serving benchmark result; with ``db`` (a tokentrace database of the
    same run's traces) each request is also compared with its traced request (``traces:*``)."""
    if not isinstance(data, dict):
        raise AuditInputError(f"{path}: a vLLM benchmark result is a JSON object")
    findings = [_key_presence(data)]
    if not isinstance(data.get("ttfts"), list):
        findings.append(Finding("recompute_stats", CANNOT, "the file has no per-request arrays (ttfts, itls, "
                                "output_lens): saved without detail", {}))
        findings.append(successful_requests(optional_number(data, "completed", path), what="completed",
                                            failed=optional_number(data, "failed", path)))
        findings += _summary_only_checks(path, data, rel_tol)
        return findings
    load_vllm_arrays(path, data, con)
    load_values(con, ((r["metric"], r["value"]) for r in audit_query(con, "vllm_values")))
    stats = distribution_stats(con)
    duration = optional_number(data, "duration", path)
    totals = audit_query(con, "vllm_totals", {"duration_s": duration})[0]
    for metric in VLLM_METRICS:
        findings.append(_stat_check(path, data, metric, stats, rel_tol))
    traced = _against_traces(data, con, db, rel_tol) if db is not None else None
    findings.append(successful_requests(totals["completed"], what="successful requests in the arrays",
                                        failed=totals["failed"]))
    findings += _count_checks(path, data, totals, rel_tol, traced)
    findings += _summary_only_checks(path, data, rel_tol)
    findings.append(_chunking(totals, stats, rel_tol))
    if traced is not None:
        findings += traced
    return findings


def _id_prefix(traced: list[dict[str, Any]], n: int) -> tuple[str | None, int]:
    """The --request-id-prefix of a vLLM bench run, read from the traced client_request_ids
    ("<prefix><index>", index < n): the prefix most ids share, and how many do."""
    counts: Counter[str] = Counter()
    for row in traced:
        m = re.fullmatch(r"(.*?)(\d+)", row.get("client_request_id") or "")
        if m and int(m[2]) < n:
            counts[m[1]] += 1
    if not counts:
        return None, 0
    return counts.most_common(1)[0]


def _against_traces(data: dict[str, Any], con: duckdb.DuckDBPyConnection, db: str | Path,
                    rel_tol: float) -> list[Finding]:
    """Request i of the arrays is the traced request whose id is ``<prefix><i>``: vllm bench
    serve --request-id-prefix sends it as X-Request-Id, vLLM's span has it as
    gen_ai.request.id = chatcmpl-<prefix><i> (requests.client_request_id)."""
    traced = load_traced_requests(db)
    n = len(data["ttfts"])
    prefix, found = _id_prefix(traced, n)
    if prefix is None:
        return [Finding("traces:records_joined", CANNOT, f"no traced request has a client_request_id of the form "
                        f"<prefix><index < {n}>: run vllm bench serve with --request-id-prefix (its ids reach "
                        "vLLM's span as gen_ai.request.id) to join the requests to the traces", {})]
    records = []
    rows = audit_query(con, "vllm_request_rows")
    for r in rows:
        records.append(RequestRecord(r["request_index"], f"{prefix}{r['request_index']}", r["ttft_ms"], r["e2el_ms"],
                                     r["tpot_ms"], r["input_len"], r["output_len"]))
    findings, _ = compare_records_with_traces(con, traced, records, rel_tol=rel_tol,
                                              id_what=f"'{prefix}<index>' (--request-id-prefix {prefix!r}, found on "
                                                      f"{found} traced requests)")
    return findings


def _key_presence(data: dict[str, Any]) -> Finding:
    present = [k for k in _EXPECTED_KEYS if k in data or (k == "request_goodput" and "request_goodput:" in data)]
    missing = [k for k in _EXPECTED_KEYS if k not in present]
    numbers = {"present": present, "missing": missing, "legacy_goodput_key": "request_goodput:" in data}
    detail = f"{len(present)} of {len(_EXPECTED_KEYS)} expected keys present"
    if missing:
        detail += f"; absent (older vLLM or saved without detail): {', '.join(missing)}"
    if "request_goodput:" in data:
        detail += "; goodput under the legacy key 'request_goodput:' (trailing colon)"
    return Finding("report_keys", PASS, detail, numbers)


def _stat_check(path: Path, data: dict[str, Any], metric: str, stats: dict[str, dict[str, Any]],
                rel_tol: float) -> Finding:
    keys = sorted(k for k in data if (m := _STAT_KEY.match(k)) and m.group(2) == metric)
    check = f"recompute_{metric}_ms"
    if not keys:
        return Finding(check, CANNOT, f"the report gives no {metric} statistics (no *_{metric}_ms keys)", {})
    row = stats.get(metric)
    if row is None or not row["n_values"]:
        return Finding(check, CANNOT, f"the arrays hold no {metric} values", {"keys": keys})
    results: dict[str, Any] = {}
    failures: list[Finding] = []
    for key in keys:
        stat = _STAT_KEY.match(key).group(1)  # type: ignore[union-attr]  # the keys were matched by _STAT_KEY when read
        column = _STAT_COLUMN.get(stat)
        claimed = optional_number(data, key, path)
        if column is None:
            results[key] = {"claimed": claimed, "verdict": CANNOT, "why": f"percentile {stat} not recomputed"}
            continue
        wrong = {name: stats.get(name, {}).get(column) for name in _WRONG_STAT.get(metric, {})}
        if stat == "std":
            wrong["std_sample_not_population"] = row["std_samp"]
        if stat.startswith("p") and f"{stat}_nearest_rank" in row:
            wrong["nearest_rank_percentile"] = row[f"{stat}_nearest_rank"]
        explain = dict(_WRONG_STAT.get(metric, {}))
        explain["std_sample_not_population"] = "it is the sample std (n - 1); vLLM uses numpy's population std"
        explain["nearest_rank_percentile"] = "it is a nearest-rank percentile; vLLM uses numpy's linear percentile"
        f = compare_figure(check, claimed, row[column], rel_tol, what=key, unit="ms", wrong=wrong, explain=explain)
        results[key] = {"claimed": claimed, "recomputed": row[column], "verdict": f.verdict,
                        **({"diagnosis": f.numbers["diagnosis"]} if "diagnosis" in f.numbers else {})}
        if f.verdict == FAIL:
            failures.append(f)
    numbers = {"n_values": row["n_values"], "method": "vLLM/numpy: linear percentiles, population std", "figures": results}
    if failures:
        first = failures[0]
        numbers["diagnosis"] = first.numbers.get("diagnosis")
        return Finding(check, FAIL, "; ".join(f.detail for f in failures), numbers)
    checked = [k for k, r in results.items() if r["verdict"] == PASS]
    return Finding(check, PASS, f"{', '.join(checked)} recomputed from {row['n_values']} values (vLLM's method: "
                   "numpy linear percentiles, population std) match", numbers)


def _count_checks(path: Path, data: dict[str, Any], totals: dict[str, Any], rel_tol: float,
                  traced: list[Finding] | None = None) -> list[Finding]:
    out: list[Finding] = []
    for key, column, what, unit in (
        ("completed", "completed", "successful requests in the arrays", "requests"),
        ("failed", "failed", "failed requests in the arrays", "requests"),
        ("total_input_tokens", "total_input_tokens", "input tokens of completed requests", "tokens"),
        ("total_output_tokens", "total_output_tokens", "output tokens of completed requests", "tokens"),
        ("request_throughput", "request_throughput", "completed / duration", "requests/s"),
        ("output_throughput", "output_throughput", "total_output_tokens / duration", "tokens/s"),
        ("total_token_throughput", "total_token_throughput", "(input + output tokens) / duration", "tokens/s"),
    ):
        wrong: dict[str, Any] = {}
        explain: dict[str, str] = {}
        if key == "total_input_tokens":
            wrong["input_tokens_of_failed_requests_counted"] = totals["total_input_tokens_all_prompts"]
            explain["input_tokens_of_failed_requests_counted"] = "it counts the prompts of failed requests too"
        out.append(compare_figure(f"count_{key}", optional_number(data, key, path), totals[column], rel_tol,
                                  what=f"{key} ({what})", unit=unit, wrong=wrong, explain=explain,
                                  missing=f"{key}: absent from this report (older vLLM files lack it)"))
    zeros = totals["failed_stored_as_zeros"]
    out.append(Finding("failed_requests_as_zeros", PASS,
                       f"{totals['failed']} failed request(s) in the arrays, {zeros} stored as zeros (TTFT 0, no "
                       "output); the recomputed statistics leave them out, as vLLM does", dict(totals)))
    n_out = totals["distinct_output_lens"]
    if totals["completed"] > 1 and n_out == 1:
        out.append(_equal_output_lengths(totals, traced))
    else:
        out.append(Finding("output_tokens_assumed_max_tokens", PASS,
                           f"output lengths vary ({n_out} distinct values, max {totals['max_output_len']}): counted, "
                           "not assumed from max_tokens", {"distinct_output_lens": n_out}))
    return out


def _summary_only_checks(path: Path, data: dict[str, Any], rel_tol: float) -> list[Finding]:
    goodput = optional_number(data, "request_goodput", path)
    if goodput is None:
        goodput = optional_number(data, "request_goodput:", path)
    throughput = optional_number(data, "request_throughput", path)
    if goodput is None or throughput is None:
        return [Finding("goodput_le_throughput", CANNOT, "no goodput figure (request_goodput is null or absent: the "
                        "run set no --goodput SLOs)", {"request_goodput": goodput, "request_throughput": throughput})]
    ok = goodput <= throughput * (1 + rel_tol)
    return [Finding("goodput_le_throughput", PASS if ok else FAIL,
                    f"request_goodput {goodput:g} {'<=' if ok else '>'} request_throughput {throughput:g} requests/s"
                    + ("" if ok else ": SLO-passing requests are a subset of completed ones"),
                    {"request_goodput": goodput, "request_throughput": throughput})]


def _equal_output_lengths(totals: dict[str, Any], traced: list[Finding] | None) -> Finding:
    """Every request has the same output length: assumed from max_tokens, or every request ran
    to max_tokens? vLLM bench reads the counts from the server's usage when it sends one, so only
    the traces can tell (their usage per request)."""
    n, length = totals["completed"], totals["max_output_len"]
    said = (f"every one of {n} requests has exactly {length:g} output tokens (total {totals['total_output_tokens']:g})")
    by_trace = next((f for f in traced or [] if f.check == "traces:output_tokens"), None)
    numbers = dict(totals)
    if by_trace is not None and by_trace.verdict == PASS:
        return Finding("output_tokens_assumed_max_tokens", PASS, f"{said}: the traces confirm it request by request "
                       f"({by_trace.detail}); the model simply never stopped before max_tokens", numbers)
    if by_trace is not None and by_trace.verdict == FAIL:
        return Finding("output_tokens_assumed_max_tokens", FAIL, f"{said}, but the traced counts differ: "
                       f"{by_trace.detail}", numbers)
    return Finding("output_tokens_assumed_max_tokens", CANNOT, f"{said}: either every request ran to max_tokens "
                   "(random datasets without a stop, or --ignore-eos) or the counts were assumed from max_tokens; vLLM "
                   "bench reads them from the server's usage, which this report does not keep: pass --db with the "
                   "run's traces (--request-id-prefix) to confirm per request", numbers)


def _chunking(totals: dict[str, Any], stats: dict[str, dict[str, Any]], rel_tol: float) -> Finding:
    multi = totals["multi_token_chunk_requests"]
    extra = totals["extra_gap_requests"]
    completed = totals["completed"]
    itl = stats.get("itl", {}).get("mean_value")
    tpot = stats.get("tpot", {}).get("mean_value")
    numbers = {"multi_token_chunk_requests": multi, "extra_gap_requests": extra,
               "one_token_requests": totals["one_token_requests"], "completed": completed,
               "mean_itl_ms": itl, "mean_tpot_ms": tpot}
    if itl is None or tpot is None:
        return Finding("itl_vs_tpot_chunking", CANNOT, "needs ITL gaps and TPOT values (requests with more than one "
                       "output token)", numbers)
    one_token = (f"; {totals['one_token_requests']} one-token requests have no TPOT and are left out of it"
                 if totals["one_token_requests"] else "")
    if extra:
        ratio = totals["extra_gap_itl_over_tpot"]
        expected = tpot * ratio if ratio is not None else None
        numbers.update({"diagnosis": "role_chunk_counted", "first_gap_max_ms": totals["extra_gap_max_first_gap_ms"],
                        "mean_itl_expected_ms": expected})
        identity = (f"; mean ITL {itl:.6g} ms = mean TPOT {tpot:.6g} ms x ({totals['max_output_len']:g} - 1) / "
                    f"{totals['max_output_len']:g} = {expected:.6g} ms" if expected is not None
                    and abs(expected - itl) <= max(rel_tol * abs(expected), 1e-9) else "")
        return Finding("itl_vs_tpot_chunking", PASS,
                       f"role_chunk_counted: {extra} of {completed} requests have as many ITL gaps as output tokens "
                       f"(one more than O - 1), the first gap at most {totals['extra_gap_max_first_gap_ms']:.3g} ms: "
                       "the benchmark client (openai-chat backend) timed the role-only first chunk, which carries no "
                       "token, as the first token, so TTFT ends at that chunk and the first content chunk adds a "
                       f"near-zero gap; ITL divides decode time by O gaps, TPOT by O - 1{identity}{one_token}", numbers)
    if multi:
        return Finding("itl_vs_tpot_chunking", PASS,
                       f"{multi} of {completed} requests have multi-token chunks (output_len > gaps + 1): ITL is per "
                       f"chunk, TPOT per token, so mean ITL {itl:.6g} ms and mean TPOT {tpot:.6g} ms legitimately "
                       f"differ{one_token}", numbers)
    if abs(itl - tpot) <= max(rel_tol * abs(tpot), 1e-9):
        return Finding("itl_vs_tpot_chunking", PASS,
                       f"one token per chunk in every request (gaps = output_len - 1): mean ITL {itl:.6g} ms and mean "
                       f"TPOT {tpot:.6g} ms are equal{one_token}", numbers)
    return Finding("itl_vs_tpot_chunking", PASS,
                   f"one token per chunk in every request (gaps = output_len - 1): mean ITL {itl:.6g} ms (over every "
                   f"gap) and mean TPOT {tpot:.6g} ms (over every request) differ only because longer requests weigh "
                   f"more in the gap mean{one_token}", numbers)
