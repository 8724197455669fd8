"""Shared helpers for tests that run ``tokentrace collect`` as a real subprocess (kill tests)."""

from __future__ import annotations

import queue
import re
import subprocess
import sys
import threading
from pathlib import Path

TOKENTRACE = Path(sys.executable).with_name("tokentrace")
START_TIMEOUT_S = 20.0


def start_collect(out_dir: Path, *extra_args: str) -> tuple[subprocess.Popen, int, int]:
    """Start ``tokentrace collect --out out_dir`` (plus ``extra_args``) on free local ports;
    return the process and its gRPC and HTTP ports, read from its first stdout line."""
    proc = subprocess.Popen(
        [str(TOKENTRACE), "collect", "--out", str(out_dir), *extra_args, "--grpc", "127.0.0.1:0", "--http", "127.0.0.1:0"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )
    lines: queue.Queue[str] = queue.Queue()
    threading.Thread(target=lambda: lines.put(proc.stdout.readline()), daemon=True).start()  # type: ignore[union-attr]  # started with stdout=PIPE
    try:
        first = lines.get(timeout=START_TIMEOUT_S)
    except queue.Empty:
        proc.kill()
        raise AssertionError(f"collect did not report its ports within {START_TIMEOUT_S} s") from None
    found = re.search(r"grpc=127\.0\.0\.1:(\d+) http=127\.0\.0\.1:(\d+)", first)
    assert found, first + proc.stderr.read()  # type: ignore[union-attr]  # started with stderr=PIPE
    return proc, int(found.group(1)), int(found.group(2))


def stderr_lines(proc: subprocess.Popen) -> queue.Queue[str]:
    """A queue that receives every line ``proc`` writes to its (piped, text) stderr, then ""
    at its end: a reader thread, so a test can wait for a line with a timeout."""
    lines: queue.Queue[str] = queue.Queue()

    def read() -> None:
        for line in proc.stderr:  # type: ignore[union-attr]  # started with stderr=PIPE
            lines.put(line)
        lines.put("")

    threading.Thread(target=read, daemon=True).start()
    return lines
