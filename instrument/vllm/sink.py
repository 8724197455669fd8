"""The engine-core process's side of the vLLM records: pack, send in batches, stop.

:class:`RecordSink` runs on vLLM's engine thread: it starts tokentrace's span exporter process
(instrument/records/exporter_process.py, started by the engine-core process, detached from
its process tree, at nice +``EXPORTER_NICE``), packs the hooks' step rows with instrument/vllm/rows.py's
:func:`~instrument.vllm.rows.pack` and sends them as channel-1 BLOB messages on a socket
that never blocks; at shutdown it sends the rest and stops the child within ~4 s.
"""

from __future__ import annotations

import logging
import time
from typing import Any

from instrument.vllm.hooks import clock_start
from instrument.vllm.hooks.tap import FLUSH_LATE_NS, FLUSH_NS
from instrument.vllm.rows import UPDATED, message, message_end, pack, units

__all__ = ["CHANNEL", "EXPORTER_NICE", "FLUSH_BYTES", "FLUSH_LATE_NS", "FLUSH_NS", "RecordSink"]

log = logging.getLogger("tokentrace.vllm")
# A send is due whenever the engine goes idle, at hooks.MAX_HELD rows (~256 steps), FLUSH_NS
# after the last send once hooks.LEAST_HELD rows (~64 steps) are held, and FLUSH_LATE_NS after
# it whatever is held; a message about every FLUSH_BYTES. Measured inside vLLM's engine core
# (SmolLM2 on 2 shared cores, batch 8): a send costs the engine thread ~70-90 µs besides
# packing and marshalling the rows (timed around the socket; mostly caches cold after a model
# step: a copy into a buffer instead cost the same; ~80-130 µs inferred on a slower day), so its cost per token is that over the
# tokens it covers: at a step every ~50 ms, sending every step was ~10 µs per token, every 1 s
# ~0.5; at ~300 ms a step, 2 s covered ~7 steps (~1.5-2 µs per token from the fixed part alone),
# hence the steps asked for. Spans reach the SDK's batch processor (5 s between exports by
# default) at most FLUSH_LATE_NS after their step; at once when the engine goes idle.
# A message is cut once about FLUSH_BYTES are packed (one packs to at most twice that, else
# it is packed again with fewer rows): a sendmsg costs the engine thread nearly the same for
# any size (benchmarks/send_size.py, after streaming 32 MiB through the caches, the exporter
# process woken: ~75-100 µs for 4 KiB, ~85-105 for 32 KiB, ~180 for 256 KiB), so a send's
# rows go as one message where they fit (512 rows of plain decode steps at batch 8, ~230
# steps: ~55 KiB, ~93 KiB with vLLM's dict and runner lists, which 32 KiB messages, used
# before, cut in two or three; ~4× that at batch 32)
FLUSH_BYTES = 256 * 1024
EXPORTER_NICE = 10  # the exporter process runs this much nicer than the engine core (at most 19)
CHANNEL = 1  # the record stream's channel of these rows, read by instrument/vllm/consumer.py


class RecordSink:
    """The engine-core process's side: pack step rows, send them in batches, stop.

    ``flush(idle)`` runs on vLLM's engine thread when the plugin's hooks find a send due: it
    packs the rows ``take(idle)`` gives (:meth:`instrument.vllm.hooks.StepTap.take`: the
    GEOMETRY fields and the held rows of instrument/vllm/rows.py) into numbered messages.
    Never waits (a full socket drops the message, counted by the sender)."""

    def __init__(self, exporters: list[str], json_path: str | None, take: Any, protocol: str | None = None) -> None:
        from instrument.otel.tracing import default_resource
        from instrument.records.exporter_process import ExporterProcess
        from instrument.records.format import RecordWriter
        from instrument.vllm.consumer import RecordConsumer

        # the resource setup_tracing gives (OTEL_RESOURCE_ATTRIBUTES, service name, instance id, host),
        # without building a provider in vLLM's process
        resource = dict(default_resource().attributes)
        # nicer: on a saturated host the exporter waits for vLLM, not the reverse (it catches up
        # when idle); detached: vLLM stops an engine core by SIGKILL to its whole process tree
        # (at once on SIGTERM with its default --shutdown-timeout 0), and a detached exporter
        # still exports what was sent and ends the requests left open (module docstring)
        # always_on there: which requests and steps are traced was decided on the engine thread
        # (instrument/vllm/sampling.py); a root must not be decided again on another trace id
        self.exporter = ExporterProcess(resource, exporters, json_path, name="vllm-exporter-process", detach=True,
                                        nice=EXPORTER_NICE, always_on=True, protocol=protocol)
        self.sender = self.exporter.join(CHANNEL, RecordConsumer)  # reads the rows there
        self.writer = RecordWriter()
        self.measure = False  # time each send with the thread's CPU clock
        self.send_cpu_ns = 0  # CPU time spent taking, packing and sending (measure), ns
        self.pack_cpu_ns = 0  # ... of which marshalling the rows (measure), ns
        self.socket_cpu_ns = 0  # ... counting their spans and handing them to the socket (measure), ns
        self.free_cpu_ns = 0  # ... freeing what the rows held: vLLM's per-step lists (measure), ns
        self.sends = 0  # messages sent (each numbered: the exporter process sees a gap)
        self.lost_steps = 0  # steps taken and not sent: packing raised (tracing stops)
        self.closed = False
        self.take = take  # (idle) -> (GEOMETRY fields, the held rows): StepTap.take
        self.message_bytes = FLUSH_BYTES  # a message is cut once about this much is packed
        self.rows_per_message = 512  # adapted so that a message packs to about message_bytes

    def flush(self, idle: bool = False) -> None:
        """Pack the held rows and send them, messages of about ``message_bytes`` (never waits);
        ``idle``: the scheduler holds no request after them (an IDLE row ends them).

        Taken and packed here, all together, rather than at each step: measured inside vLLM's
        engine core, where the model step between two sends evicts this code and vLLM's
        objects from the CPU's caches, the same work done per step cost several times what it
        costs in a loop (docs/spans.md "vLLM", cost)."""
        cpu, floor = clock_start() if self.measure else (0, 0)  # (net of a warm clock read's cost)
        clock = time.thread_time_ns if cpu else None  # the parts too, each net of one read
        header, rows = self.take(idle)
        start, end, chunk = 0, len(rows), None
        try:
            while start < end:
                count = self.rows_per_message
                stop = message_end(rows, start, count)
                chunk = rows[start:stop]
                mark = clock() if clock else 0
                payload = pack(message(header, self.sends + 1, chunk))
                if clock:
                    self.pack_cpu_ns += clock() - mark - floor
                if len(payload) > 2 * self.message_bytes and count > 1:  # too large for one message: fewer rows
                    self.rows_per_message = max(1, count * self.message_bytes // len(payload))
                    continue
                mark = clock() if clock else 0
                self._send(payload, units(chunk))
                if clock:
                    self.socket_cpu_ns += clock() - mark - floor
                start = stop
                if len(payload) < self.message_bytes // 2 and start < end:
                    self.rows_per_message = count * 2
        except Exception:  # (the hook's caller logs it and stops tracing) the steps not sent, counted
            self.lost_steps += sum(1 for row in rows[start:] if row[0] == UPDATED)
            raise
        finally:
            mark = clock() if clock else 0
            chunk = rows = None  # (vLLM's lists the rows held go now, inside the measured window)
            if clock:
                self.free_cpu_ns += clock() - mark - floor
        if cpu:
            self.send_cpu_ns += time.thread_time_ns() - cpu - floor

    def _send(self, payload: bytes, units: int) -> None:
        self.writer.blob(CHANNEL, payload)
        self.sender.send(self.writer.take(), units)
        self.sends += 1

    def close(self, timeout_s: float = 3.0) -> None:
        """Send the rest, let the exporter process build, export and report; log what was lost.

        Runs at vLLM's scheduler shutdown: after a drain (``--shutdown-timeout N``), or an
        engine error. ``stop(3.0)`` takes at most ~4 s, inside the ~5 s vLLM's process
        manager grants when it has no timeout of its own; when vLLM kills the engine core
        first (its default ``--shutdown-timeout 0``) this never runs, and the exporter
        process, detached from the engine core's process tree, exports what was sent."""
        if self.closed:
            return
        self.closed = True
        try:
            self.flush()
        except Exception:  # the exporter process is stopped all the same (its spans exported)
            log.exception("tokentrace: the last vLLM step records were not sent")
        start = time.monotonic()
        counts = self.exporter.stop(timeout_s)
        lost = sum(c.dropped + c.failed for c in counts)
        if lost:
            log.warning("tokentrace: %d vLLM spans not exported (%s; %.1f s)", lost,
                        ", ".join(f"{c.name}: {c.dropped} dropped, {c.failed} failed" for c in counts),
                        time.monotonic() - start)
