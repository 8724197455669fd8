"""The report's comparison section (``tokentrace report --compare BASELINE``): the verdicts of
``tokentrace compare`` (analyzer/compare/), the E2E decomposition, and the two runs' CDFs of
TTFT, TPOT, ITL and E2E on one plot each."""

from __future__ import annotations

import html
import math

import numpy as np

from analyzer.compare.runs import Comparison
from analyzer.report import plots

__all__ = ["comparison_section"]


def _num(value: float | None) -> str:
    if value is None or not math.isfinite(value):
        return "-"
    if value == 0:
        return "0"
    return f"{value:.4g}" if abs(value) < 1e4 else f"{value:.0f}"


def _pct(value: float | None) -> str:
    if value is None or not math.isfinite(value):
        return "-"
    return f"{value:+.1f} %"


def _interval(low: float, high: float, baseline: float) -> str:
    if not (math.isfinite(low) and math.isfinite(high)):
        return "-"
    if baseline == 0 or not math.isfinite(baseline):
        return f"{low:+.4g} .. {high:+.4g}"
    return f"{low / abs(baseline) * 100:+.1f} .. {high / abs(baseline) * 100:+.1f} %"


def _table(head: list[str], rows: list[list[str]], verdict_col: int | None = None) -> str:
    cells = "".join(f'<th class="l">{html.escape(h)}</th>' for h in head)
    body = []
    for row in rows:
        tds = []
        for i, value in enumerate(row):
            klass = "l" if i == 0 or i == verdict_col else ""
            if i == verdict_col and value == "worse":
                klass += " fail"
            elif i == verdict_col and value == "better":
                klass += " pass"
            tds.append(f'<td class="{klass.strip()}">{html.escape(value)}</td>')
        body.append("<tr>" + "".join(tds) + "</tr>")
    return f'<div class="tbl"><table><tr>{cells}</tr>{"".join(body)}</table></div>'


def _succeeded(values: np.ndarray, succeeded: np.ndarray) -> list[float]:
    kept = values[succeeded]
    return [float(v) for v in kept[np.isfinite(kept)]]


def comparison_section(c: Comparison, baseline_path: str) -> str:
    """The section's HTML: what was compared, the warnings, the table of every figure with its
    verdict, the decomposition, then one CDF plot per latency with both runs."""
    a, b = c.baseline, c.candidate
    parts = [
        "<h2>Compared with a baseline</h2>",
        (f'<p class="note">A = baseline {html.escape(baseline_path)} ({a.requests} requests), B = this run '
         f"({b.requests} requests), both from the {html.escape(a.perspective)} perspective. Each change has a "
         "95 % bootstrap interval (whole requests resampled); worse / better only when it excludes 0 and the "
         "change is at least the minimum effect (docs/compare.md).</p>"),
    ]
    parts += [f'<p class="fail">warning: {html.escape(w)}</p>' for w in c.warnings]
    rows = [[f"{r.label} ({r.unit})", r.statistic, _num(r.a), _num(r.b), _pct(r.change_pct),
             _interval(r.ci_low, r.ci_high, r.a), r.verdict] for r in c.rows]
    parts.append(_table(["figure", "statistic", "A", "B", "change", "95 % interval", "verdict"], rows,
                        verdict_col=6))
    if c.parts:
        parts.append("<h3>Where the mean E2E change comes from (ms per request; means add)</h3>")
        parts.append(_table(["part", "A (ms)", "B (ms)", "change (ms)", "95 % interval (ms)"],
                            [[p.part, _num(p.a), _num(p.b), _num(p.change),
                              _interval(p.ci_low, p.ci_high, 0.0)] for p in c.parts]))
    series = {
        "TTFT": (a.ttft_ms, b.ttft_ms, "TTFT (ms)"),
        "TPOT": (a.tpot_ms, b.tpot_ms, "TPOT (ms per output token after the first)"),
        "E2E": (a.e2e_ms, b.e2e_ms, "E2E (ms)"),
    }
    plots_html = []
    for title, (va, vb, xlabel) in series.items():
        plots_html.append(plots.cdf_svg({"A baseline": _succeeded(va, a.succeeded),
                                         "B this run": _succeeded(vb, b.succeeded)}, xlabel, title))
    gaps_a = a.gap_ms[a.succeeded[a.gap_request]] if a.gap_ms.size else a.gap_ms
    gaps_b = b.gap_ms[b.succeeded[b.gap_request]] if b.gap_ms.size else b.gap_ms
    plots_html.insert(2, plots.cdf_svg({"A baseline": [float(g) for g in gaps_a],
                                        "B this run": [float(g) for g in gaps_b]}, "ITL (ms per chunk gap)", "ITL",
                                       ylabel="fraction of gaps ≤ x"))
    parts.append('<div class="grid">' + "".join(plots_html) + "</div>")
    for text in [*(f"not compared: {t}" for t in c.not_compared), *c.notes]:
        parts.append(f'<p class="note">{html.escape(text)}</p>')
    return "".join(parts)
