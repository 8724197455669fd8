"""The keep policy at work in the span exporter process: hold each request's detail until it
has ended, decide (instrument/records/keep.py), then build its summary, and its detail if kept.

A request is one *request span* (the root its serving process started: the gateway span,
marked ``tokentrace.sampling.head`` by :class:`~instrument.records.keep.HeadMarkingSampler`)
with the spans forwarded in its trace (``tokenize``, ``queue``) and the engine's facts of
its sequence (:class:`EngineFacts`, with a callable that writes its prefill and decode spans).
The forwarded-span decoder hands :meth:`KeepStage.forwarded` every span; the engine's decoder
hands :meth:`KeepStage.engine_ended` each ended sequence. A request is decided when both
have come, or ``WAIT_S`` after the first of them (a request refused before the engine, an
engine sequence whose request span was lost).

Every request keeps its request span, with its figures as attributes (named as vLLM names
them on ``llm_request``: ``gen_ai.latency.*``, seconds; plus ``tokentrace.gap.max_ms`` and
the engine step it fell in, tokens, cached tokens, preemptions) and its decision
(``tokentrace.sampling.reason``, ``tokentrace.sampling.rules``). A request not kept loses
its chunk events and its other spans; a kept one keeps everything.

Memory: what is held for undecided requests is bounded (``max_held_bytes``, estimated per
span and per chunk event); past it the oldest are decided on what is known so far, counted
(``forced``) and said once.
"""

from __future__ import annotations

import collections
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from opentelemetry.sdk.trace import ReadableSpan
from opentelemetry.trace import StatusCode

from instrument.records.keep import KeepDecision, KeepPolicy, RequestOutcome

__all__ = ["DEFAULT_MAX_HELD_BYTES", "EngineFacts", "HEAD_ATTRIBUTE", "KeepStage", "keep_stage_of", "outcome_from",
           "outcome_of", "summary_attributes"]

log = logging.getLogger("tokentrace.export")

HEAD_ATTRIBUTE = "tokentrace.sampling.head"  # on a request span: the random sample at arrival took it
CHUNK_EVENT = "tokentrace.chunk"
PREEMPTION_EVENTS = ("tokentrace.preemption", "tokentrace.preempted")
ERROR_REASONS = ("error", "cancelled", "abort")  # finish reasons the error rule counts
WAIT_S = 2.0  # how long one side of a request waits for the other
DEFAULT_MAX_HELD_BYTES = 256 * 2**20
_SPAN_BYTES = 2048  # estimated bytes a held span takes, besides its events
_EVENT_BYTES = 400  # ... and one held chunk event


@dataclass
class EngineFacts:
    """What the engine's records say of one ended sequence (times in ns since the epoch)."""

    max_gap_ns: int | None = None  # the largest gap between two tokens the engine emitted
    gap_step: int | None = None  # the engine step that emitted the token after that gap
    prefill_ns: int = 0  # time in prefill steps (chunks, recomputes)
    decode_ns: int = 0  # time in decode steps
    preemptions: int = 0
    cached_tokens: int = 0
    held_bytes: int = 0  # estimated memory its detail holds


@dataclass
class _Request:
    trace_id: int
    since: float  # monotonic s when the first of its parts came
    span: ReadableSpan | None = None  # the request span, once forwarded
    others: list[ReadableSpan] = field(default_factory=list)  # the other forwarded spans of its trace
    facts: EngineFacts | None = None
    write_detail: Callable[[], None] | None = None
    held_bytes: int = 0


class KeepStage:
    """Holds requests until they have ended, decides, builds (one thread: the exporter's)."""

    def __init__(self, policy: KeepPolicy, hand_off: Callable[[list[ReadableSpan]], None],
                 wait_s: float = WAIT_S, max_held_bytes: int = DEFAULT_MAX_HELD_BYTES,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.policy = policy
        self.hand_off = hand_off
        self.wait_s = wait_s
        self.max_held_bytes = max_held_bytes
        self.clock = clock
        self._by_span: dict[int, _Request] = {}  # request span id -> request
        self._by_trace: dict[int, tuple[float, list[ReadableSpan]]] = {}  # trace id -> (since, spans before their root)
        self._decided: collections.OrderedDict[int, bool] = collections.OrderedDict()  # span id -> kept whole
        self.held_bytes = 0
        self.kept: dict[str, int] = {}  # requests decided, by reason ("summary": not kept; "engine_only":
        # the engine's side decided without its request span, its detail written)
        self.forced = 0  # requests decided early: the memory bound

    # --- what comes in ------------------------------------------------------------------------
    def forwarded(self, span: ReadableSpan) -> None:
        """A span forwarded from the serving process: a request span, or one of its trace."""
        attributes = span.attributes or {}
        if HEAD_ATTRIBUTE not in attributes:
            if span.context is None:
                self.hand_off([span])
                return
            self._by_trace.setdefault(span.context.trace_id, (self.clock(), []))[1].append(span)
            self._hold(_span_bytes(span))
            return
        request = self._request(span.context.span_id, span.context.trace_id)
        request.span = span
        others = self._by_trace.pop(span.context.trace_id, (0.0, []))[1]
        request.others.extend(others)
        request.held_bytes += sum(_span_bytes(s) for s in others)  # (held already: now the request's)
        held = _span_bytes(span)
        request.held_bytes += held
        self._hold(held)
        if request.facts is not None or not _reached_engine(span):
            self._decide(span.context.span_id)

    def engine_ended(self, trace_id: int, request_span_id: int, facts: EngineFacts,
                     write_detail: Callable[[], None]) -> None:
        """An engine sequence ended: its facts and the writer of its prefill / decode spans."""
        late = self._decided.get(request_span_id)
        if late is not None:  # its request was decided without it (it came past wait_s)
            if late:
                write_detail()
            return
        request = self._request(request_span_id, trace_id)
        request.facts, request.write_detail = facts, write_detail
        request.held_bytes += facts.held_bytes
        self._hold(facts.held_bytes)
        if request.span is not None:
            self._decide(request_span_id)

    def _request(self, span_id: int, trace_id: int) -> _Request:
        request = self._by_span.get(span_id)
        if request is None:
            request = self._by_span[span_id] = _Request(trace_id, self.clock())
        return request

    def _hold(self, size: int) -> None:
        self.held_bytes += size
        while self.held_bytes > self.max_held_bytes and self._by_span:
            oldest = next(iter(self._by_span))
            self.forced += 1
            if self.forced == 1:
                log.warning("tokentrace: the keep policy holds more than %d MiB of undecided requests: the "
                            "oldest are decided on what is known so far (counted in /health as forced)",
                            self.max_held_bytes // 2**20)
            self._decide(oldest)
        if not self._by_span and self._by_trace and self.held_bytes > self.max_held_bytes:
            self._release_orphans(force=True)

    # --- decisions ----------------------------------------------------------------------------
    def tick(self) -> None:
        """Decide the requests whose other side did not come within ``wait_s``."""
        now = self.clock()
        for span_id in [s for s, r in self._by_span.items() if now - r.since >= self.wait_s]:
            self._decide(span_id)
        self._release_orphans()

    def close(self) -> None:
        """Shutdown: decide every request held, on what is known."""
        for span_id in list(self._by_span):
            self._decide(span_id)
        self._release_orphans(force=True)

    def _release_orphans(self, force: bool = False) -> None:
        """Forwarded spans whose request span did not come within ``wait_s`` (or at all:
        ``force``): exported as they are (nothing says to drop them)."""
        now = self.clock()
        for trace_id in [t for t, (since, _) in self._by_trace.items() if force or now - since >= self.wait_s]:
            spans = self._by_trace.pop(trace_id)[1]
            self.held_bytes -= sum(_span_bytes(s) for s in spans)
            self.hand_off(spans)

    def _decide(self, span_id: int) -> None:
        request = self._by_span.pop(span_id)
        self.held_bytes -= request.held_bytes
        span, facts = request.span, request.facts
        if span is None:  # the engine's side alone (its request span lost, or not come yet when
            # the memory bound forced the decision): its detail is written, nothing is lost
            if request.write_detail is not None:
                request.write_detail()
            self.kept["engine_only"] = self.kept.get("engine_only", 0) + 1
            return
        outcome = outcome_of(span, facts)
        decision = self.policy.decide(outcome, self.clock())
        self.kept[decision.reason] = self.kept.get(decision.reason, 0) + 1
        if facts is None:  # its engine side may still come
            self._decided[span_id] = decision.full
            if len(self._decided) > 4096:
                self._decided.popitem(last=False)
        summary = _summary_span(span, facts, outcome, decision, request.others)
        if decision.full:
            if request.write_detail is not None:
                request.write_detail()
            self.hand_off([*request.others, summary])
        else:
            self.hand_off([summary])


def _span_bytes(span: ReadableSpan) -> int:
    """Estimated memory a held span takes (its events included)."""
    return _SPAN_BYTES + _EVENT_BYTES * len(span.events)


def outcome_of(span: ReadableSpan, facts: EngineFacts | None) -> RequestOutcome:
    """The request's figures from its request span (TTFT, E2E, TPOT from the visible chunk
    events, as docs/metrics.md's formulas: E2E ends at the last visible output) and the engine."""
    attributes = span.attributes or {}
    chunks = [e for e in span.events if e.name == CHUNK_EVENT and (e.attributes or {}).get("tokentrace.chunk.visible")]
    output = attributes.get("gen_ai.usage.output_tokens")
    reasons: Any = attributes.get("gen_ai.response.finish_reasons") or ()  # a sequence of strings
    return outcome_from(span.start_time or 0, chunks[0].timestamp if chunks else None,
                        chunks[-1].timestamp if chunks else None, output if isinstance(output, int) else 0,
                        error=span.status.status_code is StatusCode.ERROR or any(r in ERROR_REASONS for r in reasons),
                        preempted=any(e.name in PREEMPTION_EVENTS for e in span.events), facts=facts,
                        head=bool(attributes.get(HEAD_ATTRIBUTE)))


def outcome_from(start_ns: int, first_visible_ns: int | None, last_visible_ns: int | None, output_tokens: int,
                 error: bool, preempted: bool, facts: EngineFacts | None, head: bool) -> RequestOutcome:
    """A request's :class:`RequestOutcome` from its start, its first and last visible output
    (ns since the epoch; None: none), its output tokens and the engine's facts: TTFT = first
    visible - start, E2E = last visible - start, TPOT = (E2E - TTFT) / (O - 1) (the worked
    example's formulas, docs/metrics.md). Every engine's decoder decides on this."""
    ttft = e2e = tpot = None
    if first_visible_ns is not None and last_visible_ns is not None:
        ttft = (first_visible_ns - start_ns) / 1e9
        e2e = (last_visible_ns - start_ns) / 1e9
        if output_tokens > 1:
            tpot = (e2e - ttft) / (output_tokens - 1)
    return RequestOutcome(ttft_s=ttft, e2e_s=e2e, tpot_s=tpot,
                          max_gap_s=facts.max_gap_ns / 1e9 if facts and facts.max_gap_ns is not None else None,
                          error=error, preempted=preempted or bool(facts and facts.preemptions), head=head)


def _reached_engine(span: ReadableSpan) -> bool:
    """Whether the request got output (a request refused before the engine has no engine side)."""
    attributes = span.attributes or {}
    return bool(attributes.get("gen_ai.usage.output_tokens")) or any(e.name == CHUNK_EVENT for e in span.events)


def _summary_span(span: ReadableSpan, facts: EngineFacts | None, outcome: RequestOutcome,
                  decision: KeepDecision, others: list[ReadableSpan]) -> ReadableSpan:
    """The request span with its figures and decision as attributes; without its chunk events
    when the request is not kept whole."""
    attributes: dict[str, Any] = dict(span.attributes or {})
    queue = [s for s in others if s.name == "queue" and s.start_time and s.end_time]
    queue_ns = (queue[0].end_time or 0) - (queue[0].start_time or 0) if queue else None
    attributes.update(summary_attributes(outcome, facts, decision, queue_ns))
    events = span.events if decision.full else tuple(e for e in span.events if e.name != CHUNK_EVENT)
    return ReadableSpan(span.name, span.context, span.parent, span.resource, attributes, events, span.links,
                        span.kind, status=span.status, start_time=span.start_time, end_time=span.end_time,
                        instrumentation_scope=span.instrumentation_scope)


def summary_attributes(outcome: RequestOutcome, facts: EngineFacts | None, decision: KeepDecision,
                       queue_ns: int | None) -> dict[str, Any]:
    """A request's summary attributes (docs/spans.md "Kept and summarized requests"): its
    figures (``gen_ai.latency.*`` in s, as vLLM names them on ``llm_request``; the largest gap
    in ms and its engine step; preemptions) and the decision (``tokentrace.sampling.reason``,
    ``.rules``). ``queue_ns``: its time in the queue, None when unknown. Every engine's
    decoder writes its summary span with these."""
    figures: dict[str, Any] = {
        "gen_ai.latency.time_to_first_token": outcome.ttft_s, "gen_ai.latency.e2e": outcome.e2e_s,
        "gen_ai.latency.time_in_queue": queue_ns / 1e9 if queue_ns is not None else None,
        "tokentrace.tpot_ms": outcome.tpot_s * 1e3 if outcome.tpot_s is not None else None}
    if facts is not None:
        figures.update({
            "gen_ai.latency.time_in_model_prefill": facts.prefill_ns / 1e9,
            "gen_ai.latency.time_in_model_decode": facts.decode_ns / 1e9,
            "tokentrace.gap.max_ms": facts.max_gap_ns / 1e6 if facts.max_gap_ns is not None else None,
            "tokentrace.gap.engine_step": facts.gap_step,
            "tokentrace.preemptions": facts.preemptions,
        })
    attributes = {k: v for k, v in figures.items() if v is not None}
    attributes["tokentrace.sampling.reason"] = decision.reason
    if decision.rules:
        attributes["tokentrace.sampling.rules"] = decision.rules
    return attributes


def keep_stage_of(tracer_provider: Any, hand_off: Callable[[list[ReadableSpan]], None]) -> KeepStage | None:
    """The exporter process's one stage for ``tracer_provider`` (made by the first decoder that
    asks, from the ``TOKENTRACE_KEEP_*`` environment the process inherited), or None when no
    policy is set."""
    stage = getattr(tracer_provider, "_tokentrace_keep_stage", False)
    if stage is False:
        policy = KeepPolicy.from_env(warn=log.debug)  # (the serving side said its warnings at start)
        stage = KeepStage(policy, hand_off) if policy is not None else None
        tracer_provider._tokentrace_keep_stage = stage
    return stage  # type: ignore[return-value]  # the KeepStage kept on the provider (or None)
