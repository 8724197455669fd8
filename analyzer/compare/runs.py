"""Compare two runs: every metric x statistic with its change, interval and verdict, the
workload lines and the E2E decomposition (docs/compare.md)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np

from analyzer.compare.decompose import Part, StepLine, WorkloadLine, decompose_e2e, step_context, workload_lines
from analyzer.compare.resample import (
    STATISTICS,
    WINDOW_FIGURES,
    Interval,
    gap_interval,
    gap_statistics,
    request_interval,
    request_statistics,
    subset,
    window_figures,
    window_interval,
)
from analyzer.compare.run_data import RunData
from analyzer.compare.verdict import (
    DEFAULT_MIN_EFFECT_PCT,
    DEFAULT_MIN_REQUESTS,
    METRICS,
    Metric,
    relative_pct,
    verdict,
)

__all__ = ["CompareOptions", "Comparison", "ComparisonRow", "compare_runs"]


@dataclass(frozen=True)
class CompareOptions:
    """How intervals are drawn and verdicts given. ``max_requests``: above it, an interval is
    computed on this many requests of a side drawn at random (the point figures always on
    all); ``stall_factor``: a decode gap over this many times the baseline's median gap is a
    stall; ``slo_given``: goodput is compared only when an SLO was stated."""

    resamples: int = 1000
    seed: int = 0
    max_requests: int = 1000
    min_effect_pct: float = DEFAULT_MIN_EFFECT_PCT
    min_requests: int = DEFAULT_MIN_REQUESTS
    stall_factor: float = 3.0
    slo_given: bool = False


@dataclass(frozen=True)
class ComparisonRow:
    """One metric and statistic: baseline ``a``, candidate ``b`` (the metric's unit), the
    change b - a and its 95 % interval (same unit), the change in % of a, the requests with
    the figure on each side, and the verdict."""

    metric: str
    label: str
    unit: str
    statistic: str
    a: float
    b: float
    change: float
    change_pct: float | None
    ci_low: float
    ci_high: float
    n_a: int
    n_b: int
    verdict: str
    lower_is_better: bool


@dataclass
class Comparison:
    """Everything compare says about two runs."""

    baseline: RunData
    candidate: RunData
    rows: list[ComparisonRow]
    parts: list[Part]
    workload: list[WorkloadLine]
    steps: list[StepLine] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    not_compared: list[str] = field(default_factory=list)


def _row(metric: Metric, statistic: str, a: float, b: float, interval: Interval, n_a: int, n_b: int,
         options: CompareOptions) -> ComparisonRow:
    change = float(b - a)
    return ComparisonRow(
        metric=metric.key, label=metric.label, unit=metric.unit, statistic=statistic, a=float(a), b=float(b),
        change=change, change_pct=relative_pct(change, a) if np.isfinite(change) else None,
        ci_low=interval.low, ci_high=interval.high, n_a=n_a, n_b=n_b,
        verdict=verdict(float(a), float(b), interval.low, interval.high, n_a, n_b, metric.lower_is_better,
                        options.min_effect_pct, options.min_requests),
        lower_is_better=metric.lower_is_better,
    )


def _request_values(run: RunData, key: str) -> np.ndarray:
    values = getattr(run, key)[run.succeeded]
    return values[np.isfinite(values)]


def _gaps(run: RunData, keep: np.ndarray) -> tuple[np.ndarray, np.ndarray, int]:
    """The gaps of the requests ``keep`` (indices), their owners renumbered 0..len(keep)-1."""
    position = np.full(run.requests, -1)
    position[keep] = np.arange(keep.size)
    owner = position[run.gap_request]
    mine = owner >= 0
    return run.gap_ms[mine], owner[mine], int(keep.size)


def _window_arrays(run: RunData, keep: np.ndarray) -> dict[str, Any]:
    return {"s_ns": run.s_ns[keep], "end_ns": run.end_ns[keep], "succeeded": run.succeeded[keep],
            "failed": run.failed[keep], "meets_slo": run.meets_slo[keep], "output_tokens": run.output_tokens[keep]}


def _missing(metric: Metric, a: RunData, b: RunData, have_a: bool, have_b: bool) -> str:
    sides = [run.label for run, have in ((a, have_a), (b, have_b)) if not have]
    return f"{metric.label} ({metric.key}): no figure in {' or '.join(sides)}"


def _model_warnings(a: RunData, b: RunData) -> list[str]:
    """A warning when the runs name different models (a side naming none says nothing)."""
    if a.models and b.models and a.models != b.models:
        return [(f"the runs served different models: {a.label} {', '.join(a.models)}; "
                 f"{b.label} {', '.join(b.models)}")]
    return []


def compare_runs(a: RunData, b: RunData, options: CompareOptions = CompareOptions()) -> Comparison:
    """Compare the baseline ``a`` with the candidate ``b``, seen from the same perspective."""
    rows: list[ComparisonRow] = []
    not_compared: list[str] = []
    for index, metric in enumerate(METRICS):
        rng = np.random.default_rng([options.seed, index])
        if metric.kind == "request":
            x, y = _request_values(a, metric.key), _request_values(b, metric.key)
            if x.size == 0 or y.size == 0:
                not_compared.append(_missing(metric, a, b, x.size > 0, y.size > 0))
                continue
            intervals = request_interval(x[subset(x.size, options.max_requests, rng)],
                                         y[subset(y.size, options.max_requests, rng)], options.resamples, rng)
            for statistic, va, vb, interval in zip(STATISTICS, request_statistics(x), request_statistics(y),
                                                   intervals):
                rows.append(_row(metric, statistic, va, vb, interval, x.size, y.size, options))
        elif metric.kind == "gap":
            keep_a = np.flatnonzero(a.succeeded & (np.bincount(a.gap_request, minlength=a.requests) > 0))
            keep_b = np.flatnonzero(b.succeeded & (np.bincount(b.gap_request, minlength=b.requests) > 0))
            if keep_a.size == 0 or keep_b.size == 0:
                not_compared.append(_missing(metric, a, b, keep_a.size > 0, keep_b.size > 0))
                continue
            all_a, all_b = _gaps(a, keep_a)[0], _gaps(b, keep_b)[0]
            sub_a = _gaps(a, keep_a[subset(keep_a.size, options.max_requests, rng)])
            sub_b = _gaps(b, keep_b[subset(keep_b.size, options.max_requests, rng)])
            intervals = gap_interval(*sub_a, *sub_b, options.resamples, rng)
            for statistic, va, vb, interval in zip(STATISTICS, gap_statistics(all_a), gap_statistics(all_b),
                                                   intervals):
                rows.append(_row(metric, statistic, va, vb, interval, keep_a.size, keep_b.size, options))
        elif metric.kind == "window":
            if metric.key == "goodput_rps" and not options.slo_given:
                continue
            if metric.key == "goodput_rps" and not (a.slo_known and b.slo_known):
                sides = " and ".join(run.label for run in (a, b) if not run.slo_known)
                not_compared.append(f"{metric.label} ({metric.key}): {sides} is a benchmark report (SLOs are "
                                    "checked on traces only)")
                continue
            at = WINDOW_FIGURES.index(metric.key)
            if a.requests == 0 or b.requests == 0:
                not_compared.append(_missing(metric, a, b, a.requests > 0, b.requests > 0))
                continue
            keep_a = subset(a.requests, options.max_requests, rng)
            keep_b = subset(b.requests, options.max_requests, rng)
            interval = window_interval(_window_arrays(a, keep_a), a.requests / keep_a.size,
                                       _window_arrays(b, keep_b), b.requests / keep_b.size, options.resamples,
                                       rng)[at]
            va = window_figures(**_window_arrays(a, np.arange(a.requests)))[at]
            vb = window_figures(**_window_arrays(b, np.arange(b.requests)))[at]
            rows.append(_row(metric, "value", va, vb, interval, a.requests, b.requests, options))
    parts: list[Part] = []
    part_notes = ["no E2E decomposition: no request has both TTFT and E2E on each side"]
    if any(r.metric == "e2e_ms" for r in rows) and any(r.metric == "ttft_ms" for r in rows):
        parts, part_notes = decompose_e2e(a, b, options.stall_factor, options.resamples, options.max_requests,
                                          options.seed)
    workload, token_warnings = workload_lines(a, b, options.resamples, options.max_requests, options.seed,
                                        options.min_effect_pct)
    warnings = [*_model_warnings(a, b), *token_warnings]
    steps, step_notes = step_context(a, b, options.stall_factor)
    notes = [*a.notes, *b.notes, *part_notes, *step_notes]
    small = [run.label for run in (a, b) if 0 < int(run.succeeded.sum()) < 100]
    if small:
        notes.append(f"{' and '.join(small)}: under 100 succeeded requests, so p99 is interpolated between "
                     "the largest values (the extremes), not a tail estimate")
    return Comparison(a, b, rows, parts, workload, steps, warnings, notes, not_compared)
