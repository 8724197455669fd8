"""AIPerf's per-request records (``profile_export.jsonl``): read them, check AIPerf's own
per-record identities (queries/audit/aiperf_record_identities.sql), and join them to traced
requests by ``metadata.x_request_id`` (the X-Request-ID AIPerf sends: the gateway's
``tokentrace.client_request_id``).

Layouts read: AIPerf 0.13 (``metadata.request_start_ns`` / ``request_end_ns`` /
``x_request_id``, ``metrics.<name>.value``) and the 2025-10 one (``metadata.timestamp_ns``,
``metrics.min_request_timestamp`` / ``max_response_timestamp``).
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import duckdb

from analyzer.audit.compare import CANNOT, FAIL, PASS, Finding, agree, audit_query, create_table
from analyzer.audit.records_traces import RequestRecord, compare_records_with_traces, load_traced_requests
from analyzer.errors import AuditInputError

__all__ = ["AiperfRecords", "check_aiperf_records", "osl_against_server", "read_aiperf_records",
           "records_against_traces"]

_COLUMNS = {"record_index": "INTEGER", "error_code": "VARCHAR", "ttft_ms": "DOUBLE", "request_latency_ms": "DOUBLE",
            "output_sequence_length": "DOUBLE", "output_token_count": "DOUBLE", "reasoning_token_count": "DOUBLE",
            "inter_token_latency_ms": "DOUBLE", "output_token_throughput_per_user": "DOUBLE", "ttst_ms": "DOUBLE",
            "chunk_gaps": "INTEGER", "chunk_gap_sum_ms": "DOUBLE", "first_chunk_gap_ms": "DOUBLE",
            "request_start_ns": "BIGINT", "response_end_ns": "BIGINT", "request_end_ns": "BIGINT"}


@dataclass
class AiperfRecords:
    """The records file: one row per record (the columns of aiperf_records), and per record its
    x_request_id, request end (ns), usage prompt / completion tokens, and AIPerf's own input
    sequence length (ISL: the tokens of the prompt text as AIPerf's tokenizer counts them)."""

    path: Path
    rows: list[tuple[Any, ...]]
    request_ids: list[str | None]
    request_end_ns: list[float | int | None]
    usage_prompt_tokens: list[float | None]
    usage_completion_tokens: list[float | None]
    input_sequence_lengths: list[float | None]
    #: per record, its inter-chunk gaps (ms, AIPerf's inter_chunk_latency), in order
    chunk_gaps_ms: list[list[float]] = field(default_factory=list)

    @property
    def window_s(self) -> float | None:
        """First request start -> last request end over the records (s), None when unknown."""
        starts = [r[13] for r in self.rows if r[13] is not None]
        ends = [e for e in self.request_end_ns if e is not None] or [r[14] for r in self.rows if r[14] is not None]
        if not starts or not ends or max(ends) <= min(starts):
            return None
        return (max(ends) - min(starts)) / 1e9


def _metric_value(rec: dict[str, Any], name: str, where: str) -> Any:
    metrics = rec.get("metrics") or {}
    item = metrics.get(name)
    if item is None:
        return None
    if not isinstance(item, dict) or "value" not in item:
        raise AuditInputError(f"{where}: metrics.{name} has no 'value'")
    return item["value"]


def _num(value: Any, where: str) -> float | int | None:
    """A record value for a numeric column: None stays None; ints (counts, ns) and floats pass."""
    if value is None or isinstance(value, bool):
        return None
    if isinstance(value, (int, float)):
        return value
    raise AuditInputError(f"{where}: record value {value!r} is not a number")


def read_aiperf_records(path: Path) -> AiperfRecords:
    """Parse profile_export.jsonl; AuditInputError naming file and line for a bad record."""
    try:
        lines = path.read_text().splitlines()
    except FileNotFoundError:
        raise AuditInputError(f"{path}: no such file") from None
    except IsADirectoryError:
        raise AuditInputError(f"{path}: is a directory, expected AIPerf's profile_export.jsonl") from None
    out = AiperfRecords(path, [], [], [], [], [], [])
    for i, line in enumerate(lines):
        if not line.strip():
            continue
        where = f"{path}:{i + 1}"
        try:
            rec = json.loads(line)
        except json.JSONDecodeError as exc:
            raise AuditInputError(f"{where}: not valid JSON ({exc.msg})") from None
        if not isinstance(rec, dict):
            raise AuditInputError(f"{where}: an AIPerf record is a JSON object with 'metadata' and 'metrics'")
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
        start = _metric_value(rec, "min_request_timestamp", where) or meta.get("request_start_ns") or meta.get("timestamp_ns")
        error = None if err is None else str(err.get("code", "error")) if isinstance(err, dict) else str(err)
        request_end = _num(meta.get("request_end_ns"), where)
        row = (len(out.rows), error, *vals, len(gaps), float(sum(gaps)) if gaps else None, gaps[0] if gaps else None,
               start, _metric_value(rec, "max_response_timestamp", where), request_end)
        out.rows.append(tuple(_num(v, where) if k > 1 else v for k, v in enumerate(row)))
        out.request_ids.append(str(meta["x_request_id"]) if meta.get("x_request_id") else None)
        out.request_end_ns.append(request_end)
        out.input_sequence_lengths.append(_num(_metric_value(rec, "input_sequence_length", where), where))
        out.usage_prompt_tokens.append(_num(_metric_value(rec, "usage_prompt_tokens", where), where))
        out.usage_completion_tokens.append(_num(_metric_value(rec, "usage_completion_tokens", where), where))
        out.chunk_gaps_ms.append([float(v) for g in gaps if (v := _num(g, where)) is not None])
    return out


# (record column, its value by AIPerf's definition, the identity): each one is evaluated on
# the successful records that have both figures; only the evaluated ones are listed as holding.
_IDENTITIES = (("inter_token_latency_ms", "itl_ms_expected", "ITL = (latency - TTFT) / (OSL - 1)"),
               ("output_token_throughput_per_user", "per_user_expected", "per-user rate = 1000 / ITL"),
               ("request_latency_ms", "latency_ms_from_chunks", "latency = TTFT + sum(inter-chunk gaps)"),
               ("request_latency_ms", "latency_ms_from_timestamps",
                "latency = last response - request start (max_response_timestamp)"),
               ("output_sequence_length", "osl_expected", "OSL = visible + reasoning tokens"),
               ("ttst_ms", "first_chunk_gap_ms", "TTST = first inter-chunk gap"))
_REQUEST_END = "latency <= request end - request start (0.13's metadata.request_end_ns)"


def check_aiperf_records(records: AiperfRecords, m: dict[str, dict[str, Any]], con: duckdb.DuckDBPyConnection,
                         rel_tol: float) -> list[Finding]:
    """record_identities (AIPerf's per-record definitions hold; each listed one was evaluated on
    at least one record, the others are named as not evaluated) and recompute_stats."""
    rows = records.rows
    create_table(con, "aiperf_records", _COLUMNS, rows)
    ident = audit_query(con, "aiperf_record_identities")
    failed = sum(r[1] is not None for r in rows)
    tol = max(rel_tol, 1e-6)
    problems: list[str] = []
    evaluated: dict[str, int] = {}
    for got, want, what in _IDENTITIES:
        evaluated[what] = 0
        for r in ident:
            if r[got] is None or r[want] is None:
                continue
            evaluated[what] += 1
            if not agree(r[got], r[want], tol):
                problems.append(f"record {r['record_index'] + 1}: {what}: {r[got]:.6g} vs {r[want]:.6g}")
    # 0.13 has no last-response timestamp, only the request's end: the latency (to the last
    # response) cannot exceed it; the tail (end - start - latency) is reported
    tails = [r["request_tail_ms"] for r in ident if r["request_tail_ms"] is not None]
    evaluated[_REQUEST_END] = len(tails)
    for r in ident:
        tail = r["request_tail_ms"]
        if tail is not None and tail < -tol * abs(r["request_span_ms"]):
            problems.append(f"record {r['record_index'] + 1}: {_REQUEST_END}: latency {r['request_latency_ms']:.6g} "
                            f"ms > request end - start {r['request_span_ms']:.6g} ms")
    held = [f"{what} ({n})" for what, n in evaluated.items() if n]
    absent = [what for what, n in evaluated.items() if not n]
    checked = sum(evaluated.values())
    numbers: dict[str, Any] = {"records": len(rows), "failed_records": failed, "successful_records": len(ident),
                               "identities_checked": checked, "evaluated": evaluated, "not_evaluated": absent}
    if tails:
        numbers.update({"request_tail_min_ms": min(tails), "request_tail_max_ms": max(tails)})
    if problems:
        detail = "; ".join(problems)
    elif not checked:
        detail = (f"no identity could be evaluated on the {len(ident)} successful record(s): their fields are absent "
                  f"({'; '.join(absent)})")
    else:
        detail = (f"{checked} per-record identities hold over {len(ident)} successful record(s) ({failed} error "
                  f"record(s)), each evaluated on the records named: " + "; ".join(held))
        if tails:
            detail += f" (request end - start - latency: {min(tails):.3f} to {max(tails):.3f} ms)"
        if absent:
            detail += "; not evaluated, their fields absent from these records: " + "; ".join(absent)
    verdict = FAIL if problems else PASS if checked else CANNOT
    out = [Finding("record_identities", verdict, detail, numbers)]
    count = m.get("time_to_first_token", {}).get("count")
    if count is not None and len(ident) != count:
        out.append(Finding("recompute_stats", CANNOT, f"{records.path.name} holds {len(ident)} successful record(s), "
                           f"the report summarises {count:g}: a partial records file cannot reproduce the statistics",
                           numbers))
    else:
        from analyzer.audit.aiperf_summary import recompute_summary

        out.append(recompute_summary(records.path, m, con, rel_tol))
    return out


def records_against_traces(records: AiperfRecords, con: duckdb.DuckDBPyConnection, db: str | Path,
                           rel_tol: float, total_isl: float | None = None
                           ) -> tuple[list[Finding], list[dict[str, Any]]]:
    """Each record against the traced request whose client_request_id (the gateway's
    tokentrace.client_request_id) is its x_request_id: successful records figure by figure,
    error records (e.g. 429s) by their outcome in the traces (traces:error_records_joined).
    The record's TPOT is recomputed as (request_latency - TTFT) / (usage_completion_tokens - 1),
    the traces' definition: AIPerf's own inter_token_latency divides by its re-tokenized
    output_sequence_length, which can differ from the server's count by a token or two. Tokens:
    usage_completion_tokens / usage_prompt_tokens (the server's usage as AIPerf received it),
    else AIPerf's lengths. AIPerf's ISL against the input tokens the server processed:
    traces:input_tokens_vs_isl (``total_isl``: the report's, named when given). Returns the
    findings and the rows of records_vs_traces.sql (empty when no record carries an id)."""
    out: list[RequestRecord] = []
    for row, rid, prompt, completion in zip(records.rows, records.request_ids, records.usage_prompt_tokens,
                                            records.usage_completion_tokens):
        if row[1] is not None:  # an error record: AIPerf leaves it out of its statistics
            out.append(RequestRecord(row[0], rid, None, None, None, None, None, error=row[1]))
            continue
        ttft, latency, osl = row[2], row[3], row[4]
        tokens = completion if completion is not None else osl
        tpot = (latency - ttft) / (tokens - 1) if None not in (latency, ttft, tokens) and tokens > 1 else None
        out.append(RequestRecord(row[0], rid, ttft, latency, tpot, prompt, tokens))
    if not any(r.match_id for r in out):
        return [Finding("traces:records_joined", CANNOT, f"{records.path.name}: no record carries "
                        "metadata.x_request_id (AIPerf before 0.13 did not export it): nothing to join the traces by",
                        {})], []
    findings, rows = compare_records_with_traces(con, load_traced_requests(db), out, rel_tol=rel_tol,
                                                 id_what="AIPerf's metadata.x_request_id")
    findings.append(_isl_against_server(records, rows, total_isl))
    return findings, rows


def _isl_against_server(records: AiperfRecords, rows: list[dict[str, Any]], total_isl: float | None) -> Finding:
    """traces:input_tokens_vs_isl: AIPerf's input_sequence_length (the tokens of the prompt text
    it generated, by its tokenizer) summed over the joined successful records, against the input
    tokens the server processed for them (the traces' input_tokens: the prompt after the chat
    template). A difference of definitions, not an error: pass, with the difference named."""
    isl = records.input_sequence_lengths
    pairs = [(isl[r["record_index"]], r["trace_input_tokens"]) for r in rows
             if r["record_error"] is None and r["trace_id"] is not None
             and isl[r["record_index"]] is not None and r["trace_input_tokens"] is not None]
    check = "traces:input_tokens_vs_isl"
    if not pairs:
        return Finding(check, CANNOT, "no joined record has both AIPerf's input_sequence_length and the traced "
                       "request's input tokens", {})
    reported, served = sum(p[0] for p in pairs), sum(p[1] for p in pairs)
    share = (served - reported) / reported if reported else None
    numbers = {"requests": len(pairs), "aiperf_isl_tokens": reported, "server_input_tokens": served,
               "server_minus_isl_share": share, "total_isl": total_isl}
    named = f" (the report's total_isl {total_isl:g})" if total_isl is not None and total_isl == reported else ""
    if served == reported:
        return Finding(check, PASS, f"AIPerf's input_sequence_length totals {reported:g} tokens over {len(pairs)} "
                       f"joined requests{named}, the same as the server processed", numbers)
    return Finding(check, PASS, f"AIPerf's input_sequence_length totals {reported:g} tokens over {len(pairs)} joined "
                   f"requests{named}; the server processed {served:g} ({share:+.1%}): AIPerf's ISL counts the prompt "
                   "text it generated, the server the prompt after its chat template; total_isl and the input-token "
                   "throughput built on it count AIPerf's tokens, not the server's (the usage AIPerf received is "
                   "the server's: traces:input_tokens)", numbers)


_OSL_COLUMNS = {"record_index": "INTEGER", "request_id": "VARCHAR", "ttft_ms": "DOUBLE",
                "request_latency_ms": "DOUBLE", "inter_token_latency_ms": "DOUBLE", "osl": "DOUBLE",
                "server_tokens": "DOUBLE"}
#: how many requests a finding names before "and N more"
NAMED_REQUESTS = 3
_OSL_CHECK = "output_tokens_vs_osl"
_OSL_DEFINITIONS = ("ITL = (request_latency - TTFT) / (OSL - 1), per-user rate = 1000 / ITL, "
                    "output_token_throughput = total_osl / window")


def _pct_range(values: list[float]) -> str:
    lo, hi = min(values), max(values)
    return f"{lo:+.1%}" if f"{lo:+.1%}" == f"{hi:+.1%}" else f"{lo:+.1%} to {hi:+.1%}"


def _count_range(values: list[float]) -> str:
    lo, hi = min(values), max(values)
    return f"{lo:,.0f}" if lo == hi else f"{lo:,.0f}-{hi:,.0f}"


@dataclass
class _ServerCounts:
    """The rows of aiperf_osl_server (_OSL_COLUMNS) and where their server counts came from:
    ``confirmed``: records whose usage count the traced request's O or G confirms
    (traces:output_tokens); ``left_out``: successful records with an OSL but no server count."""

    rows: list[tuple[Any, ...]] = field(default_factory=list)
    sources: set[str] = field(default_factory=set)
    confirmed: int = 0
    left_out: int = 0

    def source_text(self, per_request: bool) -> str:
        """Where the server counts came from, in words, for the finding's detail."""
        source = "; ".join(sorted(self.sources))
        if self.confirmed:
            source += f"; the traced requests give the same count on {self.confirmed} of them (traces:output_tokens)"
        if per_request and self.left_out:
            source += f"; {self.left_out} successful record(s) without a server count left out"
        return source


def _per_record_counts(records: AiperfRecords | None, joined: list[dict[str, Any]] | None) -> _ServerCounts:
    """Each successful record with an OSL beside the server's count of its output tokens: its
    usage_completion_tokens, else (with --db) the joined traced request's output tokens."""
    counts = _ServerCounts()
    if records is None:
        return counts
    traced = {r["record_index"]: (r["trace_output_tokens"], r["trace_generated_tokens"]) for r in joined or []
              if r["record_error"] is None and r["trace_id"] is not None}
    for row, rid, usage in zip(records.rows, records.request_ids, records.usage_completion_tokens):
        if row[1] is not None or row[4] is None:
            continue
        trace = traced.get(row[0])
        server = usage if usage is not None else trace[0] if trace is not None else None
        if server is None:
            counts.left_out += 1
            continue
        counts.confirmed += trace is not None and usage is not None and usage in trace
        counts.sources.add("usage_completion_tokens, the usage the server returned as AIPerf recorded it"
                           if usage is not None else "the traced requests' output tokens, joined by x_request_id")
        counts.rows.append((row[0], rid or f"record {row[0] + 1}", row[2], row[3], row[7], row[4], server))
    return counts


def osl_against_server(records: AiperfRecords | None, m: dict[str, dict[str, Any]],
                       con: duckdb.DuckDBPyConnection, joined: list[dict[str, Any]] | None = None) -> Finding:
    """output_tokens_vs_osl: AIPerf's output_sequence_length (OSL: it re-tokenizes the streamed
    text) against the server's count of the same requests' output tokens O, request by request
    where the records give both (O: the record's usage_completion_tokens, the usage the server
    returned; else, with --db, the joined traced request's output tokens), else in total
    (total_osl against the summary's total_usage_completion_tokens). Where they differ, the
    bias that OSL puts on the figures AIPerf builds on it, by its own definitions
    (queries/audit/aiperf_osl_vs_server.sql): ITL (AIPerf's per-request TPOT), the per-user
    rate and output_token_throughput; the requests are named. Counts are exact: any
    difference fails, with its size."""
    counts = _per_record_counts(records, joined)
    per_request = bool(counts.rows)
    if not per_request:
        total_osl, total_usage = _avg(m, "total_osl"), _avg(m, "total_usage_completion_tokens")
        if total_osl is None or total_usage is None:
            return _osl_cannot_compare(records is not None, total_osl)
        counts.sources.add("total_usage_completion_tokens, the summary's total of the usage the server returned")
        counts.rows.append((0, None, None, None, None, total_osl, total_usage))
    create_table(con, "aiperf_osl_server", _OSL_COLUMNS, counts.rows)
    result = audit_query(con, "aiperf_osl_vs_server")
    first = result[0]
    source = counts.source_text(per_request)
    numbers: dict[str, Any] = {"per_request": per_request, "server_count_source": source,
                               "confirmed_by_traces": counts.confirmed,
                               "records_without_server_count": counts.left_out,
                               "total_osl": first["total_osl"], "total_server_tokens": first["total_server_tokens"],
                               "output_throughput_bias": first["output_throughput_bias"],
                               "definitions": _OSL_DEFINITIONS}
    if not per_request:
        return _osl_totals_finding(first, source, numbers)
    return _osl_per_request_finding(result, source, numbers)


def _osl_cannot_compare(have_records: bool, total_osl: float | None) -> Finding:
    """output_tokens_vs_osl cannot_check: no record pairs an OSL with a server count and the
    report gives no total to compare instead; says what would give one."""
    how = ("no record has both output_sequence_length and a server count (usage_completion_tokens, or "
           "a traced request joined with --db)" if have_records else
           "pass --individual profile_export.jsonl (usage_completion_tokens per record; with --db, "
           "the traced requests' counts)")
    return Finding(_OSL_CHECK, CANNOT, "AIPerf's output_sequence_length cannot be compared with the server's "
                   f"count of output tokens: the report gives no total_usage_completion_tokens and {how}",
                   {"total_osl": total_osl})


def _osl_totals_finding(first: dict[str, Any], source: str, numbers: dict[str, Any]) -> Finding:
    """output_tokens_vs_osl on the report's totals alone: pass when total_osl is the server's
    total, else fail with the output_token_throughput bias (a share)."""
    totals = f"{first['total_osl']:,.0f} against {first['total_server_tokens']:,.0f} tokens"
    if first["osl_minus_server"] == 0:
        return Finding(_OSL_CHECK, PASS, f"AIPerf's total_osl equals the server's count: {totals} (server count: "
                       f"{source}); per request: pass --individual profile_export.jsonl", numbers)
    return Finding(_OSL_CHECK, FAIL, f"AIPerf's total_osl (it re-tokenizes the streamed text) is not the server's "
                   f"count: {totals} (server count: {source}): output_token_throughput = total_osl / window is "
                   f"{first['output_throughput_bias']:+.2%} off the server's tokens; the ITL of each request whose "
                   "OSL differs is off by (O - 1) / (OSL - 1) - 1 (AIPerf's ITL = (request_latency - TTFT) / "
                   "(OSL - 1)): pass --individual profile_export.jsonl to name the requests and size it", numbers)


def _osl_per_request_finding(result: list[dict[str, Any]], source: str, numbers: dict[str, Any]) -> Finding:
    """output_tokens_vs_osl request by request: pass when every OSL is the server's count, else
    fail naming the first NAMED_REQUESTS requests that differ and the bias (shares) on ITL, the
    per-user rate and output_token_throughput."""
    first = result[0]
    differ = [r for r in result if r["osl_minus_server"] != 0]
    numbers.update({"requests": len(result), "differ": len(differ),
                    "differing": [{"request": r["request_id"], "osl": r["osl"], "server_tokens": r["server_tokens"],
                                   "itl_bias": r["itl_bias"], "per_user_rate_bias": r["per_user_rate_bias"]}
                                  for r in differ],
                    "mean_itl_ms_aiperf": first["mean_itl_ms_aiperf"],
                    "mean_itl_ms_server": first["mean_itl_ms_server"],
                    "mean_itl_bias": first["mean_itl_bias"]})
    if not differ:
        return Finding(_OSL_CHECK, PASS, f"AIPerf's output_sequence_length equals the server's count on all "
                       f"{len(result)} requests ({first['total_osl']:,.0f} tokens; server count: {source}): its ITL, "
                       "per-user rate and output_token_throughput count the tokens the server generated", numbers)
    itl = [r["itl_bias"] for r in differ if r["itl_bias"] is not None]
    rate = [r["per_user_rate_bias"] for r in differ if r["per_user_rate_bias"] is not None]
    named = ", ".join(f"{r['request_id']} (OSL {r['osl']:,.0f}, server {r['server_tokens']:,.0f})"
                      for r in differ[:NAMED_REQUESTS])
    if len(differ) > NAMED_REQUESTS:
        named += f" and {len(differ) - NAMED_REQUESTS} more"
    numbers.update({"itl_bias_min": min(itl) if itl else None, "itl_bias_max": max(itl) if itl else None,
                    "per_user_rate_bias_min": min(rate) if rate else None,
                    "per_user_rate_bias_max": max(rate) if rate else None})
    totals = f"{first['total_osl']:,.0f} against {first['total_server_tokens']:,.0f} tokens"
    detail = (f"AIPerf's output_sequence_length (it re-tokenizes the streamed text) differs from the server's count "
              f"on {len(differ)} of {len(result)} requests: OSL {_count_range([r['osl'] for r in differ])} where the "
              f"server generated {_count_range([r['server_tokens'] for r in differ])} ({named}); {totals} over the "
              f"{len(result)} (server count: {source}). Biased by it, as AIPerf's definitions give")
    return Finding(_OSL_CHECK, FAIL, detail + ": " + "; ".join(_osl_bias_parts(first, itl, rate)), numbers)


def _osl_bias_parts(first: dict[str, Any], itl: list[float], rate: list[float]) -> list[str]:
    """The bias OSL puts on each figure AIPerf builds on it, one phrase each (shares): ITL and
    the per-user rate over the differing requests (``itl``, ``rate``), mean ITL (ms) and
    output_token_throughput."""
    parts = []
    if itl:
        mean = ""
        if first["mean_itl_bias"] is not None:
            mean = (f"; mean ITL {first['mean_itl_ms_aiperf']:.6g} ms against {first['mean_itl_ms_server']:.6g} ms "
                    f"with the server's counts, {first['mean_itl_bias']:+.2%}")
        parts.append(f"ITL (AIPerf's per-request TPOT) = (request_latency - TTFT) / (OSL - 1): {_pct_range(itl)} "
                     f"on those requests{mean}")
        parts.append(f"per-user rate = 1000 / ITL: {_pct_range(rate)}")
    else:
        parts.append("ITL and the per-user rate: none of those requests has both an OSL and a server count above 1")
    if first["output_throughput_bias"] is not None:
        parts.append(f"output_token_throughput = total_osl / window: {first['output_throughput_bias']:+.2%}")
    return parts


def _avg(m: dict[str, dict[str, Any]], name: str) -> float | None:
    value = m.get(name, {}).get("avg")
    return float(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else None
