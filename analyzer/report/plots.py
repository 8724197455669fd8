"""Plots for the HTML report, rendered by matplotlib to inline SVG (no CDN, opens offline).

Every function takes rows already computed by the analyzer's SQL and returns an SVG string
in its box (``<div class="plot">``, which scrolls sideways when the SVG, at
:data:`MIN_SCALE` of its size or more, is wider than the page: a phone).
Every axis is labelled with its unit. Legends sit below the axes (never on the data), in
the same type size as the tick labels.
"""

from __future__ import annotations

import io
import re
from collections.abc import Mapping, Sequence
from typing import Any

__all__ = ["cdf_svg", "decode_steps_svg", "engine_timeline_svg", "itl_vs_prefill_svg", "phases_svg", "throughput_svg",
           "waterfall_svg"]

_PHASE_COLORS = {
    "chat": "#4c72b0",
    "gateway": "#55a868",
    "generate": "#55a868",
    "tokenize": "#c44e52",
    "queue": "#8172b2",
    "prefill": "#ccb974",
    "decode": "#64b5cd",
}


def _figure(width_in: float = 9.0, height_in: float = 3.6) -> tuple[Any, Any]:
    import matplotlib

    matplotlib.use("Agg", force=True)
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(width_in, height_in), dpi=96, layout="constrained")
    ax.grid(True, alpha=0.3)
    return fig, ax


#: Type size of legends and tick labels (points; axis labels and titles are larger).
LEGEND_FONT_PT = 9


def _legend_below(fig: Any, axes: Sequence[Any], ncol: int = 3) -> None:
    """One legend for ``axes`` (a twin axis included) below the plot, outside the data."""
    handles: list[Any] = []
    labels: list[str] = []
    for ax in axes:
        h, lab = ax.get_legend_handles_labels()
        handles += h
        labels += lab
    if handles:
        fig.legend(handles, labels, loc="outside lower center", ncol=min(ncol, len(handles)),
                   fontsize=LEGEND_FONT_PT, frameon=False)


#: A plot shrinks with the page down to this share of its drawn size, then scrolls sideways
#: inside its box (``div.plot``): at 0.8 its smallest text (9 pt, :data:`LEGEND_FONT_PT`)
#: still reads at 9.6 CSS pixels, its tick labels (10 pt) at 10.7.
MIN_SCALE = 0.8

_SVG_WIDTH = re.compile(r'<svg\b[^>]*?\swidth="([0-9.]+)pt"')


def _svg(fig: Any) -> str:
    """The figure as inline SVG in its scroll box: ``min-width`` keeps it at
    :data:`MIN_SCALE` of its size or more on a narrow screen (a phone)."""
    import matplotlib.pyplot as plt

    buf = io.StringIO()
    fig.savefig(buf, format="svg", metadata={"Date": None})
    plt.close(fig)
    text = buf.getvalue()
    text = text[text.index("<svg") :]  # drop the XML prolog: the SVG is inlined in HTML
    width = _SVG_WIDTH.match(text)
    assert width is not None, "matplotlib's SVG starts with its width"
    width_px = float(width.group(1)) * 4 / 3  # CSS: 1 pt = 4/3 px
    text = f'<svg style="min-width:{width_px * MIN_SCALE:.0f}px"' + text[len("<svg"):]
    return f'<div class="plot">{text}</div>'


def waterfall_svg(spans: Sequence[dict[str, Any]], chunks: Sequence[dict[str, Any]]) -> str:
    """One request on one time axis: a bar per span (decode steps on one row), chunk ticks.

    ``spans`` rows come from queries/report/waterfall.sql, ``chunks`` from chunk_times.sql.
    """
    lanes: list[str] = []
    bars: dict[str, list[tuple[float, float]]] = {}
    lane_domain: dict[str, str] = {}
    for s in spans:
        lane = "decode steps" if s["name"] == "decode" else f"{s['name']} ({s['kind'].lower()})"
        if lane not in bars:
            lanes.append(lane)
            bars[lane] = []
            lane_domain[lane] = s.get("clock_domain") or ""
        bars[lane].append((s["start_ms"], max(s["duration_ms"], 1e-3)))
    chunk_lanes = sorted({c["perspective"] for c in chunks})
    rows = lanes + [f"chunks: {p}" for p in chunk_lanes]
    fig, ax = _figure(9.5, 0.45 * len(rows) + 1.6)
    for y, lane in enumerate(lanes):
        key = lane.split(" ")[0].split("(")[0]
        color = _PHASE_COLORS.get(key, "#937860")
        ax.broken_barh(bars[lane], (y - 0.35, 0.7), facecolors=color, edgecolors="white", linewidth=0.3)
    for i, perspective in enumerate(chunk_lanes):
        times = [c["time_ms"] for c in chunks if c["perspective"] == perspective]
        ax.vlines(times, len(lanes) + i - 0.35, len(lanes) + i + 0.35, colors="#333333", linewidth=0.6)
    ax.set_yticks(range(len(rows)))
    labels = []
    for lane in rows:
        dom = lane_domain.get(lane, "")
        labels.append(f"{lane}\n[{dom.split('|')[0]} clock]" if dom else lane)
    ax.set_yticklabels(labels, fontsize=LEGEND_FONT_PT)
    ax.invert_yaxis()
    ax.set_xlabel("ms after the request was sent (the client span's start; without one, the server's arrival),\n"
                  "each span on its own host's clock")
    ax.set_title("Request waterfall")
    return _svg(fig)


def decode_steps_svg(itl_rows: Sequence[dict[str, Any]], steps: Sequence[dict[str, Any]]) -> str:
    """ITL per gap (ms, left axis) and logical KV bytes after each decode step (MiB, right)."""
    fig, ax = _figure()
    if itl_rows:
        ax.plot([r["gap_index"] for r in itl_rows], [r["itl_ms"] for r in itl_rows], ".-", markersize=3,
                linewidth=0.8, label="ITL (ms)")
    ax.set_xlabel("gap / decode step index (gap k: chunk k-1 → chunk k; step k: yields token k+1)")
    ax.set_ylabel("inter-token latency (ms)")
    kv = [(r["step"], r["kv_mib"]) for r in steps if r.get("kv_mib") is not None]
    if kv:
        ax2 = ax.twinx()
        ax2.plot([k for k, _ in kv], [v for _, v in kv], color="#c44e52", linewidth=1.0, label="KV (MiB)")
        ax2.set_ylabel("logical KV retained after step (MiB)")
        _legend_below(fig, [ax, ax2])
    else:
        _legend_below(fig, [ax])
    ax.set_title("ITL per gap and KV bytes per decode step")
    return _svg(fig)


def cdf_svg(series: Mapping[str, Sequence[float]], xlabel: str, title: str,
            ylabel: str = "fraction of requests ≤ x") -> str:
    """Empirical CDF of each named series (fraction of requests <= x; ``ylabel`` names what
    is counted when it is not requests)."""
    fig, ax = _figure(4.6, 3.6)
    for name, values in series.items():
        xs = sorted(v for v in values if v is not None)
        if not xs:
            continue
        ys = [(i + 1) / len(xs) for i in range(len(xs))]
        ax.step(xs, ys, where="post", label=f"{name} (n={len(xs)})")
    ax.set_xlabel(xlabel)
    ax.set_ylabel(ylabel)
    ax.set_ylim(0, 1.02)
    ax.set_title(title)
    _legend_below(fig, [ax], ncol=2)
    return _svg(fig)


def throughput_svg(rows: Sequence[dict[str, Any]], window: tuple[float, float] | None, bucket_s: float) -> str:
    """Output tokens/s and completed requests/s per bucket; the window shaded."""
    fig, ax = _figure()
    xs = [r["bucket_start_s"] for r in rows]
    ax.step(xs, [r["output_tokens_per_s"] for r in rows], where="post", label="output tokens/s")
    ax.set_xlabel(f"time since the first output chunk (s), {bucket_s:g} s buckets")
    ax.set_ylabel("output tokens per second")
    ax2 = ax.twinx()
    ax2.step(xs, [r["completed_rps"] for r in rows], where="post", color="#55a868", label="completed requests/s")
    ax2.set_ylabel("completed requests per second")
    if window is not None:
        ax.axvspan(window[0], window[1], color="#ccb974", alpha=0.2, label="metrics window")
    _legend_below(fig, [ax, ax2])
    ax.set_title("Throughput over time")
    return _svg(fig)


_PHASES = ["network_in", "gateway_overhead", "tokenize", "queue", "prefill", "first_emit", "network_out", "residual"]


def phases_svg(rows: Sequence[dict[str, Any]]) -> str:
    """Stacked TTFT phases per request (ms); a missing phase (NULL with a reason) is left out."""
    fig, ax = _figure(9.0, 3.8)
    bottoms = [0.0] * len(rows)
    xs = list(range(len(rows)))
    for phase in _PHASES:
        key = f"{phase}_ms"
        values = [r.get(key) or 0.0 for r in rows]
        if not any(values):
            continue
        ax.bar(xs, values, bottom=bottoms, label=phase, width=0.8)
        bottoms = [b + v for b, v in zip(bottoms, values)]
    ax.set_xlabel("request (ordered by client send)")
    ax.set_ylabel("TTFT component (ms)")
    ax.set_title("TTFT phase breakdown")
    _legend_below(fig, [ax], ncol=4)
    return _svg(fig)


def engine_timeline_svg(steps: Sequence[dict[str, Any]]) -> str:
    """Batch size (left axis) and KV blocks used (right axis, the cache's total dashed) per
    engine step, against the step's start (s since the first step). Rows: queries/steps.sql."""
    fig, ax = _figure()
    t0 = min(r["start_ns"] for r in steps)
    xs = [(r["start_ns"] - t0) / 1e9 for r in steps]
    ax.step(xs, [r["batch_size"] for r in steps], where="post", label="batch size (sequences)")
    ax.set_xlabel("time since the first engine step (s), engine clock")
    ax.set_ylabel("batch size (sequences in the step)")
    ax2 = ax.twinx()
    ax2.step(xs, [r["kv_blocks_used"] for r in steps], where="post", color="#c44e52", label="KV blocks used")
    totals = sorted({r["kv_blocks_total"] for r in steps if r["kv_blocks_total"] is not None})
    used_max = max((r["kv_blocks_used"] or 0 for r in steps), default=0)
    if len(totals) == 1 and used_max >= totals[0] / 2:
        ax2.axhline(totals[0], color="#c44e52", linestyle="--", linewidth=0.8, label=f"KV blocks total ({totals[0]:,})")
    elif totals:  # a far-off total would flatten the used line: named, not drawn
        ax2.plot([], [], " ", label=f"KV blocks total: {', '.join(f'{t:,}' for t in totals)} (off scale)")
    ax2.set_ylabel("KV blocks used (paged cache)")
    ax2.set_ylim(bottom=0)
    ax.set_ylim(bottom=0)
    _legend_below(fig, [ax, ax2], ncol=4)
    ax.set_title("Batch size and KV blocks used per engine step")
    return _svg(fig)


def itl_vs_prefill_svg(gaps: Sequence[dict[str, Any]], groups: Sequence[dict[str, Any]]) -> str:
    """Each gap's ITL (ms) against the prefill tokens co-scheduled in the step that produced
    it (queries/stalls.sql), with each bucket's p50 and p99 (queries/stalls_groups.sql)."""
    fig, ax = _figure()
    ax.scatter([g["prefill_tokens"] for g in gaps], [g["itl_ms"] for g in gaps], s=6, alpha=0.5,
               label="gap (ITL) ← its engine step")
    ax.set_xscale("symlog", linthresh=1)
    for row in groups:
        if row["itl_p50_ms"] is None or row["group_min"] is None:
            continue
        low = row["group_min"]
        high = row["group_max"] if row["group_max"] is not None else max(low * 4, max(g["prefill_tokens"] for g in gaps))
        ax.hlines([row["itl_p50_ms"]], low, max(high, low + 0.8), colors="#55a868", linewidth=1.5)
        ax.hlines([row["itl_p99_ms"]], low, max(high, low + 0.8), colors="#c44e52", linewidth=1.0, linestyles="--")
    ax.plot([], [], color="#55a868", label="bucket p50")
    ax.plot([], [], color="#c44e52", linestyle="--", label="bucket p99")
    ax.set_xlabel("prefill tokens co-scheduled in the gap's engine step (symlog; buckets 0, 1-128, 129-1024, >1024)")
    ax.set_ylabel("inter-token gap (ms, engine clock)")
    ax.set_ylim(bottom=0)
    _legend_below(fig, [ax])
    ax.set_title("ITL against co-scheduled prefill tokens")
    return _svg(fig)
