"""The report's first screen: the numbers a person wants first, as cards.

TTFT, TPOT and E2E p50 / p99 (queries/summary.sql, succeeded requests, from the best
perspective present: client, else server, else engine), request and output-token
throughput, goodput, errors and prefix-cache hits (queries/window.sql). Every figure is a value those queries returned; this module
only chooses and formats them. NULL figures print an em dash with the query's reason.
"""

from __future__ import annotations

import html
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from analyzer.query.utc_columns import utc_ms_text

__all__ = ["HEADLINE_PERSPECTIVES", "headline_html"]

#: The perspective the latency cards are read from: the first of these summary.sql has rows for.
HEADLINE_PERSPECTIVES = ("client", "server", "engine")

_LATENCIES = (("ttft_ms", "TTFT"), ("tpot_ms", "TPOT"), ("e2e_ms", "E2E"))


def _card(key: str, value: str, sub: str = "") -> str:
    return (f'<div class="card"><div class="k">{key}</div><div class="v">{value}</div>'
            f'<div class="s">{sub}</div></div>')


def _headline_perspective(summary: Sequence[Mapping[str, Any]]) -> str | None:
    present = {r["perspective"] for r in summary if r.get("metric") == "ttft_ms" and r.get("count")}
    return next((p for p in HEADLINE_PERSPECTIVES if p in present), None)


def headline_html(window: Mapping[str, Any], summary: Sequence[Mapping[str, Any]], fmt: Callable[[Any], str]) -> str:
    """The "At a glance" section: a grid of cards, then one line saying what they count."""
    perspective = _headline_perspective(summary)
    cards = []
    for metric, label in _LATENCIES:
        row = next((r for r in summary if r.get("metric") == metric and r.get("perspective") == perspective), None)
        if row is None or row.get("p50") is None:
            why = (row or {}).get("null_reason") or "no request has this figure"
            cards.append(_card(f"{label} p50 / p99", "—", html.escape(str(why))))
            continue
        unit = "ms/token" if metric == "tpot_ms" else "ms"
        cards.append(_card(f"{label} p50 / p99", f"{fmt(row['p50'])} / {fmt(row['p99'])} {unit}",
                           f"{row['count']:,} succeeded requests, {perspective} perspective"))
    cards.append(_card("Throughput", f"{fmt(window.get('request_throughput_rps'))} req/s",
                       f"{fmt(window.get('output_tokens_per_s'))} output tok/s"))
    slos = [f"{name} ≤ {fmt(window.get(f'slo_{key}_ms'))} ms" for key, name in
            (("ttft", "TTFT"), ("tpot", "TPOT"), ("e2e", "E2E")) if window.get(f"slo_{key}_ms") is not None]
    cards.append(_card("Goodput", f"{fmt(window.get('observed_goodput_rps'))} req/s",
                       "meeting " + ", ".join(slos) if slos else "no SLO set: every succeeded request counts"))
    attempted = window.get("attempted") or 0
    errors = (window.get("failed") or 0) + (window.get("cancelled") or 0)
    rate = window.get("error_rate")
    cards.append(_card("Errors", f"{errors:,} of {attempted:,}",
                       f"{window.get('failed') or 0:,} failed, {window.get('cancelled') or 0:,} cancelled; "
                       f"error rate {fmt(rate * 100) + ' %' if rate is not None else '—'}"))
    share = window.get("prefix_cache_hit_share")
    if share is None:
        why = window.get("prefix_cache_note") or "no counted request reports prefix-cache tokens"
        cards.append(_card("Cache hits", "—", html.escape(str(why))))
    else:
        cards.append(_card("Cache hits", f"{window.get('prefix_cache_hit_requests') or 0:,} requests",
                           f"reused a cached prompt prefix; {fmt(share * 100)} % of prompt tokens from the cache"))
    start, end = window.get("window_start_ns"), window.get("window_end_ns")
    span = (f"window {utc_ms_text(start)} to {utc_ms_text(end)} ({fmt(window.get('window_s'))} s, UTC)"
            if start is not None and end is not None else "no window (no request)")
    return (
        "<h2>At a glance</h2>"
        f'<div class="cards">{"".join(cards)}</div>'
        f'<p class="note">Latencies: succeeded requests (queries/summary.sql), p50 and p99 by linear '
        f"interpolation. Throughput, goodput and errors: queries/window.sql, mode {fmt(window.get('mode'))}, "
        f"{span}. Cache hits: window.sql's prefix_cache_* columns. Definitions: docs/metrics.md.</p>"
    )
