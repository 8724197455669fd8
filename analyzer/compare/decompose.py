"""Where a difference comes from: the workload each run was given, and the mean E2E's change
split into the changes of its phases' means.

Means add: over the same requests, mean E2E = mean queue + mean prefill + mean rest of TTFT
+ mean steady decode + mean decode stalls, since per request E2E = TTFT + (e - f), TTFT =
queue + prefill + the rest (network, gateway, tokenize, first emit: phases.sql), and e - f is
the sum of the request's visible-chunk gaps, split at ``stall_factor`` x the baseline's
median gap. Percentiles do not add: the table shows them per phase, never summed.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from analyzer.compare.resample import request_interval, request_statistics, subset
from analyzer.compare.run_data import RunData
from analyzer.compare.verdict import relative_pct, verdict

__all__ = ["Part", "StepLine", "WorkloadLine", "decompose_e2e", "stall_threshold_ms", "step_context", "workload_lines"]


@dataclass(frozen=True)
class Part:
    """One phase's mean per request on each side (ms) and the interval of its change."""

    part: str
    a: float
    b: float
    change: float
    ci_low: float
    ci_high: float


@dataclass(frozen=True)
class WorkloadLine:
    """One figure of what each run was given: tokens in and out, concurrency, requests.
    ``differs``: the change passes the verdict rule (interval excludes 0, at least the
    minimum effect); None where no interval is computed."""

    figure: str
    unit: str
    statistic: str
    a: float
    b: float
    change_pct: float | None
    differs: bool | None


def stall_threshold_ms(baseline: RunData, stall_factor: float) -> float | None:
    """``stall_factor`` x the median gap of the baseline's succeeded requests (ms): one
    threshold for both runs, so a stall is a gap of the same length on each side."""
    keep = baseline.succeeded[baseline.gap_request] if baseline.gap_ms.size else np.zeros(0, bool)
    gaps = baseline.gap_ms[keep]
    return float(stall_factor * np.median(gaps)) if gaps.size else None


def _parts_of(run: RunData, split_ttft: bool, threshold: float | None) -> dict[str, np.ndarray]:
    """Per succeeded request with TTFT and E2E known: each part's ms."""
    rows = run.succeeded & np.isfinite(run.ttft_ms) & np.isfinite(run.e2e_ms)
    ttft, e2e = run.ttft_ms[rows], run.e2e_ms[rows]
    parts: dict[str, np.ndarray] = {}
    if split_ttft:
        parts["queue"] = run.queue_ms[rows]
        parts["prefill"] = run.prefill_ms[rows]
        parts["rest of TTFT"] = ttft - parts["queue"] - parts["prefill"]
    else:
        parts["TTFT"] = ttft
    decode = e2e - ttft
    if threshold is not None:
        stall = np.where(run.gap_ms > threshold, run.gap_ms, 0.0)
        stall_per_request = np.bincount(run.gap_request, weights=stall, minlength=run.requests)[rows]
        parts["decode steady"] = decode - stall_per_request
        parts["decode stalls"] = stall_per_request
    else:
        parts["decode"] = decode
    parts["E2E"] = e2e
    return parts


def _splits_ttft(run: RunData) -> bool:
    rows = run.succeeded & np.isfinite(run.ttft_ms) & np.isfinite(run.e2e_ms)
    return bool(rows.any()) and bool(np.isfinite(run.queue_ms[rows]).all() and np.isfinite(run.prefill_ms[rows]).all())


def decompose_e2e(a: RunData, b: RunData, stall_factor: float, resamples: int, max_requests: int,
                  seed: int) -> tuple[list[Part], list[str]]:
    """The parts of the mean E2E on each side and their changes (the last part is E2E
    itself: the sum of the others), with notes saying how the split was made."""
    notes: list[str] = []
    split_ttft = _splits_ttft(a) and _splits_ttft(b)
    if not split_ttft:
        notes.append("TTFT not split into queue and prefill: a run has requests without server phase spans")
    threshold = stall_threshold_ms(a, stall_factor)
    if threshold is None:
        notes.append("decode not split into steady gaps and stalls: the baseline has no chunk gaps")
    else:
        notes.append(f"decode stalls: gaps over {stall_factor:g} x the baseline's median gap ({threshold:.4g} ms)")
    a_parts, b_parts = _parts_of(a, split_ttft, threshold), _parts_of(b, split_ttft, threshold)
    out: list[Part] = []
    for i, name in enumerate(a_parts):
        rng = np.random.default_rng([seed, 1000 + i])
        x, y = a_parts[name], b_parts[name]
        x_sub, y_sub = x[subset(x.size, max_requests, rng)], y[subset(y.size, max_requests, rng)]
        interval = request_interval(x_sub, y_sub, resamples, rng)[0]
        mean_a = float(np.mean(x)) if x.size else np.nan
        mean_b = float(np.mean(y)) if y.size else np.nan
        out.append(Part(name, mean_a, mean_b, mean_b - mean_a, interval.low, interval.high))
    return out, notes


def _concurrency(run: RunData) -> tuple[float, float]:
    """Mean requests in flight over the window (sum of request durations / window) and the
    peak (most requests open at once)."""
    if run.requests == 0 or run.window_s <= 0:
        return np.nan, np.nan
    mean = float((run.end_ns - run.s_ns).sum() / 1e9 / run.window_s)
    times = np.concatenate([run.s_ns, run.end_ns])
    steps = np.concatenate([np.ones(run.requests), -np.ones(run.requests)])
    order = np.lexsort((steps, times))  # at a tie an end (-1) comes before a start
    return mean, float(np.cumsum(steps[order]).max())


def workload_lines(a: RunData, b: RunData, resamples: int, max_requests: int, seed: int,
                   min_effect_pct: float) -> tuple[list[WorkloadLine], list[str]]:
    """What each run was given, and a warning per token distribution that differs by the
    verdict rule. A warning needs no minimum of requests (2 a side): it says the comparison
    may be unfair, not that one run is better."""
    lines: list[WorkloadLine] = [WorkloadLine("requests", "requests", "count", a.requests, b.requests,
                                              relative_pct(b.requests - a.requests, a.requests), None)]
    warnings: list[str] = []
    # the prompts of every request; the output of the succeeded ones (a refused request's
    # missing answer is not work it was given)
    for i, (figure, attr) in enumerate((("input tokens", "input_tokens"), ("output tokens", "output_tokens"))):
        x, y = getattr(a, attr), getattr(b, attr)
        if attr == "output_tokens":
            x, y = x[a.succeeded], y[b.succeeded]
        x, y = x[np.isfinite(x)], y[np.isfinite(y)]
        if x.size == 0 or y.size == 0:
            continue
        rng = np.random.default_rng([seed, 2000 + i])
        intervals = request_interval(x[subset(x.size, max_requests, rng)], y[subset(y.size, max_requests, rng)],
                                     resamples, rng)
        stats_a, stats_b = request_statistics(x), request_statistics(y)
        for j, statistic in enumerate(("mean", "p50", "p90")):
            differs = verdict(stats_a[j], stats_b[j], intervals[j].low, intervals[j].high, x.size, y.size,
                              True, min_effect_pct, 2) in ("worse", "better")
            lines.append(WorkloadLine(figure, "tokens", statistic, float(stats_a[j]), float(stats_b[j]),
                                      relative_pct(stats_b[j] - stats_a[j], stats_a[j]), differs))
            if differs and not any(w.startswith(f"the workloads differ: {figure} ") for w in warnings):
                warnings.append(f"the workloads differ: {figure} {statistic} {stats_a[j]:.4g} -> {stats_b[j]:.4g}; "
                                "every other line compares different work")
    (mean_a, peak_a), (mean_b, peak_b) = _concurrency(a), _concurrency(b)
    lines.append(WorkloadLine("concurrency", "requests in flight", "mean", mean_a, mean_b,
                              relative_pct(mean_b - mean_a, mean_a), None))
    lines.append(WorkloadLine("concurrency", "requests in flight", "peak", peak_a, peak_b,
                              relative_pct(peak_b - peak_a, peak_a), None))
    return lines, warnings


@dataclass(frozen=True)
class StepLine:
    """What the engine steps of one kind of decode gap (steady or stall) held, on each side:
    the gaps' count and share, and the mean batch size and co-scheduled prefill tokens of
    the steps that ended them."""

    gaps: str
    figure: str
    unit: str
    a: float
    b: float


def _step_figures(run: RunData, threshold: float) -> dict[tuple[str, str], float]:
    out: dict[tuple[str, str], float] = {}
    total = run.step_itl_ms.size
    for kind, mask in (("steady", run.step_itl_ms <= threshold), ("stall", run.step_itl_ms > threshold)):
        n = int(mask.sum())
        out[(kind, "gaps")] = float(n)
        out[(kind, "share of gaps")] = n / total if total else np.nan
        out[(kind, "batch size mean")] = float(run.step_batch_size[mask].mean()) if n else np.nan
        out[(kind, "prefill tokens mean")] = float(run.step_prefill_tokens[mask].mean()) if n else np.nan
    return out


def step_context(a: RunData, b: RunData, stall_factor: float) -> tuple[list[StepLine], list[str]]:
    """With engine step data on both sides (stalls.sql): for steady gaps and stalls (over
    ``stall_factor`` x the baseline's median engine gap), what their steps held. Figures,
    not verdicts: no interval is drawn for them."""
    if a.step_itl_ms.size == 0 or b.step_itl_ms.size == 0:
        sides = [run.label for run in (a, b) if run.step_itl_ms.size == 0]
        return [], [f"no engine step data in {' or '.join(sides)}: what shared the decode steps is not said"]
    threshold = float(stall_factor * np.median(a.step_itl_ms))
    fa, fb = _step_figures(a, threshold), _step_figures(b, threshold)
    units = {"gaps": "gaps", "share of gaps": "fraction", "batch size mean": "sequences",
             "prefill tokens mean": "tokens"}
    lines = [StepLine(kind, figure, units[figure], fa[(kind, figure)], fb[(kind, figure)]) for kind, figure in fa]
    note = (f"engine steps: a stall is an engine gap over {stall_factor:g} x the baseline's median engine gap "
            f"({threshold:.4g} ms, the engine's clock)")
    return lines, [note]
