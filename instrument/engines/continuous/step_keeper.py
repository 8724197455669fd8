"""Which ``engine_step`` spans the continuous engine's exporter writes under a keep policy.

Without a policy every engine step has its span. With one (instrument/records/keep.py), the
step spans follow the requests: a random sample of steps (``TOKENTRACE_KEEP_STEP_RATIO``, a
fraction, default 0.01, picked by step number so the same steps are picked on every replay),
and, for every request kept whole, the steps that ran during its largest inter-token gaps
(the :data:`GAPS_PER_REQUEST` largest, each from the step after the token before the gap to
the step that emitted the token after it, at most :data:`MAX_STEPS_PER_GAP` steps): what
shared the stall, which ``tokentrace stalls`` reads. A request is decided once it has ended,
so step records are held for the last :data:`HOLD_S` seconds (at most :data:`MAX_HELD`
records, ~150 bytes each); a kept request's gap older than that loses its steps (counted in
``lost_steps``). Steps written for a kept request form an ``engine`` trace of their own,
marked ``tokentrace.sampling.reason`` = ``gap``; the sampled steps go to the usual engine traces.
"""

from __future__ import annotations

import collections
import logging
import os
from collections.abc import Mapping
from typing import Any

from opentelemetry.context import Context
from opentelemetry.trace import SpanKind, Tracer, set_span_in_context

from instrument.engines.continuous.spans import ENGINE_SPAN, STEP_SPAN, EngineTraceWriter, StepRecord

__all__ = ["DEFAULT_STEP_RATIO", "ENV_STEP_RATIO", "StepKeeper", "step_ratio_from_env"]

log = logging.getLogger("tokentrace.export")

ENV_STEP_RATIO = "TOKENTRACE_KEEP_STEP_RATIO"
DEFAULT_STEP_RATIO = 0.01
HOLD_S = 120.0
MAX_HELD = 200_000
GAPS_PER_REQUEST = 3
MAX_STEPS_PER_GAP = 64
_MIX = 0x9E3779B97F4A7C15  # Fibonacci hashing: step numbers spread over [0, 2^64)
_MASK = (1 << 64) - 1


def step_ratio_from_env(env: Mapping[str, str] | None = None) -> float:
    """``TOKENTRACE_KEEP_STEP_RATIO`` as a fraction in [0, 1]; a malformed value: one warning
    naming the variable, and the default."""
    text = (os.environ if env is None else env).get(ENV_STEP_RATIO, "").strip()
    if not text:
        return DEFAULT_STEP_RATIO
    try:
        ratio = float(text)
    except ValueError:
        ratio = -1.0
    if not 0.0 <= ratio <= 1.0:
        log.warning("tokentrace: %s=%r is not a fraction from 0 to 1: using %g", ENV_STEP_RATIO, text,
                    DEFAULT_STEP_RATIO)
        return DEFAULT_STEP_RATIO
    return ratio


def step_sampled(step: int, ratio: float) -> bool:
    """Whether the step ratio's sample takes engine step ``step`` (deterministic per step)."""
    return ratio >= 1.0 or (ratio > 0.0 and ((step * _MIX) & _MASK) < ratio * 2**64)


class StepKeeper:
    """Holds the recent step records and writes the spans of those sampled or named by a kept
    request (one thread: the exporter's)."""

    def __init__(self, tracer: Tracer, writer: Any, steps_per_trace: int, ratio: float,
                 hold_s: float = HOLD_S, max_held: int = MAX_HELD) -> None:
        self.tracer, self.writer = tracer, writer
        self.sampled_traces = EngineTraceWriter(tracer, writer, steps_per_trace)
        self.ratio, self.hold_ns, self.max_held = ratio, int(hold_s * 1e9), max_held
        self._held: collections.deque[StepRecord] = collections.deque()
        self._written: set[int] = set()  # step numbers of the held steps whose span is written
        self.sampled = 0  # steps written for the ratio's sample
        self.kept_for_gaps = 0  # steps written for kept requests' gaps
        self.lost_steps = 0  # gap steps no longer held when their request was kept

    def step(self, rec: StepRecord) -> None:
        """A finished step: its span now if the sample takes it; held either way."""
        if step_sampled(rec.step, self.ratio):
            self.sampled_traces.step(rec)
            self._written.add(rec.step)
            self.sampled += 1
        self._held.append(rec)
        while self._held and (len(self._held) > self.max_held or rec.end_ns - self._held[0].end_ns > self.hold_ns):
            self._written.discard(self._held.popleft().step)

    def idle(self) -> None:
        """The engine went idle: the sample's open engine trace ends."""
        self.sampled_traces.close()

    def keep_gaps(self, emissions: list[tuple[int, int]]) -> None:
        """A request kept whole: ``emissions`` = (end ns, engine step) of each token it emitted,
        in order. Writes the steps of its largest gaps not written yet, under one engine trace."""
        gaps = sorted(((b[0] - a[0], a[1], b[1]) for a, b in zip(emissions, emissions[1:])), reverse=True)
        wanted: set[int] = set()
        for _, before, after in gaps[:GAPS_PER_REQUEST]:
            wanted.update(range(max(before + 1, after - MAX_STEPS_PER_GAP + 1), after + 1))
        wanted -= self._written
        if not wanted:
            return
        recs = [r for r in map(self._held_step, sorted(wanted)) if r is not None]
        self.lost_steps += len(wanted) - len(recs)
        if not recs:
            return
        root = self.tracer.start_span(ENGINE_SPAN, context=Context(), kind=SpanKind.INTERNAL,
                                      start_time=recs[0].start_ns,
                                      attributes={"tokentrace.engine.first_step": recs[0].step,
                                                  "tokentrace.engine.last_step": recs[-1].step,
                                                  "tokentrace.engine.steps": len(recs),
                                                  "tokentrace.sampling.reason": "gap"})
        context = set_span_in_context(root)
        for rec in recs:
            self.writer.write(STEP_SPAN, context, rec.span_attributes(), rec.start_ns, rec.end_ns)
            self._written.add(rec.step)
        root.end(end_time=max(r.end_ns for r in recs))
        self.kept_for_gaps += len(recs)

    def _held_step(self, step: int) -> StepRecord | None:
        """The held record of engine step ``step`` (steps arrive in order, one number each)."""
        if not self._held:
            return None
        index = step - self._held[0].step
        if 0 <= index < len(self._held) and self._held[index].step == step:
            return self._held[index]
        return next((r for r in self._held if r.step == step), None) if 0 <= index < len(self._held) else None

    def counts(self) -> dict[str, int]:
        """For /health: steps written for the sample, for kept requests' gaps, and gap steps
        lost (no longer held when their request was kept)."""
        return {"sampled": self.sampled, "kept_for_gaps": self.kept_for_gaps, "lost": self.lost_steps}

    def close(self) -> None:
        self.sampled_traces.close()
