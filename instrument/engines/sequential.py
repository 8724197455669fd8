"""The sequential engine: one worker thread runs each sequence alone through ``traced_generate``.

Sequences run in arrival order, one at a time (no batching): the queue wait of a sequence is
every earlier sequence's whole generation. It is the reference the continuous engine is
measured against (benchmarks/engine_throughput.py), and the engine for code that must see
one plain HF ``generate`` per request.

The worker thread is the only thread that touches the model. Each generated token reaches
``EngineRequest.on_token`` from the worker thread right after ``generate`` emitted it;
cancellation sets a flag that a ``StoppingCriteria`` reads after every generated token, so a
cancelled sequence stops within one decode step. Sampling is :mod:`instrument.hf.token_sampling`'s,
as a logits processor under greedy search (the processor has already chosen the token).
"""

from __future__ import annotations

import queue
import threading
from typing import Any

from instrument.clock import now_wall_ns
from instrument.engines.base import EngineRequest, EngineResult
from instrument.hf.model_handle import ModelHandle
from instrument.hf.token_sampling import SamplerLogitsProcessor, SequenceSampler

__all__ = ["SequentialEngine"]


class SequentialEngine:
    """A single thread that runs sequences in arrival order with ``traced_generate``.

    - ``kv_budget_bytes``: the logical KV budget requests are admitted against (None: none).
    - ``decode_spans``: ``all`` | ``every:N`` | ``none`` (instrument.hf.generate_spans).
    """

    name = "sequential"

    def __init__(self, handle: ModelHandle, tracer_provider: Any, *, decode_spans: str = "all",
                 kv_budget_bytes: int | None = None) -> None:
        self.handle = handle
        self.tracer_provider = tracer_provider
        self.decode_spans = decode_spans
        self._kv_budget_bytes = kv_budget_bytes
        self._jobs: queue.Queue[EngineRequest | None] = queue.Queue()
        self._cancelled: dict[str, threading.Event] = {}
        self._lock = threading.Lock()
        self._running: str | None = None
        self._generation_config = _greedy_config(handle.model)
        self._thread = threading.Thread(target=self._run, name="tokentrace-sequential-engine", daemon=True)
        self._thread.start()

    # --- the Engine interface -------------------------------------------------------------
    def submit(self, request: EngineRequest) -> None:
        with self._lock:
            self._cancelled[request.request_id] = threading.Event()
        self._jobs.put(request)

    def cancel(self, request_id: str) -> None:
        with self._lock:
            flag = self._cancelled.get(request_id)
        if flag is not None:
            flag.set()

    #: Each request reserves its worst-case logical KV while in flight (admission refuses
    #: what does not fit the budget now): ``generate`` keeps a contiguous cache per sequence.
    kv_admission = "reserve"

    @property
    def requests_waiting(self) -> int:
        """Requests queued behind the one running."""
        return self._jobs.qsize()

    @property
    def requests_running(self) -> int:
        """1 while a sequence runs, else 0."""
        return 1 if self._running is not None else 0

    def kv_reservation_bytes(self, input_tokens: int, max_tokens: int) -> int:
        """Worst-case logical KV bytes (the formula of docs/metrics.md) for input + max_tokens tokens."""
        return (self.handle.kv_bytes_per_token or 0) * (input_tokens + max_tokens)

    @property
    def kv_capacity_bytes(self) -> int | None:
        return self._kv_budget_bytes

    def health(self) -> dict[str, Any]:
        return {"name": self.name, "ready": True, "queued": self._jobs.qsize(), "running": self._running}

    def close(self, grace_s: float = 5.0) -> None:
        """Finish the running sequence for up to ``grace_s`` seconds, cancel the rest, stop."""
        self._jobs.put(None)
        self._thread.join(grace_s)
        if self._thread.is_alive():
            with self._lock:
                flags = list(self._cancelled.values())
            for flag in flags:
                flag.set()
            self._thread.join(max(grace_s, 5.0))

    # --- the worker thread ----------------------------------------------------------------
    def _run(self) -> None:
        while True:
            request = self._jobs.get()
            if request is None:
                return
            with self._lock:
                flag = self._cancelled.get(request.request_id) or threading.Event()
            admitted_ns = now_wall_ns()
            self._running = request.request_id
            try:
                if flag.is_set():
                    result = EngineResult(admitted_ns, "cancelled")
                else:
                    result = self._generate(request, flag, admitted_ns)
            finally:
                self._running = None
                with self._lock:
                    self._cancelled.pop(request.request_id, None)
            try:
                request.on_done(result)
            except Exception:  # pragma: no cover - a callback bug must not kill the worker
                import logging

                logging.getLogger("tokentrace.gateway").exception("on_done callback failed for %s", request.request_id)

    def _generate(self, request: EngineRequest, cancel: threading.Event, admitted_ns: int) -> EngineResult:
        import torch
        from transformers import LogitsProcessorList, StoppingCriteria, StoppingCriteriaList

        from instrument.hf.generate import traced_generate

        model = self.handle.model
        params = request.params
        sampler = SequenceSampler(params, self.handle.eos_ids, request.input_ids, self.handle.vocab_size,
                                  device=model.device)
        processor = SamplerLogitsProcessor(sampler)
        # Batch of one: the answers are two fixed tensors, not a new tensor per step.
        go_on = torch.zeros((1,), dtype=torch.bool, device=model.device)
        stop = torch.ones((1,), dtype=torch.bool, device=model.device)

        class CancelCriteria(StoppingCriteria):
            """Stops generation after the current token once the sequence is cancelled."""

            def __call__(self, input_ids: Any, scores: Any, **kwargs: Any) -> Any:
                return stop if cancel.is_set() else go_on

        on_token = request.on_token
        pending_logprobs = processor.logprobs
        with_logprobs = params.logprobs

        class TokenStreamer:
            """Receives each generated token (after the prompt) on the worker thread."""

            prompt_seen = False

            def put(self, value: Any) -> None:
                if not self.prompt_seen:
                    self.prompt_seen = True
                    return
                for token_id in value.reshape(-1).tolist():
                    on_token(int(token_id), pending_logprobs.popleft() if with_logprobs else None)

            def end(self) -> None:
                pass

        input_ids = torch.tensor([request.input_ids], dtype=torch.long, device=model.device)
        config = self._generation_config
        try:
            traced = traced_generate(
                model, self.handle.tokenizer,
                {"input_ids": input_ids, "attention_mask": torch.ones_like(input_ids)},
                tracer_provider=self.tracer_provider, parent_context=request.parent_context,
                decode_spans=self.decode_spans, model_name=self.handle.model_id, streamer=TokenStreamer(),
                stopping_criteria=StoppingCriteriaList([CancelCriteria()]),
                logits_processor=LogitsProcessorList([processor]), generation_config=config,
                max_new_tokens=params.max_tokens,
            )
        except Exception as error:  # noqa: BLE001 - the sequence fails; the engine keeps serving
            return EngineResult(admitted_ns, "cancelled" if cancel.is_set() else "error", sampler.generated,
                                error=error)
        sequence = traced.sequences[0]
        finish = "cancelled" if cancel.is_set() and sequence.finish_reason != "stop" else sequence.finish_reason
        return EngineResult(admitted_ns, finish, sequence.generated_tokens)


def _greedy_config(model: Any) -> Any:
    """A generation config with greedy search and no processors of its own (the sampler is
    the only one), keeping the model's special token ids."""
    from transformers import GenerationConfig

    own = model.generation_config
    return GenerationConfig(
        do_sample=False, eos_token_id=own.eos_token_id, pad_token_id=own.pad_token_id, bos_token_id=own.bos_token_id,
    )
