"""The report's Timeline plot: requests on the engine's time axis (matplotlib, inline SVG).

Three bands share one time axis (s since the first request shown started, on the lanes'
clock): counters above (sequences running and waiting per engine step, KV blocks used on
the right axis), one lane per request in the middle (queue, prefill chunks, recompute
prefills, decode steps; a tick per generated token; preemptions; the slowest gaps boxed and
numbered), the engine steps beneath (each step as wide as it lasted, as high as the tokens it
scheduled, coloured by the prefill tokens it carried: decode only, 1-128, 129-1024, >1024).
Rows come from analyzer/report/timeline_data.py (queries/report/timeline.sql, steps.sql)
and stalls_slowest.sql; nothing is computed here but positions.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from analyzer.report.plots import _PHASE_COLORS, LEGEND_FONT_PT, _svg
from analyzer.report.timeline_data import Lane, labelled

__all__ = ["BUCKET_COLORS", "timeline_svg"]

#: an engine step's colour by the prefill tokens it carried (steps.sql's prefill_tokens_bucket)
BUCKET_COLORS = {"0": "#9ecae1", "1-128": "#fdd49e", "129-1024": "#fc8d59", ">1024": "#b30000"}
_BUCKET_NAMES = {"0": "step: decode only", "1-128": "step: prefill 1-128 tokens", "129-1024": "step: prefill 129-1024 tokens",
                 ">1024": "step: prefill >1024 tokens"}
_RECOMPUTE = "#dd8452"
_STALL = "#c44e52"


def _short(text: str, width: int = 22) -> str:
    return text if len(text) <= width else "…" + text[-(width - 1):]


def _counters(ax: Any, steps: Sequence[dict[str, Any]], t0: int) -> Any:
    xs = [(s["start_ns"] - t0) / 1e9 for s in steps]
    ax.step(xs, [s["batch_size"] for s in steps], where="post", color="#4c72b0", linewidth=0.9, label="running (sequences)")
    ax.step(xs, [s["waiting"] for s in steps], where="post", color="#8172b2", linewidth=0.9, linestyle="--",
            label="waiting (sequences)")
    ax.set_ylabel("sequences", fontsize=LEGEND_FONT_PT)
    ax.set_ylim(bottom=0)
    kv = [(x, s["kv_blocks_used"]) for x, s in zip(xs, steps) if s["kv_blocks_used"] is not None]
    if kv:
        ax2 = ax.twinx()
        ax2.step([x for x, _ in kv], [v for _, v in kv], where="post", color="#55a868", linewidth=0.9,
                 label="KV blocks used")
        ax2.set_ylabel("KV blocks", fontsize=LEGEND_FONT_PT)
        ax2.set_ylim(bottom=0)
        return ax2
    return None


def _lanes(ax: Any, lanes: Sequence[Lane], t0: int, stalls: Sequence[dict[str, Any]], tick_every: int) -> None:
    for y, lane in enumerate(lanes):
        for kind, recompute, color in (("queue", None, _PHASE_COLORS["queue"]), ("prefill", False, _PHASE_COLORS["prefill"]),
                                       ("prefill", True, _RECOMPUTE), ("decode", None, _PHASE_COLORS["decode"])):
            bars = [((i["start_ns"] - t0) / 1e9, (i["end_ns"] - t0) / 1e9)
                    for i in lane.kind(kind) if recompute is None or bool(i["recompute"]) == recompute]
            _bars(ax, bars, y - 0.3, y + 0.3, color)
        ticks = [(i["start_ns"] - t0) / 1e9 for i in lane.kind("token", "chunk")][::tick_every]
        if ticks:  # one path for the lane's ticks, not one element per token
            xs = [v for x in ticks for v in (x, x, float("nan"))]
            ax.plot(xs, [v for _ in ticks for v in (y - 0.42, y - 0.3, float("nan"))], color="#333333",
                    linewidth=0.5)
        preempted = [(i["start_ns"] - t0) / 1e9 for i in lane.kind("preemption")]
        if preempted:
            ax.plot(preempted, [y] * len(preempted), "x", color=_STALL, markersize=7, markeredgewidth=1.6)
    row = {lane.request["lane_span_id"]: y for y, lane in enumerate(lanes)}
    for n, gap in enumerate(stalls, start=1):
        y = row[gap["request_span_id"]]
        start, end = (gap["prev_emit_ns"] - t0) / 1e9, (gap["emit_ns"] - t0) / 1e9
        ax.add_patch(_rectangle(start, y - 0.45, end - start, 0.9))
        ax.text(end, y - 0.45, str(n), color=_STALL, fontsize=LEGEND_FONT_PT, fontweight="bold", ha="left", va="bottom")
    ax.set_yticks(range(len(lanes)))
    ax.set_yticklabels([_short(text) for _, text in labelled(lanes)], fontsize=LEGEND_FONT_PT)
    ax.set_ylim(len(lanes) - 0.4, -0.7)
    # legend entries for what the lanes draw (only what is there)
    drawn = {(i["kind"], bool(i["recompute"])) for lane in lanes for i in lane.items}
    for key, color, name in ((("queue", False), _PHASE_COLORS["queue"], "queue"),
                             (("prefill", False), _PHASE_COLORS["prefill"], "prefill chunk"),
                             (("prefill", True), _RECOMPUTE, "prefill (recompute)"),
                             (("decode", False), _PHASE_COLORS["decode"], "decode step")):
        if key in drawn:
            ax.bar([0], [0], width=0, color=color, label=name)
    if {k for k, _ in drawn} & {"token", "chunk"}:
        ax.plot([], [], "|", color="#333333", label="token" if tick_every == 1 else f"token (every {tick_every}th)")
    if ("preemption", False) in drawn:
        ax.plot([], [], "x", color=_STALL, label="preemption")
    if stalls:
        ax.plot([], [], "s", markerfacecolor="none", markeredgecolor=_STALL, label="slowest gap (numbered)")


def _bars(ax: Any, bars: Sequence[tuple[float, float]], low: float, high: float, color: str) -> None:
    """Rectangles (start s, end s) between ``low`` and ``high`` as one compound path: one SVG
    element however many bars (a lane has one per decode step)."""
    if not bars:
        return
    from matplotlib.patches import PathPatch
    from matplotlib.path import Path

    vertices: list[tuple[float, float]] = []
    codes: list[Any] = []  # Path's codes (numpy uint8)
    for start, end in bars:
        end = max(end, start)
        vertices += [(start, low), (end, low), (end, high), (start, high), (start, low)]
        codes += [Path.MOVETO, Path.LINETO, Path.LINETO, Path.LINETO, Path.CLOSEPOLY]
    ax.add_patch(PathPatch(Path(vertices, codes), facecolor=color, linewidth=0))
    ax.update_datalim(vertices)


def _rectangle(x: float, y: float, w: float, h: float) -> Any:
    from matplotlib.patches import Rectangle

    return Rectangle((x, y), w, h, fill=False, edgecolor=_STALL, linewidth=1.2)


def _engine(ax: Any, steps: Sequence[dict[str, Any]], t0: int) -> None:
    """Each step as a polygon column (start..end, 0..scheduled tokens), one polygon per
    bucket, so the SVG holds four paths however many steps."""
    for bucket, color in BUCKET_COLORS.items():
        xs: list[float] = []
        ys: list[float] = []
        for s in steps:
            if s["prefill_tokens_bucket"] != bucket:
                continue
            start, end = (s["start_ns"] - t0) / 1e9, (s["end_ns"] - t0) / 1e9
            xs += [start, start, end, end]
            ys += [0, s["scheduled_tokens"] or 0, s["scheduled_tokens"] or 0, 0]
        if xs:
            ax.fill(xs, ys, color=color, linewidth=0, label=_BUCKET_NAMES[bucket])
    ax.set_ylabel("tokens scheduled\n(symlog)", fontsize=LEGEND_FONT_PT)
    ax.set_yscale("symlog", linthresh=1)  # a decode-only step (1 token per sequence) stays visible
    ax.set_ylim(bottom=0)


def timeline_svg(lanes: Sequence[Lane], steps: Sequence[dict[str, Any]], stalls: Sequence[dict[str, Any]],
                 clock: str, tick_every: int = 1) -> str:
    """The plot as inline SVG. ``lanes`` in the order drawn (top to bottom), ``steps`` the
    engine steps to draw (queries/steps.sql rows of the lanes' clock domain; none: the
    counter and engine bands are left out), ``stalls`` the gaps to box (stalls_slowest.sql
    rows, numbered in order), ``clock`` the name of the lanes' clock for the axis label,
    ``tick_every`` n: one token tick in n is drawn."""
    import matplotlib

    matplotlib.use("Agg", force=True)
    import matplotlib.pyplot as plt

    lane_in = max(1.2, 0.26 * len(lanes))
    heights = [1.1, lane_in, 1.0] if steps else [lane_in]
    fig = plt.figure(figsize=(9.5, sum(heights) + 2.2), dpi=96, layout="constrained")
    axes = fig.subplots(len(heights), 1, sharex=True, gridspec_kw={"height_ratios": heights})
    axes = list(axes) if steps else [axes]
    for ax in axes:
        ax.grid(True, alpha=0.3)
        ax.tick_params(labelsize=LEGEND_FONT_PT)
    t0 = min(lane.start_ns for lane in lanes)
    legend_axes = []
    if steps:
        twin = _counters(axes[0], steps, t0)
        legend_axes += [axes[0]] + ([twin] if twin is not None else [])
        _engine(axes[2], steps, t0)
        lane_ax = axes[1]
    else:
        lane_ax = axes[0]
    _lanes(lane_ax, lanes, t0, stalls, tick_every)
    legend_axes.insert(0, lane_ax)
    if steps:
        legend_axes.append(axes[2])
    handles: list[Any] = []
    labels: list[str] = []
    for ax in legend_axes:
        h, lab = ax.get_legend_handles_labels()
        handles += h
        labels += lab
    fig.legend(handles, labels, loc="outside lower center", ncol=4, fontsize=LEGEND_FONT_PT, frameon=False)
    axes[-1].set_xlabel(f"time since the first request shown started (s), {clock}")
    axes[0].set_title("Requests on the engine's time axis" if steps else "Requests on one time axis (no engine steps)")
    return _svg(fig)
