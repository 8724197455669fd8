"""What a server's latency histogram is judged against: per histogram family, the traced
figure that measures the same thing (and how each side defines it), read from the traces of
the same run (``--db``) or from the client's records (``--individual``).

Families are vLLM's (``vllm:*``, 0.32 and on) and tokentrace's own ``/metrics``
(``gen_ai_server_*``). Request families hold one observation per finished request; the
inter-token family one per output token after the first (vLLM: the engine core's output
times, so the traced gaps are the engine's, where tokentrace's vLLM plugin traced the request).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

__all__ = ["CLIENT_COLUMNS", "FAMILY_FIGURES", "FamilyFigure", "GAPS", "client_rows", "traced_rows"]

#: the per-token column of a traced row: its gaps (ms), one per token after the first
GAPS = "gaps_ms"


@dataclass(frozen=True)
class FamilyFigure:
    """How one histogram family is checked. ``column``: the traced row's figure (ms) measured as
    the histogram measures it; ``other_column``: a traced figure of the same name defined
    otherwise (compared and explained, never judged); the definitions say each side's
    start and end."""

    what: str
    column: str
    histogram_definition: str
    traced_definition: str
    other_column: str | None = None
    other_definition: str = ""

    @property
    def per_token(self) -> bool:
        return self.column == GAPS

    def column_for(self, client: bool) -> str | None:
        """The row column this family is checked against: the traced figure, or with
        ``client`` the client records' (:data:`CLIENT_COLUMNS`, or the gaps); None when the
        client measures nothing that bounds it."""
        if not client or self.per_token:
            return self.column
        return CLIENT_COLUMNS.get(self.column)


_VLLM_QUEUE = FamilyFigure(
    "queue", "vllm_queue_ms",
    "vLLM's time_in_queue: the engine core's QUEUED event -> its first SCHEDULED event (the wait in the "
    "scheduler's waiting queue only)",
    "vLLM's own gen_ai.latency.time_in_queue of the same request (llm_request: the same two events)",
    "queue_ms",
    "tokentrace's vLLM plugin's queue span: vLLM's arrival time (the API server) -> the first step that "
    "scheduled the request (tokenization, the hand-over to the engine core and the step in progress included)")

#: histogram family -> how it is checked
FAMILY_FIGURES: dict[str, FamilyFigure] = {
    "gen_ai_server_time_to_first_token_seconds": FamilyFigure(
        "TTFT", "ttft_ms", "the gateway's first visible chunk - the request's arrival", "the gateway span's TTFT"),
    "gen_ai_server_request_duration_seconds": FamilyFigure(
        "E2E", "e2e_ms", "the gateway's last write - the request's arrival", "the gateway span's E2E"),
    "gen_ai_server_time_per_output_token_seconds": FamilyFigure(
        "TPOT", "tpot_ms", "(E2E - TTFT) / (output tokens - 1)", "the gateway span's TPOT"),
    "vllm:time_to_first_token_seconds": FamilyFigure(
        "TTFT", "ttft_ms", "the frontend's first output - vLLM's arrival time", "vLLM's server-perspective TTFT"),
    "vllm:e2e_request_latency_seconds": FamilyFigure(
        "E2E", "e2e_ms", "the frontend's last output - vLLM's arrival time", "vLLM's server-perspective E2E"),
    "vllm:request_time_per_output_token_seconds": FamilyFigure(
        "TPOT", "tpot_ms", "decode time / (output tokens - 1)", "vLLM's server-perspective TPOT"),
    "vllm:request_queue_time_seconds": _VLLM_QUEUE,
    "vllm:request_prefill_time_seconds": FamilyFigure(
        "prefill", "vllm_prefill_ms", "the engine core's first SCHEDULED event -> its first token",
        "vLLM's own gen_ai.latency.time_in_model_prefill", "prefill_ms",
        "tokentrace's vLLM plugin's prefill spans (the steps that prefilled the prompt)"),
    "vllm:request_decode_time_seconds": FamilyFigure(
        "decode", "vllm_decode_ms", "the engine core's first token -> its last token",
        "vLLM's own gen_ai.latency.time_in_model_decode", "decode_ms",
        "the plugin's first token -> last token emission"),
    "vllm:request_inference_time_seconds": FamilyFigure(
        "inference", "vllm_inference_ms", "the engine core's first SCHEDULED event -> its last token",
        "vLLM's own time_in_model_prefill + time_in_model_decode"),
    "vllm:inter_token_latency_seconds": FamilyFigure(
        "inter-token gap", GAPS, "one per output token after the first: the engine core's output time - the "
        "previous one's", "the traced gaps between consecutive tokens (the engine's, where the plugin traced it)"),
    # vLLM before 0.11 named the same histogram so (its per-request TPOT came later)
    "vllm:time_per_output_token_seconds": FamilyFigure(
        "inter-token gap", GAPS, "one per output token after the first", "the traced gaps between consecutive "
        "tokens"),
}

#: the client records' figures (ms) a family can be compared with: a client figure contains
#: the server's (network and client time added), so only TTFT and E2E bound it
CLIENT_COLUMNS = {"ttft_ms": "ttft_ms", "e2e_ms": "e2e_ms"}

_PHASE_COLUMNS = ("queue_ms", "prefill_ms", "decode_ms", "vllm_queue_ms", "vllm_prefill_ms", "vllm_decode_ms")


def traced_rows(db: str | Path) -> list[dict[str, Any]]:
    """One dict per server-perspective request in ``db``, ended first first: the columns of
    queries/requests.sql, the phase columns of queries/phases.sql (``queue_ms``, ``vllm_*_ms``
    ...), ``vllm_inference_ms`` and :data:`GAPS` (its gaps, ms: the engine perspective's when
    the request has one, else the server's)."""
    from analyzer.audit.records_traces import traces_copy
    from analyzer.query.runner import run_query

    con = traces_copy(db)
    try:
        rows = [r for r in run_query(con, "requests", {"perspective": "server"}).dicts()]
        phases = {(p["trace_id"], p["request_span_id"]): p for p in run_query(con, "phases").dicts()}
        gaps: dict[tuple[str, str, str], list[float]] = {}
        for g in run_query(con, "itl").dicts():
            if g["itl_ms"] is not None:
                gaps.setdefault((g["perspective"], g["trace_id"], g["request_span_id"]), []).append(g["itl_ms"])
    finally:
        con.close()
    for r in rows:
        key = (r["trace_id"], r["request_span_id"])
        phase = phases.get(key, {})
        for column in _PHASE_COLUMNS:
            r[column] = phase.get(column)
        prefill, decode = r["vllm_prefill_ms"], r["vllm_decode_ms"]
        r["vllm_inference_ms"] = None if prefill is None or decode is None else prefill + decode
        r[GAPS] = gaps.get(("engine", *key), gaps.get(("server", *key), []))
    rows.sort(key=lambda r: (r.get("e_ns") or 0, r.get("s_ns") or 0))
    return rows


def client_rows(path: Path) -> list[dict[str, Any]]:
    """The successful records of AIPerf's ``profile_export.jsonl`` as rows with ``ttft_ms``,
    ``e2e_ms``, ``e_ns`` (the request's end, AIPerf's clock) and :data:`GAPS` (its inter-chunk
    gaps, ms), ended first first."""
    from analyzer.audit.aiperf_records import read_aiperf_records
    from analyzer.errors import AuditInputError

    try:
        with open(path, "rb") as f:
            head = f.read(64).lstrip()
    except OSError as exc:
        raise AuditInputError(f"--individual {path}: cannot read ({exc.strerror})") from None
    if head[:1] == b"[":
        raise AuditInputError(f"--individual {path}: a JSON list; against server histograms --individual reads "
                              "AIPerf's profile_export.jsonl (one record per line)")
    records = read_aiperf_records(path)
    rows = []
    for i, row in enumerate(records.rows):
        if row[1] is not None:  # an error record: no latency
            continue
        end = records.request_end_ns[i] or row[14]
        rows.append({"ttft_ms": row[2], "e2e_ms": row[3], "e_ns": end, "s_ns": row[13],
                     GAPS: records.chunk_gaps_ms[i]})
    rows.sort(key=lambda r: (r.get("e_ns") or 0, r.get("s_ns") or 0))
    return rows


def definitions_note(figure: FamilyFigure, mine: dict[float, dict[str, Any]] | None,
                     other: dict[float, dict[str, Any]] | None, outside: list[str]) -> str:
    """What the otherwise-defined traced figure says beside the histogram ('' when none was
    traced): its median and largest value next to the histogram's own figure's, and, when it
    lies outside the buckets (``outside``: where), both definitions. ``mine`` / ``other``: the
    rows of queries/audit/histogram_exact.sql per q (seconds)."""
    if not other or figure.other_column is None:
        return ""
    o = other[0.5]
    text = (f"; beside it, the traced {figure.other_column}: p50 {o['exact_nearest_rank']:.4g} s, largest "
            f"{o['max_value']:.4g} s")
    if mine:
        m = mine[0.5]
        text += f" (the histogram's own definition: p50 {m['exact_nearest_rank']:.4g} s, largest {m['max_value']:.4g} s)"
    if not outside:
        return text + f", in the same buckets ({figure.other_column}: {figure.other_definition})"
    return (text + f"; it falls outside the histogram's buckets ({', '.join(outside)}): not the same quantity. "
            f"The histogram measures {figure.histogram_definition}; {figure.other_column} is "
            f"{figure.other_definition}")
