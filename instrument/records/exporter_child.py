"""The span exporter process itself: records in, spans out (instrument/records/exporter_process.py
starts it and is its owner).

``python -m instrument.records.exporter_child SETTINGS_JSON``, a fresh interpreter: none of
the parent's threads, locks or ``__main__`` come along; the records socket and the control
socket are passed as file descriptors. It builds a TracerProvider with the parent's resource
and the same exporters, feeds each message to its router (instrument/records/router.py) and
answers the parent's orders on the control socket (module docstring of exporter_process.py).
"""

from __future__ import annotations

import json
import logging
import os
import select
import signal
import socket
import sys
import threading
import time
from collections.abc import Callable
from typing import Any

__all__ = ["Control", "main"]

LOGGER = logging.getLogger("tokentrace.export")
REPORT_EVERY_S = 0.5
_RECV_BYTES = 1 << 22


class Control:
    """JSON messages over a SOCK_SEQPACKET socket (one message per packet)."""

    def __init__(self, sock: socket.socket) -> None:
        self.sock = sock

    def send(self, obj: Any) -> None:
        self.sock.sendall(json.dumps(obj).encode())

    def poll(self, timeout: float = 0.0) -> bool:
        # poll(), not select(): a process with 1,024 or more files open (vLLM's engine core) has
        # descriptor numbers select() refuses
        waiter = select.poll()
        waiter.register(self.sock, select.POLLIN)
        return bool(waiter.poll(timeout * 1000))

    def recv(self) -> Any:
        data = self.sock.recv(1 << 20)
        if not data:
            raise EOFError("control socket closed")
        return json.loads(data)


def _child_main(sock: socket.socket, control: Control, settings: dict[str, Any]) -> None:
    """The exporter process's loop (runs in the child): make the provider, then build the
    spans of every message on ``sock`` and answer the parent's orders on ``control`` (flush,
    stop; a count report every ``REPORT_EVERY_S``) until told to stop or left alone, then stop."""
    # the parent decides when to stop (stop(), or its end closing the control socket): a
    # SIGINT / SIGTERM sent to the whole process group or cgroup must not cut the export short
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    from instrument.otel.export_health import export_health
    from instrument.records.router import Router

    provider = _child_provider(settings)
    router = Router(provider)  # each entry to the decoder its writer named (DECODER entries)
    received = malformed = malformed_units = 0
    buf = bytearray(_RECV_BYTES)
    # non-blocking: a socket with a timeout waits for data before every receive, MSG_DONTWAIT or
    # not (CPython), which made each flush order cost two 0.1 s waits; select() does the waiting
    sock.setblocking(False)

    def report(final: bool = False, flushed: int | None = None) -> bool:
        """Send the counts to the parent; False when it is gone (its end of the socket closed)."""
        counts = [c.as_dict() for c in export_health(provider)]
        stage = getattr(provider, "_tokentrace_keep_stage", None)  # the keep policy's, when one is set
        keep = {**stage.kept, "forced": stage.forced} if stage else None
        steps = getattr(provider, "_tokentrace_step_keeper", None)  # engine_step spans under the policy
        if keep is not None and steps is not None:
            keep["engine_steps"] = steps.counts()
        try:
            control.send({"pid": os.getpid(), "counts": counts, "received": received, "malformed": malformed,
                          "malformed_units": malformed_units,
                          "unknown_slots": router.unknown_slots, "lost_units": router.lost_units,
                          "keep": keep, "final": final, "flushed": flushed})
        except OSError:  # (BrokenPipeError, ConnectionResetError): killed between our poll and this send
            return False
        return True

    def drain() -> bool:
        """Build the spans of one waiting message; False when none was waiting."""
        nonlocal received, malformed, malformed_units
        try:
            n = sock.recv_into(buf, 0, socket.MSG_DONTWAIT)
        except BlockingIOError:
            return False
        except ConnectionResetError:  # the sender's end was reset: nothing more to read
            return False
        if n == 0:
            return False
        message = memoryview(buf)[:n]
        units = int.from_bytes(message[:4], "little")
        received += units
        try:
            router.feed(message[4:])
        except Exception:  # noqa: BLE001 - one bad message must not stop the exporter
            malformed += 1
            malformed_units += units  # counted as dropped (what it built before failing: exported too)
        return True

    waiter = select.poll()  # (not select(): see Control.poll)
    sock_fd, control_fd = sock.fileno(), control.sock.fileno()
    waiter.register(sock_fd, select.POLLIN)
    waiter.register(control_fd, select.POLLIN)
    # at once: a detached child's pid reaches the parent this way
    stop_timeout = None if report() else _sender_gone(drain, router, settings.get("sender_pid", 0))["stop"]
    last = time.monotonic()
    while stop_timeout is None:
        # wait for a message or an order, whichever comes first (a flush order is answered at
        # once, not after a receive times out), at most until the next report is due
        wait = max(0.0, REPORT_EVERY_S - (time.monotonic() - last))
        ready = {fd for fd, _ in waiter.poll(wait * 1000)}
        if ready and not drain() and sock_fd in ready:  # readable and empty: the parent closed it
            ready.add(control_fd)
        if control_fd in ready:
            try:
                order = control.recv()
            except (EOFError, ConnectionResetError):  # the serving process is gone: flush what came and leave
                order = _sender_gone(drain, router, settings.get("sender_pid", 0))
            if "flush" in order:  # everything sent before the order, built and exported
                while drain():
                    pass
                provider.force_flush(int(order["timeout_ms"]))
                if not report(flushed=order["flush"]):
                    order = _sender_gone(drain, router, settings.get("sender_pid", 0))
                else:
                    last = time.monotonic()
                    continue
            stop_timeout = float(order.get("stop", 5.0))
        if stop_timeout is None and time.monotonic() - last >= REPORT_EVERY_S:
            router.tick()
            if not report():  # the serving process is gone: as when its socket closes
                stop_timeout = float(_sender_gone(drain, router, settings.get("sender_pid", 0))["stop"])
            last = time.monotonic()
    _child_stop(provider, router, drain, report, stop_timeout)


def _child_provider(settings: dict[str, Any]) -> Any:
    """The exporter process's TracerProvider: the parent's resource and exporters, made here."""
    from opentelemetry.sdk.trace.sampling import ALWAYS_ON

    from instrument.otel.tracing import setup_tracing

    attrs = dict(settings["resource"])
    return setup_tracing(str(attrs.pop("service.name", "tokentrace")), exporter=settings["exporters"] or ["none"],
                         json_path=settings.get("json_path"), endpoint=settings.get("endpoint"),
                         protocol=settings.get("protocol"), instance_id=attrs.pop("service.instance.id", None),
                         resource_attributes=attrs,
                         sampler=ALWAYS_ON if settings.get("always_on") else None,
                         say_no_destination=False)  # the serving process said it


def _sender_gone(drain: Callable[[], bool], router: Any, sender_pid: int) -> dict[str, Any]:
    """The serving process closed the control socket without a stop order: build what it
    sent (all in the socket), say whether anything it held was lost, and return the stop
    order it did not send."""
    while drain():  # everything it sent is in the socket
        pass
    if router.at_rest:
        LOGGER.warning("tokentrace: the process that sent spans (pid %d) ended without stopping its exporter "
                       "process; its last message said it held nothing more: exporting all it sent, "
                       "nothing lost", sender_pid)
    else:
        LOGGER.warning("tokentrace: the process that sent spans (pid %d) ended without stopping its "
                       "exporter process (killed?) while it still held steps: exporting what it sent; "
                       "what it held after its last send is lost", sender_pid)
    return {"stop": 5.0}


def _child_stop(provider: Any, router: Any, drain: Callable[[], bool], report: Callable[..., bool],
                stop_timeout: float) -> None:
    """The exporter process's end: build what is still in the socket, shut the provider down
    (its exporters send what they hold), all within ``stop_timeout`` s, then the final report."""
    deadline = time.monotonic() + stop_timeout
    while time.monotonic() < deadline and drain():
        pass
    router.close()
    done = threading.Event()
    threading.Thread(target=lambda: (provider.shutdown(), done.set()), daemon=True).start()  # type: ignore[func-returns-value]  # called for their effects
    done.wait(max(0.1, deadline - time.monotonic()))
    report(final=True)  # (False: nobody left to read it, orphaned)


def main(argv: list[str]) -> int:
    """``python -m instrument.records.exporter_child SETTINGS_JSON`` (started by ExporterProcess)."""
    settings = json.loads(argv[0])
    if settings.get("nice"):  # this much nicer than the sender (at most 19), before forking
        try:
            os.setpriority(os.PRIO_PROCESS, 0, min(19, os.getpriority(os.PRIO_PROCESS, 0) + int(settings["nice"])))
        except OSError:
            pass
    if settings.pop("detach", False) and os.fork() > 0:  # the process started exits; its child goes on
        os._exit(0)
    sock = socket.socket(fileno=settings.pop("records_fd"))
    control = Control(socket.socket(fileno=settings.pop("control_fd")))
    _child_main(sock, control, settings)
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))

