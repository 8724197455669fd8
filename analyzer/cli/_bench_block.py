"""The run summary ``tokentrace bench`` ends with: one 80-column block in the shape users know
from ``vllm bench serve`` and AIPerf (requests, duration, throughput, then mean / p50 / p90 /
p99 of TTFT, TPOT, ITL and E2E), drawn from the JSON object of
:func:`analyzer.cli._bench_json.bench_summary` (queries/window.sql and queries/summary.sql,
client perspective): no second formula."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

__all__ = ["WIDTH", "summary_block"]

#: Width of the block, in characters.
WIDTH = 60

_ROWS = (("TTFT", "ttft_ms"), ("TPOT", "tpot_ms"), ("ITL", "itl_ms"), ("E2E", "e2e_ms"))


def _figure(value: Any, digits: int = 2) -> str:
    return "-" if value is None else f"{value:,.{digits}f}"


def _line(label: str, value: str) -> str:
    return f"{label:<{WIDTH - len(value) - 1}} {value}"


def summary_block(summary: Mapping[str, Any], *, sent: int, asked: int, stopped_by: str | None = None) -> list[str]:
    """The lines of the block. ``summary``: bench_summary's object; ``sent`` / ``asked``:
    requests sent and asked for (--requests); ``stopped_by``: the signal that stopped the
    run, if one did (the requests not sent are then counted)."""
    title = " tokentrace bench result "
    lines = [title.center(WIDTH, "=")]
    lines.append(_line("Requests completed:", str(summary.get("requests_completed", 0))))
    lines.append(_line("Requests failed:", str(summary.get("requests_failed", 0))))
    if summary.get("requests_cancelled") or stopped_by:
        lines.append(_line("Requests cancelled by the stop:", str(summary.get("requests_cancelled", 0))))
    if sent < asked:
        lines.append(_line(f"Requests not sent ({stopped_by or 'stopped'}):", str(asked - sent)))
    lines.append(_line("Duration, first send to last end (s):", _figure(summary.get("window_s"))))
    lines.append(_line("Request throughput (req/s):", _figure(summary.get("request_throughput_rps"))))
    lines.append(_line("Output token throughput (tok/s):", _figure(summary.get("output_tokens_per_second"))))
    lines.append(" completed requests, in ms ".center(WIDTH, "-"))
    lines.append(f"{'':<8}{'mean':>13}{'p50':>13}{'p90':>13}{'p99':>13}")
    for label, key in _ROWS:
        row = summary.get(key) or {}
        lines.append(f"{label:<8}" + "".join(f"{_figure(row.get(k)):>13}" for k in ("mean", "p50", "p90", "p99")))
    lines.append("=" * WIDTH)
    reasons = summary.get("null_reasons") or {}
    for key, reason in reasons.items():
        lines.append(f"{key}: {reason}")
    return lines
