"""The continuous engine: transformers' own continuous-batching manager, traced per step.

One long-lived ``ContinuousBatchingManager`` (paged KV cache, FIFO scheduler, chunked
prefill, one batched forward per step) serves every request for the process's life. The
engine sizes its cache from the KV budget (not from the machine's free memory, which is
what makes a default manager take tens of seconds to start on CPU: docs/gateway.md,
"Engines"), hooks its loop (instrument/engines/continuous/hooks.py, the only module that reads
transformers internals) and writes, per sequence, one ``prefill`` span per prefill chunk and
one ``decode`` span per decode step, each naming the engine step it ran in, plus one
``engine_step`` span per step in traces of the engine's own (instrument/engines/continuous/spans.py).

With ``span_export="process"`` (``serve --span-export process``) the engine thread writes
none of these spans: per step it packs one compact record (instrument/engines/continuous/record_sink.py,
instrument/records/format.py) for a span exporter process
(instrument/records/exporter_process.py), which builds the same spans with the same code
and exports them.

Threads: ``submit`` / ``cancel`` come from the gateway's event loop; everything else runs on
the manager's generation thread (hooks, callbacks, span writing or record packing). The
request queue's bookkeeping (waiting / started / preempted, cancellations, queue-wait
deadlines) is in instrument/engines/continuous/request_queue.py.
"""

from __future__ import annotations

import collections
import logging
import threading
import time
from typing import Any

from instrument.clock import now_wall_ns
from instrument.engines.base import EngineRequest, EngineResult
from instrument.engines.continuous import hooks as cb_hooks
from instrument.engines.continuous.request_queue import RequestQueue
from instrument.engines.continuous.spans import (
    EngineTraceWriter,
    SequenceRecord,
    StepRecord,
    record_run,
    write_preemption_events,
    write_sequence_spans,
)
from instrument.hf.generate_spans import DecodeSpanPolicy
from instrument.hf.model_handle import ModelHandle
from instrument.hf.token_sampling import SequenceSampler, TokenLogprobs
from instrument.kv import formula as kv
from instrument.otel.span_writer import span_writer_for
from instrument.otel.tracing import SPAN_EXPORT_CHOICES, get_tracer, span_export_of

__all__ = ["ContinuousEngine", "DEFAULT_KV_BUDGET_BYTES", "DEFAULT_KV_CACHE_TOKENS", "SPAN_EXPORT_CHOICES"]

LOGGER = logging.getLogger("tokentrace.engine")
DEFAULT_KV_BUDGET_BYTES = 512 * 2**20  # without --kv-budget-bytes: at most this much paged cache...
DEFAULT_KV_CACHE_TOKENS = 32_768  # ...and at most this many tokens (the attention mask grows with it)


class ContinuousEngine(RequestQueue):
    """transformers' continuous batching behind the engine interface (module docstring).

    - ``kv_budget_bytes``: size of the paged KV cache, bytes (whole blocks; default: the
      smaller of 512 MiB and 32,768 tokens). Blocks are allocated as a sequence grows; a
      request that does not fit the blocks free waits in the scheduler's queue, and when
      running sequences outgrow the cache the newest is preempted (its blocks freed, its
      prompt + generated tokens prefilled again later). Only a request whose input +
      max_tokens could never fit the whole cache is refused (``kv_reservation_bytes``).
    - ``prefix_caching``: share the blocks of identical prompt prefixes (transformers' block
      sharing; a hit skips their prefill), default on.
    - ``max_queue_wait_s``: a request not scheduled within this many seconds of its
      submission ends with :class:`QueueWaitExceeded` (the gateway answers 503 with
      Retry-After); None (default) waits as long as the request's own timeout.
    - ``kv_block_tokens``: tokens per KV block (page), default 16.
    - ``max_batch_tokens``: tokens one step may compute (longer prompts are prefilled in
      chunks of at most this many), default 512.
    - ``max_batch_size``: sequences one step may hold, default 64.
    - ``steps_per_engine_trace``: ``engine_step`` spans under one engine root at most, default 1000.
    - ``decode_spans``: ``all`` | ``every:N`` | ``none``.
    - ``warmup``: run a few untraced sequences before reporting ready (first forwards pay
      one-time kernel set-up).
    - ``device_time``: CUDA event time of each step's forward (``tokentrace.device_ns`` on
      ``engine_step`` spans); default on when the model is on CUDA.
    - ``span_export``: ``inline`` (spans written on the engine thread, exported by
      ``tracer_provider``) or ``process`` (step records to a span exporter process that
      makes ``tracer_provider``'s exporters again: it must come from ``setup_tracing``
      without extra exporter objects); default: the provider's own mode
      (:func:`~instrument.otel.tracing.span_export_of`: ``process`` when its exporters are
      made by an exporter process, as ``serve`` makes it).

    ``tracing`` (attribute, default True): False keeps token delivery, cancellation and the
    queue time but records no steps and writes no prefill/decode/engine spans — the
    baseline benchmarks/engine_throughput.py measures the tracing cost per step against.
    Switch it only while the engine is idle.
    """

    name = "continuous"

    def __init__(self, handle: ModelHandle, tracer_provider: Any, *, decode_spans: str = "all",
                 kv_budget_bytes: int | None = None, kv_block_tokens: int = 16, max_batch_tokens: int = 512,
                 max_batch_size: int = 64, steps_per_engine_trace: int = 1000, warmup: bool = True,
                 device_time: bool | None = None, prefix_caching: bool = True,
                 max_queue_wait_s: float | None = None, metrics: Any = None, span_export: str | None = None) -> None:
        cb_hooks.check_version()
        model = handle.model
        self.handle = handle
        self.policy = DecodeSpanPolicy.parse(decode_spans)
        try:
            self.layout: kv.KVLayout | None = kv.kv_layout_from_config(model.config, kv_dtype=str(model.dtype))
            self.layout_name = self.layout.layout
        except ValueError as exc:
            raise ValueError(f"continuous engine: {exc}") from None
        if kv_block_tokens < 1 or max_batch_tokens < 1 or max_batch_size < 1:
            raise ValueError("continuous engine: kv_block_tokens, max_batch_tokens and max_batch_size must be >= 1")
        bytes_per_block = kv_block_tokens * self.layout.kv_bytes_per_token
        if kv_budget_bytes is None:
            blocks = min(DEFAULT_KV_BUDGET_BYTES // bytes_per_block, -(-DEFAULT_KV_CACHE_TOKENS // kv_block_tokens))
        else:
            blocks = kv_budget_bytes // bytes_per_block
        if blocks < 1:
            raise ValueError(f"--kv-budget-bytes {kv_budget_bytes}: smaller than one KV block "
                             f"({kv_block_tokens} tokens x {self.layout.kv_bytes_per_token} bytes = {bytes_per_block} bytes)")
        if span_export is None:
            span_export = span_export_of(tracer_provider)
        if span_export not in SPAN_EXPORT_CHOICES:
            raise ValueError(f"--span-export must be one of {', '.join(SPAN_EXPORT_CHOICES)}, got {span_export!r}")
        if max_queue_wait_s is not None and max_queue_wait_s <= 0:
            raise ValueError(f"--max-queue-wait-s must be > 0, got {max_queue_wait_s:g}")
        self.prefix_caching = prefix_caching
        self.max_queue_wait_s = max_queue_wait_s
        self.metrics = metrics  # the gateway's ServerMetrics hooks (instrument/gateway/metrics.py) or None
        self._eos_ids = sorted(handle.eos_ids)
        # Requests waiting to be scheduled = submitted - started: each counter is written by
        # one thread only (submit: the gateway's loop; started: the engine's thread).
        self._step_start_ns: int | None = None  # start of the step in flight (metrics)
        self._submitted = 0
        self._started = 0
        self._deadlines: collections.deque[tuple[float, str]] = collections.deque()  # (monotonic s, id), FIFO
        self.preemptions = 0
        self._live: dict[str, SequenceRecord] = {}
        self._cancels: list[str] = []
        self._cancelling: list[str] = []
        self._lock = threading.Lock()
        self._step = 0
        self._current: StepRecord | None = None
        self._current_traced = False
        self.tracing = True
        self._accepting = True
        self._warm_ids: set[str] = set()
        self._warm_done = threading.Event()
        self.tracer = get_tracer(tracer_provider)
        self.writer = span_writer_for(self.tracer)
        self.engine_traces = EngineTraceWriter(self.tracer, self.writer, steps_per_engine_trace)
        self.span_export = span_export
        self.records: Any = None  # record_sink.StepRecordSink (span_export="process")
        self.exporter: Any = None  # its ExporterProcess
        if span_export == "process":
            from instrument.engines.continuous.record_sink import StepRecordSink

            self.records = StepRecordSink(tracer_provider, self.layout, self.layout_name, bytes_per_block,
                                          decode_spans, steps_per_engine_trace)
            self.exporter = self.records.exporter
        self.sampler = cb_hooks.RowSampler(self)
        started = time.perf_counter()
        self.manager = cb_hooks.build_manager(
            model, eos_ids=self._eos_ids, block_tokens=kv_block_tokens, num_blocks=blocks,
            max_batch_tokens=max_batch_tokens, max_requests_per_batch=max_batch_size, sampler=self.sampler,
            prefix_caching=prefix_caching)
        self.geometry = cb_hooks.cache_geometry(self.manager)
        if self.geometry.bytes_per_block != bytes_per_block:
            raise ValueError(f"continuous engine: the paged cache holds {self.geometry.bytes_per_block} bytes per "
                             f"block, the KV formula gives {bytes_per_block}: refusing to report wrong KV figures")
        on_cuda = getattr(model.device, "type", "cpu") == "cuda"
        self.tap = cb_hooks.StepTap(self.manager, self, device_time=on_cuda if device_time is None else device_time)
        cb_hooks.start_manager(self.manager)
        self.build_s = time.perf_counter() - started
        try:
            self.warmup_s = self._warm_up() if warmup else 0.0
        except BaseException:
            if self.records is not None and self.records.owns_exporter:
                self.exporter.stop(1.0)
            raise
        self.ready = True

    # --- the Engine interface -------------------------------------------------------------
    def submit(self, request: EngineRequest) -> None:
        params = request.params
        record = SequenceRecord(request, SequenceSampler(params, self._eos_ids, request.input_ids,
                                                         self.handle.vocab_size, device=self.handle.model.device))
        self._live[request.request_id] = record
        self._submitted += 1
        if self.max_queue_wait_s is not None:
            self._deadlines.append((time.monotonic() + self.max_queue_wait_s, request.request_id))
        accepted = None
        if self._accepting:
            accepted = self.manager.add_request(
                request.input_ids, request_id=request.request_id, max_new_tokens=params.max_tokens,
                eos_token_id=-1 if params.ignore_eos else self._eos_ids)
        if accepted is None:
            self._live.pop(request.request_id, None)
            self._submitted -= 1  # never queued: not waiting (requests_waiting = submitted - started)
            request.on_done(EngineResult(now_wall_ns(), "error", error=RuntimeError("the engine is not running")))

    #: KV is not reserved per request at admission: blocks are allocated as sequences grow,
    #: and a request that does not fit waits in the scheduler's queue (the admission
    #: controller then only refuses what could never fit, and bounds requests in flight).
    kv_admission = "paged"

    @property
    def kv_blocks_used(self) -> int:
        """KV blocks some sequence holds now, each shared block once (read from the cache)."""
        return self.tap.blocks_used()

    def kv_reservation_bytes(self, input_tokens: int, max_tokens: int) -> int:
        """Whole blocks for input + max_tokens tokens (what the sequence can come to hold), bytes:
        a request over the cache's capacity can never run (answered 400)."""
        g = self.geometry
        return -(-(input_tokens + max_tokens) // g.block_tokens) * g.bytes_per_block

    @property
    def kv_capacity_bytes(self) -> int:
        return self.geometry.blocks_total * self.geometry.bytes_per_block

    def health(self) -> dict[str, Any]:
        g = self.geometry
        return {"name": self.name, "ready": self.ready and self.manager.is_running(), "steps": self._step,
                "sequences": len(self._live), "kv_blocks_total": g.blocks_total,
                "kv_blocks_used": self.tap.blocks_used(), "kv_blocks_cached": self.tap.blocks_cached(),
                "kv_block_tokens": g.block_tokens, "prefix_caching": self.prefix_caching,
                "requests_waiting": self.requests_waiting, "requests_running": self.requests_running,
                "preemptions": self.preemptions,
                "kv_bytes_per_block": g.bytes_per_block, "build_s": round(self.build_s, 3),
                "warmup_s": round(self.warmup_s, 3), "span_export": self.span_export,
                **({"exporter_process": self.exporter.health()} if self.exporter is not None else {})}

    def close(self, grace_s: float = 5.0) -> None:
        """Let running sequences finish for up to ``grace_s`` s, cancel the rest, stop the loop."""
        self._accepting = False
        deadline = time.monotonic() + grace_s
        while self._live and time.monotonic() < deadline and self.manager.is_running():
            time.sleep(0.01)
        for request_id in list(self._live):
            self.cancel(request_id)
        deadline = time.monotonic() + 5.0
        while self._live and time.monotonic() < deadline and self.manager.is_running():
            time.sleep(0.01)
        self.manager.stop(block=True, timeout=10.0)
        for request_id in list(self._live):  # the loop is gone: nothing will end these any more
            self._finish(request_id, "cancelled", now_wall_ns())
        self.engine_traces.close()
        if self.records is not None:
            self.records.close(10.0)

    # --- hooks (the manager's thread) -------------------------------------------------------
    def on_scheduled(self, start_ns: int, forward_start_ns: int, sequences: list[Any], blocks_used: int,
                     waiting: int) -> None:
        self._finish_cancelled(start_ns)
        self._step += 1
        self._step_start_ns = start_ns  # the step-duration metric, traced or not
        metrics = self.metrics
        if not self.tracing:
            self._current = None
            live = self._live
            for s in sequences:
                record = live.get(s.request_id)
                if record is not None and record.waiting:
                    self._start(record, s, start_ns)
            if metrics is not None:
                metrics.step_scheduled(len(sequences))
            return
        if self.records is not None:
            self.records.step(self._step, start_ns, forward_start_ns, sequences, self._live, self._start, blocks_used,
                              waiting, self.geometry, self.tap.blocks_cached)
            if metrics is not None:
                metrics.step_scheduled(len(sequences))
            return
        g = self.geometry
        prefill_tokens = sum(s.tokens for s in sequences if s.prefill)
        rec = StepRecord(self._step, start_ns, forward_start_ns, len(sequences), sum(s.tokens for s in sequences),
                         prefill_tokens, blocks_used, g.blocks_total, g.block_tokens, waiting,
                         sum(1 for s in sequences if s.prefill), self.tap.blocks_cached())
        if metrics is not None:
            metrics.step_scheduled(len(sequences))
        self._current = rec
        self._current_traced = False
        live = self._live
        for s in sequences:
            record = live.get(s.request_id)
            if record is None:
                continue
            self._current_traced = True
            if record.waiting:
                self._start(record, s, start_ns)
            # a recompute that ends emits token k + 1: step k has no decode span (docs/spans.md)
            record_run(record, rec, s.tokens, s.blocks, s.context_tokens, s.prefill, record.preempted > 0,
                       s.prefill and s.emits and record.emitted > 0)

    def on_idle(self) -> None:
        self._finish_cancelled(now_wall_ns())
        self.engine_traces.close()
        if self.records is not None:
            self.records.idle()

    def on_step_done(self, end_ns: int, emitted: list[tuple[Any, int, bool]]) -> None:
        records = self.records
        if records is not None:
            records.step_done(end_ns, self.tap.device_ns)
        rec = self._current
        if rec is not None:
            rec.end_ns = end_ns
            rec.device_ns = self.tap.device_ns
        # one step-duration sample per step that ran, as one batch-size sample (traced or not)
        if self.metrics is not None and self._step_start_ns is not None:
            self.metrics.step_done((end_ns - self._step_start_ns) / 1e9)
        self._step_start_ns = None
        self._current = None
        live = self._live
        for seq, token, finished in emitted:
            record = live.get(seq.request_id)
            if record is None:
                if seq.request_id in self._warm_ids and finished:
                    self._warm_ids.discard(seq.request_id)
                    if not self._warm_ids:
                        self._warm_done.set()
                continue
            logprobs, record.pending_logprobs = record.pending_logprobs, None
            record.emitted += 1
            record.request.on_token(token, logprobs)
            if finished:
                stop = token in self._eos_ids and not record.request.params.ignore_eos
                self._finish(seq.request_id, "stop" if stop else "length", end_ns)
        if rec is not None and self._current_traced:  # a step with only warm-up sequences gets no span
            self.engine_traces.step(rec)
        if records is not None:
            records.after_step(end_ns)

    def on_output(self, request_id: str, error: str | None) -> None:
        if error is not None and request_id in self._live:
            self._finish(request_id, "error", now_wall_ns(), RuntimeError(error))

    def sampler_of(self, request_id: str) -> SequenceSampler | None:
        record = self._live.get(request_id)
        return record.sampler if record is not None else None

    def keep_logprobs(self, request_id: str, logprobs: TokenLogprobs) -> None:
        record = self._live.get(request_id)
        if record is not None:
            record.pending_logprobs = logprobs

    # --- internals ------------------------------------------------------------------------
    def _finish(self, request_id: str, reason: str, at_ns: int, error: BaseException | None = None) -> None:
        record = self._live.pop(request_id, None)
        if record is None:
            return
        if record.waiting:  # it never ran (or was preempted and never ran again): no longer waiting
            record.waiting = False
            self._started += 1
        if record.slot:
            self.records.end_sequence(record.slot)
            write_preemption_events(record, self.geometry.bytes_per_block)
        elif record.prefill or record.decode:
            try:
                write_sequence_spans(self.writer, record, self.layout, self.layout_name,
                                     self.geometry.bytes_per_block, self.policy)
            except Exception:  # pragma: no cover - a span bug must not leave the request hanging
                LOGGER.exception("writing the spans of %s failed", request_id)
        blocks = record.last_blocks
        bytes_per_block = self.geometry.bytes_per_block
        shared_blocks = record.cached_tokens // self.geometry.block_tokens
        result = EngineResult(record.admitted_ns if record.admitted_ns is not None else at_ns, reason, record.emitted,
                              error=error, kv_physical_bytes=blocks * bytes_per_block if blocks is not None else None,
                              cached_tokens=record.cached_tokens if record.admitted_ns is not None else 0,
                              kv_shared_bytes=shared_blocks * bytes_per_block if blocks is not None else None,
                              preemptions=record.preempted)
        try:
            record.request.on_done(result)
        except Exception:  # pragma: no cover - a callback bug must not kill the loop
            LOGGER.exception("on_done callback failed for %s", request_id)

    def _warm_up(self, sequences: int = 2, tokens: int = 4, timeout_s: float = 120.0) -> float:
        """Run a few untraced sequences through the loop (first forwards set kernels up); seconds."""
        started = time.perf_counter()
        prompt = list(range(1, 9))
        self._warm_ids = {f"tokentrace-warmup-{i}" for i in range(sequences)}
        for request_id in sorted(self._warm_ids):
            self.manager.add_request(prompt, request_id=request_id, max_new_tokens=tokens, eos_token_id=-1)
        if not self._warm_done.wait(timeout_s):
            raise RuntimeError(f"continuous engine: the warm-up did not finish within {timeout_s:g} s")
        return time.perf_counter() - started
