"""The continuous engine's ``--span-export process`` side: step records instead of spans.

:class:`StepRecordSink` is what the engine thread calls per step in place of span writing
(instrument/engines/continuous/engine.py): one STEP entry and one SEQ entry per scheduled sequence
(an OPEN entry at a sequence's first schedule, an END entry when it ends) packed by
instrument/records/format.py's ``RecordWriter``, sent to the span exporter process
(instrument/records/exporter_process.py) every ``FLUSH_BYTES`` or ``FLUSH_NS`` and when
the engine goes idle or stops. No span, dict or attribute work per token. The exporter
process is the provider's own when ``forward_spans`` started one for it (``serve``: the
gateway's spans go there too, instrument/records/span_forward.py), else the sink starts one.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from opentelemetry import trace

from instrument.clock import now_wall_ns
from instrument.engines.continuous.span_builder import SpanBuilder, layout_meta
from instrument.kv.formula import KVLayout
from instrument.records.channels import RECORD_ENTRIES
from instrument.records.exporter_process import ExporterProcess
from instrument.records.format import (
    SEQ,
    SEQ_PREFILL,
    SEQ_RECOMPUTE,
    SEQ_RECOMPUTE_EMITS,
    SEQ_SIZE,
    RecordWriter,
    pack_seq,
)

__all__ = ["FLUSH_BYTES", "FLUSH_NS", "StepRecordSink"]

# A send wakes the exporter process: ~40 µs of engine-thread CPU each on a 2-core box,
# against ~3 µs for a send to a busy reader (benchmarks/record_transport.py, tracing_cost.py):
# one wake-up per ~50 ms instead of per step.
FLUSH_BYTES = 32 * 1024
FLUSH_NS = 50_000_000


class StepRecordSink:
    """Packs the engine's steps into records and hands them to the span exporter process."""

    def __init__(self, tracer_provider: Any, layout: KVLayout | None, layout_name: str, bytes_per_block: int,
                 decode_spans: str, steps_per_trace: int) -> None:
        from instrument.otel.export_health import add_counts_source
        from instrument.records.span_forward import exporter_process_of

        shared = exporter_process_of(tracer_provider)  # the serve's one, when its spans are forwarded
        self.owns_exporter = shared is None
        self.exporter = ExporterProcess.for_provider(tracer_provider) if shared is None else shared
        self.writer = RecordWriter()
        self.writer.meta(layout_meta(layout, layout_name, bytes_per_block, decode_spans, steps_per_trace))
        # the exporter process reads this engine's entries (channel 0) with its SpanBuilder,
        # told the layout (META) before any step
        self.sender = self.exporter.join(RECORD_ENTRIES, SpanBuilder, preamble=self.writer.take())
        self.units = 0  # spans the packed, unsent records stand for
        self.sent_ns = 0  # when the records last went out
        self.busy = False  # a step was recorded since the last IDLE entry
        if self.owns_exporter:
            add_counts_source(tracer_provider, self.exporter.counts)

    def step(self, step: int, start_ns: int, forward_start_ns: int, sequences: list[Any], live: dict[str, Any],
             start: Callable[[Any, Any, int], None], blocks_used: int, waiting: int, geometry: Any,
             blocks_cached: Callable[[], int]) -> None:
        """One scheduled step: ``sequences`` as the hooks report them, ``live`` the engine's
        SequenceRecords by request id, ``start(record, s, start_ns)`` the engine's first-run
        hook. A step with no live (traced) sequence gets no entry, as it gets no span inline."""
        records = self.writer
        records.reserve_step()
        count = len(sequences)
        buf, pos = records.run_buffer(count)  # SEQ entries packed in place, in this loop
        traced = tokens = prefill_tokens = prefill_sequences = 0
        for s in sequences:
            tokens += s.tokens
            if s.prefill:
                prefill_tokens += s.tokens
                prefill_sequences += 1
            record = live.get(s.request_id)
            if record is None:
                continue
            if record.waiting:
                start(record, s, start_ns)
            slot = record.slot
            if not slot:  # first schedule (rare): an OPEN entry between the SEQ entries
                records.run_end(pos)
                record.slot = slot = records.new_slot()
                parent = trace.get_current_span(record.request.parent_context).get_span_context()
                records.open_sequence(slot, parent.trace_id, parent.span_id, parent.trace_flags, record.cached_tokens,
                                      parent.trace_state.to_header() if parent.trace_state else "")
                buf, pos = records.run_buffer(count)
            if s.prefill:
                flags = (SEQ_PREFILL | (SEQ_RECOMPUTE if record.preempted > 0 else 0)
                         | (SEQ_RECOMPUTE_EMITS if s.emits and record.emitted else 0))
            else:
                flags = 0
            pack_seq(buf, pos, SEQ, slot, s.tokens, s.blocks, s.context_tokens, flags)
            pos += SEQ_SIZE
            record.blocks_now = s.blocks
            traced += 1
        records.run_end(pos)
        if not traced:
            records.cancel_step()
            return
        records.fill_step(step, start_ns, forward_start_ns, len(sequences), tokens, prefill_tokens, prefill_sequences,
                          waiting, blocks_used, geometry.blocks_total, blocks_cached(), geometry.block_tokens)
        self.units += traced + 1  # one span per scheduled sequence and one engine_step span
        self.busy = True

    def step_done(self, end_ns: int, device_ns: int | None) -> int | None:
        """The open step's end; its start (ns), or None when the step got no entry."""
        records = self.writer
        if not records.step_open:
            return None
        records.finish_step(end_ns, device_ns)
        return records.step_start_ns

    def end_sequence(self, slot: int) -> None:
        self.writer.end_sequence(slot)

    def after_step(self, end_ns: int) -> None:
        """Send when enough is packed or enough time went by."""
        pending = self.writer.pending()
        if pending and (pending >= FLUSH_BYTES or end_ns - self.sent_ns >= FLUSH_NS):
            self.flush()

    def idle(self) -> None:
        """The engine went idle: the open engine trace ends; send now (nothing when no step
        was recorded since the last idle, e.g. with the engine's tracing off)."""
        if self.busy:
            self.writer.idle()
            self.busy = False
        if self.writer.pending():
            self.flush()

    def flush(self) -> None:
        """Send what is packed (one message; never waits)."""
        if self.writer.pending():
            units, self.units = self.units, 0
            self.sender.send(self.writer.take(), units)
            self.sent_ns = now_wall_ns()

    def close(self, timeout_s: float = 10.0) -> None:
        """Send the last records; an exporter process of its own is then asked to drain, flush
        and report within ``timeout_s`` (a shared one stops with its provider's shutdown)."""
        self.idle()
        if self.owns_exporter:
            self.exporter.stop(timeout_s)
