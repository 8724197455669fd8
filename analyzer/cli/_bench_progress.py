"""``tokentrace bench``'s live progress line and its account of failed requests.

On a terminal (stderr a TTY) one line is redrawn twice a second while the load runs::

    bench 0:14  12/24 done, 1 failed, 3 in flight, 8 to send  312.4 tok/s

``done`` counts requests that ended (completed or failed), ``failed`` those of them that did
not complete (an HTTP status other than 200, a network error or timeout, a stream that ended
without a finish reason), ``tok/s`` the visible chunks received per second of wall-clock time
since the start (the client counts one token per visible chunk, as its spans do). The line is
erased when the load ends; nothing is drawn when stderr is not a terminal.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import Any, TextIO

__all__ = ["BenchProgress", "describe_failure", "is_failed"]


def is_failed(result: Any) -> bool:
    """A request that did not complete and was not cancelled by the bench itself stopping."""
    return not result.completed and result.finish_reason != "cancelled"


def describe_failure(result: Any, timeout_s: float) -> str:
    """Two lines naming a failed request: what failed (HTTP status, exception or error message)
    and the seconds it waited from send to failure; then its ids (client_request_id = the
    X-Request-ID sent, response_id = the server's id for it)::

        request 17: HTTP 200, 12 chunks, then ReadTimeout after 120.0 s (--timeout-s 120)
          client_request_id bench-1a2b3c4d-17, response_id chatcmpl-0f3c...
    """
    what = result.error or ("the stream ended without a finish reason" if result.status_code == 200 else "failed")
    timed_out = what.split(":")[0].endswith("Timeout")
    waited = "" if result.waited_s is None else f" after {result.waited_s:.1f} s"
    if timed_out:  # httpx's timeouts carry no message: name the limit that ended the wait
        what = f"{what}{waited} (--timeout-s {timeout_s:g})"
    else:
        what = f"{what}{waited}"
    if result.status_code is None:
        head = f"no HTTP response, {what}"
    elif result.status_code == 200:
        head = f"HTTP 200, {result.chunks} chunk{'s' if result.chunks != 1 else ''}, then {what}"
    else:
        head = f"HTTP {result.status_code}: {what}"
    ids = [f"client_request_id {result.client_request_id}"] if result.client_request_id else []
    if result.response_id:
        ids.append(f"response_id {result.response_id}")
    return f"request {result.index}: {head}\n  {', '.join(ids) or 'no id (no X-Request-ID sent, none answered)'}"


class BenchProgress:
    """Counts requests as the load goes and, when ``enabled``, redraws one line on ``stream``
    every ``interval_s`` seconds from a daemon thread (the counters are plain ints written by
    the load's event loop thread and only read here)."""

    def __init__(self, total: int, stream: TextIO, *, enabled: bool, interval_s: float = 0.5,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.total = total
        self.stream = stream
        self.enabled = enabled
        self.interval_s = interval_s
        self.clock = clock
        self.started = clock()
        self.sent = self.done = self.failed = self.tokens = 0
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._width = 0

    # --- callbacks of instrument.client.run_load (event loop thread) ----------------------
    def on_send(self, _index: int) -> None:
        self.sent += 1

    def on_chunk(self, visible: bool) -> None:
        if visible:
            self.tokens += 1

    def on_result(self, result: Any) -> None:
        self.done += 1
        if is_failed(result):
            self.failed += 1

    # --- the line ---------------------------------------------------------------------------
    def line(self) -> str:
        """The progress line (at most 80 characters for up to 99,999 requests)."""
        elapsed = max(self.clock() - self.started, 1e-9)
        minutes, seconds = divmod(int(elapsed), 60)
        in_flight = self.sent - self.done
        return (f"bench {minutes}:{seconds:02d}  {self.done}/{self.total} done, {self.failed} failed, "
                f"{in_flight} in flight, {self.total - self.sent} to send  {self.tokens / elapsed:.1f} tok/s")

    def _draw(self) -> None:
        text = self.line()
        pad = max(self._width - len(text), 0)
        self.stream.write("\r" + text + " " * pad)
        self.stream.flush()
        self._width = len(text)

    def _run(self) -> None:
        while not self._stop.wait(self.interval_s):
            self._draw()

    def __enter__(self) -> BenchProgress:
        self.started = self.clock()
        if self.enabled:
            self._draw()
            self._thread = threading.Thread(target=self._run, name="bench-progress", daemon=True)
            self._thread.start()
        return self

    def __exit__(self, *_exc: Any) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=2.0)
            self.stream.write("\r" + " " * self._width + "\r")  # erase the line: the summary follows
            self.stream.flush()
