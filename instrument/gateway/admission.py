"""Admission control (token, sequence and KV-memory budgets) and per-key rate limits.

Both fail fast: an over-budget request is refused at once (the app answers 429 with
``Retry-After``) rather than waiting without bound. Thread-safe; pure Python.

KV bytes per request are sized for the worst case it was admitted with, by the engine's
rule (``Engine.kv_reservation_bytes``): the sequential engine reserves the logical figure
``kv_bytes_per_token x (input_tokens + max_tokens)`` (instrument/kv.py's formula), the
continuous engine the paged cache's whole blocks for those tokens. Released when the request
ends (completed, failed or cancelled).
"""

from __future__ import annotations

import math
import threading
import time
from dataclasses import dataclass
from typing import Callable

__all__ = ["AdmissionBudgets", "AdmissionController", "AdmissionRefused", "Ticket", "RateLimiter"]


@dataclass(frozen=True)
class AdmissionBudgets:
    """Limits over every admitted request not yet finished (queued or running). None = unlimited.

    - ``max_queued_requests``: sequences in flight (queued + running).
    - ``max_queued_tokens``: sum of ``input_tokens + max_tokens`` over requests in flight.
    - ``kv_budget_bytes``: sum of worst-case logical KV bytes over requests in flight.
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
    kv_bytes: int
    queue_depth: int
    tokens_ahead: int
    released: bool = False


class AdmissionController:
    """Counts requests, tokens and KV bytes in flight against :class:`AdmissionBudgets`.

    ``kv_bytes_for(input_tokens, max_tokens)`` (bytes) is the engine's reservation rule;
    without it, the logical formula with ``kv_bytes_per_token``.
    """

    def __init__(self, budgets: AdmissionBudgets, kv_bytes_per_token: int | None = None, *,
                 kv_bytes_for: Callable[[int, int], int] | None = None) -> None:
        self.budgets = budgets
        self.kv_bytes_per_token = kv_bytes_per_token
        self._kv_bytes_for = kv_bytes_for
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
            ticket = Ticket(tokens, kv_bytes, queue_depth=self.requests_in_flight, tokens_ahead=self.tokens_in_flight)
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
