"""Spans of the continuous engine: each sequence's prefill chunks and decode steps, and one
``engine_step`` span per batched step in traces of the engine's own (docs/spans.md, "Under
continuous batching").

The engine records per step one :class:`StepRecord` (O(batch): what ran, KV blocks) and per
sequence a :class:`SequenceRecord` (O(1) per token: references to the step records it ran
in). Spans are written from these after the fact, with explicit times; decode spans are the
lazy step spans of :mod:`instrument.otel.span_writer` (id and attributes built by the exporter).

A request's spans name their step (``tokentrace.engine.step``), and an ``engine_step`` span
carries the same number: a reader joins the two on (``service.instance.id``,
``tokentrace.engine.step``), which is unique per engine process.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass, field
from typing import Any

from opentelemetry import trace
from opentelemetry.context import Context
from opentelemetry.trace import SpanKind

from instrument.engines.base import EngineRequest
from instrument.hf.generate_spans import DecodeSpanPolicy
from instrument.hf.token_sampling import SequenceSampler, TokenLogprobs
from instrument.kv.formula import KVLayout

__all__ = ["EngineTraceWriter", "SequenceRecord", "StepRecord", "record_run", "write_preemption_events", "write_sequence_spans"]

STEP_SPAN = "engine_step"
PREEMPTION_EVENT = "tokentrace.preemption"
ENGINE_SPAN = "engine"


@dataclass(slots=True)
class StepRecord:
    """One batched engine step. Times in ns since the epoch (instrument/clock.py), counts in
    sequences, tokens and KV blocks."""

    step: int
    start_ns: int  # the scheduler started
    forward_start_ns: int  # scheduling done, the forward starts
    batch_size: int
    scheduled_tokens: int
    prefill_tokens: int
    kv_blocks_used: int
    kv_blocks_total: int
    kv_block_tokens: int
    waiting: int  # sequences the scheduler left waiting
    prefill_sequences: int = 0  # sequences that computed prompt tokens in the step
    kv_blocks_cached: int = 0  # blocks no sequence holds, kept for the prefix cache
    end_ns: int = 0  # tokens handed over
    device_ns: int | None = None  # CUDA time of the step's forward and sampling, ns (CUDA only)

    def span_attributes(self) -> dict[str, Any]:
        """The ``engine_step`` span's attributes."""
        return {
            "tokentrace.engine.step": self.step,
            "tokentrace.batch.size": self.batch_size,
            "tokentrace.batch.tokens": self.scheduled_tokens,
            "tokentrace.batch.prefill_tokens": self.prefill_tokens,
            "tokentrace.batch.prefill_sequences": self.prefill_sequences,
            "tokentrace.batch.waiting": self.waiting,
            "tokentrace.kv.blocks_used": self.kv_blocks_used,
            "tokentrace.kv.blocks_total": self.kv_blocks_total,
            "tokentrace.kv.blocks_cached": self.kv_blocks_cached,
            "tokentrace.kv.block_tokens": self.kv_block_tokens,
            "tokentrace.engine.schedule_ns": self.forward_start_ns - self.start_ns,
            **({"tokentrace.device_ns": self.device_ns} if self.device_ns is not None else {}),
        }


def _step_attributes(rec: StepRecord) -> dict[str, Any]:
    """What a request's prefill / decode span says about the step it ran in."""
    return {
        "tokentrace.engine.step": rec.step,
        "tokentrace.batch.size": rec.batch_size,
        "tokentrace.batch.tokens": rec.scheduled_tokens,
        "tokentrace.batch.prefill_tokens": rec.prefill_tokens,
    }


@dataclass(slots=True)
class SequenceRecord:
    """What one sequence did, step by step (filled on the engine's thread)."""

    request: EngineRequest
    sampler: SequenceSampler
    admitted_ns: int | None = None
    cached_tokens: int = 0  # prompt tokens whose blocks came from the prefix cache at the first schedule
    # (step, tokens computed, blocks held, context tokens after the step, recompute after a
    # preemption), one per prefill chunk
    prefill: list[tuple[StepRecord, int, int, int, bool]] = field(default_factory=list)
    decode: list[StepRecord] = field(default_factory=list)  # decode step k = decode[k - 1]
    decode_blocks: list[int] = field(default_factory=list)
    decode_context: list[int] = field(default_factory=list)
    emitted: int = 0  # tokens handed to the request
    pending_logprobs: TokenLogprobs | None = None
    cancel_requested: bool = False
    waiting: bool = True  # not running: not yet scheduled, or preempted and not scheduled again
    preempted: int = 0  # times the scheduler preempted it
    preemptions: list[tuple[int, int, str]] = field(default_factory=list)  # (at ns, blocks freed, mode)
    queue_expired: bool = False  # ended because it waited longer than max_queue_wait_s
    recomputed_steps: list[int] = field(default_factory=list)  # decode steps k a recompute prefill emitted
    slot: int = 0  # its slot in the step records (--span-export process; 0: none yet)
    blocks_now: int | None = None  # blocks held in the last step it ran in (--span-export process)

    @property
    def last_blocks(self) -> int | None:
        """Blocks held in the last step the sequence ran in."""
        if self.decode_blocks:
            return self.decode_blocks[-1]
        return self.prefill[-1][2] if self.prefill else self.blocks_now


def record_run(seq: Any, rec: StepRecord, tokens: int, blocks: int, context: int, prefill: bool, recompute: bool,
               recompute_emits: bool) -> None:
    """``seq`` (a SequenceRecord, or the exporter process's view of one) ran in step ``rec``:
    ``tokens`` computed, ``blocks`` held, ``context`` tokens after it. A prefill chunk (``recompute``: after a preemption) is one entry of
    ``prefill``; a recompute chunk that ends by emitting the next token also stands for
    that token's decode step (docs/spans.md). The inline path (continuous.py) and the
    exporter process (instrument/engines/continuous/span_builder.py) both fill records through here."""
    if prefill:
        seq.prefill.append((rec, tokens, blocks, context, recompute))
        if not recompute_emits:
            return
        seq.recomputed_steps.append(len(seq.decode) + 1)
    seq.decode.append(rec)
    seq.decode_blocks.append(blocks)
    seq.decode_context.append(context)


def write_preemption_events(record: Any, bytes_per_block: int) -> None:
    """One ``tokentrace.preemption`` event per preemption of ``record`` on the request's span
    (the gateway span, live in the serving process: written there in both span-export paths)."""
    if record.preemptions:
        request_span = trace.get_current_span(record.request.parent_context)
        for at_ns, blocks, mode in record.preemptions:
            request_span.add_event(PREEMPTION_EVENT, {
                "tokentrace.preemption.reason": "kv_cache_full", "tokentrace.preemption.mode": mode,
                "tokentrace.kv.blocks_freed": blocks, "tokentrace.kv.bytes_freed": blocks * bytes_per_block,
            }, timestamp=at_ns)


def write_sequence_spans(writer: Any, record: SequenceRecord, layout: KVLayout | None, layout_name: str,
                         bytes_per_block: int, policy: DecodeSpanPolicy) -> None:
    """The sequence's ``prefill`` span per prefill chunk and ``decode`` span per decode step
    (those ``policy`` keeps), children of the request's parent context, and one
    ``tokentrace.preemption`` event per preemption on the request's span (the gateway span)."""
    parent = record.request.parent_context
    write_preemption_events(record, bytes_per_block)
    per_token = layout.kv_bytes_per_token if layout is not None else None
    kv_inputs: dict[str, Any] = {"tokentrace.kv.layout": layout_name}
    if layout is not None:
        kv_inputs.update({
            "tokentrace.kv.layers": layout.total_layers, "tokentrace.kv.heads": layout.kv_heads,
            "tokentrace.kv.head_dim": layout.head_dim, "tokentrace.kv.dtype": layout.dtype,
            "tokentrace.kv.bytes_per_token": layout.kv_bytes_per_token,
        })
    block_tokens = record.prefill[0][0].kv_block_tokens if record.prefill else 1
    # a recompute chunk that emitted a token stands for decode step k (decode[k - 1] is its step)
    emitted_by = {id(record.decode[k - 1]): k for k in record.recomputed_steps}
    for index, (rec, tokens, blocks, context, recompute) in enumerate(record.prefill):
        attributes = dict(kv_inputs)
        attributes.update(_step_attributes(rec))
        attributes.update({
            "tokentrace.prefill.tokens": tokens,
            "tokentrace.input_tokens": tokens,
            "tokentrace.cached_tokens": record.cached_tokens if index == 0 else 0,
            "tokentrace.prefill.chunk": index,
            "tokentrace.kv.physical_bytes": blocks * bytes_per_block,
        })
        if index == 0:
            attributes["gen_ai.usage.cache_read.input_tokens"] = record.cached_tokens
            attributes["tokentrace.kv.shared_bytes"] = record.cached_tokens // block_tokens * bytes_per_block
        if recompute:
            attributes["tokentrace.prefill.recompute"] = True
            if id(rec) in emitted_by:  # it emitted token k + 1, as decode step k would have
                attributes["tokentrace.step"] = emitted_by[id(rec)]
        if layout is not None:
            attributes["tokentrace.kv.bytes"] = layout.kv_bytes(context)
        writer.write("prefill", parent, attributes, rec.start_ns, rec.end_ns)
    if not record.decode:
        return
    steps = tuple(record.decode)
    starts = (0, *(rec.start_ns for rec in steps))  # index k = decode step k
    ends = (0, *(rec.end_ns for rec in steps))
    kept = policy.steps(len(steps) + 1)
    if record.recomputed_steps:  # the recompute prefill's span stands for these steps
        skipped = set(record.recomputed_steps)
        kept = [k for k in kept if k not in skipped]  # type: ignore[assignment]  # a list where the policy gave a range
    writer.write_steps(
        "decode", parent, kept,
        functools.partial(_decode_attributes, steps, tuple(record.decode_blocks), tuple(record.decode_context),
                          per_token, layout, bytes_per_block),
        starts, 0, ends,
    )


def _decode_attributes(steps: tuple[StepRecord, ...], blocks: tuple[int, ...], context: tuple[int, ...],
                       per_token: int | None, layout: KVLayout | None, bytes_per_block: int, k: int) -> dict[str, Any]:
    """Attributes of decode step ``k`` (built when the exporter reads the span)."""
    rec = steps[k - 1]
    attributes: dict[str, Any] = {
        "tokentrace.step": k,
        "tokentrace.context_tokens": context[k - 1],
        "tokentrace.engine.step": rec.step,
        "tokentrace.batch.size": rec.batch_size,
        "tokentrace.batch.tokens": rec.scheduled_tokens,
        "tokentrace.batch.prefill_tokens": rec.prefill_tokens,
        "tokentrace.kv.physical_bytes": blocks[k - 1] * bytes_per_block,
    }
    if layout is not None:
        attributes["tokentrace.kv.bytes_per_token"] = per_token
        attributes["tokentrace.kv.bytes"] = layout.kv_bytes(context[k - 1])
    return attributes


class EngineTraceWriter:
    """``engine_step`` spans, ``steps_per_trace`` at most under one root ``engine`` span.

    A trace of the engine's own covers one busy period (from the first step after the engine
    was idle until it is idle again) or ``steps_per_trace`` steps, whichever is shorter, so
    that Jaeger can open it (its UI slows down past a few thousand spans) and so that the
    root ends, and is exported, while the engine keeps running.
    """

    def __init__(self, tracer: trace.Tracer, writer: Any, steps_per_trace: int = 1000) -> None:
        if steps_per_trace < 1:
            raise ValueError(f"steps_per_trace must be at least 1, got {steps_per_trace}")
        self.tracer = tracer
        self.writer = writer
        self.steps_per_trace = steps_per_trace
        self._root: trace.Span | None = None
        self._context: Context | None = None
        self._first: StepRecord | None = None
        self._last: StepRecord | None = None
        self._count = 0

    def step(self, rec: StepRecord) -> None:
        """Write one finished step's span (opening a new engine trace when none is open)."""
        if self._root is None:
            self._root = self.tracer.start_span(
                ENGINE_SPAN, context=Context(), kind=SpanKind.INTERNAL, start_time=rec.start_ns,
                attributes={"tokentrace.engine.first_step": rec.step},
            )
            self._context = trace.set_span_in_context(self._root)
            self._first, self._count = rec, 0
        self.writer.write(STEP_SPAN, self._context, rec.span_attributes(), rec.start_ns, rec.end_ns)
        self._last = rec
        self._count += 1
        if self._count >= self.steps_per_trace:
            self.close()

    def close(self) -> None:
        """End the open engine trace (the engine went idle, the trace is full, or shutdown)."""
        root, last = self._root, self._last
        if root is None or last is None:
            return
        root.set_attributes({"tokentrace.engine.last_step": last.step, "tokentrace.engine.steps": self._count})
        root.end(end_time=last.end_ns)
        self._root = self._context = self._first = self._last = None
        self._count = 0
