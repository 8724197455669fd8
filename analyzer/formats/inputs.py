"""Input discovery and sniffing: paths, globs, directories and ``-`` (stdin); ``.gz`` and
``.zst`` (recognised by their magic bytes, not their names); which reader a stream needs.
"""

from __future__ import annotations

import glob
import gzip
import io
import re
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from analyzer.errors import LoadError

__all__ = ["INPUT_FORMATS", "InputFile", "detect_format", "expand_inputs", "open_stream"]

INPUT_FORMATS: tuple[str, ...] = ("auto", "otlp-json", "otlp-proto", "jaeger-json", "parquet")

GZIP_MAGIC = b"\x1f\x8b"
ZSTD_MAGIC = b"\x28\xb5\x2f\xfd"
PARQUET_MAGIC = b"PAR1"
STDIN = "-"


@dataclass(frozen=True)
class InputFile:
    """One input: a file, stdin (``path`` None) or a Parquet dataset directory written by export."""

    name: str
    path: Path | None
    dataset_dir: bool = False

    @property
    def size_bytes(self) -> int | None:
        if self.path is None or self.dataset_dir:
            return None
        try:
            return self.path.stat().st_size
        except OSError:
            return None


def _is_export_dir(path: Path) -> bool:
    return (path / "spans").is_dir() and any((path / "spans").rglob("*.parquet"))


def _expand_one(arg: str) -> list[InputFile]:
    if arg == STDIN:
        return [InputFile("<stdin>", None)]
    path = Path(arg)
    if path.is_dir():
        if _is_export_dir(path):
            return [InputFile(str(path), path, dataset_dir=True)]
        files = sorted(p for p in path.rglob("*") if p.is_file() and not any(part.startswith(".") for part in p.relative_to(path).parts))
        if not files:  # nothing would be loaded: say so rather than exit 0 having done nothing
            raise LoadError(arg, None, "not_found", "an empty folder (no file to load, hidden files skipped)")
        return [InputFile(str(p), p) for p in files]
    if path.is_file():
        return [InputFile(str(path), path)]
    if any(ch in arg for ch in "*?["):
        matches = sorted(glob.glob(arg, recursive=True))
        if not matches:
            raise LoadError(arg, None, "not_found", "no file matches this pattern")
        out: list[InputFile] = []
        for m in matches:
            out.extend(_expand_one(m))
        return out
    raise LoadError(arg, None, "not_found", "no such file or directory")


def expand_inputs(args: Sequence[str]) -> list[InputFile]:
    """Files to load, in order: each argument is a file, a directory (its files, sorted, or one
    Parquet dataset when it holds ``spans/``), a glob (``**`` allowed) or ``-`` for stdin."""
    out: list[InputFile] = []
    seen: set[str] = set()
    for arg in args:
        for f in _expand_one(arg):
            if f.name not in seen:
                seen.add(f.name)
                out.append(f)
    return out


def open_stream(f: InputFile) -> io.BufferedReader:
    """Open an input as a buffered binary stream, decompressing gzip or zstd (whole-file)."""
    raw: Any = sys.stdin.buffer if f.path is None else open(f.path, "rb")  # a buffered binary stream
    stream: io.BufferedReader = raw if isinstance(raw, io.BufferedReader) else io.BufferedReader(raw, buffer_size=1 << 20)
    head = stream.peek(4)[:4]
    if head[:2] == GZIP_MAGIC:
        return io.BufferedReader(gzip.GzipFile(fileobj=stream), buffer_size=1 << 20)
    if head == ZSTD_MAGIC:
        try:
            import zstandard
        except ImportError:
            raise LoadError(f.name, None, "unsupported", "zstd-compressed input needs the 'zstandard' package") from None
        reader = zstandard.ZstdDecompressor().stream_reader(stream, read_across_frames=True)
        return io.BufferedReader(reader, buffer_size=1 << 20)
    return stream


_CONSOLE = re.compile(rb'"(trace_id|span_id)"\s*:\s*"0x[0-9a-fA-F]')


def detect_format(name: str, head: bytes) -> str:
    """The reader a stream needs, from its first bytes: ``otlp-json``, ``otlp-proto``,
    ``jaeger-json`` (decided after parsing), ``parquet`` or ``empty``. Raises LoadError for
    inputs that are not traces (the SDK console exporter's text, unknown binary)."""
    stripped = head.lstrip()
    if not stripped:
        return "empty"
    if head[:4] == PARQUET_MAGIC:
        return "parquet"
    if _CONSOLE.search(head):
        raise LoadError(name, None, "not_otlp",
                        "this is the OpenTelemetry SDK ConsoleSpanExporter's text (0x ids, ISO times), not OTLP;"
                        " write traces with an OTLP file exporter (JSON lines) or the Collector's file exporter")
    first = stripped[:1]
    if first in (b"{", b"["):
        return "json"
    if len(head) >= 5 and (head[4:8] == ZSTD_MAGIC or head[4:5] == b"\x0a"):
        return "otlp-proto"
    raise LoadError(name, None, "unrecognized_input",
                    "expected OTLP/JSON (lines or a document), OTLP/protobuf (length-prefixed), Jaeger JSON or Parquet")
