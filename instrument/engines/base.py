"""The interface between the gateway and an engine: submit, stream tokens, cancel, report budgets.

The gateway never knows which engine runs. It builds one :class:`EngineRequest` per sequence
(prompt token ids, :class:`SamplingParams`, the gateway span's context, two callbacks) and
calls :meth:`Engine.submit`; the engine calls ``on_token`` on its own thread for every
generated token, in order, and ``on_done`` exactly once with an :class:`EngineResult`
(completed, failed or cancelled). :meth:`Engine.cancel` stops a sequence within one engine
step; ``on_done`` follows with ``finish_reason="cancelled"``.

Engines write the request's ``prefill`` and ``decode`` spans as children of
``EngineRequest.parent_context`` (docs/spans.md); the gateway writes ``gateway``,
``tokenize``, ``queue`` (from ``EngineRequest.enqueued_ns`` to ``EngineResult.admitted_ns``)
and the chunk events.

Budgets: :meth:`Engine.kv_reservation_bytes` is what one request reserves against the KV
budget (the sequential engine: the logical formula of docs/metrics.md for input + max_tokens tokens; the
continuous engine: the paged cache's whole blocks for them), and
:attr:`Engine.kv_capacity_bytes` the budget itself (None: unlimited).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Protocol

from opentelemetry.context import Context

from instrument.clock import now_wall_ns
from instrument.hf.token_sampling import SamplingParams, TokenLogprobs

__all__ = ["Engine", "EngineRequest", "EngineResult", "QueueWaitExceeded", "SamplingParams", "TokenLogprobs"]


@dataclass
class EngineResult:
    """How one sequence ended.

    - ``admitted_ns``: when the engine's scheduler first ran it (ns since the epoch, the
      process clock of instrument/clock.py); the ``queue`` span ends there. For a sequence
      cancelled before it ran, the time it was dropped.
    - ``finish_reason``: ``stop`` (a stop token) | ``length`` (max_tokens) | ``cancelled`` | ``error``.
    - ``generated_tokens``: G, tokens generated including a final stop token.
    """

    admitted_ns: int
    finish_reason: str
    generated_tokens: int = 0
    error: BaseException | None = None
    kv_physical_bytes: int | None = None  # paged engines: whole blocks held at the end, bytes
    cached_tokens: int | None = None  # prompt tokens served from the prefix cache (None: no prefix cache)
    kv_shared_bytes: int | None = None  # of kv_physical_bytes, the blocks taken from the prefix cache, bytes
    preemptions: int = 0  # times the engine preempted the sequence (its KV freed and recomputed)


class QueueWaitExceeded(Exception):
    """The request waited longer than the engine's ``max_queue_wait_s`` to be scheduled
    (the gateway answers 503 with ``Retry-After: retry_after_s``)."""

    def __init__(self, message: str, *, retry_after_s: int = 1) -> None:
        super().__init__(message)
        self.retry_after_s = retry_after_s


@dataclass
class EngineRequest:
    """One sequence for an engine. Callbacks run on the engine's thread and must be quick.

    - ``on_token(token_id, logprobs)``: each generated token in order (``logprobs`` None
      unless ``params.logprobs``); the last call comes before ``on_done``.
    - ``on_done(result)``: exactly once.
    - ``on_started()``: optional; when the engine's scheduler first runs the sequence (the
      continuous engine calls it; the gateway waits for it before answering a streamed
      request under ``max_queue_wait_s``).
    """

    request_id: str
    input_ids: list[int]
    params: SamplingParams
    parent_context: Context
    on_token: Callable[[int, TokenLogprobs | None], None]
    on_done: Callable[[EngineResult], None]
    enqueued_ns: int = field(default_factory=now_wall_ns)
    on_started: Callable[[], None] | None = None


class Engine(Protocol):
    """What the gateway needs from an engine (three verbs and two budget figures)."""

    name: str  # "sequential" | "continuous"

    def submit(self, request: EngineRequest) -> None:
        """Queue a sequence; never blocks. Its callbacks follow on the engine's thread."""

    def cancel(self, request_id: str) -> None:
        """Stop a sequence within one engine step (no-op when it already ended)."""

    #: ``reserve``: each request reserves ``kv_reservation_bytes`` of the KV budget while in
    #: flight (admission refuses what does not fit now); ``paged``: blocks are allocated as
    #: sequences grow and a request that does not fit waits in the engine's queue (admission
    #: refuses only what could never fit).
    kv_admission: str

    @property
    def requests_waiting(self) -> int:
        """Requests submitted and waiting to be scheduled (what vLLM calls the queue)."""

    @property
    def requests_running(self) -> int:
        """Requests the engine runs now."""

    def kv_reservation_bytes(self, input_tokens: int, max_tokens: int) -> int:
        """KV bytes one request of this size can come to hold (checked against :attr:`kv_capacity_bytes`)."""

    @property
    def kv_capacity_bytes(self) -> int | None:
        """The KV budget requests are admitted against, bytes (None: no KV budget)."""

    def health(self) -> dict[str, Any]:
        """Engine state for ``/health`` (name, warm, and engine-specific figures)."""

    def close(self, grace_s: float = 5.0) -> None:
        """Let running sequences finish for up to ``grace_s`` seconds, cancel the rest, stop."""
