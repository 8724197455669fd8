"""Admission control (token, sequence and KV-memory budgets) and per-key rate limits.

The admission queue is bounded: a request over ``max_queued_requests`` (requests in flight,
waiting + running) or the token budget is refused at once (the app answers 429 with
``Retry-After``) rather than waiting without bound. Thread-safe; pure Python.

KV memory depends on the engine (``Engine.kv_admission``):

- ``reserve`` (the sequential engine): each request reserves its worst case while in flight,
  the logical figure ``kv_bytes_per_token x (input_tokens + max_tokens)`` (instrument/kv/formula.py's
  formula); a request that does not fit the KV left now is refused (429). Released when the
  request ends (completed, failed or cancelled).
- ``paged`` (the continuous engine): nothing is reserved. The engine allocates blocks as a
  sequence grows; a request that does not fit the blocks free waits in the engine's queue
  (still counted against ``max_queued_requests``), and the engine preempts a running
  sequence when the cache runs out mid-generation. Only a request whose input + max_tokens
  could never fit the whole cache is refused (400).

Queue depth (``Ticket.queue_depth``, the ``queue`` span's ``tokentrace.queue.depth``) is what
a vLLM user reads as such: requests waiting to be scheduled when this one arrived (the
engine's count), not requests in flight (``Ticket.requests_in_flight``).
"""

from __future__ import annotations

import math
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass

__all__ = ["AdmissionBudgets", "AdmissionController", "AdmissionRefused", "Ticket", "RateLimiter"]


@dataclass(frozen=True)
class AdmissionBudgets:
    """Limits over every admitted request not yet finished (queued or running). None = unlimited.

    - ``max_queued_requests``: sequences in flight (waiting + running).
    - ``max_queued_tokens``: sum of ``input_tokens + max_tokens`` over requests in flight.
    - ``kv_budget_bytes``: the KV budget, bytes: with ``kv_reserve``, the sum of worst-case
      KV bytes over requests in flight; without, the most one request may come to hold.
    """

    max_queued_requests: int | None = 64
    max_queued_tokens: int | None = None
    kv_budget_bytes: int | None = None


class AdmissionRefused(Exception):
    """Over a budget. ``retry_after_s`` (seconds) goes into the Retry-After header;
    ``permanent`` means the request could never fit (answered 400, not 429)."""

    def __init__(self, message: str, *, budget: str, retry_after_s: int = 1, permanent: bool = False) -> None:
        super().__init__(message)
        self.budget = budget
        self.retry_after_s = retry_after_s
        self.permanent = permanent


@dataclass
class Ticket:
    """What one admitted request holds until :meth:`AdmissionController.release`."""

    tokens: int
    kv_bytes: int  # reserved (0 when the engine allocates KV as sequences grow)
    queue_depth: int  # requests waiting to be scheduled when this one was admitted
    tokens_ahead: int  # input + max_tokens of the requests in flight then
    requests_in_flight: int = 0  # requests admitted and not finished then (waiting + running)
    released: bool = False


class AdmissionController:
    """Counts requests, tokens and KV bytes in flight against :class:`AdmissionBudgets`.

    ``kv_bytes_for(input_tokens, max_tokens)`` (bytes) is the engine's worst-case rule;
    without it, the logical formula with ``kv_bytes_per_token``. ``kv_reserve``: whether a
    request reserves that much while in flight (module docstring). ``waiting()``: requests
    waiting to be scheduled now (the engine's count; None: those in flight).
    """

    def __init__(self, budgets: AdmissionBudgets, kv_bytes_per_token: int | None = None, *,
                 kv_bytes_for: Callable[[int, int], int] | None = None, kv_reserve: bool = True,
                 waiting: Callable[[], int] | None = None) -> None:
        self.budgets = budgets
        self.kv_bytes_per_token = kv_bytes_per_token
        self._kv_bytes_for = kv_bytes_for
        self.kv_reserve = kv_reserve
        self._waiting = waiting
        self._lock = threading.Lock()
        self.requests_in_flight = 0
        self.tokens_in_flight = 0
        self.kv_bytes_in_flight = 0

    def kv_bytes_for(self, input_tokens: int, max_tokens: int) -> int:
        """Worst-case KV bytes one request reserves (0 when the layout is unknown)."""
        if self._kv_bytes_for is not None:
            return self._kv_bytes_for(input_tokens, max_tokens)
        return (self.kv_bytes_per_token or 0) * (input_tokens + max_tokens)

    def admit(self, input_tokens: int, max_tokens: int) -> Ticket:
        """Reserve budget for one request or raise :class:`AdmissionRefused`."""
        tokens = input_tokens + max_tokens
        kv_bytes = self.kv_bytes_for(input_tokens, max_tokens)
        b = self.budgets
        if b.max_queued_tokens is not None and tokens > b.max_queued_tokens:
            raise AdmissionRefused(
                f"request needs {tokens} tokens (input + max_tokens) but the token budget is {b.max_queued_tokens}",
                budget="tokens", permanent=True,
            )
        if b.kv_budget_bytes is not None and kv_bytes > b.kv_budget_bytes:
            raise AdmissionRefused(
                f"request needs {kv_bytes} KV bytes but the KV budget is {b.kv_budget_bytes} bytes",
                budget="kv", permanent=True,
            )
        with self._lock:
            if b.max_queued_requests is not None and self.requests_in_flight + 1 > b.max_queued_requests:
                raise AdmissionRefused(
                    f"server busy: {self.requests_in_flight} requests in flight (limit {b.max_queued_requests})",
                    budget="requests",
                )
            if not self.kv_reserve:
                kv_bytes = 0  # the engine allocates KV as sequences grow (module docstring)
            if b.max_queued_tokens is not None and self.tokens_in_flight + tokens > b.max_queued_tokens:
                raise AdmissionRefused(
                    f"server busy: {self.tokens_in_flight} tokens in flight + {tokens} exceeds the token budget "
                    f"{b.max_queued_tokens}", budget="tokens",
                )
            if b.kv_budget_bytes is not None and self.kv_bytes_in_flight + kv_bytes > b.kv_budget_bytes:
                raise AdmissionRefused(
                    f"server busy: {self.kv_bytes_in_flight} KV bytes in flight + {kv_bytes} exceeds the KV budget "
                    f"{b.kv_budget_bytes} bytes", budget="kv",
                )
            waiting = self._waiting() if self._waiting is not None else self.requests_in_flight
            ticket = Ticket(tokens, kv_bytes, queue_depth=waiting, tokens_ahead=self.tokens_in_flight,
                            requests_in_flight=self.requests_in_flight)
            self.requests_in_flight += 1
            self.tokens_in_flight += tokens
            self.kv_bytes_in_flight += kv_bytes
            return ticket

    def release(self, ticket: Ticket) -> None:
        """Give back a ticket's budget (idempotent)."""
        with self._lock:
            if ticket.released:
                return
            ticket.released = True
            self.requests_in_flight -= 1
            self.tokens_in_flight -= ticket.tokens
            self.kv_bytes_in_flight -= ticket.kv_bytes


class RateLimiter:
    """Token bucket per API key: ``rate_per_s`` requests per second, bursts up to ``burst``."""

    def __init__(self, rate_per_s: float | None, burst: int | None = None) -> None:
        self.rate_per_s = rate_per_s
        self.burst = float(burst if burst is not None else max(1, math.ceil(rate_per_s or 1)))
        self._buckets: dict[str, tuple[float, float]] = {}  # key -> (tokens, last monotonic s)
        self._lock = threading.Lock()

    def check(self, key: str) -> float | None:
        """Take one request for ``key``; None if allowed, else seconds until one is available."""
        if self.rate_per_s is None:
            return None
        now = time.monotonic()
        with self._lock:
            tokens, last = self._buckets.get(key, (self.burst, now))
            tokens = min(self.burst, tokens + (now - last) * self.rate_per_s)
            if tokens >= 1.0:
                self._buckets[key] = (tokens - 1.0, now)
                return None
            self._buckets[key] = (tokens, now)
            return (1.0 - tokens) / self.rate_per_s
