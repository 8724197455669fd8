"""The keep policy: which requests keep their full per-token detail, decided once a request
has ended (in the span exporter process, before any of its spans is built).

Every request leaves a summary; full detail (queue, prefill, decode spans, chunk events) is
kept for the random sample taken at arrival (the head decision: the tracer's sampler, a
caller's sampled ``traceparent`` honoured) and for every request the policy names:

=============================  ================================================================
setting (env; ``serve`` flag)  a request is kept when
=============================  ================================================================
``TOKENTRACE_KEEP_TTFT_MS``    its TTFT is over this many ms (``--keep-ttft-ms``)
``TOKENTRACE_KEEP_GAP_MS``     its largest inter-token gap on the engine side is over this
                               many ms (``--keep-gap-ms``): the gap ``stalls`` ranks
``TOKENTRACE_KEEP_TPOT_MS``    its TPOT, (E2E - TTFT) / (O - 1), is over this (``--keep-tpot-ms``)
``TOKENTRACE_KEEP_E2E_MS``     its E2E is over this many ms (``--keep-e2e-ms``)
``TOKENTRACE_KEEP_SLOWEST``    a fraction f in (0, 1): its TTFT or its largest gap is above the
                               (1 - f) quantile of the requests that ended in the last 10
                               minutes (so up to 2f of them kept), by more than the
                               quantile's 1 % error; only once ``MIN_REQUESTS`` have ended
                               (``--keep-slowest``)
=============================  ================================================================

With any of them set, errors, aborts and preempted requests are kept too. A malformed value
is one warning line naming the variable, and that rule is off; a policy that keeps
everything (a threshold of 0, a fraction of 1) is said once. Quantiles come from ``ddsketch``
(relative error 1 %), one sketch per minute, merged over the last ten.

``tokentrace.sampling.reason`` (:attr:`KeepDecision.reason`): ``head`` whenever the random
sample took the request (even if it was also slow: the random sample stays unbiased), else
the first rule it crossed in the order of :data:`RULES`, else ``summary``;
``tokentrace.sampling.rules`` lists every rule it crossed with the threshold in force.
"""

from __future__ import annotations

import collections
import logging
import math
import os
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

__all__ = ["ENV", "HeadMarkingSampler", "KeepDecision", "KeepPolicy", "MIN_REQUESTS", "RULES", "RequestOutcome",
           "WINDOW_S"]

log = logging.getLogger("tokentrace.export")

ENV = {"ttft": "TOKENTRACE_KEEP_TTFT_MS", "gap": "TOKENTRACE_KEEP_GAP_MS", "tpot": "TOKENTRACE_KEEP_TPOT_MS",
       "e2e": "TOKENTRACE_KEEP_E2E_MS", "slowest": "TOKENTRACE_KEEP_SLOWEST"}
RULES = ("ttft", "gap", "tpot", "e2e", "slowest", "error", "preempted")
MIN_REQUESTS = 100  # ended requests the slowest rule waits for
WINDOW_S = 600.0  # the slowest rule's window: the requests that ended in the last 10 minutes
_MINUTE_S = 60.0
_RELATIVE_ACCURACY = 0.01


@dataclass(frozen=True)
class RequestOutcome:
    """What is known of a request once it has ended (seconds; None: not measured)."""

    ttft_s: float | None = None
    e2e_s: float | None = None
    tpot_s: float | None = None
    max_gap_s: float | None = None  # the largest inter-token gap on the engine side
    error: bool = False  # ended in an error or was aborted
    preempted: bool = False
    head: bool = False  # the random sample at arrival took it


@dataclass(frozen=True)
class KeepDecision:
    """Whether a request keeps its full detail, and why."""

    full: bool
    reason: str  # "head", a rule of RULES, or "summary"
    rules: tuple[str, ...] = ()  # every rule crossed, e.g. "gap 412 ms > 200 ms"


class KeepPolicy:
    """Thresholds (ms) and the slowest fraction; :meth:`decide` per ended request."""

    def __init__(self, ttft_ms: float | None = None, gap_ms: float | None = None, tpot_ms: float | None = None,
                 e2e_ms: float | None = None, slowest: float | None = None) -> None:
        for name, value in (("ttft", ttft_ms), ("gap", gap_ms), ("tpot", tpot_ms), ("e2e", e2e_ms)):
            if value is not None and not (math.isfinite(value) and value >= 0):
                raise ValueError(f"{ENV[name]}: expected a number of ms >= 0, got {value!r}")
        if slowest is not None and not (0 < slowest <= 1):
            raise ValueError(f"{ENV['slowest']}: expected a fraction in (0, 1], got {slowest!r}")
        self.thresholds_ms = {"ttft": ttft_ms, "gap": gap_ms, "tpot": tpot_ms, "e2e": e2e_ms}
        self.slowest = slowest
        self._minutes: collections.deque[tuple[int, object, object]] = collections.deque()  # (minute, ttft, gap)
        self._cached: tuple[float, float | None, float | None] | None = None  # (at s, ttft q, gap q)

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None,
                 warn: Callable[[str], None] = log.warning) -> KeepPolicy | None:
        """The policy the environment sets, or None when it sets none. A malformed value: one
        ``warn`` line naming the variable, that rule off."""
        env = os.environ if env is None else env
        values: dict[str, float | None] = {}
        for name, var in ENV.items():
            raw = env.get(var, "").strip()
            if not raw:
                continue
            try:
                value = float(raw)
                if name == "slowest":
                    cls(slowest=value)
                else:
                    cls(**{f"{name}_ms": value})  # the constructor's checks
            except ValueError:
                expected = "a fraction in (0, 1]" if name == "slowest" else "a number of ms >= 0"
                warn(f"tokentrace: {var}={raw!r} is not {expected}: that keep rule is off")
                continue
            values[name] = value
        if not values:
            return None
        policy = cls(values.get("ttft"), values.get("gap"), values.get("tpot"), values.get("e2e"),
                     values.get("slowest"))
        if policy.keeps_everything:
            warn(f"tokentrace: the keep policy ({policy.describe()}) keeps every request whole")
        return policy

    @property
    def keeps_everything(self) -> bool:
        """A threshold of 0 or a fraction of 1: every request crosses it."""
        return any(v == 0 for v in self.thresholds_ms.values()) or self.slowest == 1

    def describe(self) -> str:
        """The policy in one line, e.g. ``ttft > 500 ms, slowest 1 %, errors, preempted``."""
        parts = [f"{name} > {value:g} ms" for name, value in self.thresholds_ms.items() if value is not None]
        if self.slowest is not None:
            parts.append(f"slowest {self.slowest * 100:g} %")
        return ", ".join([*parts, "errors", "preempted"])

    # --- the slowest rule's window -------------------------------------------------------------
    def _record(self, outcome: RequestOutcome, now_s: float) -> None:
        from ddsketch import DDSketch

        minute = int(now_s // _MINUTE_S)
        if not self._minutes or self._minutes[-1][0] != minute:
            self._minutes.append((minute, DDSketch(_RELATIVE_ACCURACY), DDSketch(_RELATIVE_ACCURACY)))
        while self._minutes and self._minutes[0][0] <= minute - WINDOW_S / _MINUTE_S:
            self._minutes.popleft()
        _, ttft, gap = self._minutes[-1]
        if outcome.ttft_s is not None and outcome.ttft_s > 0:
            ttft.add(outcome.ttft_s)  # type: ignore[attr-defined]  # ddsketch ships no types: a DDSketch
        if outcome.max_gap_s is not None and outcome.max_gap_s > 0:
            gap.add(outcome.max_gap_s)  # type: ignore[attr-defined]  # ddsketch ships no types: a DDSketch

    def slowest_thresholds(self, now_s: float) -> tuple[float | None, float | None]:
        """The (1 - f) quantiles of TTFT and of the largest gap (s) over the window, or None
        for each that has fewer than ``MIN_REQUESTS`` requests. Recomputed at most once a
        second (a merge of up to ten sketches)."""
        cached = self._cached
        if cached is not None and now_s - cached[0] < 1.0:
            return cached[1], cached[2]
        from ddsketch import DDSketch

        found: list[float | None] = []
        for index in (1, 2):
            merged = DDSketch(_RELATIVE_ACCURACY)
            for minute in self._minutes:
                if minute[0] > (now_s // _MINUTE_S) - WINDOW_S / _MINUTE_S:
                    merged.merge(minute[index])  # type: ignore[arg-type]  # ddsketch ships no types: a DDSketch
            enough = merged.count >= MIN_REQUESTS and self.slowest is not None
            found.append(merged.get_quantile_value(1 - self.slowest) if enough else None)  # type: ignore[operator]  # slowest is set when enough is true
        self._cached = (now_s, found[0], found[1])
        return found[0], found[1]

    # --- the decision -----------------------------------------------------------------------
    def decide(self, outcome: RequestOutcome, now_s: float) -> KeepDecision:
        """Keep ``outcome``'s request whole or not (``now_s``: when it ended, s on any
        monotonic clock; its figures then join the slowest rule's window)."""
        crossed: list[tuple[str, str]] = []
        measured = {"ttft": outcome.ttft_s, "gap": outcome.max_gap_s, "tpot": outcome.tpot_s, "e2e": outcome.e2e_s}
        for name, threshold in self.thresholds_ms.items():
            value = measured[name]
            if threshold is not None and value is not None and value * 1e3 > threshold:
                crossed.append((name, f"{name} {value * 1e3:.0f} ms > {threshold:g} ms"))
        if self.slowest is not None:
            ttft_q, gap_q = self.slowest_thresholds(now_s)
            quantile = f"p{(1 - self.slowest) * 100:g}"
            for name, q in (("ttft", ttft_q), ("gap", gap_q)):
                value = measured[name]
                # over the estimate by more than its relative error: a value at the quantile is not above it
                if q is not None and value is not None and value > q * (1 + _RELATIVE_ACCURACY):
                    crossed.append(("slowest", f"slowest: {name} {value * 1e3:.0f} ms > {quantile} {q * 1e3:.0f} ms"))
        if outcome.error:
            crossed.append(("error", "error"))
        if outcome.preempted:
            crossed.append(("preempted", "preempted"))
        if self.slowest is not None:
            self._record(outcome, now_s)
        rules = tuple(text for _, text in crossed)
        if outcome.head:
            return KeepDecision(True, "head", rules)
        if not crossed:
            return KeepDecision(False, "summary", ())
        first = min(crossed, key=lambda c: RULES.index(c[0]))[0]
        return KeepDecision(True, first, rules)


class HeadMarkingSampler:
    """The serving process's sampler under a keep policy: every request is recorded (its
    detail decided once it has ended), and its root span says whether ``head`` (the sampler
    the standard variables name, a caller's sampled ``traceparent`` honoured) took it:
    ``tokentrace.sampling.head``. Spans with a local parent follow it."""

    def __init__(self, head: object) -> None:
        self.head = head

    def should_sample(self, parent_context: object, trace_id: int, name: str, kind: object = None,
                      attributes: object = None, links: object = None, trace_state: object = None) -> object:
        from opentelemetry import trace
        from opentelemetry.sdk.trace.sampling import Decision, SamplingResult

        # (the SDK starts the span with the result's attributes: the ones given, plus the mark)
        given = dict(attributes or {})  # type: ignore[call-overload]  # the SDK's attributes mapping
        parent = trace.get_current_span(parent_context).get_span_context()  # type: ignore[arg-type]  # None is the current context, as the SDK passes it
        if parent.is_valid and not parent.is_remote:
            return SamplingResult(Decision.RECORD_AND_SAMPLE, given, parent.trace_state)
        inner: Any = self.head
        head = inner.should_sample(parent_context, trace_id, name, kind, attributes, links, trace_state)
        marked = {**given, "tokentrace.sampling.head": head.decision.is_sampled()}
        return SamplingResult(Decision.RECORD_AND_SAMPLE, marked, head.trace_state)

    def get_description(self) -> str:
        return f"HeadMarkingSampler{{{self.head.get_description()}}}"  # type: ignore[attr-defined]  # every SDK sampler has get_description
