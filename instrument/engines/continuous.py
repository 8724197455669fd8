"""The continuous engine: transformers' own continuous-batching manager, traced per step.

One long-lived ``ContinuousBatchingManager`` (paged KV cache, FIFO scheduler, chunked
prefill, one batched forward per step) serves every request for the process's life. The
engine sizes its cache from the KV budget (not from the machine's free memory, which is
what makes a default manager take tens of seconds to start on CPU: docs/gateway.md,
"Engines"), hooks its loop (instrument/engines/cb_hooks.py, the only module that reads
transformers internals) and writes, per sequence, one ``prefill`` span per prefill chunk and
one ``decode`` span per decode step, each naming the engine step it ran in, plus one
``engine_step`` span per step in traces of the engine's own (instrument/engines/cb_spans.py).

Threads: ``submit`` / ``cancel`` come from the gateway's event loop; everything else runs on
the manager's generation thread (hooks, callbacks, span writing).
"""

from __future__ import annotations

import logging
import threading
import time
from typing import Any

from instrument import kv
from instrument.clock import now_wall_ns
from instrument.engines import cb_hooks
from instrument.engines.base import EngineRequest, EngineResult
from instrument.engines.cb_spans import EngineTraceWriter, SequenceRecord, StepRecord, write_sequence_spans
from instrument.generate_spans import DecodeSpanPolicy
from instrument.model_handle import ModelHandle
from instrument.sampling import SequenceSampler, TokenLogprobs
from instrument.span_writer import span_writer_for
from instrument.tracing import get_tracer

__all__ = ["ContinuousEngine", "DEFAULT_KV_BUDGET_BYTES", "DEFAULT_KV_CACHE_TOKENS"]

LOGGER = logging.getLogger("tokentrace.engine")
DEFAULT_KV_BUDGET_BYTES = 512 * 2**20  # without --kv-budget-bytes: at most this much paged cache...
DEFAULT_KV_CACHE_TOKENS = 32_768  # ...and at most this many tokens (the attention mask grows with it)


class ContinuousEngine:
    """transformers' continuous batching behind the engine interface (module docstring).

    - ``kv_budget_bytes``: size of the paged KV cache, bytes (whole blocks; default: the
      smaller of 512 MiB and 32,768 tokens). Requests are admitted against it by whole blocks.
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

    ``tracing`` (attribute, default True): False keeps token delivery, cancellation and the
    queue time but records no steps and writes no prefill/decode/engine spans — the
    baseline benchmarks/engine_throughput.py measures the tracing cost per step against.
    Switch it only while the engine is idle.
    """

    name = "continuous"

    def __init__(self, handle: ModelHandle, tracer_provider: Any, *, decode_spans: str = "all",
                 kv_budget_bytes: int | None = None, kv_block_tokens: int = 16, max_batch_tokens: int = 512,
                 max_batch_size: int = 64, steps_per_engine_trace: int = 1000, warmup: bool = True,
                 device_time: bool | None = None) -> None:
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
        self._eos_ids = sorted(handle.eos_ids)
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
        self.sampler = cb_hooks.RowSampler(self)
        started = time.perf_counter()
        self.manager = cb_hooks.build_manager(
            model, eos_ids=self._eos_ids, block_tokens=kv_block_tokens, num_blocks=blocks,
            max_batch_tokens=max_batch_tokens, max_requests_per_batch=max_batch_size, sampler=self.sampler)
        self.geometry = cb_hooks.cache_geometry(self.manager)
        if self.geometry.bytes_per_block != bytes_per_block:
            raise ValueError(f"continuous engine: the paged cache holds {self.geometry.bytes_per_block} bytes per "
                             f"block, the KV formula gives {bytes_per_block}: refusing to report wrong KV figures")
        on_cuda = getattr(model.device, "type", "cpu") == "cuda"
        self.tap = cb_hooks.StepTap(self.manager, self, device_time=on_cuda if device_time is None else device_time)
        cb_hooks.start_manager(self.manager)
        self.build_s = time.perf_counter() - started
        self.warmup_s = self._warm_up() if warmup else 0.0
        self.ready = True

    # --- the Engine interface -------------------------------------------------------------
    def submit(self, request: EngineRequest) -> None:
        params = request.params
        record = SequenceRecord(request, SequenceSampler(params, self._eos_ids, request.input_ids,
                                                         self.handle.vocab_size, device=self.handle.model.device))
        self._live[request.request_id] = record
        accepted = None
        if self._accepting:
            accepted = self.manager.add_request(
                request.input_ids, request_id=request.request_id, max_new_tokens=params.max_tokens,
                eos_token_id=-1 if params.ignore_eos else self._eos_ids)
        if accepted is None:
            self._live.pop(request.request_id, None)
            request.on_done(EngineResult(now_wall_ns(), "error", error=RuntimeError("the engine is not running")))

    def cancel(self, request_id: str) -> None:
        with self._lock:
            record = self._live.get(request_id)
            if record is None or record.cancel_requested:
                return
            record.cancel_requested = True
            self._cancels.append(request_id)
        cb_hooks.wake(self.manager)

    def kv_reservation_bytes(self, input_tokens: int, max_tokens: int) -> int:
        """Whole blocks for input + max_tokens tokens (what the sequence can come to hold), bytes."""
        g = self.geometry
        return -(-(input_tokens + max_tokens) // g.block_tokens) * g.bytes_per_block

    @property
    def kv_capacity_bytes(self) -> int:
        return self.geometry.blocks_total * self.geometry.bytes_per_block

    def health(self) -> dict[str, Any]:
        g = self.geometry
        return {"name": self.name, "ready": self.ready and self.manager.is_running(), "steps": self._step,
                "sequences": len(self._live), "kv_blocks_total": g.blocks_total,
                "kv_blocks_used": g.blocks_total - self.tap.blocks_free(), "kv_block_tokens": g.block_tokens,
                "kv_bytes_per_block": g.bytes_per_block, "build_s": round(self.build_s, 3),
                "warmup_s": round(self.warmup_s, 3)}

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

    # --- hooks (the manager's thread) -------------------------------------------------------
    def before_schedule(self) -> None:
        with self._lock:
            cancels, self._cancels = self._cancels, []
        for request_id in cancels:
            self.manager.cancel_request(request_id)
        self._cancelling = cancels  # the scheduler drops them in the prepare that follows

    def on_scheduled(self, start_ns: int, forward_start_ns: int, sequences: list[Any], blocks_free: int,
                     waiting: int) -> None:
        self._finish_cancelled(start_ns)
        self._step += 1
        if not self.tracing:
            self._current = None
            live = self._live
            for s in sequences:
                record = live.get(s.request_id)
                if record is not None and record.admitted_ns is None:
                    record.admitted_ns = start_ns
            return
        g = self.geometry
        prefill_tokens = sum(s.tokens for s in sequences if s.prefill)
        rec = StepRecord(self._step, start_ns, forward_start_ns, len(sequences), sum(s.tokens for s in sequences),
                         prefill_tokens, g.blocks_total - blocks_free, g.blocks_total, g.block_tokens, waiting,
                         sum(1 for s in sequences if s.prefill))
        self._current = rec
        self._current_traced = False
        live = self._live
        for s in sequences:
            record = live.get(s.request_id)
            if record is None:
                continue
            self._current_traced = True
            if record.admitted_ns is None:
                record.admitted_ns = start_ns
                record.cached_tokens = s.context_tokens - s.tokens  # a reused prefix is not computed
            if s.prefill:
                record.prefill.append((rec, s.tokens, s.blocks, s.context_tokens))
            else:
                record.decode.append(rec)
                record.decode_blocks.append(s.blocks)
                record.decode_context.append(s.context_tokens)

    def on_idle(self) -> None:
        self._finish_cancelled(now_wall_ns())
        self.engine_traces.close()

    def on_step_done(self, end_ns: int, emitted: list[tuple[Any, int, bool]]) -> None:
        rec = self._current
        if rec is not None:
            rec.end_ns = end_ns
            rec.device_ns = self.tap.device_ns
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
    def _finish_cancelled(self, at_ns: int) -> None:
        cancelling, self._cancelling = self._cancelling, []
        for request_id in cancelling:
            if request_id in self._live:
                self._finish(request_id, "cancelled", at_ns)

    def _finish(self, request_id: str, reason: str, at_ns: int, error: BaseException | None = None) -> None:
        record = self._live.pop(request_id, None)
        if record is None:
            return
        if record.prefill or record.decode:
            try:
                write_sequence_spans(self.writer, record, self.layout, self.layout_name,
                                     self.geometry.bytes_per_block, self.policy)
            except Exception:  # pragma: no cover - a span bug must not leave the request hanging
                LOGGER.exception("writing the spans of %s failed", request_id)
        blocks = record.last_blocks
        result = EngineResult(record.admitted_ns if record.admitted_ns is not None else at_ns, reason, record.emitted,
                              error=error, kv_physical_bytes=blocks * self.geometry.bytes_per_block
                              if blocks is not None else None)
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
