"""``ParquetWriter``: accepted Export requests as a Parquet dump ``tokentrace load`` reads.

Each request's spans go through the loader's own OTLP/JSON mapping
(:func:`analyzer.formats.otlp_json.add_traces_data`) into an in-memory DuckDB holding the
canonical tables, and :func:`analyzer.formats.parquet_export.export_parquet` writes them, Hive-partitioned, into
a private folder. The folder is renamed ``.ready`` and its files moved into the output
(children first, spans last), and only then does :meth:`ParquetWriter.write` return, i.e. the
sender is acknowledged. Segments (rotation) and their compaction: see
:mod:`analyzer.collect.parquet_layout`.

Spans the mapping rejects (e.g. an end before the start, a malformed attribute) cannot be
stored as rows: they are reported back to the sender as rejected, with the reason. So are
later copies of a span repeated with different content in one request (an identical repeat
is stored once).
"""

from __future__ import annotations

import json
import os
import queue
import secrets
import shutil
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import duckdb

from analyzer.collect.parquet_layout import (
    INCOMING,
    READY_SUFFIX,
    WORKSPACE,
    WRITING_SUFFIX,
    Recovery,
    compact_group,
    fsync_dir,
    fsync_file,
    move_request_in,
    parts_by_folder,
    recover,
)
from analyzer.errors import TokentraceError
from analyzer.formats import stage
from analyzer.formats.canonical import EVENT_COLUMNS, LINK_COLUMNS, SPAN_COLUMNS, Reject, RowSink
from analyzer.formats.otlp_json import add_traces_data

__all__ = ["COMPACT_WAIT_S", "OutputError", "OutputInUse", "ParquetWriter", "map_request"]

LOCK_FILE = "lock"
COMPACT_WAIT_S = 600.0  # close() waits at most this long for compactions (seconds); parts stay safe either way
_TABLES = ("spans", "span_events", "span_links", "_stage_spans", "_stage_events", "_stage_links")


class OutputError(TokentraceError, ValueError):
    """The output folder cannot be prepared (created, locked or recovered)."""


class OutputInUse(OutputError):
    """Another receiver holds the output folder's lock."""


def _stderr(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip()
    return text.splitlines()[0] if text else type(exc).__name__


def _reject_text(r: Reject) -> str:
    name = None
    try:
        raw = json.loads(r.raw) if r.raw else None
        name = raw.get("name") if isinstance(raw, dict) else None
    except ValueError:
        pass
    who = f"span {name!r}" if name is not None else "a span"
    if r.span_id:
        who += f" (spanId {r.span_id})"
    return f"{who}: {r.reason}" + (f": {r.detail}" if r.detail else "")


def map_request(document: dict[str, Any]) -> tuple[list, list, list, list[str]]:
    """Canonical staging rows (spans, events, links) of one OTLP/JSON request, and one reason
    per span the mapping rejected."""
    rows: tuple[list, list, list] = ([], [], [])

    def keep(spans: list, events: list, links: list) -> None:
        rows[0].extend(spans)
        rows[1].extend(events)
        rows[2].extend(links)

    sink = RowSink("request", strict=False, flush=keep, batch_spans=sys.maxsize)
    add_traces_data(document, sink, None)
    sink.flush_now()
    return rows[0], rows[1], rows[2], [_reject_text(r) for r in sink.rejects]


class _Segment:
    def __init__(self, segment_id: str) -> None:
        self.id = segment_id
        self.parts: list[Path] = []
        self.bytes = 0
        self.requests = 0


class ParquetWriter:
    """Thread-safe writer of one Parquet part per request into ``out_dir``, rotating segments
    when their parts reach ``rotate_bytes`` (bytes) and compacting closed segments in a
    background thread. ``fsync``: fsync parts and folders before acknowledging.

    Construction takes the folder's lock (:class:`OutputInUse` if another receiver has it) and
    runs crash recovery (:func:`~analyzer.collect.parquet_layout.recover`); see ``recovery``.
    """

    def __init__(self, out_dir: str | Path, *, rotate_bytes: int, fsync: bool = False,
                 log: Callable[[str], None] = _stderr) -> None:
        if rotate_bytes < 1:
            raise ValueError(f"rotate_bytes must be >= 1, got {rotate_bytes}")
        self.out_dir = Path(out_dir).resolve()
        self.rotate_bytes = rotate_bytes
        self.fsync = fsync
        self.log = log
        self.requests_written = 0
        self.spans_repeated_identical = 0  # identical copies of a span within one request, stored once (not in the output)
        self.segments_compacted = 0
        self.compaction_errors = 0
        self._written: dict[Path, None] = {}  # an ordered set; compacted parts leave it
        self._lock = threading.Lock()
        self._closed = False
        self.workspace = self.out_dir / WORKSPACE
        self.incoming = self.workspace / INCOMING
        try:
            self.incoming.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise OutputError(f"cannot create --out {str(self.out_dir)!r}: {exc}") from None
        self._lock_fd = self._take_lock()
        try:
            self._run_token = secrets.token_hex(3)
            self._segment_counter = 0
            self._request_counter = 0
            recovery_segment = self._segment_id(0)  # counter 0: the requests a restart moves in
            try:
                self.recovery: Recovery = recover(self.out_dir, self.workspace, recovery_segment, fsync)
            except OSError as exc:
                raise OutputError(f"cannot recover {str(self.out_dir)!r} after an earlier crash: {exc}") from None
            self._segment = self._new_segment()
            from analyzer.db.store import connect

            self._con = connect(":memory:")
            stage.create_stage(self._con)
            self._schemas = stage.stage_schemas(self._con)
            self._queue: queue.Queue[tuple[str, list[Path]] | None] = queue.Queue()
            self._compactor = threading.Thread(target=self._compact_loop, name="parquet-compactor", daemon=True)
            self._compactor.start()
            for segment_id, parts in sorted(self.recovery.segments_to_compact.items()):
                self._queue.put((segment_id, parts))
        except BaseException:
            os.close(self._lock_fd)
            raise

    # -- the folder lock ------------------------------------------------------------------
    def _take_lock(self) -> int:
        fd = os.open(self.workspace / LOCK_FILE, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            import fcntl
        except ImportError:  # pragma: no cover - not POSIX: no lock
            return fd
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            os.close(fd)
            raise OutputInUse(f"--out {str(self.out_dir)!r} is in use by another tokentrace collect") from None
        return fd

    # -- writing --------------------------------------------------------------------------
    @property
    def files(self) -> list[Path]:
        """Files this writer put in the output that still exist (parts and compacted segments), in order."""
        with self._lock:
            written = list(self._written)
        return [p for p in written if p.exists()]

    def _segment_id(self, counter: int) -> str:
        """``<UTC start time>-<run token>-<counter>``: unique across restarts (the token is random)."""
        return f"{time.strftime('%Y%m%dT%H%M%SZ', time.gmtime())}-{self._run_token}-{counter:06d}"

    def _new_segment(self) -> _Segment:
        self._segment_counter += 1
        return _Segment(self._segment_id(self._segment_counter))

    def write(self, document: dict[str, Any]) -> list[str]:
        """Store one OTLP/JSON ``ExportTraceServiceRequest``; returns the reasons of spans that
        could not be stored (one string each). On return the rows are in place in the output.
        Raises OSError when they could not be written, RuntimeError after :meth:`close`."""
        spans, events, links, rejected = map_request(document)
        if not spans:
            with self._lock:
                if self._closed:
                    raise RuntimeError("the writer is closed")
            return rejected
        keys = {(row[0], row[1]) for row in spans}
        with self._lock:
            if self._closed:
                raise RuntimeError("the writer is closed")
            self._request_counter += 1
            request_id = f"{self._segment.id}-{self._request_counter:08d}"
            writing = self.incoming / f"{request_id}{WRITING_SUFFIX}"
            moved: list[Path] = []
            try:
                not_stored, repeats = self._export(spans, events, links, len(keys) < len(spans), writing)
                rejected += not_stored
                ready = writing.with_name(f"{request_id}{READY_SUFFIX}")
                os.rename(writing, ready)
                if self.fsync:
                    fsync_dir(self.incoming)
                move_request_in(self.out_dir, ready, request_id, self.fsync, moved)
            except duckdb.Error as exc:
                shutil.rmtree(writing, ignore_errors=True)
                raise OSError(f"cannot write Parquet into {self.out_dir}: {_first_line(exc)}") from exc
            except OSError:
                shutil.rmtree(writing, ignore_errors=True)
                raise
            finally:  # what landed belongs to this segment, acknowledged or not (see parquet_layout)
                self._written.update(dict.fromkeys(moved))
                self._segment.parts.extend(moved)
            self.requests_written += 1
            self.spans_repeated_identical += repeats  # only once the request is stored (like spans_written)
            self._segment.bytes += sum(p.stat().st_size for p in moved)
            self._segment.requests += 1
            if self._segment.bytes >= self.rotate_bytes:
                self._rotate()
        return rejected

    def _export(self, spans: list, events: list, links: list, repeated_keys: bool, target: Path) -> tuple[list[str], int]:
        """Stage the rows, keep one copy per span, export; returns reasons for conflicting
        repeats and the number of identical repeats stored once."""
        from analyzer.formats.parquet_export import export_parquet

        con = self._con
        rejected: list[str] = []
        repeats = 0
        try:
            stage.append_stage(con, self._schemas, spans, events, links)
            if repeated_keys:
                result = stage.commit_stage(con, 0)
                assert result is not None  # insert_if_conflicts (the default): a result
                repeats = result.duplicates_identical
                rejected = [f"span (spanId {s}) of trace {t}: conflicting_duplicate: same ids as an earlier span "
                            "in this request, different content" for _line, _o, t, s, _raw in result.conflicting]
            else:
                span_cols = ", ".join(SPAN_COLUMNS)
                con.execute(f"INSERT INTO spans ({span_cols}, load_id) SELECT {span_cols}, 0 FROM _stage_spans")
                for table, staged, columns in (("span_events", "_stage_events", EVENT_COLUMNS),
                                               ("span_links", "_stage_links", LINK_COLUMNS)):
                    cols = ", ".join(columns)
                    con.execute(f"INSERT INTO {table} ({cols}) SELECT {cols} FROM {staged}")
            export_parquet(con, target)
        finally:
            for table in _TABLES:
                con.execute(f"DELETE FROM {table}")
        if self.fsync:
            for path in target.rglob("*.parquet"):
                fsync_file(path)
        return rejected, repeats

    def _rotate(self) -> None:
        """Close the current segment (lock held): queue it for compaction, start a new one."""
        if self._segment.parts:
            self._queue.put((self._segment.id, list(self._segment.parts)))
        self._segment = self._new_segment()

    # -- compaction -----------------------------------------------------------------------
    def _compact_loop(self) -> None:
        con = duckdb.connect(":memory:")
        try:
            while True:
                item = self._queue.get()
                if item is None:
                    return
                self._compact_segment(con, *item)
        finally:
            con.close()

    def _compact_segment(self, con: duckdb.DuckDBPyConnection, segment_id: str, parts: list[Path]) -> None:
        ok = True
        for folder, group in sorted(parts_by_folder(parts).items()):
            present = [p for p in group if p.exists()]
            if not present:
                continue
            try:
                final = compact_group(con, self.out_dir, folder, segment_id, present)
            except Exception as exc:  # noqa: BLE001 - OSError, duckdb.Error or a bug: the parts are intact either way
                ok = False
                self.compaction_errors += 1
                self.log(f"warning: could not compact segment {segment_id} in {folder} (its {len(present)} part "
                         f"file(s) stay and load as they are): {type(exc).__name__}: {_first_line(exc)}")
                continue
            with self._lock:
                for p in present:
                    self._written.pop(p, None)
                self._written[final] = None
        if ok:
            self.segments_compacted += 1

    def close(self) -> None:
        """Close the current segment, compact every closed one (waits up to ``COMPACT_WAIT_S``
        seconds; what is left stays as parts and is compacted at the next start), release the
        folder (idempotent)."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
            self._rotate()
            self._queue.put(None)
        self._compactor.join(COMPACT_WAIT_S)
        if self._compactor.is_alive():
            self.log(f"warning: compaction still running after {COMPACT_WAIT_S:.0f} s; "
                     "its parts stay and are compacted at the next start")
        self._con.close()
        os.close(self._lock_fd)
