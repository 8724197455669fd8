"""Run the gateway app with uvicorn in a background thread (tests, the demo, benchmarks).

Binds 127.0.0.1 on an ephemeral port by default; ``url`` is known once :meth:`start` returns.
"""

from __future__ import annotations

import threading
import time
from typing import Any

__all__ = ["GracefulServer", "ServerThread", "is_loopback"]


def is_loopback(host: str) -> bool:
    """Whether binding ``host`` only accepts local connections."""
    import ipaddress

    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def _graceful_server_class() -> Any:
    import contextlib

    import uvicorn

    from instrument.otel.shutdown import StopSignals

    class _GracefulServer(uvicorn.Server):
        """uvicorn's server, but SIGINT and SIGTERM both stop it gracefully and neither is
        re-raised afterwards (uvicorn re-raises a caught SIGTERM with the default handler,
        which kills the process before its spans are flushed: instrument/otel/shutdown.py).
        ``stop_signal`` names the signal that stopped it; ``on_listening(url)`` is called
        once the sockets listen."""

        stop_signal: str | None = None
        on_listening: Any = None

        @contextlib.contextmanager
        def capture_signals(self) -> Any:
            def stop(name: str) -> None:
                self.stop_signal = name
                self.should_exit = True

            def force(name: str) -> None:
                self.force_exit = True

            with StopSignals(stop, force):
                yield

        async def startup(self, sockets: Any = None) -> None:
            await super().startup(sockets=sockets)
            if self.started and self.on_listening is not None and self.servers:
                host, port = self.servers[0].sockets[0].getsockname()[:2]
                self.on_listening(f"http://{host}:{port}")

    return _GracefulServer


def GracefulServer(config: Any) -> Any:
    """A uvicorn ``Server`` that stops gracefully on SIGINT and SIGTERM (see ``_GracefulServer``)."""
    return _graceful_server_class()(config)


class ServerThread:
    """uvicorn serving ``app`` in a daemon thread. Use as a context manager or start()/stop()."""

    def __init__(self, app: Any, host: str = "127.0.0.1", port: int = 0, *, log_level: str = "warning") -> None:
        import uvicorn

        gateway = getattr(getattr(app, "state", None), "gateway", None)
        if gateway is not None and not is_loopback(host) and not gateway.settings.api_keys:
            raise ValueError(f"binding {host} (not loopback) needs API keys (GatewaySettings.api_keys)")
        self.config = uvicorn.Config(app, host=host, port=port, log_level=log_level, lifespan="on",
                                     timeout_graceful_shutdown=5)
        self.server = uvicorn.Server(self.config)
        self.thread = threading.Thread(target=self.server.run, name="tokentrace-uvicorn", daemon=True)
        self.host = host
        self.port: int | None = None

    @property
    def url(self) -> str:
        """Base URL, e.g. ``http://127.0.0.1:54321``."""
        return f"http://{self.host}:{self.port}"

    def start(self, timeout_s: float = 30.0) -> ServerThread:
        """Start serving; returns once the socket is listening (RuntimeError after ``timeout_s`` s)."""
        self.thread.start()
        deadline = time.monotonic() + timeout_s
        while not self.server.started:
            if not self.thread.is_alive() or time.monotonic() > deadline:
                raise RuntimeError(f"the gateway did not start on {self.host} within {timeout_s:g} s")
            time.sleep(0.01)
        self.port = self.server.servers[0].sockets[0].getsockname()[1]
        return self

    def stop(self, timeout_s: float = 15.0) -> None:
        """Ask uvicorn to exit and wait up to ``timeout_s`` seconds for the thread."""
        self.server.should_exit = True
        self.thread.join(timeout_s)

    def __enter__(self) -> ServerThread:
        return self.start()

    def __exit__(self, *exc: Any) -> None:
        self.stop()
