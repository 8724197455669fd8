"""The keep policy on vLLM's requests, in the exporter process (instrument/records/keep.py).

Under a policy (``TOKENTRACE_KEEP_*``, read once: instrument/vllm/sampling.py) vLLM's engine
thread records every request and every step whole, and marks the random sample in each
arrival row (instrument/vllm/rows.py ``KEPT_IF_SLOW``). Here,
:class:`~instrument.vllm.spans.SpanBuilder` writes a request of the random sample as without
a policy, and holds the detail of every other one (its ``queue``, ``prefill`` and ``decode``
spans, as the few ints each is made from: :meth:`DetailKeeper.hold`) until it has ended. Then
:meth:`DetailKeeper.decide` decides, with the same :class:`~instrument.records.keep.KeepPolicy`,
:func:`~instrument.records.keep_stage.outcome_from` and
:func:`~instrument.records.keep_stage.summary_attributes` as the continuous engine's keep
stage: every request keeps its ``engine_request`` span (the summary: its figures and the
decision as attributes), a kept one its chunk events and its detail too, and the
``engine_step`` span of the step that ended its largest gap (besides the step ratio's).

Memory: the detail held for undecided requests is bounded (``max_held_bytes``, by default
:data:`~instrument.records.keep_stage.DEFAULT_MAX_HELD_BYTES`, estimated per step a request
ran in); past it the oldest undecided request is decided on what is known so far (kept: its
detail written, and written as it comes from then on; not kept: dropped, and no more held),
counted (``forced``) and said once.
"""

from __future__ import annotations

import logging
from collections import deque
from typing import Any

from instrument.records.keep import KeepDecision, KeepPolicy
from instrument.records.keep_stage import (
    DEFAULT_MAX_HELD_BYTES,
    ERROR_REASONS,
    HEAD_ATTRIBUTE,
    EngineFacts,
    outcome_from,
    summary_attributes,
)

__all__ = ["DROPPED", "HELD_STEP_BYTES", "DetailKeeper"]

log = logging.getLogger("tokentrace.vllm")
#: estimated bytes one held step of one request takes (its detail tuple, and its chunk's)
HELD_STEP_BYTES = 200
#: a request's ``held`` once decided not kept before its end (the memory bound): nothing more held
DROPPED: list[Any] = []
_GAP_STEPS_REMEMBERED = 4096


class DetailKeeper:
    """The policy, what is held for undecided requests, and the decisions counted (one thread)."""

    def __init__(self, policy: KeepPolicy, max_held_bytes: int = DEFAULT_MAX_HELD_BYTES) -> None:
        self.policy = policy
        self.max_held_bytes = max_held_bytes
        self.held_bytes = 0  # estimated, of every undecided request
        self.kept: dict[str, int] = {}  # requests decided, by reason ("summary": not kept whole)
        self.forced = 0  # requests decided before their end: the memory bound
        # engine steps whose engine_step span a kept request's largest gap wrote (once each)
        self._gap_steps: set[int] = set()
        self._gap_order: deque[int] = deque()

    def hold(self, rec: Any, detail: tuple[Any, ...]) -> None:
        """Hold one step of ``rec``'s detail (it is undecided)."""
        rec.held.append(detail)
        rec.held_bytes += HELD_STEP_BYTES
        self.held_bytes += HELD_STEP_BYTES

    @property
    def over(self) -> bool:
        """What is held is past the bound."""
        return self.held_bytes > self.max_held_bytes

    def oldest_undecided(self, live: dict[str, Any]) -> Any:
        """The undecided request that arrived first (``live`` is in arrival order), or None."""
        for rec in live.values():
            if rec.decision is None and rec.held:
                return rec
        return None

    def forced_decision(self, rec: Any, now_ns: int) -> KeepDecision:
        """Decide ``rec`` before its end, on what is known (the memory bound)."""
        self.forced += 1
        if self.forced == 1:
            log.warning("tokentrace: the keep policy holds more than %d MiB of undecided vLLM requests: the oldest "
                        "are decided on what is known so far (counted)", self.max_held_bytes // 2**20)
        return self.decide(rec, "", False, now_ns)

    def release(self, rec: Any) -> None:
        """``rec`` is decided: what it held is no longer counted."""
        self.held_bytes -= rec.held_bytes
        rec.held_bytes = 0

    def decide(self, rec: Any, reason: str, error: bool, end_ns: int) -> KeepDecision:
        """Decide ``rec`` (``reason``: its finish reason, "" before its end), counted."""
        decision = self.policy.decide(self.outcome(rec, reason, error), end_ns / 1e9)
        rec.decision = decision
        self.kept[decision.reason] = self.kept.get(decision.reason, 0) + 1
        self.release(rec)
        return decision

    def outcome(self, rec: Any, reason: str, error: bool) -> Any:
        """``rec``'s figures: TTFT to its first visible token (a stop token alone is not
        visible, as its chunk events say); E2E to its last token, a final stop token included
        (as vLLM counts it in ``completion_tokens`` and the analyzer's vLLM engine view ends
        e: queries/views/24_vllm_engine.sql), so TPOT = (E2E - TTFT) / (G - 1) over G - 1 real
        gaps; its largest gap."""
        emits = rec.emits
        visible = emits[:-1] if reason == "stop" and emits and emits[-1][1] == 1 else emits
        return outcome_from(rec.arrival_ns, visible[0][0] if visible else None, emits[-1][0] if visible else None,
                            rec.generated, error=error or reason in ERROR_REASONS, preempted=rec.preemptions > 0,
                            facts=self.facts(rec), head=rec.head)

    @staticmethod
    def facts(rec: Any) -> EngineFacts:
        return EngineFacts(max_gap_ns=rec.gap_ns, gap_step=rec.gap_step, prefill_ns=rec.prefill_ns,
                           decode_ns=rec.decode_ns, preemptions=rec.preemptions, cached_tokens=rec.cached)

    def summary(self, rec: Any, reason: str, error: bool, end_ns: int) -> dict[str, Any]:
        """``rec``'s summary attributes at its end (its decision too)."""
        outcome = self.outcome(rec, reason, error)
        queued_until = rec.queue_end_ns if rec.queued else end_ns
        attributes = summary_attributes(outcome, self.facts(rec), rec.decision, max(0, queued_until - rec.arrival_ns))
        attributes[HEAD_ATTRIBUTE] = rec.head
        return attributes

    def gap_step_due(self, step: int) -> bool:
        """Whether a kept request's largest gap still has to write engine step ``step``'s span
        (once per step)."""
        if step in self._gap_steps:
            return False
        self._gap_steps.add(step)
        self._gap_order.append(step)
        if len(self._gap_order) > _GAP_STEPS_REMEMBERED:
            self._gap_steps.discard(self._gap_order.popleft())
        return True

    def said(self) -> str:
        """The decisions in one line, e.g. ``12 kept whole (head 8, gap 3, preempted 1), 88 summarized``."""
        whole = {k: v for k, v in self.kept.items() if k != "summary"}
        parts = ", ".join(f"{k} {v}" for k, v in sorted(whole.items()))
        forced = f"; {self.forced} decided early (memory bound)" if self.forced else ""
        return f"{sum(whole.values())} kept whole ({parts or 'none'}), {self.kept.get('summary', 0)} summarized{forced}"
