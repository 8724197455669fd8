"""File names, crash recovery and compaction of ``tokentrace collect --format parquet`` output.

The output folder is a Parquet dump in the layout ``tokentrace export`` writes (docs/parquet.md),
so ``tokentrace load DIR`` and ``--parquet DIR`` read it unchanged::

    DIR/spans/service_name=<svc>/date=<YYYY-MM-DD>/part-<segment>-<seq>-data_0.parquet   one per request
    DIR/spans/service_name=<svc>/date=<YYYY-MM-DD>/seg-<segment>.parquet                 a compacted segment
    DIR/span_events/...  DIR/span_links/...                                              the same names
    DIR/.tokentrace-collect/                                                             the receiver's workspace

A *segment* is a rotation unit: the parts of consecutive requests until their size reaches the
rotation limit. A closed segment's parts in one partition folder are compacted into one
``seg-<segment>.parquet`` there: written under a hidden temporary name, fsync'ed, renamed, and
only then are the parts deleted. Names that do not end in ``.parquet`` (temporaries) are never
read by the loader.

What a crash can leave, and what :func:`recover` (run at every start) does with it:

- ``.tokentrace-collect/incoming/<id>.writing/``: a request being written, never acknowledged
  and never visible: deleted.
- ``.tokentrace-collect/incoming/<id>.ready/``: a request written completely whose files were
  being moved into place (children first, spans last): the move is finished, its files named
  as parts of a new segment of this run.
- ``.seg-<segment>.parquet.tmp``: an unfinished compaction: deleted (its parts are intact).
- ``seg-<segment>.parquet`` beside parts of the same segment (killed between the rename and the
  deletes): the parts are deleted. Until then the loader sees each of those spans twice, with
  identical content.
- parts of a segment without its ``seg-`` file: the segment is compacted again.
"""

from __future__ import annotations

import os
import re
import shutil
from dataclasses import dataclass, field
from pathlib import Path

import duckdb

from analyzer.collect.writer import fsync_dir

__all__ = [
    "CHILD_FIRST_TABLES",
    "INCOMING",
    "PART_NAME",
    "Recovery",
    "SEGMENT_NAME",
    "WORKSPACE",
    "compact_group",
    "fsync_dir",
    "fsync_file",
    "part_name",
    "parts_by_folder",
    "recover",
    "segment_file_name",
]

WORKSPACE = ".tokentrace-collect"
INCOMING = "incoming"
WRITING_SUFFIX = ".writing"
READY_SUFFIX = ".ready"
# Children before spans: a request cut short while moving in leaves only events/links without
# their span, which the loader ignores (it attaches child rows to spans), never a span without them.
CHILD_FIRST_TABLES: tuple[str, ...] = ("span_links", "span_events", "spans")
SEGMENT_ID = r"\d{8}T\d{6}Z-[0-9a-f]{6}-\d{6}"
PART_NAME = re.compile(rf"^part-(?P<segment>{SEGMENT_ID})-(?P<seq>\d{{8}})-(?P<stem>\w+)\.parquet$")
SEGMENT_NAME = re.compile(rf"^seg-(?P<segment>{SEGMENT_ID})\.parquet$")
TEMP_NAME = re.compile(rf"^\.seg-{SEGMENT_ID}\.parquet\.tmp$")
REQUEST_DIR = re.compile(rf"^(?P<request>{SEGMENT_ID}-\d{{8}})(?P<state>\.writing|\.ready)$")
# The row order `tokentrace export` writes (analyzer/formats/parquet_export.py; docs/parquet.md "Rows are sorted").
ROW_ORDER = {
    "spans": "trace_id, start_ns, span_id",
    "span_events": "trace_id, span_id, event_index",
    "span_links": "trace_id, span_id, link_index",
}


def part_name(request_id: str, stem: str) -> str:
    """``part-<segment>-<seq>-<stem>.parquet`` for the file ``<stem>.parquet`` of one request."""
    return f"part-{request_id}-{stem}.parquet"


def segment_file_name(segment: str) -> str:
    return f"seg-{segment}.parquet"


def fsync_file(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _rename_new(src: Path, dst: Path) -> None:
    """Rename ``src`` to ``dst``, which must not exist (POSIX rename would replace it silently)."""
    if dst.exists():
        raise FileExistsError(f"refusing to replace {dst}")
    os.rename(src, dst)


def move_request_in(out_dir: Path, request_dir: Path, request_id: str, fsync: bool, moved: list[Path]) -> None:
    """Move a written request's files (``request_dir/<table>/<partition>/<stem>.parquet``) to
    ``out_dir/<table>/<partition>/part-<request_id>-<stem>.parquet``, children first, appending
    each final path to ``moved`` as it lands (so a caller knows what is in place even when a
    later move fails); then remove ``request_dir``. Files moved before a crash are simply not
    there any more, so finishing a move is the same call."""
    for table in CHILD_FIRST_TABLES:
        root = request_dir / table
        if not root.is_dir():
            continue
        for src in sorted(root.rglob("*.parquet")):
            folder = out_dir / src.parent.relative_to(request_dir)
            folder.mkdir(parents=True, exist_ok=True)
            dst = folder / part_name(request_id, src.stem)
            _rename_new(src, dst)
            if fsync:
                fsync_dir(folder)
            moved.append(dst)
    shutil.rmtree(request_dir)


def parts_by_folder(paths: list[Path]) -> dict[Path, list[Path]]:
    """Group part files by their partition folder (one compaction each)."""
    groups: dict[Path, list[Path]] = {}
    for p in paths:
        groups.setdefault(p.parent, []).append(p)
    return groups


def compact_group(con: duckdb.DuckDBPyConnection, out_dir: Path, folder: Path, segment: str, parts: list[Path]) -> Path:
    """Replace the ``parts`` (one segment, one partition folder) by ``seg-<segment>.parquet``.

    One part is renamed (atomic, no window); several are merged in the export's row order into
    a hidden temporary, fsync'ed, renamed, the folder fsync'ed, then the parts deleted. A crash
    at any point loses nothing (see the module docstring). Returns the compacted file.
    """
    final = folder / segment_file_name(segment)
    parts = sorted(parts)
    if len(parts) == 1:
        _rename_new(parts[0], final)
        fsync_dir(folder)
        return final
    table = folder.relative_to(out_dir).parts[0]
    temp = folder / f".{final.name}.tmp"
    files = ", ".join("'" + str(p).replace("'", "''") + "'" for p in parts)
    temp_sql = str(temp).replace("'", "''")
    con.execute(
        f"COPY (SELECT * FROM read_parquet([{files}], hive_partitioning = false) ORDER BY {ROW_ORDER[table]}) "
        f"TO '{temp_sql}' (FORMAT parquet, COMPRESSION zstd)"
    )
    fsync_file(temp)
    _rename_new(temp, final)
    fsync_dir(folder)
    for p in parts:
        p.unlink()
    fsync_dir(folder)
    return final


@dataclass
class Recovery:
    """What :func:`recover` found and did at start (counts are files or requests)."""

    requests_discarded: int = 0  # unacknowledged, never visible
    requests_completed: int = 0  # written completely; their move into place finished
    temporaries_removed: int = 0
    duplicate_parts_removed: int = 0  # parts already inside their segment's compacted file
    segments_to_compact: dict[str, list[Path]] = field(default_factory=dict)

    @property
    def anything(self) -> bool:
        return bool(self.requests_discarded or self.requests_completed or self.temporaries_removed
                    or self.duplicate_parts_removed or self.segments_to_compact)

    def summary(self) -> str:
        parts = sum(len(v) for v in self.segments_to_compact.values())
        return (f"{self.requests_completed} request(s) moved into place, {self.requests_discarded} unacknowledged "
                f"request(s) discarded, {self.duplicate_parts_removed} part(s) already compacted removed, "
                f"{self.temporaries_removed} temporary file(s) removed, {len(self.segments_to_compact)} earlier "
                f"segment(s) ({parts} part(s)) to compact")


def recover(out_dir: Path, workspace: Path, recovery_segment: str, fsync: bool) -> Recovery:
    """Bring ``out_dir`` to a clean state after any crash (idempotent; see the module docstring).

    Requests found ``.ready`` are moved in as parts of ``recovery_segment`` (a segment id of
    this run, never compacted before), so no ``seg-`` file can already claim them.
    """
    result = Recovery()
    incoming = workspace / INCOMING
    if incoming.is_dir():
        for entry in sorted(incoming.iterdir()):
            m = REQUEST_DIR.match(entry.name)
            if not m or not entry.is_dir():
                continue
            if m.group("state") == WRITING_SUFFIX:
                shutil.rmtree(entry)
                result.requests_discarded += 1
            else:
                result.requests_completed += 1
                moved: list[Path] = []
                move_request_in(out_dir, entry, f"{recovery_segment}-{result.requests_completed:08d}", fsync, moved)
    for table in CHILD_FIRST_TABLES:
        root = out_dir / table
        if not root.is_dir():
            continue
        for folder in sorted({p.parent for p in root.rglob("*") if p.is_file()}):
            names = sorted(p.name for p in folder.iterdir())
            compacted = {m.group("segment") for n in names if (m := SEGMENT_NAME.match(n))}
            changed = False
            for name in names:
                if TEMP_NAME.match(name):
                    (folder / name).unlink()
                    result.temporaries_removed += 1
                    changed = True
                    continue
                m = PART_NAME.match(name)
                if not m:
                    continue
                if m.group("segment") in compacted:
                    (folder / name).unlink()
                    result.duplicate_parts_removed += 1
                    changed = True
                else:
                    result.segments_to_compact.setdefault(m.group("segment"), []).append(folder / name)
            if changed:
                fsync_dir(folder)
    return result
