"""The report's "Timeline" section: requests on the engine's time axis, the engine steps
beneath, counters above, the slowest gaps boxed with what shared their step.

Which requests: with more than ``timeline_requests`` requests, the N slowest (largest E2E on
the lane's clock) and, for each, the request that started just before it and just after it
(its neighbours in time): at most 3 N lanes. One clock: the lanes of the clock domain with
engine steps and the most requests (else the most requests); the others are counted in the
note (``tokentrace export --perfetto`` has every one). The engine band and token ticks are
thinned to :data:`analyzer.report.engine_steps.MAX_PLOT_POINTS`.
"""

from __future__ import annotations

import html
from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import duckdb

from analyzer.query.runner import run_query
from analyzer.report.engine_steps import MAX_PLOT_POINTS
from analyzer.report.timeline_data import Engine, Lane, read_engine, read_lanes
from analyzer.report.timeline_plot import timeline_svg

__all__ = ["DEFAULT_TIMELINE_REQUESTS", "STALLS_SHOWN", "pick_lanes", "timeline_section"]

#: ``report --timeline-requests``: the slowest requests drawn (each with its neighbours in time)
DEFAULT_TIMELINE_REQUESTS = 10
#: the slowest gaps boxed on the lanes and listed under the plot
STALLS_SHOWN = 5

Table = Callable[[Sequence[Mapping[str, Any]], Sequence[str]], str]

#: the columns of the slowest-gaps table (labels: analyzer/report/labels.py)
#: (response_id: the request by what the client got, its span id in the cell's tooltip)
STALL_COLUMNS = ["gap", "response_id", "token_index", "itl_ms", "step", "batch_size", "shared_decode_sequences",
                 "shared_prefill_sequences", "shared_prefill_tokens", "untraced_sequences", "waiting",
                 "kv_blocks_used"]


def pick_lanes(lanes: Sequence[Lane], n: int) -> list[Lane]:
    """All ``lanes`` when there are at most ``n``; else the ``n`` slowest (largest ``e2e_ms``;
    a request without one is never among them) and each one's neighbour before and after in
    start order. ``lanes`` are in start order; so is the result."""
    if len(lanes) <= n:
        return list(lanes)
    timed = [i for i, lane in enumerate(lanes) if lane.request["e2e_ms"] is not None]
    slowest = sorted(timed, key=lambda i: (-lanes[i].request["e2e_ms"], i))[:n]
    keep = {j for i in slowest for j in (i - 1, i, i + 1) if 0 <= j < len(lanes)}
    return [lanes[i] for i in sorted(keep)]


def _domain(engine: Engine, lanes: Sequence[Lane]) -> str:
    with_steps = {s["clock_domain"] for s in engine.steps}
    counts = Counter(lane.clock_domain for lane in lanes)
    return max(counts, key=lambda d: (d in with_steps, counts[d], d))


def _stalls(con: duckdb.DuckDBPyConnection, lanes: Sequence[Lane]) -> list[dict[str, Any]]:
    """Each lane's slowest gap (stalls_slowest.sql), the STALLS_SHOWN largest, numbered from
    the slowest, with the emission times of the tokens around each (the lane's token rows)."""
    by_span = {lane.request["lane_span_id"]: lane for lane in lanes}
    rows = run_query(con, "stalls_slowest", {"per_request": 1, "request_span_ids": list(by_span)}, views=False).dicts()
    rows = sorted((r for r in rows if r["request_span_id"] in by_span), key=lambda r: -r["itl_ms"])[:STALLS_SHOWN]
    out: list[dict[str, Any]] = []
    for r in rows:
        lane = by_span[r["request_span_id"]]
        emit = {i["token_index"]: i["start_ns"] for i in lane.kind("token")}
        if r["token_index"] in emit and r["token_index"] - 1 in emit:
            out.append({**r, "gap": len(out) + 1, "prev_emit_ns": emit[r["token_index"] - 1],
                        "emit_ns": emit[r["token_index"]]})
    return out


def _thin(rows: list[dict[str, Any]], cap: int) -> tuple[list[dict[str, Any]], int]:
    n = max(1, -(-len(rows) // cap))
    return rows[::n], n


def timeline_section(con: duckdb.DuckDBPyConnection, table: Table, timeline_requests: int) -> str:
    """The section's HTML (views installed on ``con``)."""
    requests = read_lanes(con, kinds=["request"])  # one row per request; the items of those drawn only
    head = "<h2>Timeline</h2>"
    if not requests:
        return head + '<p class="note">No request in these traces: nothing to draw.</p>'
    engine = read_engine(con)
    domain = _domain(engine, requests)
    in_domain = [lane for lane in requests if lane.clock_domain == domain]
    picked = {lane.key for lane in pick_lanes(in_domain, timeline_requests)}
    shown = [lane for lane in read_lanes(con, request_span_ids=sorted({k[1] for k in picked})) if lane.key in picked]
    start, end = min(lane.start_ns for lane in shown), max(lane.end_ns for lane in shown)
    steps = [s for s in engine.steps_of(domain) if s["end_ns"] >= start and s["start_ns"] <= end]
    plotted_steps, step_every = _thin(steps, MAX_PLOT_POINTS)
    tokens = sum(len(lane.kind("token", "chunk")) for lane in shown)
    tick_every = max(1, -(-tokens // MAX_PLOT_POINTS))
    stalls = _stalls(con, shown) if steps else []
    service = domain.split("|")[0] or "unknown service"
    how = (f"all {len(shown):,} request{'s' if len(shown) != 1 else ''}" if len(shown) == len(in_domain) else
           f"the {timeline_requests:,} slowest requests by E2E and their neighbours in time: {len(shown):,} of "
           f"{len(in_domain):,} (<code>--timeline-requests N</code>)")
    notes = [(f"{how}, on the clock of {html.escape(service)} (clock domain {html.escape(domain)}); "
             "times from queries/report/timeline.sql.")]
    others = len(requests) - len(in_domain)
    if others:
        notes.append(f"{others:,} requests on other clocks are not drawn: one time axis holds one clock "
                     "(<code>tokentrace export --perfetto</code> has every request, one process per clock).")
    if steps:
        thinned = f"every {step_every}th of {len(steps):,}" if step_every > 1 else f"all {len(steps):,}"
        notes.append(f"Engine steps from queries/steps.sql ({thinned} drawn): each as wide as it lasted and as high "
                     "as the tokens it scheduled, coloured by its prefill tokens; counters per step above.")
    else:
        notes.append(html.escape(engine.no_steps_reason() or "no engine track: no step in the time shown") + ".")
    if tick_every > 1:
        notes.append(f"One token tick in {tick_every} drawn ({tokens:,} tokens).")
    out = [head, '<p class="note">' + " ".join(notes) + "</p>",
           timeline_svg(shown, plotted_steps, stalls, f"{service}'s clock", tick_every)]
    if stalls:
        out.append("<h3>Slowest gaps on the timeline</h3>"
                   f'<p class="note">The {len(stalls)} slowest gaps between generated tokens among the requests '
                   "shown (queries/stalls_slowest.sql), numbered as boxed on the plot, with what shared the engine "
                   "step that ended each: the other sequences decoding and prefilling, their prefill tokens, and "
                   "sequences in the step whose spans are not in the data.</p>"
                   + table(stalls, STALL_COLUMNS))
    return "".join(out)
