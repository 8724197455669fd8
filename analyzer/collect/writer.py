"""Rotating OTLP/JSON lines files: one ``ExportTraceServiceRequest`` per line.

Files are named ``otlp-traces-<UTC timestamp>-<counter>.jsonl`` inside the output folder
and created exclusively (never appended to, never overwritten): a restart on the same
folder starts a new file beside the old ones, so a line cut short by a crash stays the
last line of its own file. A line is written and flushed (and fsync'ed when asked)
before :meth:`JsonlWriter.write` returns, i.e. before the sender gets its acknowledgement.
"""

from __future__ import annotations

import json
import os
import threading
import time
from pathlib import Path
from typing import IO, Any

__all__ = ["DEFAULT_ROTATE_BYTES", "FILE_PREFIX", "FILE_SUFFIX", "JsonlWriter", "fsync_dir"]

DEFAULT_ROTATE_BYTES = 64 * 1024 * 1024
FILE_PREFIX = "otlp-traces-"
FILE_SUFFIX = ".jsonl"
MAX_NAME_ATTEMPTS = 100_000  # bound on the counter search for a free file name


class JsonlWriter:
    """Thread-safe writer of JSON lines into ``out_dir``, rotating when a file would pass
    ``rotate_bytes`` (a line is never split; a line larger than the limit gets its own file)."""

    def __init__(self, out_dir: str | Path, *, rotate_bytes: int = DEFAULT_ROTATE_BYTES, fsync: bool = False) -> None:
        if rotate_bytes < 1:
            raise ValueError(f"rotate_bytes must be >= 1, got {rotate_bytes}")
        self.out_dir = Path(out_dir).resolve()
        self.rotate_bytes = rotate_bytes
        self.fsync = fsync
        self.files: list[Path] = []
        self.lines_written = 0
        self._lock = threading.Lock()
        self._stream: IO[bytes] | None = None
        self._size = 0
        self._counter = 0
        self._closed = False
        self.out_dir.mkdir(parents=True, exist_ok=True)

    def _open_next(self) -> None:
        stamp = time.strftime("%Y%m%dT%H%M%SZ", time.gmtime())
        for _ in range(MAX_NAME_ATTEMPTS):
            self._counter += 1
            path = self.out_dir / f"{FILE_PREFIX}{stamp}-{self._counter:06d}{FILE_SUFFIX}"
            if path.parent != self.out_dir:  # generated names only; this cannot happen
                raise RuntimeError(f"refusing to write outside {self.out_dir}: {path}")
            try:
                self._stream = path.open("xb")
            except FileExistsError:
                continue
            self._size = 0
            self.files.append(path)
            if self.fsync:
                fsync_dir(self.out_dir)
            return
        raise RuntimeError(f"no free file name in {self.out_dir} after {MAX_NAME_ATTEMPTS} attempts")

    def _close_current(self) -> None:
        if self._stream is None:
            return
        self._stream.flush()
        if self.fsync:
            os.fsync(self._stream.fileno())
        self._stream.close()
        self._stream = None

    def write(self, document: dict[str, Any]) -> list[str]:
        """Append ``document`` as one compact JSON line; flushed (and fsync'ed) on return.
        Returns ``[]``: every span is stored (the loader judges them later)."""
        line = (json.dumps(document, separators=(",", ":"), ensure_ascii=False) + "\n").encode("utf-8")
        with self._lock:
            if self._closed:
                raise RuntimeError("the writer is closed")
            if self._stream is not None and self._size and self._size + len(line) > self.rotate_bytes:
                self._close_current()
            if self._stream is None:
                self._open_next()
            assert self._stream is not None
            self._stream.write(line)
            self._stream.flush()
            if self.fsync:
                os.fsync(self._stream.fileno())
            self._size += len(line)
            self.lines_written += 1
        return []

    def close(self) -> None:
        """Flush and close the current file (idempotent)."""
        with self._lock:
            self._close_current()
            self._closed = True


def fsync_dir(path: Path) -> None:
    """fsync a folder, so a file created or renamed in it survives a crash (no-op where unsupported)."""
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:  # pragma: no cover - platforms without directory fds
        return
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
