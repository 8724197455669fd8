"""The metrics compare reports and the rules that turn a change and its interval into a
verdict (docs/compare.md).

A verdict is ``worse`` or ``better`` only when the 95 % interval of the change excludes 0
**and** the change is at least the minimum effect (default 2 % of the baseline's figure);
otherwise ``no_difference``. ``too_few`` when either side has fewer requests with the figure
than the minimum (default 20): no verdict from nothing.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

__all__ = [
    "DEFAULT_MIN_EFFECT_PCT",
    "DEFAULT_MIN_REQUESTS",
    "METRICS",
    "VERDICTS",
    "Metric",
    "regression_beyond",
    "relative_pct",
    "verdict",
]

DEFAULT_MIN_EFFECT_PCT = 2.0
DEFAULT_MIN_REQUESTS = 20
VERDICTS = ("worse", "better", "no_difference", "too_few")


@dataclass(frozen=True)
class Metric:
    """One figure compare reports. ``kind``: request (one value per request), gap (every
    ITL gap, resampled with its request) or window (one value per run, statistic
    ``value``). ``lower_is_better``: latencies and the error rate; rates are the other way."""

    key: str
    label: str
    unit: str
    kind: str
    lower_is_better: bool


METRICS: tuple[Metric, ...] = (
    Metric("ttft_ms", "TTFT", "ms", "request", True),
    Metric("tpot_ms", "TPOT", "ms/token", "request", True),
    Metric("itl_ms", "ITL", "ms", "gap", True),
    Metric("e2e_ms", "E2E", "ms", "request", True),
    Metric("queue_ms", "queue", "ms", "request", True),
    Metric("prefill_ms", "prefill", "ms", "request", True),
    Metric("output_tokens_per_s", "req out rate", "tokens/s", "request", False),
    Metric("request_throughput_rps", "req throughput", "requests/s", "window", False),
    Metric("output_token_throughput", "tok throughput", "tokens/s", "window", False),
    Metric("goodput_rps", "goodput", "requests/s", "window", False),
    Metric("error_rate", "error rate", "fraction", "window", True),
)


def relative_pct(change: float, baseline: float) -> float | None:
    """``change`` as a percentage of ``|baseline|``; None when the baseline is 0 and the
    change too (nothing moved), +/-inf when only the baseline is 0."""
    if baseline == 0:
        return None if change == 0 else math.copysign(math.inf, change)
    return change / abs(baseline) * 100.0


def verdict(a: float, b: float, ci_low: float, ci_high: float, n_a: int, n_b: int, lower_is_better: bool,
            min_effect_pct: float = DEFAULT_MIN_EFFECT_PCT, min_requests: int = DEFAULT_MIN_REQUESTS) -> str:
    """worse / better / no_difference / too_few for the change ``b - a`` and its interval."""
    if n_a < min_requests or n_b < min_requests:
        return "too_few"
    if any(math.isnan(v) for v in (a, b, ci_low, ci_high)):
        return "no_difference"
    excludes_zero = ci_low > 0 or ci_high < 0
    pct = relative_pct(b - a, a)
    if not excludes_zero or pct is None or abs(pct) < min_effect_pct:
        return "no_difference"
    went_up = b > a
    return "worse" if went_up == lower_is_better else "better"


def regression_beyond(a: float, ci_low: float, ci_high: float, pct: float) -> bool:
    """Whether the interval's bound nearest zero lies beyond ``pct`` percent of the
    baseline: the --fail-on-regression gate, which noise inside the interval cannot trip."""
    nearest = ci_low if abs(ci_low) <= abs(ci_high) else ci_high
    if ci_low <= 0 <= ci_high:
        return False
    relative = relative_pct(nearest, a)
    return relative is not None and abs(relative) > pct
