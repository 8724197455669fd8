"""``--db`` for benchmark reports: join the report's per-request records to the traced requests
by id and compare request by request (queries/audit/records_vs_traces.sql).

A record joins the traced request whose ``client_request_id`` (the id the client sent: the
gateway's ``tokentrace.client_request_id`` = ``X-Request-ID``, vLLM's request id less its
``chatcmpl-`` prefix) or ``response_id`` equals the record's id (AIPerf: ``x_request_id``;
vLLM bench: ``<--request-id-prefix><index>``). Per joined request: output and input tokens
must be equal; TTFT and E2E measured by the client (the record) contain the server's (a
server-perspective trace): the record may exceed the trace by the network and client time, but
never be shorter by more than :data:`CONTAINMENT_SLACK_MS`; TPOT is the same definition on two
clocks and must agree within :data:`DEFINITION_REL_TOL`.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import astuple, dataclass
from pathlib import Path
from typing import Any

import duckdb

from analyzer.audit.compare import CANNOT, DEFINITION_REL_TOL, FAIL, PASS, Finding, audit_query, create_table
from analyzer.errors import AuditInputError
from analyzer.query.runner import run_query

__all__ = ["CONTAINMENT_SLACK_MS", "RequestRecord", "compare_records_with_traces", "load_traced_requests",
           "traces_copy"]

#: How far a client-measured TTFT / E2E may fall below the server-measured one (clock reading
#: granularity and the server's own stamping order), in ms.
CONTAINMENT_SLACK_MS = 1.0

_TRACED_COLUMNS = {"trace_id": "VARCHAR", "request_span_id": "VARCHAR", "perspective": "VARCHAR",
                   "source": "VARCHAR", "s_ns": "BIGINT", "ttft_ms": "DOUBLE", "e2e_ms": "DOUBLE",
                   "tpot_ms": "DOUBLE", "input_tokens": "BIGINT", "output_tokens": "BIGINT",
                   "output_tokens_basis": "VARCHAR", "response_id": "VARCHAR", "client_request_id": "VARCHAR",
                   "generated_tokens": "BIGINT", "outcome": "VARCHAR"}
_RECORD_COLUMNS = {"record_index": "INTEGER", "match_id": "VARCHAR", "ttft_ms": "DOUBLE", "e2e_ms": "DOUBLE",
                   "tpot_ms": "DOUBLE", "input_tokens": "DOUBLE", "output_tokens": "DOUBLE", "error": "VARCHAR"}


@dataclass(frozen=True)
class RequestRecord:
    """One request of a benchmark report: its index, the id it joins the traces by, and the
    report's figures for it (ms; tokens). None where the report does not give one. ``error``:
    the record's error code (e.g. "429"); None for a successful record."""

    record_index: int
    match_id: str | None
    ttft_ms: float | None
    e2e_ms: float | None
    tpot_ms: float | None
    input_tokens: float | None
    output_tokens: float | None
    error: str | None = None


def traces_copy(db: str | Path) -> duckdb.DuckDBPyConnection:
    """An in-memory connection holding a copy of the tables of the tokentrace database ``db``
    (attached read-only, never written); AuditInputError when it is not one."""
    con = duckdb.connect(":memory:")
    try:
        try:
            con.execute("ATTACH $path AS traces (READ_ONLY)", {"path": str(db)})
        except duckdb.Error as exc:
            raise AuditInputError(f"{db}: cannot open as a DuckDB database ({exc})") from None
        tables = [r[0] for r in con.execute("SELECT table_name FROM duckdb_tables() WHERE database_name = 'traces' "
                                            "AND schema_name = 'main'").fetchall()]
        if "spans" not in tables:
            raise AuditInputError(f"{db}: not a tokentrace database (no 'spans' table)")
        for table in tables:
            quoted = '"' + table.replace('"', '""') + '"'  # an identifier, quoted and escaped
            con.execute(f"CREATE TABLE main.{quoted} AS SELECT * FROM traces.main.{quoted}")
        con.execute("DETACH traces")
    except BaseException:
        con.close()
        raise
    return con


def load_traced_requests(db: str | Path) -> list[dict[str, Any]]:
    """The rows of queries/requests.sql over the traces in ``db`` (every perspective)."""
    con = traces_copy(db)
    try:
        return run_query(con, "requests").dicts()
    finally:
        con.close()


def compare_records_with_traces(con: duckdb.DuckDBPyConnection, traced: Sequence[dict[str, Any]],
                                records: Sequence[RequestRecord], *, id_what: str,
                                rel_tol: float) -> tuple[list[Finding], list[dict[str, Any]]]:
    """Findings ``traces:*`` of the per-request comparison, and the joined rows.

    ``id_what`` says what the records' ids are (for the detail), e.g. "AIPerf's x_request_id".
    """
    create_table(con, "audit_traced", _TRACED_COLUMNS,
                 [tuple(r.get(c) for c in _TRACED_COLUMNS) for r in traced])
    create_table(con, "audit_records", _RECORD_COLUMNS, [astuple(r) for r in records])
    every = audit_query(con, "records_vs_traces")
    rows = [r for r in every if r["record_error"] is None]
    joined = [r for r in rows if r["trace_id"] is not None]
    numbers: dict[str, Any] = {"records": len(rows), "joined": len(joined),
                               "traced_requests": len({(t["trace_id"], t["request_span_id"]) for t in traced})}
    errors = _error_records([r for r in every if r["record_error"] is not None], id_what)
    if not joined:
        with_ids = sum(1 for t in traced if t.get("client_request_id") or t.get("response_id"))
        return [Finding("traces:records_joined", CANNOT,
                        f"none of the {len(rows)} records' ids ({id_what}) is a client_request_id or response_id "
                        f"of the {numbers['traced_requests']} traced request(s) ({with_ids} of their rows carry an id; "
                        "a gateway records the client's id only when the request carried X-Request-ID)",
                        numbers)] + errors, every
    columns = sorted({r["id_column"] for r in joined})
    perspectives = sorted({f"{r['source']} {r['perspective']}" for r in joined})
    twice = [r["match_id"] for r in joined if r["matches"] > 1]
    numbers.update({"joined_by": columns, "perspectives": perspectives, "ids_matching_several": twice[:5]})
    missing = [r["match_id"] for r in rows if r["trace_id"] is None]
    detail = (f"{len(joined)} of {len(rows)} successful records joined to traced requests by {id_what} = requests."
              f"{' / '.join(columns)} ({', '.join(perspectives)} perspective)")
    if missing:
        detail += f"; {len(missing)} record(s) have no traced request (e.g. {', '.join(map(str, missing[:3]))})"
    if twice:
        detail += f"; {len(twice)} id(s) match several traced requests (the first by start time is used)"
    out = [Finding("traces:records_joined", PASS, detail, numbers)] + errors
    out += [_output_counts(joined), _equal_counts(joined, "input_tokens")]
    out += [_contains(joined, "ttft_ms"), _contains(joined, "e2e_ms"), _same_definition(joined, "tpot_ms")]
    return out, every


def _error_records(rows: Sequence[dict[str, Any]], id_what: str) -> list[Finding]:
    """traces:error_records_joined: the report's error records (e.g. 429s) joined to their
    traced requests by the same id; each must have ended unsuccessfully there. No finding
    when the report has no error record."""
    if not rows:
        return []
    joined = [r for r in rows if r["trace_id"] is not None]
    missing = [r["match_id"] for r in rows if r["trace_id"] is None]
    codes = sorted({str(r["record_error"]) for r in rows})
    outcomes = sorted({r["trace_outcome"] for r in joined})
    wrong = [r["match_id"] for r in joined if r["trace_outcome"] == "succeeded"]
    numbers = {"error_records": len(rows), "joined": len(joined), "record_error_codes": codes,
               "trace_outcomes": outcomes, "succeeded_in_traces": wrong[:5], "without_trace": missing[:5]}
    check = "traces:error_records_joined"
    if not joined:
        return [Finding(check, CANNOT, f"none of the {len(rows)} error records (codes {', '.join(codes)}) has a "
                        f"traced request with its id ({id_what})", numbers)]
    detail = (f"{len(joined)} of {len(rows)} error records (codes {', '.join(codes)}) joined their traced requests "
              f"by the same id; outcome there: {', '.join(outcomes)}")
    if missing:
        detail += f"; {len(missing)} have no traced request (e.g. {', '.join(map(str, missing[:3]))})"
    if wrong:
        return [Finding(check, FAIL, detail + f"; {len(wrong)} of them succeeded in the traces (e.g. "
                        f"{', '.join(map(str, wrong[:3]))}): the report and the server disagree", numbers)]
    return [Finding(check, PASS, detail, numbers)]


def _output_counts(joined: Sequence[dict[str, Any]]) -> Finding:
    """traces:output_tokens: the report's count is the usage the server returned, which counts
    every token up to the one that ended the answer (vLLM's rule; tokentrace's gateway
    too): the trace's G (a final stop token, or trailing tokens that decode to no text,
    included) or, after a stop-sequence match, its O. Equal to either passes; the detail says
    how many matched which."""
    pairs = [(r["match_id"], r["record_output_tokens"], r["trace_output_tokens"], r["trace_generated_tokens"])
             for r in joined if r["record_output_tokens"] is not None and r["trace_output_tokens"] is not None]
    if not pairs:
        return Finding("traces:output_tokens", CANNOT, "output_tokens: no joined request has it on both sides", {})
    to_o = [p for p in pairs if p[1] == p[2]]
    to_g = [p for p in pairs if p[1] != p[2] and p[3] is not None and p[1] == p[3]]
    wrong = [p for p in pairs if p not in to_o and p not in to_g]
    bases = sorted({r["output_tokens_basis"] for r in joined if r["output_tokens_basis"]})
    numbers = {"compared": len(pairs), "differ": len(wrong), "equal_to_output_tokens": len(to_o),
               "equal_to_generated_tokens": len(to_g), "first_differences": [p[:3] for p in wrong[:5]],
               "trace_basis": bases}
    read = f" (traces: {', '.join(bases)})" if bases else ""
    if wrong:
        shown = "; ".join(f"{i}: report {a:g}, traces O {b:g}" + (f", G {g:g}" if g is not None else "")
                          for i, a, b, g in wrong[:5])
        return Finding("traces:output_tokens", FAIL, f"output_tokens: {len(wrong)} of {len(pairs)} joined requests "
                       f"differ{read}: {shown}", numbers)
    detail = f"output_tokens: equal on all {len(pairs)} joined requests{read}"
    if to_g:
        detail += (f"; {len(to_g)} of them to the generated tokens G (traces' O + the final stop token or trailing "
                   "tokens without text: the usage counts them, as vLLM's does), "
                   f"{len(to_o)} to the visible tokens O")
    return Finding("traces:output_tokens", PASS, detail, numbers)


def _pairs(joined: Sequence[dict[str, Any]], name: str) -> list[tuple[Any, float, float]]:
    return [(r["match_id"], r[f"record_{name}"], r[f"trace_{name}"]) for r in joined
            if r[f"record_{name}"] is not None and r[f"trace_{name}"] is not None]


def _equal_counts(joined: Sequence[dict[str, Any]], name: str) -> Finding:
    check = f"traces:{name}"
    pairs = _pairs(joined, name)
    if not pairs:
        return Finding(check, CANNOT, f"{name}: no joined request has it on both sides", {})
    wrong = [(i, a, b) for i, a, b in pairs if a != b]
    bases = sorted({r["output_tokens_basis"] for r in joined if r["output_tokens_basis"]}) if name == "output_tokens" else []
    numbers = {"compared": len(pairs), "differ": len(wrong), "first_differences": wrong[:5], "trace_basis": bases}
    read = f" (traces: {', '.join(bases)})" if bases else ""
    if wrong:
        shown = "; ".join(f"{i}: report {a:g}, traces {b:g}" for i, a, b in wrong[:5])
        return Finding(check, FAIL, f"{name}: {len(wrong)} of {len(pairs)} joined requests differ{read}: {shown}",
                       numbers)
    return Finding(check, PASS, f"{name}: equal on all {len(pairs)} joined requests{read}", numbers)


def _contains(joined: Sequence[dict[str, Any]], name: str) -> Finding:
    """A client-measured interval vs the traced one: direct comparison on a client-perspective
    trace; containment (record >= trace) on a server-perspective one."""
    check = f"traces:{name}"
    pairs = _pairs(joined, name)
    if not pairs:
        return Finding(check, CANNOT, f"{name}: no joined request has it on both sides (a record of a non-streamed "
                       "request has no TTFT; a trace without chunk events or latency attributes has none)", {})
    client = all(r["perspective"] == "client" for r in joined)
    diffs = [a - b for _, a, b in pairs]
    numbers: dict[str, Any] = {"compared": len(pairs), "mean_diff_ms": sum(diffs) / len(diffs), "min_diff_ms": min(diffs),
               "max_diff_ms": max(diffs), "slack_ms": CONTAINMENT_SLACK_MS}
    spread = (f"report - traces: mean {numbers['mean_diff_ms']:.3f} ms, min {numbers['min_diff_ms']:.3f}, "
              f"max {numbers['max_diff_ms']:.3f} over {len(pairs)} joined requests")
    if client:
        wrong = [(i, a, b) for i, a, b in pairs if abs(a - b) > max(CONTAINMENT_SLACK_MS, DEFINITION_REL_TOL * abs(a))]
        rule = "both client-measured: equal within 1 ms or 1 %"
    else:
        wrong = [(i, a, b) for i, a, b in pairs if a < b - CONTAINMENT_SLACK_MS]
        rule = ("the report measures at the client, the traces at the server: the client's interval contains the "
                "server's (network and client time), so the report may be longer, never shorter")
    numbers["violations"] = wrong[:5]
    if wrong:
        shown = "; ".join(f"{i}: report {a:.3f} ms, traces {b:.3f} ms" for i, a, b in wrong[:5])
        return Finding(check, FAIL, f"{name}: {len(wrong)} request(s) break the rule ({rule}): {shown}", numbers)
    return Finding(check, PASS, f"{name}: {spread}; {rule}", numbers)


def _same_definition(joined: Sequence[dict[str, Any]], name: str) -> Finding:
    check = f"traces:{name}"
    pairs = _pairs(joined, name)
    if not pairs:
        return Finding(check, CANNOT, f"{name}: no joined request has it on both sides (one-token requests, "
                       "non-streamed ones (one body write: no per-token timing) and traces without first-token "
                       "times have none)", {})
    rel = [abs(a - b) / abs(b) if b else float("inf") for _, a, b in pairs]
    diffs = [a - b for _, a, b in pairs]
    numbers = {"compared": len(pairs), "max_abs_diff_ms": max(abs(d) for d in diffs), "max_rel_diff": max(rel),
               "mean_diff_ms": sum(diffs) / len(diffs), "rel_tol": DEFINITION_REL_TOL}
    wrong = [(i, a, b) for (i, a, b), x in zip(pairs, rel) if x > DEFINITION_REL_TOL]
    what = ("(E2E - TTFT) / (O - 1) on both sides, measured at two points: they differ by the change in transit "
            "time between the first and the last token, / (O - 1)")
    if wrong:
        shown = "; ".join(f"{i}: report {a:.4f} ms, traces {b:.4f} ms" for i, a, b in wrong[:5])
        return Finding(check, FAIL, f"{name}: {len(wrong)} of {len(pairs)} joined requests differ by more than "
                       f"{DEFINITION_REL_TOL:.0%}: {shown}; {what}", numbers)
    return Finding(check, PASS, f"{name}: agree on all {len(pairs)} joined requests within {DEFINITION_REL_TOL:.0%} "
                   f"(largest difference {numbers['max_abs_diff_ms']:.4f} ms, {numbers['max_rel_diff']:.2e} "
                   f"relative); {what}", numbers)
