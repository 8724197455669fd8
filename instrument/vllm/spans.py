"""Spans from vLLM scheduler step records (docs/spans.md, "vLLM"), built OUTSIDE vLLM's processes.

:class:`SpanBuilder.consume` is **the seam**: it takes one engine-neutral
:class:`~instrument.vllm.hooks.StepFacts` (ints and request ids, no vLLM object) and writes
the spans it completes. It runs in the span exporter process
(instrument/records/exporter_process.py), on the StepFacts that
:class:`~instrument.vllm.consumer.RecordConsumer` rebuilds from the records vLLM's engine
thread packed (instrument/vllm/rows.py); nothing here runs in vLLM's engine-core process.

Per request (vLLM's request id; trace context = the ``traceparent`` vLLM received):

- ``engine_request`` (INTERNAL): arrival .. end; a child of the received context (a sibling
  of vLLM's ``llm_request``), a root when there was none. ``gen_ai.request.id`` = the id
  ``llm_request`` carries (vLLM's request id without the 8 random characters the frontend
  appends), usage, cached tokens, finish reason (``cancelled`` on abort; ``error``, status
  ERROR and ``error.type`` ``shutdown`` when the engine shut down while it ran), one
  ``tokentrace.chunk`` event per step that generated tokens for it (at the step's end),
  one ``tokentrace.preempted`` event per preemption.
- below it ``queue`` (arrival .. start of the first step that scheduled it), ``prefill`` per
  prompt chunk, ``decode`` per generated token after the first (per step under speculative
  decoding: the tokens it emitted and the drafts it verified), each spanning its engine step
  and naming it (``tokentrace.engine.step``).

Per step: ``engine_step`` under an ``engine`` root (at most 1,000 steps per engine trace; a
trace ends when the engine goes idle).
"""

from __future__ import annotations

import logging
from collections import deque
from typing import Any

from opentelemetry import trace
from opentelemetry.context import Context
from opentelemetry.trace import SpanKind, Status, StatusCode
from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

from instrument.otel.span_writer import span_writer_for
from instrument.vllm.engine_trace import EngineTrace, engine_figures
from instrument.vllm.facts import FINISHED_ABORTED, FINISHED_ERROR, FINISHED_LENGTH, StepFacts
from instrument.vllm.keep import DROPPED, DetailKeeper
from instrument.vllm.rows import KEPT_IF_SLOW
from instrument.vllm.sampling import MASK64, step_sampled

__all__ = ["SpanBuilder"]

log = logging.getLogger("tokentrace.vllm")
_FINISH = {FINISHED_ABORTED: "cancelled", FINISHED_LENGTH: "length", FINISHED_ERROR: "error"}
_PROPAGATOR = TraceContextTextMapPropagator()


class _Request:
    """What the builder keeps per live request (in the exporter process)."""

    __slots__ = ("span", "context", "arrival_ns", "prompt_tokens", "cached", "queued", "chunks", "decodes",
                 "generated", "emits", "blocks", "block_bytes", "preemptions", "drafts", "accepted", "held", "head",
                 "decision", "held_bytes", "queue_end_ns", "last_emit_ns", "gap_ns", "gap_step", "gap_engine",
                 "prefill_ns", "decode_ns")

    def __init__(self, span: Any, arrival_ns: int, prompt_tokens: int) -> None:
        self.span = span
        self.context = trace.set_span_in_context(span)
        self.arrival_ns = arrival_ns
        self.prompt_tokens = prompt_tokens
        self.cached = 0
        self.queued = False
        self.chunks = 0
        self.decodes = 0
        self.generated = 0
        self.emits: list[tuple[int, int]] = []  # (time_ns, tokens) per step that sampled tokens
        self.blocks = 0
        self.block_bytes = 0
        self.preemptions = 0
        self.drafts = 0  # speculative decoding: draft tokens verified in its decode steps
        self.accepted = 0  # ... of which accepted
        # under a keep policy (instrument/vllm/keep.py): its detail per step until decided (None:
        # written as it comes: the random sample, or kept; keep.DROPPED: not kept), its decision
        self.held: list[tuple[Any, ...]] | None = None
        self.head = True  # the random sample took it
        self.decision: Any = None
        self.held_bytes = 0
        self.queue_end_ns = 0  # the start of the first step that scheduled it
        self.last_emit_ns = 0  # ... and its figures for the policy: the largest gap between two
        self.gap_ns: int | None = None  # emissions, the step that ended it (its number and its
        self.gap_step: int | None = None  # engine_step figures), time in prefill and decode steps
        self.gap_engine: tuple[Any, ...] | None = None
        self.prefill_ns = 0
        self.decode_ns = 0


class SpanBuilder:
    """Turns :class:`StepFacts` records into spans (one thread at a time)."""

    def __init__(self, tracer: trace.Tracer, request_id_of: Any = str, steps_per_engine_trace: int = 1000,
                 on_idle: Any = None, step_bound: int = MASK64 + 1, keeper: DetailKeeper | None = None) -> None:
        self.tracer = tracer
        # the keep policy (instrument/vllm/keep.py): None, every request sampled here is written whole
        self.keeper = keeper
        # engine_step spans for the steps sampling.step_sampled picks (default: every step)
        self.step_bound = step_bound
        self.writer = span_writer_for(tracer)  # finished spans handed to the processor directly (~5 µs)
        self.request_id_of = request_id_of  # internal id -> the id llm_request carries
        self.on_idle = on_idle
        self.live: dict[str, _Request] = {}
        self.unsampled: set[str] = set()  # live requests not sampled: no span, not discarded work
        # requests that ended recently: a step scheduled before the end was known (vLLM's async
        # scheduling, an abort between schedule and output) still names them
        self._ended: set[str] = set()
        self._ended_order: deque[str] = deque()
        self.engine_trace = EngineTrace(tracer, self.writer, steps_per_engine_trace)
        self.steps = 0  # scheduler steps consumed
        self.tokens = 0  # generated tokens seen (sampled in a step, for a live request)
        self.lost_requests = 0  # live requests forgotten at an idle engine (engine_idle)
        self.last_end_ns = 0  # the latest step end consumed, ns since the epoch
        self.partial_steps_sampled = 0  # steps sampled here that the engine held as PARTIAL rows (no engine_step)

    # -- the seam ---------------------------------------------------------------------------
    def consume(self, facts: StepFacts) -> None:
        """Write every span ``facts`` completes."""
        for req_id, arrival_s, headers, prompt_tokens, sampled in facts.arrivals:
            if sampled:
                self.unsampled.discard(req_id)
                self._arrive(req_id, arrival_s, headers, prompt_tokens, sampled)
            else:  # followed for its neighbours' step facts, no span of its own
                self.live.pop(req_id, None)
                self.unsampled.add(req_id)
        for req_id, cached in facts.first:
            rec = self.live.get(req_id)
            if rec is not None:
                rec.cached = cached
        if facts.step >= 0 and facts.batch_size:
            self.steps += 1
            self._step(facts)
            self.last_end_ns = max(self.last_end_ns, facts.end_ns)
        for req_id, blocks, time_ns in facts.preempted:
            rec = self.live.get(req_id)
            if rec is not None:
                rec.preemptions += 1
                rec.span.add_event("tokentrace.preempted", {"tokentrace.kv.blocks_freed": blocks}, timestamp=time_ns)
        for req_id, status, time_ns in facts.finished:
            self._finish(req_id, status, facts.end_ns if facts.step >= 0 else time_ns)
        if not self.live and not self.unsampled:
            self.close_engine_trace()
            if self.on_idle is not None:
                self.on_idle()

    def engine_idle(self) -> int:
        """The engine said it holds no request (an IDLE entry): a request still live here lost
        its end, or its arrival, in a message the exporter process never received (dropped at a
        full socket). It is forgotten: its span is incomplete and never exported (counted in
        ``lost_requests``, one warning per idle); without this, it would stay live for good and
        the engine would never look idle again. Returns how many were forgotten."""
        lost = len(self.live)
        self.unsampled.clear()
        if lost:
            self.lost_requests += lost
            if self.keeper is not None:
                for rec in self.live.values():
                    self.keeper.release(rec)
            log.warning("tokentrace: %d vLLM request(s) lost their end in a dropped message; their spans are "
                        "not exported (%d so far)", lost, self.lost_requests)
            self.live.clear()
        self.close_engine_trace()
        if self.on_idle is not None:
            self.on_idle()
        return lost

    def end_at_shutdown(self, end_ns: int) -> int:
        """The engine shut down with requests still running (vLLM's scheduler shutdown, e.g.
        SIGTERM mid-load: vLLM frees no request then). Each ends as failed: finish reason
        ``error``, status ERROR, ``error.type`` ``shutdown``, at ``end_ns`` (ns since the
        epoch; no earlier than its last step), so its ``engine_request`` span (and the
        ``queue`` span of one never scheduled) is exported and its prefill and decode spans
        keep their parent. Then the open ``engine`` root ends. Returns how many ended so."""
        running = list(self.live)
        self.unsampled.clear()
        for req_id in running:
            self._finish(req_id, FINISHED_ERROR, end_ns, error_type="shutdown")
        self.close_engine_trace()
        return len(running)

    # -- requests ---------------------------------------------------------------------------
    def _arrive(self, req_id: str, arrival_s: float, headers: Any, prompt_tokens: int, sampled: Any = True) -> None:
        parent = _PROPAGATOR.extract(headers) if headers else Context()
        arrival_ns = int(arrival_s * 1e9)
        span = self.tracer.start_span(
            "engine_request", context=parent, kind=SpanKind.INTERNAL, start_time=arrival_ns,
            attributes={"gen_ai.request.id": self.request_id_of(req_id), "gen_ai.usage.input_tokens": prompt_tokens},
        )
        rec = self.live[req_id] = _Request(span, arrival_ns, prompt_tokens)
        if self.keeper is not None and sampled == KEPT_IF_SLOW:  # (True == 1: the random sample)
            rec.head, rec.held = False, []

    def _step(self, facts: StepFacts) -> None:
        n = facts.n  # the requests in the columns: all the step's, or those sampled requests' spans need
        prefill_tokens = sum(facts.tokens[i] for i in range(n) if facts.prefill[i])
        base = {  # every span of the step has these; engine_step has more (step_attributes)
            "tokentrace.engine.step": facts.step, "tokentrace.batch.size": facts.batch_size,
            "tokentrace.batch.tokens": facts.batch_tokens, "tokentrace.batch.prefill_tokens": prefill_tokens,
        }
        step_attributes = dict(base)
        per_token = facts.bytes_per_block // facts.block_tokens if facts.block_tokens else 0
        step = (base, facts.start_ns, facts.end_ns, per_token, facts.bytes_per_block)
        keeper = self.keeper
        sampled_step = step_sampled(facts.step, self.step_bound)
        # the step's engine_step figures: written now when sampled; under a keep policy also
        # referenced by the requests whose largest gap it ends so far (written if one is kept)
        engine = (engine_figures(facts, step_attributes) if facts.whole and (sampled_step or keeper is not None)
                  else None)
        duration = facts.end_ns - facts.start_ns
        discarded_tokens = discarded_sequences = step_drafts = step_accepted = 0
        for i in range(n):
            rec = self.live.get(facts.req_ids[i])  # type: ignore[arg-type]  # rows below n have their request id
            if rec is None and facts.req_ids[i] in self.unsampled:
                continue  # in the step's figures, no span of its own
            if rec is None:  # ended before this step's output: computed, delivered to no one
                discarded_tokens += facts.tokens[i]
                discarded_sequences += 1
                if facts.req_ids[i] not in self._ended:  # once per request (then counted as ended)
                    log.warning("tokentrace: engine step %d names request %s it never saw arrive",
                                facts.step, facts.req_ids[i])
                    self._remember_ended(facts.req_ids[i])  # type: ignore[arg-type]  # rows below n have their request id
                continue
            held = rec.held
            if not rec.queued:
                rec.queued = True
                rec.queue_end_ns = facts.start_ns
                if held is None:
                    self.writer.write("queue", rec.context, {}, rec.arrival_ns, facts.start_ns)
            tokens, blocks, prefill, emitted = facts.tokens[i], facts.blocks[i], facts.prefill[i], facts.sampled[i]
            rec.blocks, rec.block_bytes = blocks, blocks * facts.bytes_per_block
            detail = (step, tokens, facts.computed[i], blocks, prefill, emitted, rec.chunks, rec.generated)
            if held is None:
                self._detail(rec, detail)
            elif held is not DROPPED:
                keeper.hold(rec, detail)  # type: ignore[union-attr]  # a held request implies a keeper
            if prefill:
                rec.chunks += 1
            else:
                rec.decodes += 1
                drafts = tokens - 1  # speculative decoding: draft tokens verified with the step's own token
                if drafts > 0:
                    accepted = max(0, emitted - 1)
                    rec.drafts += drafts
                    rec.accepted += accepted
                    step_drafts += drafts
                    step_accepted += accepted
            if emitted:
                self.tokens += emitted
                rec.generated += emitted
                rec.emits.append((facts.end_ns, emitted))
            if keeper is not None:
                if prefill:
                    rec.prefill_ns += duration
                else:
                    rec.decode_ns += duration
                if emitted:
                    if rec.last_emit_ns and (rec.gap_ns is None or facts.end_ns - rec.last_emit_ns > rec.gap_ns):
                        rec.gap_ns, rec.gap_step, rec.gap_engine = facts.end_ns - rec.last_emit_ns, facts.step, engine
                    rec.last_emit_ns = facts.end_ns
        step_attributes["tokentrace.batch.discarded_tokens"] = discarded_tokens
        step_attributes["tokentrace.batch.discarded_sequences"] = discarded_sequences
        if step_drafts:
            step_attributes["tokentrace.spec.draft_tokens"] = step_drafts
            step_attributes["tokentrace.spec.accepted_tokens"] = step_accepted
        if keeper is not None and keeper.over:
            self._force_decisions()
        if sampled_step:
            if not facts.whole:  # the engine thread decided otherwise (another step ratio): no figures for it
                self.partial_steps_sampled += 1
                if self.partial_steps_sampled == 1:
                    log.warning("tokentrace: engine step %d is sampled here but the engine held it partially (its "
                                "TOKENTRACE_VLLM_STEP_SAMPLE_RATIO differs from this process's): no engine_step span "
                                "for such steps (counted)", facts.step)
                return
            self.engine_trace.step(engine)  # type: ignore[arg-type]  # set above for a whole sampled step

    def _detail(self, rec: _Request, detail: tuple[Any, ...]) -> None:
        """Write ``rec``'s prefill or decode span of one step (``detail``: what :meth:`_step`
        read of it; its chunk index and tokens generated before the step)."""
        (base, start_ns, end_ns, per_token, bytes_per_block), tokens, computed, blocks, prefill, emitted, chunk, \
            generated = detail
        attributes = dict(base)
        attributes.update({"tokentrace.kv.blocks": blocks, "tokentrace.kv.physical_bytes": blocks * bytes_per_block,
                           "tokentrace.kv.bytes_per_token": per_token})
        if prefill:
            attributes.update({
                "tokentrace.prefill.tokens": tokens, "tokentrace.input_tokens": tokens,
                "tokentrace.prefill.chunk": chunk,
                "tokentrace.prefill.recompute": prefill == 2,
                "tokentrace.cached_tokens": rec.cached if chunk == 0 else 0,
                "gen_ai.usage.cache_read.input_tokens": rec.cached if chunk == 0 else 0,
                "tokentrace.context_tokens": computed + tokens,
            })
            if prefill == 2 and emitted and generated:  # emitted token k + 1, as decode step k would
                attributes["tokentrace.step"] = generated
            name = "prefill"
        else:
            # decode step k feeds token k (k = tokens generated so far) and emits token k + 1;
            # after a recomputed prefill (which emitted a token) k skips that token's step
            attributes["tokentrace.step"] = generated
            drafts = tokens - 1  # speculative decoding: draft tokens verified with the step's own token
            if drafts > 0:
                # it emits the accepted drafts and one token of its own, and keeps their KV
                # only (vLLM rolls the rejected drafts back)
                attributes.update({"tokentrace.decode.tokens": emitted, "tokentrace.spec.draft_tokens": drafts,
                                   "tokentrace.spec.accepted_tokens": max(0, emitted - 1),
                                   "tokentrace.context_tokens": computed + emitted})
            else:
                attributes["tokentrace.context_tokens"] = computed + tokens
            name = "decode"
        self.writer.write(name, rec.context, attributes, start_ns, end_ns)

    def _write_held(self, rec: _Request) -> None:
        """A request kept whole under the policy: the detail held so far, written (then as it comes)."""
        if rec.queued:
            self.writer.write("queue", rec.context, {}, rec.arrival_ns, rec.queue_end_ns)
        for detail in rec.held or ():
            self._detail(rec, detail)
        rec.held = None

    def _force_decisions(self) -> None:
        """Past the memory bound: the oldest undecided requests decided on what is known so far."""
        keeper = self.keeper
        while keeper is not None and keeper.over:
            rec = keeper.oldest_undecided(self.live)
            if rec is None:
                return
            if keeper.forced_decision(rec, self.last_end_ns).full:
                self._write_held(rec)
            else:
                rec.held = DROPPED

    def _finish(self, req_id: str, status: int, end_ns: int, error_type: str | None = None) -> None:
        rec = self.live.pop(req_id, None)
        if rec is None:
            if req_id in self.unsampled:
                self.unsampled.discard(req_id)
                self._remember_ended(req_id)
            return
        if error_type is not None:  # ended by the engine, not by vLLM's scheduler: after its last step
            end_ns = max(end_ns, rec.emits[-1][0] if rec.emits else 0)
            rec.span.set_attribute("error.type", error_type)
            rec.span.set_status(Status(StatusCode.ERROR, f"the vLLM engine stopped ({error_type}) while it ran"))
        self._remember_ended(req_id)
        reason = _FINISH.get(status, "stop")
        end_ns = max(end_ns, rec.arrival_ns)
        full = True
        if self.keeper is not None:
            full = self._decide(rec, reason, error_type is not None, end_ns)
        last = len(rec.emits) - 1 if full else -1  # (not kept whole: no chunk events)
        for index, (time_ns, tokens) in enumerate(rec.emits if full else ()):
            # vLLM counts a final stop token (EOS) in completion_tokens; it is not shown (a
            # speculative step that emitted it with accepted drafts showed those)
            visible = not (reason == "stop" and index == last and tokens == 1)
            rec.span.add_event("tokentrace.chunk", {"tokentrace.chunk.index": index, "tokentrace.chunk.tokens": tokens,
                                                    "tokentrace.chunk.visible": visible}, timestamp=time_ns)
        rec.span.set_attributes({
            "gen_ai.usage.output_tokens": rec.generated, "tokentrace.generated_tokens": rec.generated,
            "tokentrace.cached_tokens": rec.cached, "gen_ai.usage.cache_read.input_tokens": rec.cached,
            "gen_ai.response.finish_reasons": [reason], "tokentrace.kv.blocks": rec.blocks,
            "tokentrace.kv.physical_bytes": rec.block_bytes, "tokentrace.preemptions": rec.preemptions,
        })
        if rec.drafts:
            rec.span.set_attributes({"tokentrace.spec.draft_tokens": rec.drafts,
                                     "tokentrace.spec.accepted_tokens": rec.accepted})
        if not rec.queued and full:  # ended before it was ever scheduled: all of it was queue time
            self.writer.write("queue", rec.context, {}, rec.arrival_ns, end_ns)
        rec.span.end(end_time=end_ns)

    def _decide(self, rec: _Request, reason: str, error: bool, end_ns: int) -> bool:
        """The keep policy's decision on ``rec`` at its end (taken earlier past the memory
        bound): its summary attributes set, its held detail written if kept whole, and the
        engine_step span of the step that ended its largest gap. Returns whether it is kept whole."""
        keeper = self.keeper
        assert keeper is not None
        if rec.decision is None:  # (the random sample, written as it came, is decided too: the
            keeper.decide(rec, reason, error, end_ns)  # slowest rule's window counts every request)
        rec.span.set_attributes(keeper.summary(rec, reason, error, end_ns))
        if not rec.decision.full:
            rec.held = DROPPED
            return False
        if rec.held is not None:
            self._write_held(rec)
        engine = rec.gap_engine
        if (engine is not None and rec.gap_step is not None and not step_sampled(rec.gap_step, self.step_bound)
                and keeper.gap_step_due(rec.gap_step)):
            self.engine_trace.step(engine)
        return True

    def _remember_ended(self, req_id: str) -> None:
        self._ended.add(req_id)
        self._ended_order.append(req_id)
        if len(self._ended_order) > 65536:
            self._ended.discard(self._ended_order.popleft())

    # -- engine steps -------------------------------------------------------------------------
    def close_engine_trace(self) -> None:
        """End the open ``engine`` root (idle, full, or shutdown)."""
        self.engine_trace.close()
