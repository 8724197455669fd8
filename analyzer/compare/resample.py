"""Bootstrap intervals of the change between two runs, resampling whole requests.

Three resamplers, each drawing requests with replacement on each side independently and
taking the 2.5th and 97.5th percentiles of (candidate statistic - baseline statistic):

- per-request figures (TTFT, TPOT, E2E, queue, prefill, output tokens/s of a request):
  ``scipy.stats.bootstrap`` over the two samples, percentile method;
- the gaps (ITL): a request drawn k times brings all its gaps k times (multinomial weights
  per request), so a long request never counts as many independent samples; the pooled
  mean and weighted percentiles are recomputed per resample with numpy;
- window figures (request and token throughput, goodput, error rate): per resample the
  counts and the window (earliest start to latest end of the drawn requests) are recomputed.

Percentiles are linear interpolation between order statistics everywhere (numpy's default,
DuckDB's quantile_cont: the definition summary.sql uses). Every draw comes from a
``numpy.random.Generator`` seeded by the caller, so a result is the same on every run.
"""

from __future__ import annotations

import warnings
from dataclasses import dataclass

import numpy as np

__all__ = [
    "QUANTILES", "STATISTICS", "Interval", "gap_interval", "gap_statistics", "request_interval",
    "request_statistics", "subset", "window_figures", "window_interval",
]

#: The statistics of a distribution compare reports, and their quantile levels.
STATISTICS = ("mean", "p50", "p90", "p99")
QUANTILES = (0.5, 0.9, 0.99)
#: The window figures (statistic "value"), in the order window_figures returns them.
WINDOW_FIGURES = ("request_throughput_rps", "output_token_throughput", "goodput_rps", "error_rate")
_LEVEL = 0.95
#: Cells of a gap-weight matrix (resamples x gaps, int32) built at once
_GAP_CELLS_PER_CHUNK = 1_000_000


@dataclass(frozen=True)
class Interval:
    """A 95 % percentile-bootstrap interval of the change (candidate - baseline), in the
    metric's unit; NaN bounds when no resample gave a figure."""

    low: float
    high: float


def request_statistics(values: np.ndarray) -> np.ndarray:
    """mean, p50, p90, p99 of the finite ``values`` (NaN each when there are none)."""
    known = values[np.isfinite(values)]
    if known.size == 0:
        return np.full(len(STATISTICS), np.nan)
    return np.concatenate([[known.mean()], np.quantile(known, QUANTILES)])


def subset(n: int, max_requests: int, rng: np.random.Generator) -> np.ndarray:
    """Indices of the requests an interval is computed on: all of them, or a random
    ``max_requests`` of them (sorted) when there are more."""
    if n <= max_requests:
        return np.arange(n)
    return np.sort(rng.choice(n, size=max_requests, replace=False))


def _stats_along(x: np.ndarray, axis: int = -1) -> np.ndarray:
    """mean, p50, p90, p99 along ``axis`` (linear interpolation, numpy's default), the order
    statistics found by one partition instead of a sort per quantile."""
    x = np.moveaxis(x, axis, -1)
    n = x.shape[-1]
    positions = [q * (n - 1) for q in QUANTILES]
    lows = [int(np.floor(h)) for h in positions]
    highs = [min(lo + 1, n - 1) for lo in lows]
    part = np.partition(x, sorted(set(lows + highs)), axis=-1)
    out = [np.mean(x, axis=-1)]
    for h, lo, hi in zip(positions, lows, highs):
        below, above = part[..., lo], part[..., hi]
        out.append(below + (h - lo) * (above - below))
    return np.stack(out)


def request_interval(a: np.ndarray, b: np.ndarray, resamples: int, rng: np.random.Generator) -> list[Interval]:
    """Intervals of the change of mean, p50, p90, p99 between two samples of per-request
    figures (finite values only), by ``scipy.stats.bootstrap`` (independent samples,
    percentile method)."""
    from scipy import stats

    a, b = a[np.isfinite(a)], b[np.isfinite(b)]
    if a.size < 2 or b.size < 2:
        return [Interval(np.nan, np.nan)] * len(STATISTICS)

    def change(x: np.ndarray, y: np.ndarray, axis: int = -1) -> np.ndarray:
        return _stats_along(y, axis) - _stats_along(x, axis)

    with warnings.catch_warnings():  # identical values: a zero-width interval is the answer
        warnings.simplefilter("ignore")
        result = stats.bootstrap((a, b), change, n_resamples=resamples, vectorized=True, method="percentile",
                                 confidence_level=_LEVEL, rng=rng, batch=max(1, 2_000_000 // max(a.size, b.size)))
    low, high = result.confidence_interval
    return [Interval(float(lo), float(hi)) for lo, hi in zip(np.atleast_1d(low), np.atleast_1d(high))]


def _percentile_interval(changes: np.ndarray) -> list[Interval]:
    """Per column of ``changes`` (resamples x figures): the 2.5th .. 97.5th percentile."""
    out = []
    for column in changes.T:
        known = column[np.isfinite(column)]
        if known.size == 0:
            out.append(Interval(np.nan, np.nan))
            continue
        lo, hi = np.quantile(known, [(1 - _LEVEL) / 2, 1 - (1 - _LEVEL) / 2])
        out.append(Interval(float(lo), float(hi)))
    return out


def gap_statistics(gap_ms: np.ndarray) -> np.ndarray:
    """mean, p50, p90, p99 of every gap pooled (NaN each when there is none)."""
    return request_statistics(gap_ms)


def _weighted_gap_stats(sorted_gaps: np.ndarray, sorted_owner: np.ndarray, weights: np.ndarray) -> np.ndarray:
    """Per row of ``weights`` (resamples x requests: how often each request was drawn): the
    mean and linear percentiles of the gaps of the drawn requests, each gap repeated as
    often as its request was drawn. ``sorted_gaps`` ascending, ``sorted_owner`` their
    request indices. Returns resamples x 4."""
    rows, requests = weights.shape
    out = np.full((rows, len(STATISTICS)), np.nan)
    sums = np.bincount(sorted_owner, weights=sorted_gaps, minlength=requests)
    counts = np.bincount(sorted_owner, minlength=requests).astype(np.float64)
    with np.errstate(invalid="ignore", divide="ignore"):
        out[:, 0] = (weights @ sums) / (weights @ counts)
    weights = weights.astype(np.int32)
    per_chunk = max(1, _GAP_CELLS_PER_CHUNK // max(1, sorted_gaps.size))
    for start in range(0, rows, per_chunk):
        # expanded position of each gap: how many drawn gaps are <= it, per resample
        cum = np.cumsum(np.take(weights[start:start + per_chunk], sorted_owner, axis=1), axis=1, dtype=np.int64)
        for r in range(cum.shape[0]):
            n = cum[r, -1]
            if n <= 0:
                continue
            for j, q in enumerate(QUANTILES, start=1):
                h = q * (n - 1)
                lo = np.floor(h)
                i_lo = np.searchsorted(cum[r], lo, side="right")
                i_hi = np.searchsorted(cum[r], min(lo + 1, n - 1), side="right")
                out[start + r, j] = sorted_gaps[i_lo] + (h - lo) * (sorted_gaps[i_hi] - sorted_gaps[i_lo])
    return out


def _resampled_gap_stats(gap_ms: np.ndarray, owner: np.ndarray, requests: int, resamples: int,
                         rng: np.random.Generator) -> np.ndarray:
    order = np.argsort(gap_ms, kind="stable")
    weights = rng.multinomial(requests, np.full(requests, 1.0 / requests), size=resamples)
    return _weighted_gap_stats(gap_ms[order], owner[order], weights)


def gap_interval(a_gaps: np.ndarray, a_owner: np.ndarray, a_requests: int, b_gaps: np.ndarray,
                 b_owner: np.ndarray, b_requests: int, resamples: int, rng: np.random.Generator) -> list[Interval]:
    """Intervals of the change of the pooled gaps' mean, p50, p90, p99: each side's requests
    (``*_requests`` of them, numbered 0..n-1 in ``*_owner``) drawn whole, with their gaps."""
    if a_gaps.size == 0 or b_gaps.size == 0 or a_requests < 2 or b_requests < 2:
        return [Interval(np.nan, np.nan)] * len(STATISTICS)
    a_stats = _resampled_gap_stats(a_gaps, a_owner, a_requests, resamples, rng)
    b_stats = _resampled_gap_stats(b_gaps, b_owner, b_requests, resamples, rng)
    return _percentile_interval(b_stats - a_stats)


def window_figures(s_ns: np.ndarray, end_ns: np.ndarray, succeeded: np.ndarray, failed: np.ndarray,
                   meets_slo: np.ndarray, output_tokens: np.ndarray, scale: float = 1.0) -> np.ndarray:
    """Request throughput (succeeded / window, requests/s), output token throughput (output
    tokens of succeeded requests / window, tokens/s), goodput (requests meeting every SLO /
    window, requests/s) and error rate (failed / attempted, a fraction) of a set of
    requests: window.sql's closed-cohort figures over its default window (earliest start to
    latest end). Along the last axis, so a resamples x requests matrix gives one row of
    figures per resample. ``scale``: the counts are multiplied by it (a subset standing for
    a whole run)."""
    window_s = (end_ns.max(axis=-1) - s_ns.min(axis=-1)) / 1e9
    attempted = succeeded.shape[-1]
    tokens = np.where(succeeded, np.nan_to_num(output_tokens), 0.0).sum(axis=-1)
    with np.errstate(invalid="ignore", divide="ignore"):
        per_s = np.where(window_s > 0, scale / np.where(window_s > 0, window_s, 1.0), np.nan)
        figures = [succeeded.sum(axis=-1) * per_s, tokens * per_s, meets_slo.sum(axis=-1) * per_s,
                   failed.sum(axis=-1) / attempted if attempted else np.nan * window_s]
    return np.stack([np.asarray(f, dtype=float) for f in figures], axis=-1)


def _resampled_window(s_ns: np.ndarray, end_ns: np.ndarray, succeeded: np.ndarray, failed: np.ndarray,
                      meets_slo: np.ndarray, output_tokens: np.ndarray, scale: float, resamples: int,
                      rng: np.random.Generator) -> np.ndarray:
    n = s_ns.size
    out = np.empty((resamples, len(WINDOW_FIGURES)))
    per_chunk = max(1, _GAP_CELLS_PER_CHUNK // max(1, n))
    for start in range(0, resamples, per_chunk):
        rows = min(per_chunk, resamples - start)
        drawn = rng.integers(0, n, size=(rows, n))
        out[start:start + rows] = window_figures(s_ns[drawn], end_ns[drawn], succeeded[drawn], failed[drawn],
                                                 meets_slo[drawn], output_tokens[drawn], scale)
    return out


def window_interval(a: dict[str, np.ndarray], a_scale: float, b: dict[str, np.ndarray], b_scale: float,
                    resamples: int, rng: np.random.Generator) -> list[Interval]:
    """Intervals of the change of the four window figures; ``a`` / ``b``: the arrays of
    :func:`window_figures` by name (s_ns, end_ns, succeeded, failed, meets_slo,
    output_tokens), ``*_scale`` as there."""
    if a["s_ns"].size < 2 or b["s_ns"].size < 2:
        return [Interval(np.nan, np.nan)] * len(WINDOW_FIGURES)
    a_figs = _resampled_window(**a, scale=a_scale, resamples=resamples, rng=rng)
    b_figs = _resampled_window(**b, scale=b_scale, resamples=resamples, rng=rng)
    return _percentile_interval(b_figs - a_figs)
