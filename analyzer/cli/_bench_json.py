"""``tokentrace bench --format json``: one object a script can compare across runs.

Every figure comes from the same SQL as the table output (client perspective):
queries/window.sql (closed cohort: counts, request throughput, output token throughput) and
queries/summary.sql (distributions over succeeded requests). Keys (units in the names):

- ``requests_completed`` / ``requests_failed`` / ``requests_cancelled``: window.sql's
  succeeded / failed / cancelled (a 429 counts as failed: its client span ends in error).
- ``output_tokens_per_second``, ``request_throughput_rps``: window.sql's
  ``output_tokens_per_s`` and ``request_throughput_rps`` over the cohort window (first send
  to last request end), with ``window_s`` and ``token_counting_rule``.
- ``ttft_ms``, ``tpot_ms``, ``e2e_ms``, ``itl_ms``: ``{"mean", "p50", "p90", "p99", "count"}``
  from summary.sql (None values when no request had the figure: see ``null_reasons``).
- ``http_status``: responses per HTTP status ("no response" for network errors).
- ``failures`` (added by bench.py): every failed request, ``{index, client_request_id,
  response_id, http_status, error, chunks, waited_s}`` (waited_s: seconds from send to the
  failure); ``request_id_prefix``: the X-Request-ID prefix (request i sent PREFIX{i});
  ``request_ids``: every request sent, ``{index, client_request_id, response_id}``.
"""

from __future__ import annotations

from typing import Any

__all__ = ["bench_summary"]

DISTRIBUTIONS = ("ttft_ms", "tpot_ms", "e2e_ms", "itl_ms")


def bench_summary(con: Any, http_status: dict[str, int]) -> dict[str, Any]:
    """The bench's JSON object from the client spans loaded in ``con``."""
    from analyzer.query.runner import run_query

    window_rows = run_query(con, "window", {"perspective": "client"}).dicts()
    window = window_rows[0] if window_rows else {}
    summary = {row["metric"]: row for row in run_query(con, "summary", {"perspective": "client"}).dicts()}
    out: dict[str, Any] = {
        "requests_completed": window.get("succeeded", 0),
        "requests_failed": window.get("failed", 0),
        "requests_cancelled": window.get("cancelled", 0),
        "output_tokens_per_second": window.get("output_tokens_per_s"),
        "request_throughput_rps": window.get("request_throughput_rps"),
        "window_s": window.get("window_s"),
        "token_counting_rule": window.get("token_counting_rule"),
        "http_status": dict(sorted(http_status.items())),
    }
    reasons = {}
    for metric in DISTRIBUTIONS:
        row = summary.get(metric)
        if row is None:
            out[metric] = {"mean": None, "p50": None, "p90": None, "p99": None, "count": 0}
            reasons[metric] = "no gap" if metric == "itl_ms" else "no request"
            continue
        out[metric] = {key: row[key] for key in ("mean", "p50", "p90", "p99", "count")}
        if row.get("null_reason"):
            reasons[metric] = row["null_reason"]
    out["null_reasons"] = reasons
    return out
