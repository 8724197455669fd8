"""``--db`` for guidellm reports: each per-request record joined to its traced request by
``response_id`` (the id the server returned, e.g. tokentrace's ``chatcmpl-...``; guidellm
keeps it per record) and compared figure by figure (analyzer/audit/records_traces.py).

The record's figures in the traces' definitions: TTFT = first token - request start; E2E =
request_latency; TPOT = guidellm's inter_token_latency_ms, (last - first token) / (O - 1)
(guidellm's own time_per_output_token_ms includes TTFT and is not the traces' TPOT); tokens
from the usage. Errored and incomplete records join as error records: they must have ended
unsuccessfully in the traces."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import duckdb

from analyzer.audit.compare import CANNOT, DEFINITION_REL_TOL, FAIL, PASS, Finding
from analyzer.audit.records_traces import (
    CONTAINMENT_SLACK_MS,
    RequestRecord,
    compare_records_with_traces,
    load_traced_requests,
)

__all__ = ["records_against_traces"]


def records_against_traces(rows: list[dict[str, Any]], con: duckdb.DuckDBPyConnection, db: str | Path,
                           rel_tol: float) -> list[Finding]:
    """``traces:*`` findings for one benchmark's records (rows of audit/guidellm_requests.sql)."""
    records: list[RequestRecord] = []
    for index, r in enumerate(rows):
        if r["status"] != "successful":
            records.append(RequestRecord(index, r["response_id"], None, None, None, None, None,
                                         error=r["error"] or r["status"]))
            continue
        latency = r["request_latency_s"]
        records.append(RequestRecord(index, r["response_id"], r["ttft_ms"], None if latency is None else latency * 1000,
                                     r["itl_ms"], r["prompt_tokens"], r["output_tokens"]))
    if not any(r.match_id for r in records):
        return [Finding("traces:records_joined", CANNOT, "no record carries a response_id (the server returned no "
                        "id, or the requests failed before a response): nothing to join the traces by", {})]
    traced = load_traced_requests(db)
    findings, joined = compare_records_with_traces(con, traced, records, rel_tol=rel_tol,
                                                   id_what="guidellm's response_id")
    # usage counting tokens without text (G > O): guidellm divides by G - 1 and ends at the chunk
    # carrying the usage, the traces by O - 1 at the last visible chunk: not the same TPOT
    other = {r["record_index"] for r in joined if r["trace_id"] is not None and r["record_output_tokens"] is not None
             and r["trace_output_tokens"] is not None and r["record_output_tokens"] != r["trace_output_tokens"]}
    if other:
        kept = [RequestRecord(r.record_index, r.match_id, r.ttft_ms, r.e2e_ms, None if r.record_index in other
                              else r.tpot_ms, r.input_tokens, r.output_tokens, r.error) for r in records]
        findings, joined = compare_records_with_traces(con, traced, kept, rel_tol=rel_tol,
                                                       id_what="guidellm's response_id")
    tpot = next(f for f in findings if f.check == "traces:tpot_ms")
    if other:
        tpot.detail += (f"; {len(other)} request(s) left out: their usage counts tokens without text (G > O), so "
                        "guidellm's (last - first token) / (G - 1) and the traces' per-visible-token TPOT differ by "
                        "definition")
        tpot.numbers["left_out_usage_counts_g"] = len(other)
    if tpot.verdict == FAIL:
        _within_transit(tpot, joined)
    return findings


def _within_transit(tpot: Finding, joined: list[dict[str, Any]]) -> None:
    """A TPOT that differs by more than 1 % still agrees when its decode window, (O - 1) x TPOT,
    differs by no more than the transit the client added at its two ends: the TTFT excess (client
    - server, at the first token) plus the E2E excess (at the end) plus 1 ms. With a fast model
    (a few ms a token) the client's event loop alone moves the window by more than 1 %."""
    beyond: list[str] = []
    widest = 0.0
    for r in joined:
        a, b, n = r["record_tpot_ms"], r["trace_tpot_ms"], r["record_output_tokens"]
        if r["trace_id"] is None or a is None or b is None or not n or abs(a - b) <= DEFINITION_REL_TOL * abs(b):
            continue
        shift = abs(a - b) * (n - 1)
        bound = (max(0.0, (r["record_ttft_ms"] or 0) - (r["trace_ttft_ms"] or 0))
                 + max(0.0, (r["record_e2e_ms"] or 0) - (r["trace_e2e_ms"] or 0)) + CONTAINMENT_SLACK_MS)
        widest = max(widest, shift)
        if shift > bound:
            beyond.append(f"{r['match_id']}: decode window {shift:.3f} ms apart, transit bound {bound:.3f} ms")
    tpot.numbers["beyond_transit"] = beyond[:5]
    if beyond:
        tpot.detail += f"; beyond the transit the client added: {'; '.join(beyond[:3])}"
        return
    tpot.verdict = PASS
    tpot.detail += (f"; each of them within the transit the client added at the two ends (TTFT excess + E2E excess "
                    f"+ 1 ms; widest decode-window difference {widest:.3f} ms): the same TPOT on two clocks")
