"""Spans from step records (instrument/records/format.py), built in the exporter process.

:class:`SpanBuilder` is the continuous engine's decoder of the record stream's channel 0: the
engine's record sink (record_sink.py) names it when it joins the span exporter process, whose
router hands it each entry of that channel (:meth:`SpanBuilder.entry`).

The builder keeps what the continuous engine keeps on its own thread in the inline path
(instrument/engines/continuous/spans.py): one :class:`StepRecord` per STEP entry, and per slot the
prefill chunks and decode steps its SEQ entries name. On END it calls the same
``write_sequence_spans``, and every STEP goes to the same ``EngineTraceWriter``: the span
contract (docs/spans.md) is written by one piece of code in both paths. What stays in the
serving process: the ``tokentrace.preemption`` events, which go on the gateway's request
span (a live span there, rare: one per preemption).
"""

from __future__ import annotations

import dataclasses
import functools
from dataclasses import dataclass, field
from typing import Any

from opentelemetry import trace
from opentelemetry.trace import NonRecordingSpan, SpanContext, TraceFlags, TraceState

from instrument.engines.continuous.spans import EngineTraceWriter, StepRecord, record_run, write_sequence_spans
from instrument.engines.continuous.step_keeper import StepKeeper, step_ratio_from_env
from instrument.hf.generate_spans import DecodeSpanPolicy
from instrument.kv.formula import KVLayout
from instrument.otel.span_writer import span_writer_for
from instrument.otel.tracing import get_tracer
from instrument.records import format as fmt
from instrument.records.keep_stage import EngineFacts, keep_stage_of

__all__ = ["SpanBuilder", "emissions", "engine_facts", "layout_meta"]


def layout_meta(layout: KVLayout | None, layout_name: str, bytes_per_block: int, decode_spans: str,
                steps_per_trace: int) -> dict[str, Any]:
    """The META entry's content for an engine (JSON-able)."""
    return {"layout": dataclasses.asdict(layout) if layout is not None else None, "layout_name": layout_name,
            "bytes_per_block": bytes_per_block, "decode_spans": decode_spans, "steps_per_trace": steps_per_trace}


@dataclass(slots=True)
class _Request:
    parent_context: Any
    trace_id: int = 0  # the request span's (the parent of every span of the sequence)
    span_id: int = 0


@dataclass(slots=True)
class _Sequence:
    """What ``write_sequence_spans`` reads of a SequenceRecord."""

    request: _Request
    cached_tokens: int
    prefill: list[tuple[StepRecord, int, int, int, bool]] = field(default_factory=list)
    decode: list[StepRecord] = field(default_factory=list)
    decode_blocks: list[int] = field(default_factory=list)
    decode_context: list[int] = field(default_factory=list)
    recomputed_steps: list[int] = field(default_factory=list)
    preemptions: tuple[()] = ()


def engine_facts(seq: _Sequence) -> EngineFacts:
    """The keep policy's facts of an ended sequence: the largest gap between two tokens it
    emitted (the first at the end of its first prefill, token k + 1 at the end of its k-th
    decode step) and the step after it, time in prefill and decode steps, preemptions."""
    first = [rec.end_ns for rec, _, _, _, recompute in seq.prefill if not recompute]
    previous = max(first) if first else None
    max_gap = gap_step = None
    for rec in seq.decode:
        if previous is not None and (max_gap is None or rec.end_ns - previous > max_gap):
            max_gap, gap_step = rec.end_ns - previous, rec.step
        previous = rec.end_ns
    emitted_by_recompute = len(seq.recomputed_steps)
    return EngineFacts(
        max_gap_ns=max_gap, gap_step=gap_step,
        prefill_ns=sum(rec.end_ns - rec.start_ns for rec, *_ in seq.prefill),
        decode_ns=sum(rec.end_ns - rec.start_ns for rec in seq.decode),
        preemptions=emitted_by_recompute, cached_tokens=seq.cached_tokens,
        held_bytes=96 * (len(seq.prefill) + len(seq.decode)))


def emissions(seq: _Sequence) -> list[tuple[int, int]]:
    """(end ns, engine step) of each token the sequence emitted, in order: the first at the end
    of its first prefill, token k + 1 at the end of its k-th decode step."""
    first = [(rec.end_ns, rec.step) for rec, _, _, _, recompute in seq.prefill if not recompute]
    return ([max(first)] if first else []) + [(rec.end_ns, rec.step) for rec in seq.decode]


class SpanBuilder:
    """Builds the spans of the continuous engine's step records on ``tracer_provider``."""

    def __init__(self, tracer_provider: Any) -> None:
        self.tracer_provider = tracer_provider
        self.tracer = get_tracer(tracer_provider)
        self.writer = span_writer_for(self.tracer)
        # tokentrace's SDK provider: span_writer_for gives the direct writer (hand_off is its)
        self.stage = keep_stage_of(tracer_provider, self.writer.hand_off)  # type: ignore[union-attr]  # see above
        self.engine_traces: EngineTraceWriter | None = None
        self.step_keeper: StepKeeper | None = None  # with a keep policy: the steps' spans follow the requests
        self.layout: KVLayout | None = None
        self.layout_name = ""
        self.bytes_per_block = 0
        self.policy = DecodeSpanPolicy.parse("all")
        self.sequences: dict[int, _Sequence] = {}
        self.unknown_slots = 0  # SEQ / END entries of a slot never opened (its OPEN was dropped)
        self.lost_units = 0  # ... of which SEQ entries: a span each that is never built
        self._step: StepRecord | None = None
        self._engine_at_rest = True  # no engine entry since the last IDLE (see at_rest)

    def _meta(self, info: dict[str, Any]) -> None:
        layout = info.get("layout")
        if layout is not None:
            layout = KVLayout(**{**layout, "notes": tuple(layout.get("notes") or ())})
        self.layout, self.layout_name = layout, info["layout_name"]
        self.bytes_per_block = int(info["bytes_per_block"])
        self.policy = DecodeSpanPolicy.parse(info["decode_spans"])
        if self.engine_traces is not None:
            self.engine_traces.close()
        self.engine_traces = EngineTraceWriter(self.tracer, self.writer, int(info["steps_per_trace"]))
        if self.stage is not None:
            if self.step_keeper is not None:
                self.step_keeper.close()
            self.step_keeper = StepKeeper(self.tracer, self.writer, int(info["steps_per_trace"]), step_ratio_from_env())
            self.tracer_provider._tokentrace_step_keeper = self.step_keeper  # its counts, in /health

    def feed(self, message: bytes | memoryview) -> None:
        """Build the spans one message of these entries finishes (raises ValueError on a
        malformed message). In the exporter process the router calls :meth:`entry` instead."""
        for entry in fmt.iter_entries(message):
            self.entry(entry)

    def entry(self, entry: tuple[Any, ...]) -> None:
        """One entry as :func:`~instrument.records.format.iter_entries` yields it."""
        kind = entry[0]
        if kind != fmt.META:
            self._engine_at_rest = kind == fmt.IDLE
        if kind == fmt.SEQ:
            _, slot, tokens, blocks, context, flags = entry
            seq, rec = self.sequences.get(slot), self._step
            if seq is None or rec is None:
                self.unknown_slots += 1
                self.lost_units += 1
                return
            record_run(seq, rec, tokens, blocks, context, bool(flags & fmt.SEQ_PREFILL),
                       bool(flags & fmt.SEQ_RECOMPUTE), bool(flags & fmt.SEQ_RECOMPUTE_EMITS))
        elif kind == fmt.STEP:
            (_, step, start, forward, end, batch, tokens, prefill_tokens, prefill_seqs, waiting, used, total,
             cached, block_tokens, device) = entry
            rec = StepRecord(step, start, forward, batch, tokens, prefill_tokens, used, total, block_tokens,
                             waiting, prefill_seqs, cached, end, None if device < 0 else device)
            self._step = rec
            if self.step_keeper is not None:
                self.step_keeper.step(rec)
            elif self.engine_traces is not None:
                self.engine_traces.step(rec)
        elif kind == fmt.OPEN:
            _, slot, trace_id, span_id, flags, cached, state = entry
            parent = SpanContext(trace_id, span_id, is_remote=False, trace_flags=TraceFlags(flags),
                                 trace_state=TraceState.from_header([state]) if state else None)
            self.sequences[slot] = _Sequence(_Request(trace.set_span_in_context(NonRecordingSpan(parent)), trace_id,
                                                      span_id), cached)
        elif kind == fmt.END:
            seq = self.sequences.pop(entry[1], None)
            if seq is None:
                self.unknown_slots += 1
            elif seq.prefill or seq.decode:
                if self.stage is None:
                    write_sequence_spans(self.writer, seq,  # type: ignore[arg-type]  # _Sequence: what it reads
                                         self.layout, self.layout_name, self.bytes_per_block, self.policy)
                else:  # the keep policy: the spans are written only if the request is kept whole
                    self.stage.engine_ended(seq.request.trace_id, seq.request.span_id, engine_facts(seq),
                                            functools.partial(self._write_kept, seq))
        elif kind == fmt.IDLE:
            if self.engine_traces is not None:
                self.engine_traces.close()
            if self.step_keeper is not None:
                self.step_keeper.idle()
        elif kind == fmt.META:
            self._meta(entry[1])
        else:
            raise ValueError(f"continuous engine records: entry kind {kind} is not one of this engine's")

    def _write_kept(self, seq: _Sequence) -> None:
        """A request the keep policy kept whole: its prefill and decode spans, and the engine
        steps of its largest gaps."""
        write_sequence_spans(self.writer, seq,  # type: ignore[arg-type]  # _Sequence: what it reads of one
                             self.layout, self.layout_name, self.bytes_per_block, self.policy)
        if self.step_keeper is not None:
            self.step_keeper.keep_gaps(emissions(seq))

    @property
    def at_rest(self) -> bool:
        """Whether the engine's last entry said it went idle: an engine that ends unannounced
        then lost nothing it had not sent."""
        return self._engine_at_rest

    def tick(self) -> None:
        if self.stage is not None:
            self.stage.tick()

    def close(self) -> None:
        """End the open engine trace; the keep stage decides what it still holds (shutdown)."""
        if self.engine_traces is not None:
            self.engine_traces.close()
        if self.stage is not None:
            self.stage.close()
        if self.step_keeper is not None:
            self.step_keeper.close()
