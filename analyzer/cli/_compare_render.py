"""``tokentrace compare``'s output: a comparison (analyzer/compare/) as text (80 columns: the
warnings, the verdicts, the workload, the table per metric, the E2E decomposition, the engine
steps, notes), as one JSON object, or as csv rows (one per metric and statistic). Text rounds
for reading; json and csv keep full precision. Not a verb (the leading underscore keeps it
out of verb discovery)."""

from __future__ import annotations

import math
import textwrap
from typing import Any

from analyzer.cli._human import cell_text, wrap_note
from analyzer.cli._options import to_jsonable
from analyzer.compare.run_data import RunData
from analyzer.compare.runs import CompareOptions, Comparison, ComparisonRow
from analyzer.query.utc_columns import utc_ms_text

__all__ = ["CSV_COLUMNS", "csv_rows", "json_object", "text_lines"]

#: The keys of each metric row in json, and the csv's columns, in this order.
CSV_COLUMNS = ("metric", "statistic", "unit", "a", "b", "change", "change_pct", "ci_low", "ci_high", "ci_low_pct",
               "ci_high_pct", "n_a", "n_b", "verdict", "lower_is_better")


def _num(value: float | None) -> str:
    """A figure for reading: 4 significant digits, '-' for none."""
    if value is None or (isinstance(value, float) and not math.isfinite(value)):
        return "-"
    return cell_text(float(value))


def _pct(value: float | None, change: float = 0.0) -> str:
    """A change in % of the baseline; None: 0 % when nothing changed, else '-' (unknown)."""
    if value is None:
        return "0 %" if change == 0 else "-"
    if not math.isfinite(value):
        return "new" if value > 0 else "gone"
    return f"{value:+.1f} %"


def _pct_of(value: float, baseline: float) -> float | None:
    if not math.isfinite(value) or baseline == 0 or not math.isfinite(baseline):
        return None
    return value / abs(baseline) * 100.0


def _interval_text(row: ComparisonRow) -> str:
    """The interval in % of the baseline; in the metric's unit when the baseline is 0."""
    if not (math.isfinite(row.ci_low) and math.isfinite(row.ci_high)):
        return "-"
    low, high = _pct_of(row.ci_low, row.a), _pct_of(row.ci_high, row.a)
    if low is None or high is None:
        return f"{row.ci_low:+.4g} .. {row.ci_high:+.4g}"
    return f"{low:+.1f} .. {high:+.1f} %"


def _side_line(tag: str, run: RunData, path: str) -> list[str]:
    start = utc_ms_text(int(run.s_ns.min())) if run.requests else "-"
    return textwrap.wrap(f"{tag}: {path}: {run.requests} requests from {start}, window {run.window_s:.1f} s",
                         80, subsequent_indent="    ", break_long_words=False, break_on_hyphens=False)


def text_lines(c: Comparison, paths: tuple[str, str], options: CompareOptions) -> list[str]:
    """The 80-column block."""
    lines = [f"compare, {c.baseline.perspective} perspective (A = baseline, B = candidate)"]
    lines += _side_line("A", c.baseline, paths[0]) + _side_line("B", c.candidate, paths[1])
    for warning in c.warnings:
        lines += textwrap.wrap(f"warning: {warning}", 80, subsequent_indent="  ")
    counts = {v: sum(r.verdict == v for r in c.rows) for v in ("worse", "better", "no_difference", "too_few")}
    lines += ["", f"verdicts ({len(c.rows)} figures; 95 % intervals, min effect {options.min_effect_pct:g} %):",
              "  " + ", ".join(f"{n} {v}" for v, n in counts.items() if n)]
    changed = [r for r in c.rows if r.verdict in ("worse", "better")]
    for r in changed:
        lines.append(f"  {r.verdict:<7} {r.label + ' ' + r.statistic:<24} {_pct(r.change_pct, r.change):>9}  "
                     f"({_interval_text(r)})")
    if not changed and counts["no_difference"]:
        lines.append("  nothing changed beyond noise and the minimum effect")
    lines += ["", "workload (a different workload makes every line below suspect)",
              f"  {'figure':<14} {'stat':<5} {'A':>10} {'B':>10} {'change':>9}"]
    for w in c.workload:
        mark = "  differs" if w.differs else ""
        change = _pct(w.change_pct, w.b - w.a)
        lines.append(f"  {w.figure:<14} {w.statistic:<5} {_num(w.a):>10} {_num(w.b):>10} {change:>9}{mark}")
    lines += ["", f"  {'stat':<5} {'A':>10} {'B':>10} {'change':>9}  {'95 % interval':>19}  verdict"]
    current = None
    for r in c.rows:
        if r.metric != current:
            current = r.metric
            lines.append(f"{r.label} ({r.unit}), requests A {r.n_a}, B {r.n_b}")
        lines.append(f"  {r.statistic:<5} {_num(r.a):>10} {_num(r.b):>10} {_pct(r.change_pct, r.change):>9}  "
                     f"{_interval_text(r):>19}  {r.verdict}")
    if c.parts:
        lines += ["", "where the mean E2E change comes from (ms per request; means add)",
                  f"  {'part':<14} {'A':>10} {'B':>10} {'change':>10}  {'95 % interval':>21}"]
        for p in c.parts:
            interval = (f"{p.ci_low:+.1f} .. {p.ci_high:+.1f}" if math.isfinite(p.ci_low) and math.isfinite(p.ci_high)
                        else "-")
            name = "E2E (the sum)" if p.part == "E2E" else p.part
            lines.append(f"  {name:<14} {p.a:>10.1f} {p.b:>10.1f} {p.change:>+10.1f}  {interval:>21}")
    if c.steps:
        lines += ["", "what shared the decode steps (engine step data, the engine's clock)",
                  f"  {'gaps':<7} {'figure':<20} {'A':>10} {'B':>10}"]
        for s in c.steps:
            lines.append(f"  {s.gaps:<7} {s.figure:<20} {_num(s.a):>10} {_num(s.b):>10}")
    for text in c.not_compared:
        lines += wrap_note(f"not compared: {text}", 80)
    for note in c.notes:
        lines += wrap_note(note, 80)
    return lines


def _row_dict(r: ComparisonRow) -> dict[str, Any]:
    return {"metric": r.metric, "statistic": r.statistic, "unit": r.unit, "a": r.a, "b": r.b, "change": r.change,
            "change_pct": r.change_pct, "ci_low": r.ci_low, "ci_high": r.ci_high,
            "ci_low_pct": _pct_of(r.ci_low, r.a), "ci_high_pct": _pct_of(r.ci_high, r.a), "n_a": r.n_a,
            "n_b": r.n_b, "verdict": r.verdict, "lower_is_better": r.lower_is_better}


def _side(run: RunData, path: str) -> dict[str, Any]:
    return {"path": path, "perspective": run.perspective, "requests": run.requests,
            "succeeded": int(run.succeeded.sum()),
            "window_start_utc": utc_ms_text(int(run.s_ns.min())) if run.requests else None,
            "window_s": run.window_s}


def json_object(c: Comparison, paths: tuple[str, str], options: CompareOptions) -> dict[str, Any]:
    """Everything in one object: the two sides, the options, warnings, workload, one object
    per metric and statistic (``metrics``), the decomposition, the engine steps' figures,
    what was not compared, notes."""
    return to_jsonable({
        "baseline": _side(c.baseline, paths[0]),
        "candidate": _side(c.candidate, paths[1]),
        "options": {"confidence_level": 0.95, "resamples": options.resamples, "seed": options.seed,
                    "max_requests": options.max_requests, "min_effect_pct": options.min_effect_pct,
                    "min_requests": options.min_requests, "stall_factor": options.stall_factor},
        "warnings": c.warnings,
        "workload": [{"figure": w.figure, "statistic": w.statistic, "unit": w.unit, "a": w.a, "b": w.b,
                      "change_pct": w.change_pct, "differs": w.differs} for w in c.workload],
        "metrics": [_row_dict(r) for r in c.rows],
        "decomposition": [{"part": p.part, "unit": "ms", "a": p.a, "b": p.b, "change": p.change,
                           "ci_low": p.ci_low, "ci_high": p.ci_high} for p in c.parts],
        "steps": [{"gaps": s.gaps, "figure": s.figure, "unit": s.unit, "a": s.a, "b": s.b} for s in c.steps],
        "not_compared": c.not_compared,
        "notes": c.notes,
    })


def csv_rows(c: Comparison) -> list[tuple[Any, ...]]:
    """One row per metric and statistic, in :data:`CSV_COLUMNS` order (NaN as empty)."""
    out = []
    for r in c.rows:
        d = _row_dict(r)
        out.append(tuple(None if isinstance(v, float) and not math.isfinite(v) else v
                         for v in (d[k] for k in CSV_COLUMNS)))
    return out
