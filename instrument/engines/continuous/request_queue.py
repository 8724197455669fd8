"""The continuous engine's request queue: waiting, started, preempted, cancelled, expired.

:class:`RequestQueue` is a part of :class:`~instrument.engines.continuous.ContinuousEngine`
(a mixin: the engine's fields, one concern): how many requests wait to be scheduled
(``submitted - started``, each counter written by one thread), what happens when the
scheduler runs a sequence for the first time or preempts it, and cancellations — asked for
on the gateway's loop (``cancel``), handed to the manager before its next schedule
(``before_schedule``, the manager's thread), ended once the scheduler has dropped them
(``_finish_cancelled``), including requests whose ``max_queue_wait_s`` passed before they
were scheduled (they end with :class:`~instrument.engines.base.QueueWaitExceeded`).
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from typing import Any

from instrument.engines.base import QueueWaitExceeded
from instrument.engines.continuous import hooks as cb_hooks
from instrument.engines.continuous.spans import SequenceRecord

__all__ = ["RequestQueue"]


class RequestQueue:
    """The queue half of ContinuousEngine (module docstring); no state of its own."""

    _live: dict[str, SequenceRecord]
    _lock: Any
    _cancels: list[str]
    _cancelling: list[str]
    _deadlines: Any
    _submitted: int
    _started: int
    manager: Any
    metrics: Any
    max_queue_wait_s: float | None
    preemptions: int
    _warm_ids: set[str]  # the warm-up sequences still running (before the engine reports ready)
    _finish: Callable[..., None]  # the engine's: ends a request (request id, reason, ns, error)

    @property
    def requests_waiting(self) -> int:
        """Requests submitted and not (or no longer: preempted) running: waiting to be scheduled."""
        return max(0, self._submitted - self._started)

    @property
    def requests_running(self) -> int:
        """Requests the scheduler runs (admitted, not finished, not preempted)."""
        return max(0, len(self._live) - self.requests_waiting)

    def cancel(self, request_id: str) -> None:
        with self._lock:
            record = self._live.get(request_id)
            if record is None or record.cancel_requested:
                return
            record.cancel_requested = True
            self._cancels.append(request_id)
        cb_hooks.wake(self.manager)

    def before_schedule(self) -> None:
        with self._lock:
            cancels, self._cancels = self._cancels, []
        deadlines = self._deadlines
        if deadlines and deadlines[0][0] <= time.monotonic():
            cancels.extend(self._expire_waits(time.monotonic()))
        for request_id in cancels:
            self.manager.cancel_request(request_id)
        self._cancelling = cancels  # the scheduler drops them in the prepare that follows

    def _expire_waits(self, now_s: float) -> list[str]:
        """Requests whose queue wait passed ``max_queue_wait_s`` and are still waiting: marked to
        end with :class:`QueueWaitExceeded` (FIFO deadlines: only the head is looked at)."""
        expired = []
        deadlines, live = self._deadlines, self._live
        while deadlines and deadlines[0][0] <= now_s:
            _, request_id = deadlines.popleft()
            record = live.get(request_id)
            if record is not None and record.admitted_ns is None and not record.cancel_requested:
                record.cancel_requested = True
                record.queue_expired = True
                expired.append(request_id)
        return expired

    def _start(self, record: SequenceRecord, s: Any, start_ns: int) -> None:
        """The scheduler runs ``record`` for the first time (or again after a preemption)."""
        record.waiting = False
        self._started += 1
        if record.admitted_ns is None:
            record.admitted_ns = start_ns
            record.cached_tokens = s.context_tokens - s.tokens  # a reused prefix is not computed
            if record.request.on_started is not None:
                record.request.on_started()
            if self.metrics is not None:
                self.metrics.prefix_cache_queried(len(record.request.input_ids), record.cached_tokens)

    def on_preempted(self, request_id: str, at_ns: int, blocks: int, mode: str) -> None:
        if request_id in self._warm_ids:  # warm-up, before ready: no request's, not counted
            return
        self.preemptions += 1
        if self.metrics is not None:
            self.metrics.preempted(mode)
        record = self._live.get(request_id)
        if record is None:
            return
        record.preempted += 1
        record.preemptions.append((at_ns, blocks, mode))
        if not record.waiting:
            record.waiting = True
            self._started -= 1

    def _finish_cancelled(self, at_ns: int) -> None:
        cancelling, self._cancelling = self._cancelling, []
        for request_id in cancelling:
            record = self._live.get(request_id)
            if record is None:
                continue
            if record.queue_expired:
                assert self.max_queue_wait_s is not None  # a request expires only under it
                self._finish(request_id, "error", at_ns, QueueWaitExceeded(
                    f"not scheduled within --max-queue-wait-s {self.max_queue_wait_s:g} s "
                    f"({self.requests_waiting} requests waiting)", retry_after_s=max(1, math.ceil(self.max_queue_wait_s))))
            else:
                self._finish(request_id, "cancelled", at_ns)
