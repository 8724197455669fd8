"""The span exporter process: step records in, spans out, never in the serving process's way.

Transport (measured by benchmarks/record_transport.py; why: docs/design/span-export-process.md):
an
``AF_UNIX`` ``SOCK_SEQPACKET`` socket pair. The serving process sends one message of one or
more steps' records (instrument/engines/continuous/record_sink.py: every 32 KiB / 50 ms and when the
engine goes idle) with a non-blocking ``sendmsg`` (~0.8 µs for a batch-64 record to a busy
reader; waking a sleeping one costs ~40 µs here); a full socket buffer (4 MiB asked,
thousands of steps) raises instead of waiting, and the message is dropped and counted there.
A message starts with a u32: the spans its records stand for (for the loss count). Messages keep their boundaries, and a dead reader makes the next
send fail, so a dead exporter is noticed on the engine thread at no cost. A shared-memory
ring was cheaper per record (0.3 µs) but needs polling in the reader and its own death
detection; a multiprocessing pipe blocks when full.

The child (``python -m instrument.records.exporter_child``, a fresh interpreter: none of
the parent's threads, locks or ``__main__`` come along; the two sockets are passed as file
descriptors) builds a TracerProvider with the parent's resource and the same exporters (``setup_tracing``: OTLP
from the ``OTEL_*`` variables it inherits, OTLP-JSON lines), feeds each message to its
router (instrument/records/router.py: each entry to the decoder its writer named when it
joined, :meth:`ExporterProcess.join`), and at start and every 0.5 s reports its export
counts on a control socket (JSON messages). ``stop()`` asks it to drain the socket, flush and report; what
it has not exported by the bound is counted as dropped.

Counts (the shutdown line and /health, through ``export_health.add_counts_source``): the
child's exporters' submitted / exported / failed / dropped, plus the spans of messages
that never reached it: dropped at a full socket, or sent after its last report when it
died. Each sender says how many spans a message stands for: the engine's step records
estimate one per STEP entry and one per SEQ entry (exact for ``--decode-spans all``;
engine roots and ``every:N`` differ), the gateway's forwarded spans
(instrument/records/span_forward.py) count exactly.
Restarts: if the child dies (killed, crashed), serving goes on, one error line says so, the
writers' messages are dropped and counted meanwhile, and the owner's monitor thread (never a
writer's thread: not vLLM's engine thread) starts a new child after 1 s, longer after each
death in a row (``RESTART_DELAYS_S``), at most ``RESTARTS_PER_MINUTE`` a minute, one line
each. The new child's first messages are the decoders the writers joined with and their
preambles (the continuous engine's META): it reads every channel as the first did. What the
dead child had been sent and not built is counted as dropped, and so are later steps of
sequences it had opened (the new child never saw their OPEN entry: the builder counts them).
``restart=False`` keeps the old behaviour: tracing stops for good.

``detach=True`` (the vLLM plugin's): the child forks once more at start and the process
started exits, so the exporter is no longer a descendant of the serving process. vLLM
stops its engine core by SIGKILL to the whole process tree (``kill_process_tree``; with its
default ``--shutdown-timeout 0`` right after SIGTERM, before any handler runs); a detached
exporter outlives that, sees both sockets close, builds what was sent, ends what was still
open (each decoder's ``close()``), exports, says in one line that the sender ended without
stopping it, and exits within ~5 s. Its liveness is then its control socket, and its pid
comes in its reports.
"""

from __future__ import annotations

import collections
import errno
import json
import logging
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from typing import Any

from instrument.otel.export_health import ExportCounts
from instrument.records.channels import decoder_target
from instrument.records.exporter_child import Control
from instrument.records.format import RecordWriter

__all__ = ["ExporterProcess", "RecordSender"]

LOGGER = logging.getLogger("tokentrace.export")
SEND_BUFFER_BYTES = 4 * 2**20
RESTART_DELAYS_S = (1.0, 2.0, 5.0, 10.0, 20.0)  # before the k-th restart within a minute
RESTARTS_PER_MINUTE = 4
_DECODER_ROOM = 512  # bytes a DECODER entry takes (its target's name is far shorter)


class ExporterProcess:
    """The owner's side: the socket the writers send on, the child, its counts, its restarts."""

    def __init__(self, resource_attributes: dict[str, Any], exporters: list[str], json_path: str | None = None,
                 name: str = "exporter-process", endpoint: str | None = None, protocol: str | None = None,
                 detach: bool = False, nice: int = 0, always_on: bool = False, restart: bool = True,
                 env: dict[str, str] | None = None) -> None:
        self.name = name
        self.env = dict(env or {})  # variables the child gets besides this process's (the keep policy's)
        self.detached = detach  # the child forks and the process started exits (module docstring)
        self.restart = restart  # start a new child when one dies (module docstring, "Restarts")
        self._settings = {"resource": {k: v for k, v in resource_attributes.items()}, "exporters": list(exporters),
                          "json_path": json_path, "endpoint": endpoint, "protocol": protocol, "detach": detach,
                          "nice": nice, "always_on": always_on}
        self._senders: list[RecordSender] = []
        self._joined: dict[int, tuple[str, bytes]] = {}  # channel -> (its decoder, the preamble)
        self.dead = False
        self.restarts = 0  # children started after the first one died
        self._restart_times: collections.deque[float] = collections.deque()  # monotonic s of the last ones
        self._lost_before = 0  # spans the earlier children never built (in flight when they died, malformed)
        self._past: dict[str, list[int]] = {}  # the earlier children's exporter counts, by exporter name
        self._started = threading.Event()  # the child's first report came: its exporters are made
        self._lock = threading.Lock()
        self._stopped = False
        self._stopping = threading.Event()
        self._flushes = 0
        self._flushed = threading.Condition()
        self._spawn()
        self._first = self.sender()
        self._monitor = threading.Thread(target=self._watch, name="tokentrace-exporter-watch", daemon=True)
        self._monitor.start()

    def _spawn(self) -> None:
        """Start a child on a new socket pair; the decoders joined so far (and their preambles)
        are its first messages, so nothing a writer sends can reach it before them."""
        parent_sock, child_sock = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        parent_sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, SEND_BUFFER_BYTES)
        child_sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, SEND_BUFFER_BYTES)
        parent_sock.setblocking(False)
        control, child_control = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        settings = {**self._settings, "records_fd": child_sock.fileno(), "control_fd": child_control.fileno(),
                    "sender_pid": os.getpid()}
        process = subprocess.Popen(
            [sys.executable, "-m", "instrument.records.exporter_child", json.dumps(settings)],
            pass_fds=(child_sock.fileno(), child_control.fileno()), start_new_session=True,
            env={**os.environ, **self.env} if self.env else None)
        child_sock.close()
        child_control.close()
        for channel, (target, preamble) in self._joined.items():
            parent_sock.sendmsg(((0).to_bytes(4, "little"), _decoder_message(channel, target, preamble)))
        self._report: dict[str, Any] = {"counts": [], "received": 0}
        self._sent_base = self.sent_units  # what earlier children were sent
        self._started.clear()
        self.process = process
        self._pid: int | None = None if self.detached else process.pid  # (detached: from its first report)
        self._control = Control(control)
        self._sock = parent_sock  # the writers send here from now on

    @classmethod
    def for_provider(cls, tracer_provider: Any) -> ExporterProcess:
        """The exporter process for a ``setup_tracing`` provider whose exporters were given by
        name (the child makes them again: same names, OTLP-JSON path, endpoint, protocol,
        resource; the provider's ``exporter_env`` added to its environment). ValueError for any
        other provider (extra exporter objects, e.g. in-memory, cannot cross a process boundary)."""
        from instrument.otel.tracing import exporter_settings

        settings = exporter_settings(tracer_provider)
        if settings is None or settings["extra_exporters"]:
            raise ValueError("--span-export process: the tracer provider must come from setup_tracing with "
                             "exporters given by name (another process makes them again)")
        return cls(dict(tracer_provider.resource.attributes), list(settings["exporters"]), settings["json_path"],
                   endpoint=settings["endpoint"], protocol=settings["protocol"],
                   env=getattr(tracer_provider, "exporter_env", None))

    # --- the senders ------------------------------------------------------------------------
    def join(self, channel: int, decoder: type | str, preamble: bytes | memoryview = b"") -> RecordSender:
        """A sender for a writer whose entries of ``channel`` the exporter process reads with
        ``decoder`` (its class, or ``module:qualname``; made there with the process's tracer
        provider). The first message on it is one DECODER entry naming the decoder, then
        ``preamble`` (entries the decoder needs before anything else, e.g. the continuous
        engine's META): nothing the writer sends can reach the process before them.

        Raises ValueError when ``channel`` (0-255) is read by another decoder already, or the
        decoder cannot be imported by name in another process."""
        target = decoder_target(decoder)
        if not 0 <= channel <= 255:
            raise ValueError(f"record channel {channel}: expected 0-255")
        known = self._joined.get(channel, (None,))[0]
        if known is not None and known != target:
            raise ValueError(f"record channel {channel}: read by {known}, a writer asked for {target}")
        self._joined[channel] = (target, bytes(preamble))
        sender = self.sender()
        if not sender.send(_decoder_message(channel, target, preamble), 0):
            LOGGER.error("tokentrace: the span exporter process did not get the name of channel %d's decoder "
                         "(%s): that channel's spans are counted as dropped", channel, target)
        return sender

    def sender(self) -> RecordSender:
        """A sender for one more writing thread whose decoder joined already (or for messages of
        entries the process reads without one, e.g. a test's): its own counters, the same
        socket (a SEQPACKET send is one atomic message)."""
        sender = RecordSender(self)
        self._senders.append(sender)
        return sender

    def send(self, message: memoryview, units: int) -> bool:
        """The first sender's :meth:`RecordSender.send` (the engine thread's)."""
        return self._first.send(message, units)

    @property
    def sent_units(self) -> int:
        """Spans the messages sent stand for, summed over the senders."""
        return sum(s.sent_units for s in self._senders)

    @property
    def dropped_units(self) -> int:
        """Spans of messages dropped on the sending side, summed over the senders."""
        return sum(s.dropped_units for s in self._senders)

    @property
    def dropped_messages(self) -> int:
        return sum(s.dropped_messages for s in self._senders)

    # --- monitoring and restarts -------------------------------------------------------------
    def _died(self, why: str) -> None:
        """The child is gone: the writers' messages are dropped (counted) until a new one runs."""
        with self._lock:
            if self.dead or self._stopped:
                self.dead = self.dead or not self._stopped
                return
            self.dead = True
        with self._flushed:  # a flush() waiting on the dead child returns now, not at its timeout
            self._flushed.notify_all()
        if self.restart:
            LOGGER.error("tokentrace: the span exporter process (pid %s) %s; serving goes on, a new one is "
                         "started (the spans sent meanwhile are counted as dropped)", self.pid, why)
        else:
            LOGGER.error("tokentrace: tracing stopped: the span exporter process (pid %s) %s; serving goes on, "
                         "the spans sent after this are counted as dropped", self.pid, why)

    @property
    def pid(self) -> int | None:
        """The exporter process's pid (detached: None until its first report, sent once it has
        started, ~1 s)."""
        return self._pid

    def _alive(self) -> bool:
        """The child still runs (detached: its control socket is open and it was not killed)."""
        return not self.dead if self.detached else self.process.poll() is None

    def _watch(self) -> None:
        """The monitor thread: reads the child's reports, notices its death, restarts it."""
        while not self._stopped:
            if self._watch_one() or not self.restart or not self._restart_after_backoff():
                return

    def _watch_one(self) -> bool:
        """Watch the current child until it ends: True when it ended as asked (its final report,
        or a stop), False when it died."""
        while not self._stopped:
            if self.dead:  # a writer's send found its socket closed
                return False
            try:
                if self._control.poll(0.2):
                    report = self._control.recv()
                    self._report = report
                    self._pid = report.get("pid", self._pid)
                    self._started.set()
                    if report.get("flushed") is not None:
                        with self._flushed:
                            self._flushed.notify_all()
                    if report.get("final"):
                        return True
            except (EOFError, OSError, ValueError) as exc:
                if self.detached and isinstance(exc, (EOFError, OSError)) and not self._stopped:
                    self._died("closed its socket")  # (detached: no process of ours to poll)
                    return False
            if self.detached:
                self.process.poll()  # reaps the process started, which exits once it has forked
                continue
            if self.process.poll() is not None and not self._stopped:
                self._died(f"exited with code {self.process.returncode}")
                return False
        return True

    def _restart_after_backoff(self) -> bool:
        """Wait (``RESTART_DELAYS_S``: longer after each death in a row, and so that at most
        ``RESTARTS_PER_MINUTE`` start in any minute), then start a new child. False when
        stopped meanwhile, or when the new child cannot be started (tracing stays off)."""
        now = time.monotonic()
        while self._restart_times and now - self._restart_times[0] > 60.0:
            self._restart_times.popleft()
        delay = RESTART_DELAYS_S[min(len(self._restart_times), len(RESTART_DELAYS_S) - 1)]
        if len(self._restart_times) >= RESTARTS_PER_MINUTE:
            delay = max(delay, 60.0 - (now - self._restart_times[0]))
        if self._stopping.wait(delay):
            return False
        with self._lock:
            if self._stopped:
                return False
            self._fold_dead_child()
            old_sock, old_control, old_pid = self._sock, self._control, self.pid
            try:
                self._spawn()
            except OSError as exc:
                LOGGER.error("tokentrace: tracing stopped: a new span exporter process could not be started (%s)", exc)
                return False
            self.restarts += 1
            self._restart_times.append(time.monotonic())
            self.dead = False
        for closing in (old_sock, old_control.sock):
            closing.close()
        if self.detached and old_pid is not None:  # a detached child that lost its sockets exits by itself
            _kill_quietly(old_pid)
        LOGGER.warning("tokentrace: span exporter process restarted (pid %s, restart %d); %d spans lost so far",
                       self.pid, self.restarts, self._lost_before)
        return True

    def _fold_dead_child(self) -> None:
        """Add the dead child's counts to the earlier ones': its exporters' (what it had not
        exported is dropped) and what it was sent and never built."""
        report = self._report
        in_transit = max(0, self.sent_units - self._sent_base - int(report.get("received", 0)))
        self._lost_before += in_transit + int(report.get("malformed_units", 0)) + int(report.get("lost_units", 0))
        for c in report.get("counts", []):
            past = self._past.setdefault(str(c["name"]), [0] * 6)
            for i, value in enumerate((c["submitted"], c["exported"], c["failed"], c["dropped"] + c["pending"],
                                       c["batches_exported"], c["batches_failed"])):
                past[i] += int(value)

    def counts(self) -> list[ExportCounts]:
        """The children's exporters' counts, plus spans that never reached one or were never
        built (module docstring)."""
        report = self._report
        in_transit = max(0, self.sent_units - self._sent_base - int(report.get("received", 0)))
        gone = self.dead or self._stopped
        lost = (self.dropped_units + int(report.get("malformed_units", 0)) + int(report.get("lost_units", 0))
                + self._lost_before + (in_transit if gone else 0))
        pending_extra = 0 if gone else in_transit
        rows = [ExportCounts(**{k: v for k, v in c.items() if k != "lost"}) for c in report.get("counts", [])]
        names = {r.name for r in rows}
        rows += [ExportCounts(name, 0, 0, 0, 0, 0, 0, 0, None) for name in self._past if name not in names]
        rows = [_plus(r, self._past.get(r.name)) for r in rows]
        if not rows:
            rows = [ExportCounts(self.name, 0, 0, 0, 0, 0, 0, 0, None)]
        first = rows[0]
        note = "exporter process died" if self.dead else first.last_error
        rows[0] = ExportCounts(f"{self.name}:{first.name}", first.submitted + lost + pending_extra, first.exported,
                               first.failed, first.dropped + lost, first.pending + pending_extra,
                               first.batches_exported, first.batches_failed, note)
        return rows

    def wait_started(self, timeout_s: float = 30.0) -> bool:
        """Wait until the child has made its exporters and sent its first report (~0.3-1 s
        after start: a fresh interpreter imports the OpenTelemetry SDK). False on timeout."""
        return self._started.wait(timeout_s)

    def flush(self, timeout_s: float = 30.0) -> bool:
        """Wait until the child has built and exported every message sent so far (benchmarks,
        tests; serving never calls this). False on timeout or a dead child."""
        if self.dead or self._stopped:
            return False
        with self._flushed:  # the order's number taken under the lock: two flushes never share one
            self._flushes += 1
            n = self._flushes
            self._control.send({"flush": n, "timeout_ms": int(timeout_s * 1000)})
            return self._flushed.wait_for(lambda: self._report.get("flushed") == n or self.dead, timeout_s) \
                and not self.dead

    def health(self) -> dict[str, Any]:
        """For /health: alive or not, restarts, what was dropped on the way, and the keep
        policy's decisions (requests by reason, ``summary``: not kept whole; ``forced``: decided
        early by the memory bound; None without a policy)."""
        return {"pid": self.pid, "alive": self._alive(), "dead": self.dead, "restarts": self.restarts,
                "keep": self._report.get("keep"),
                "dropped_messages": self.dropped_messages, "dropped_spans": self.dropped_units,
                "malformed_messages": self._report.get("malformed", 0)}

    def stop(self, timeout_s: float = 10.0) -> list[ExportCounts]:
        """Ask the child to drain, flush and report within ``timeout_s``; kill it past that.
        No child is started after this (a restart waiting for its turn is called off)."""
        self._stopping.set()
        if not self.dead and self._alive():
            try:
                self._control.send({"stop": max(0.5, timeout_s - 1.0)})
            except OSError:
                pass
            self._monitor.join(timeout_s)
        with self._lock:  # (a restart in progress finishes first: its child is the one stopped)
            self._stopped = True
        try:
            self.process.wait(1.0)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait(1.0)
        if self.detached and not self._report.get("final") and self._pid is not None:  # no final report in time
            _kill_quietly(self._pid)
        self._sock.close()
        self._control.sock.close()
        return self.counts()


class RecordSender:
    """One writing thread's side of the exporter socket; never waits (see the module docstring)."""

    __slots__ = ("_owner", "sent_units", "dropped_units", "dropped_messages")

    def __init__(self, owner: ExporterProcess) -> None:
        self._owner = owner
        self.sent_units = 0  # spans the messages sent stand for
        self.dropped_units = 0  # ... and those dropped here (full socket, dead exporter)
        self.dropped_messages = 0

    def send(self, message: bytes | memoryview, units: int) -> bool:
        """Send one message standing for ``units`` spans; never waits. False when dropped."""
        owner = self._owner
        if owner.dead:
            self.dropped_units += units
            self.dropped_messages += 1
            return False
        try:
            owner._sock.sendmsg((units.to_bytes(4, "little"), message))  # one packet, no joined copy
        except OSError as exc:
            # a full buffer (EAGAIN) or one message over the socket's limit (EMSGSIZE) drops this
            # message, counted; only a closed or reset socket ends tracing
            if not (isinstance(exc, BlockingIOError) or exc.errno in (errno.EMSGSIZE, errno.ENOBUFS)):
                owner._died(f"its socket failed ({errno.errorcode.get(exc.errno or 0, exc.errno)})")
            self.dropped_units += units
            self.dropped_messages += 1
            return False
        self.sent_units += units
        return True


def _decoder_message(channel: int, target: str, preamble: bytes | memoryview) -> bytes:
    """The message a writer's join sends first: its DECODER entry, then its preamble."""
    writer = RecordWriter(_DECODER_ROOM + len(preamble))
    writer.decoder(channel, target)
    return bytes(writer.take()) + bytes(preamble)


def _plus(row: ExportCounts, past: list[int] | None) -> ExportCounts:
    """``row`` with an earlier child's counts of the same exporter added."""
    if not past:
        return row
    return ExportCounts(row.name, row.submitted + past[0], row.exported + past[1], row.failed + past[2],
                        row.dropped + past[3], row.pending, row.batches_exported + past[4],
                        row.batches_failed + past[5], row.last_error)


def _kill_quietly(pid: int) -> None:
    try:
        os.kill(pid, signal.SIGKILL)
    except OSError:
        pass
