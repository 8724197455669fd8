"""The one module that reaches into transformers' continuous-batching internals (guarded).

transformers 5.24 exposes the manager (``model.init_continuous_batching``: ``add_request``,
``cancel_request``, ``start``, ``stop``) but no per-step callback. The continuous engine needs
three things the public API does not give, and takes them here, on the manager's own objects:

1. **Per-step hooks.** The manager's generation loop calls, on its thread, per step:
   ``batch_processor.prepare_next_batch()`` (scheduling: admit, split prompts, allocate
   blocks, build the batch tensors) → the forward and sampling → ``batch_processor.update_batch()``
   (append each new token, finish sequences, free their blocks). :class:`StepTap` wraps the
   two methods on the batch processor instance and reports each step to a
   :class:`StepListener`: which sequences ran, with how many tokens, in prefill or decode,
   how many KV blocks each holds, the cache's free blocks, and the times.
2. **Per-sequence sampling.** transformers' per-request logits processors cover temperature,
   top-k and top-p, and greedy vs sampling is one switch for the whole batch. A
   :class:`RowSampler` (a ``ContinuousBatchingLogitsProcessor``) runs each row's own
   :class:`~instrument.hf.token_sampling.SequenceSampler` and leaves one finite score per row; the
   manager is built greedy, so it picks exactly that token.
3. **Outputs without copies.** Finished and failed sequences reach the manager's output
   router; :class:`EngineOutputRouter` hands them to the listener instead of a queue.
4. **Preemptions.** When the paged cache cannot hold the next tokens of the running
   sequences, the batch processor's ``offloading_manager.offload_requests()`` evicts the
   newest starved ones (with ``cpu_offload_space=0``, the default here, a *soft reset*: the
   blocks are freed and an equivalent request, prompt + generated tokens, is queued again to
   be prefilled from scratch; vLLM's "recompute"). :class:`StepTap` wraps it and reports each
   evicted sequence with the blocks its block table held.
5. **Prefix cache accounting.** With block sharing on, a block no running sequence holds but
   whose content is hashed stays out of the free pool (``ledger.cached_blocks``) until
   memory pressure evicts it; :meth:`StepTap.blocks_cached` counts them, so that
   ``blocks_used`` counts every block some sequence holds exactly once.

Everything here was read on transformers ``TESTED_TRANSFORMERS`` (tests/test_engine_continuous.py
pins it): another version may rename any of it, so :func:`check_version` refuses to run on
one that was not checked.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Protocol

import torch
from transformers.generation.continuous_batching.cb_logits_processors import ContinuousBatchingLogitsProcessor
from transformers.generation.continuous_batching.continuous_api import OutputRouter
from transformers.generation.continuous_batching.requests import RequestStatus

from instrument.clock import now_wall_ns
from instrument.hf.token_sampling import SequenceSampler, TokenLogprobs, draw_tokens, one_hot_scores

__all__ = ["PREEMPT_RECOMPUTE", "TESTED_TRANSFORMERS", "EngineOutputRouter", "RowSampler", "ScheduledSequence",
           "StepListener",
           "StepTap", "build_manager", "cache_geometry", "check_version", "start_manager", "wake"]

TESTED_TRANSFORMERS = "5.24.0"
FULL_ATTENTION = "full_attention"
PREEMPT_RECOMPUTE = "recompute"  # soft reset: blocks freed, prompt + generated tokens prefilled again
PREEMPT_CPU_OFFLOAD = "cpu_offload"  # blocks copied to the CPU swap pool (not used here: cpu_offload_space=0)


def check_version() -> None:
    """ValueError unless the installed transformers is the version these hooks were read on."""
    import transformers

    if transformers.__version__ != TESTED_TRANSFORMERS:
        raise ValueError(
            f"the continuous engine hooks transformers {TESTED_TRANSFORMERS} internals; "
            f"{transformers.__version__} is installed (use --engine sequential, or check "
            "instrument/engines/continuous/hooks.py against that version)"
        )


@dataclass(frozen=True)
class CacheGeometry:
    """The paged cache's block accounting: ``block_tokens`` tokens per block, ``bytes_per_block``
    bytes per block (every layer's K and V), ``blocks_total`` blocks."""

    block_tokens: int
    bytes_per_block: int
    blocks_total: int


def cache_geometry(manager: Any) -> CacheGeometry:
    """Block size, bytes per block and capacity of the manager's paged cache (full attention only)."""
    cache = manager.batch_processor.cache
    if list(cache.cache_allocators) != [FULL_ATTENTION]:
        raise ValueError(f"continuous engine: only full-attention models are supported, this one has "
                         f"{', '.join(cache.cache_allocators)} layers")
    allocator = cache.cache_allocators[FULL_ATTENTION]
    return CacheGeometry(allocator.tokens_per_page, allocator.bytes_per_block, allocator.num_blocks)


def build_manager(model: Any, *, eos_ids: list[int], block_tokens: int, num_blocks: int, max_batch_tokens: int,
                  max_requests_per_batch: int, sampler: RowSampler, prefix_caching: bool = True) -> Any:
    """A manager for ``model`` sized as asked (not by the machine's free memory), greedy (the
    sampler chooses), synchronous steps, block sharing (prefix caching) as ``prefix_caching``
    says, no CPU swap pool (a preempted sequence is recomputed), with ``sampler`` as its only
    logits processor and its batch processor already built (the loop is not started)."""
    from transformers import GenerationConfig
    from transformers.generation.configuration_utils import ContinuousBatchingConfig

    check_version()
    own = model.generation_config
    generation_config = GenerationConfig(do_sample=False, eos_token_id=eos_ids or -1, pad_token_id=own.pad_token_id,
                                         bos_token_id=own.bos_token_id, max_new_tokens=16)
    cb_config = ContinuousBatchingConfig(
        page_size=block_tokens, num_blocks=num_blocks, max_batch_tokens=max_batch_tokens,
        max_requests_per_batch=max_requests_per_batch, max_blocks_per_request=0,
        # Synchronous steps: a step's tokens belong to the step that computed them.
        use_async_batching=False, allow_block_sharing=prefix_caching, auto_switch_to_flash=False,
        max_memory_percent=0.9, cpu_offload_space=0.0,
    )
    manager = model.init_continuous_batching(generation_config=generation_config, continuous_batching_config=cb_config)
    processors = manager.logit_processor
    processors.logits_processor.append(sampler)
    processors.tensors_required += 1
    processors.do_processing = True
    manager.output_router = EngineOutputRouter(sampler.listener)
    manager.warmup()  # builds the batch processor (cache, static tensors); no CUDA graphs on CPU
    return manager


@dataclass
class ScheduledSequence:
    """One sequence in one step: ``tokens`` computed (a prefill chunk, or 1 when decoding),
    ``prefill`` (no token generated before this step), ``blocks`` KV blocks it holds during
    the step, ``context_tokens`` tokens in its cache after the step."""

    request_id: str
    tokens: int
    prefill: bool
    emits: bool
    blocks: int
    context_tokens: int
    state: Any  # transformers' RequestState, only for the step's update


class StepListener(Protocol):
    """What the engine does with each step (called on the manager's thread)."""

    def before_schedule(self) -> None:
        """Before the scheduler runs (hand over cancellations)."""

    def on_scheduled(self, start_ns: int, forward_start_ns: int, sequences: list[ScheduledSequence],
                     blocks_used: int, waiting: int) -> None:
        """A step was scheduled and is about to run (``blocks_used``: blocks some sequence holds,
        each counted once however many share it)."""

    def on_preempted(self, request_id: str, at_ns: int, blocks: int, mode: str) -> None:
        """The scheduler evicted a running sequence that held ``blocks`` blocks (``mode``:
        ``recompute`` or ``cpu_offload``); it waits to be scheduled again."""

    def on_idle(self) -> None:
        """The scheduler found nothing to run."""

    def on_step_done(self, end_ns: int, emitted: list[tuple[ScheduledSequence, int, bool]]) -> None:
        """The step ran: ``(sequence, token, finished)`` for each sequence that got a token."""

    def on_output(self, request_id: str, error: str | None) -> None:
        """transformers delivered a sequence's final output (``error``: why it failed)."""

    def sampler_of(self, request_id: str) -> SequenceSampler | None:
        """The sequence's sampler (None: not ours, e.g. a warm-up sequence: greedy)."""

    def keep_logprobs(self, request_id: str, logprobs: TokenLogprobs) -> None:
        """The logprobs the sampler computed for the sequence's newest token."""


class StepTap:
    """Wraps one batch processor's ``prepare_next_batch`` / ``update_batch`` (module docstring).

    On CUDA (``device_time``), a pre-allocated ``torch.cuda.Event`` pair brackets each step's
    forward and sampling on the compute stream (recorded after scheduling, and before the
    update, which waits for the stream anyway); ``device_ns`` then holds the last step's
    device time in ns (None on CPU).
    """

    def __init__(self, manager: Any, listener: StepListener, *, device_time: bool = False) -> None:
        self.listener = listener
        self.device_ns: int | None = None
        processor = manager.batch_processor
        self._processor = processor
        self._allocator = processor.cache.cache_allocators[FULL_ATTENTION]
        self._pool = processor.cache.pool
        self._scheduler = processor.scheduler
        self._ledger = self._allocator.ledger
        self._scheduled: list[ScheduledSequence] = []
        prepare, update = processor.prepare_next_batch, processor.update_batch
        offloader = processor.offloading_manager
        offload = offloader.offload_requests
        scheduler, block_table = self._scheduler, self._allocator.block_table

        def offload_requests() -> bool:
            # Runs inside prepare_next_batch, only when the cache could not hold a step (rare):
            # which starved sequences go back to waiting, and what their block tables held.
            held = {state.request_id: len(block_table.get(state.request_id, ())) for state, _ in
                    scheduler.starved_requests}
            done = offload()
            at_ns = now_wall_ns()
            for request_id, blocks in held.items():
                state = scheduler.waiting_requests.get(request_id)
                if state is not None:
                    mode = PREEMPT_CPU_OFFLOAD if state.is_cpu_offloaded else PREEMPT_RECOMPUTE
                    listener.on_preempted(request_id, at_ns, blocks, mode)
            return done

        offloader.offload_requests = offload_requests
        events = None
        if device_time and torch.cuda.is_available() and manager.model.device.type == "cuda":
            events = (torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True))
        stream = processor.inputs_and_outputs.compute_stream

        def prepare_next_batch() -> bool:
            listener.before_schedule()
            start_ns = now_wall_ns()
            if not prepare():
                listener.on_idle()
                return False
            self._scheduled = scheduled = self._read_batch()
            listener.on_scheduled(start_ns, now_wall_ns(), scheduled, self.blocks_used(),
                                  len(self._scheduler.waiting_requests))
            if events is not None:
                events[0].record(stream)
            return True

        def update_batch() -> None:
            scheduled = self._scheduled
            before = [len(s.state.generated_tokens) for s in scheduled]
            if events is not None:
                events[1].record(stream)
            update()
            if events is not None:
                events[1].synchronize()
                self.device_ns = int(events[0].elapsed_time(events[1]) * 1e6)
            end_ns = now_wall_ns()
            emitted = []
            for seq, length in zip(scheduled, before):
                tokens = seq.state.generated_tokens
                if seq.emits and len(tokens) > length:
                    emitted.append((seq, int(tokens[-1]), seq.state.status >= RequestStatus.FINISHED))
            self._scheduled = []
            listener.on_step_done(end_ns, emitted)

        processor.prepare_next_batch = prepare_next_batch
        processor.update_batch = update_batch

    def _read_batch(self) -> list[ScheduledSequence]:
        block_table = self._allocator.block_table
        out = []
        for future in self._processor.inputs_and_outputs.requests_in_batch:
            state = future.state
            rid = state.request_id
            out.append(ScheduledSequence(rid, future.query_length, not state.generated_tokens, future.has_new_token,
                                         len(block_table.get(rid, ())), state.position_offset, state))
        return out

    def blocks_free(self) -> int:
        """Blocks no sequence holds: free sectors' blocks plus the free blocks of the allocator."""
        allocator = self._allocator
        return self._pool.num_free_sectors * allocator.blocks_per_sector + self._pool.count_free_blocks(allocator.index)

    def blocks_cached(self) -> int:
        """Blocks no sequence holds, kept for their hashed content (prefix cache; 0 with sharing off)."""
        return len(self._ledger.cached_blocks)

    def blocks_used(self) -> int:
        """Blocks some sequence holds, each counted once (a shared block is one block)."""
        return self._allocator.num_blocks - self.blocks_free() - self.blocks_cached()

    def blocks_held(self, request_id: str) -> int:
        """Blocks in ``request_id``'s block table now (0 once freed)."""
        return len(self._allocator.block_table.get(request_id, ()))


class RowSampler(ContinuousBatchingLogitsProcessor):
    """Each row's own sampler (module docstring, 2). Rows are the step's sequences with a new
    token, in the order the batch processor lists them (``prepare_tensor_args`` sees that list
    just before the forward whose logits ``__call__`` gets)."""

    supported_kwargs: dict[str, type] = {}
    ignored_kwargs: tuple[str, ...] = ()

    def __init__(self, listener: StepListener) -> None:
        self.listener = listener
        self._rows: list[str] = []

    def fill_defaults(self, int32_tensor: torch.Tensor) -> None:
        int32_tensor.zero_()

    def prepare_tensor_args(self, requests_with_new_token: list[Any]) -> torch.Tensor:
        self._rows = [future.state.request_id for future in requests_with_new_token]
        return torch.zeros(len(self._rows), dtype=torch.int32)

    def __call__(self, scores: torch.Tensor, tensor_arg: torch.Tensor) -> torch.Tensor:
        # ``scores`` has one row per sequence in the step (transformers slices logits_indices by
        # the step's sequences); the first rows are those with a new token, in order; the rest
        # (sequences still prefilling) are never read back, and stay one-hot on token 0.
        rows = self._rows
        if len(rows) > scores.shape[0]:
            raise RuntimeError(f"RowSampler: {scores.shape[0]} logits rows for {len(rows)} sequences with a new token")
        sampler_of = self.listener.sampler_of
        samplers = [sampler_of(rid) for rid in rows]
        tokens: list[int] = [0] * len(rows)
        greedy, sampled = [], []  # rows whose pick needs nothing but the pick: done for all at once
        for i, s in enumerate(samplers):
            if s is None or (s.params.plain and s.params.greedy):
                greedy.append(i)
            elif s.params.plain:
                sampled.append(i)
            else:
                tokens[i], logprobs = s.choose(scores[i])
                if logprobs is not None:
                    self.listener.keep_logprobs(rows[i], logprobs)
        if greedy:
            for i, token in zip(greedy, torch.argmax(scores[greedy], dim=-1).tolist()):
                tokens[i] = int(token)
        if sampled:
            chosen = [s for i in sampled if (s := samplers[i]) is not None]  # every sampled row has one
            picks = draw_tokens(scores[sampled], [s.params for s in chosen], [s.uniform() for s in chosen])
            for i, token in zip(sampled, picks):
                tokens[i] = int(token)
        for i in greedy + sampled:
            if (sampler := samplers[i]) is not None:
                sampler.record(tokens[i])
        return one_hot_scores(scores, tokens + [0] * (scores.shape[0] - len(rows)))


class EngineOutputRouter(OutputRouter):
    """Sends final outputs (finished or failed sequences) to the listener, not to a queue."""

    def __init__(self, listener: StepListener | None) -> None:
        super().__init__()
        self.listener = listener

    def deliver(self, output: Any) -> None:
        if output.is_finished() and self.listener is not None:
            self.listener.on_output(output.request_id, output.error)

    def deliver_batch(self, outputs: list[Any]) -> None:
        for output in outputs:
            self.deliver(output)


def start_manager(manager: Any) -> None:
    """``manager.start()``, but the generation thread is a daemon: a process that never stops
    its engine (an app built and not served, a test) can still exit. Mirrors ``start()`` of
    transformers 5.24 (clear the thread status, run the loop in the caller's inference mode)."""
    import threading

    if manager.is_running():
        return
    manager.background_thread_status.clear()
    manager._generation_thread = threading.Thread(
        target=manager._run_generation_loop, kwargs={"use_inference_mode": torch.is_inference_mode_enabled()},
        name="tokentrace-continuous-batching", daemon=True,
    )
    manager._generation_thread.start()


def wake(manager: Any) -> None:
    """Wake the manager's loop if it waits for work (it polls every 0.1 s otherwise)."""
    manager._wake_up_loop.set()
