"""``--db``: recompute every claimed figure from the traces with the analyzer's own metric
queries (queries/requests.sql, summary.sql, window.sql) and compare.

A figure without ``stat`` is one request's value: it is compared when the traces hold exactly
one request (else ``cannot_check``: say which statistic the figure is). ``stat: mean | p50 |
p90 | p99`` figures are compared with summary.sql's distribution over the traced requests.
A model constant (``kv_bytes_per_token``) is no request's value and needs no statistic: it is
compared with the one value every traced request gives (any perspective). The perspective is
the best one the traces have (client, else server, else engine). Each figure is judged
within the precision it is written to (``Claim.half_unit``).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from analyzer.audit.claims_file import Claims
from analyzer.audit.compare import CANNOT, Finding, compare_figure
from analyzer.audit.records_traces import traces_copy
from analyzer.query.runner import run_query

__all__ = ["check_claims_against_traces"]

_PER_REQUEST = ("input_tokens", "output_tokens", "ttft_ms", "tpot_ms", "e2e_ms", "decode_output_tokens_per_second",
                "whole_request_output_tokens_per_second")
#: figures of the model, the same for every request: compared with the traces' one value
_MODEL_CONSTANTS = ("kv_bytes_per_token",)
_SUMMARY_STAT = {"mean": "mean", "p50": "p50", "p90": "p90", "p99": "p99"}
_WINDOW = ("window_s", "attempted", "succeeded", "request_throughput_rps", "error_rate")
_UNITS = {"ttft_ms": "ms", "tpot_ms": "ms", "e2e_ms": "ms", "itl_ms": "ms", "window_s": "s"}


def check_claims_against_traces(claims: Claims, db: str | Path, rel_tol: float) -> list[Finding]:
    """One finding per claimed figure that traces can give (prefixed ``traces:``)."""
    # The user's database stays untouched: its tables are copied into memory, where the
    # metric queries install their views.
    con = traces_copy(db)
    try:
        requests = run_query(con, "requests").dicts()
        every_request = requests
        perspectives = {r["perspective"] for r in requests}
        perspective = next((p for p in ("client", "server", "engine") if p in perspectives), None)
        if perspective is None:
            return [Finding("traces", CANNOT, f"{db}: no requests in the traces", {})]
        requests = [r for r in requests if r["perspective"] == perspective]
        summary = {r["metric"]: r for r in run_query(con, "summary", {"perspective": perspective}).dicts()}
        window = run_query(con, "window", {"perspective": perspective}).dicts()
    finally:
        con.close()
    out: list[Finding] = []
    for name, claim in claims.figures.items():
        check = f"traces:{name}"
        unit = _UNITS.get(name, "")
        where = f"{name} vs the traces ({perspective} perspective, {len(requests)} request(s))"
        if name in _WINDOW:
            value = window[0].get(name) if window else None
            out.append(compare_figure(check, claim.value, value, rel_tol, what=where + ", closed cohort over all "
                                      "requests", unit=unit, missing="window.sql gives no value",
                                      half_unit=claim.half_unit))
            continue
        if name in _MODEL_CONSTANTS:
            out.append(_model_constant(check, claim.value, every_request, name, rel_tol))
            continue
        if claim.stat == "request":
            if name not in _PER_REQUEST:
                out.append(Finding(check, CANNOT, f"{name} is not a per-request figure of requests.sql", {}))
            elif len(requests) != 1:
                out.append(Finding(check, CANNOT, f"{name} is one request's value but the traces hold "
                                   f"{len(requests)} requests: add stat: mean | p50 | p90 | p99", {}))
            else:
                out.append(compare_figure(check, claim.value, requests[0].get(name), rel_tol, what=where, unit=unit,
                                          missing=f"requests.sql gives no {name} ({requests[0].get('null_reason')})",
                                          half_unit=claim.half_unit))
            continue
        row = summary.get(name)
        if row is None:
            out.append(Finding(check, CANNOT, f"summary.sql has no distribution of {name}", {}))
            continue
        column = _SUMMARY_STAT[claim.stat]
        wrong: dict[str, Any] = {}
        explain: dict[str, str] = {}
        if name == "tpot_ms" and "itl_ms" in summary:
            wrong["per_chunk_itl_as_tpot"] = summary["itl_ms"].get(column)
            explain["per_chunk_itl_as_tpot"] = ("it is the per-chunk ITL statistic: with multi-token chunks a "
                                                "per-chunk gap is not a per-token TPOT")
        if name == "itl_ms" and "itl_per_token_ms" in summary:
            wrong["per_token_itl_as_itl"] = summary["itl_per_token_ms"].get(column)
        out.append(compare_figure(check, claim.value, row.get(column), rel_tol, what=f"{claim.stat} {where}",
                                  unit=unit, wrong=wrong, explain=explain,
                                  missing=f"summary.sql gives no {claim.stat} of {name} ({row.get('null_reason')})",
                                  half_unit=claim.half_unit))
    return out


def _model_constant(check: str, claimed: float, requests: list[dict[str, Any]], name: str,
                    rel_tol: float) -> Finding:
    """A model constant against the value the traced requests give (requests.sql, every
    perspective): one value for all of them is compared; none, or several (several models
    in one database), cannot be."""
    values = sorted({r[name] for r in requests if r.get(name) is not None})
    what = f"{name} (a model constant) vs the traces"
    if not values:
        reasons = sorted({str(r.get("kv_null_reason")) for r in requests if r.get("kv_null_reason")})
        why = f" ({'; '.join(reasons[:2])})" if reasons else ""
        return Finding(check, CANNOT, f"{what}: none of the {len(requests)} traced request rows gives {name}{why}",
                       {"claimed": claimed})
    if len(values) > 1:
        return Finding(check, CANNOT, f"{what}: the traced requests give {len(values)} different values "
                       f"({', '.join(f'{x:g}' for x in values[:5])}): several models in one database; audit one "
                       "model's traces", {"claimed": claimed, "trace_values": values[:5]})
    given = sum(r.get(name) is not None for r in requests)
    return compare_figure(check, claimed, values[0], rel_tol, unit="bytes/token",
                          what=f"{what} (the same on all {given} traced request rows that give it)")
