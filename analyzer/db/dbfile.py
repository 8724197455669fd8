"""What a ``--db`` path is, checked before DuckDB opens it: a DuckDB database file, or not.

DuckDB 2.0 opens some files that are not databases without complaint (a ``.csv`` path gives
an empty, read-only in-memory catalog: a load into it "succeeds" and stores nothing), and
ends in a multi-line ``IOException`` for others (an empty file, a missing folder). Every
caller that opens a database file by path goes through :func:`check_database_path` first,
so a wrong path is one line naming the file and what it is, and the file is never touched.

A DuckDB database file carries the magic bytes ``DUCK`` at offset 8 (its main header).
"""

from __future__ import annotations

import os
from pathlib import Path

from analyzer.errors import DatabaseFileError

__all__ = ["DUCKDB_MAGIC", "check_database_path", "describe_file", "is_parquet_dump"]

DUCKDB_MAGIC = b"DUCK"
_MAGIC_OFFSET = 8
LOAD_HINT = "load traces first with tokentrace load"

# (leading bytes, what the file is)
_SIGNATURES: tuple[tuple[bytes, str], ...] = (
    (b"PAR1", "a Parquet file"),
    (b"SQLite format 3\x00", "a SQLite database"),
    (b"\x1f\x8b", "a gzip file"),
    (b"\x28\xb5\x2f\xfd", "a zstd file"),
    (b"PK\x03\x04", "a zip archive"),
    (b"\x89HDF", "an HDF5 file"),
    (b"ARROW1", "an Arrow IPC file"),
)


def is_parquet_dump(path: str | Path) -> bool:
    """True for a folder laid out as ``tokentrace export`` writes it (``spans/`` holding
    Parquet files, at any depth), or any folder whose files are Parquet."""
    root = Path(path)
    if not root.is_dir():
        return False
    spans = root / "spans"
    if spans.is_dir() and next(spans.glob("**/*.parquet"), None) is not None:
        return True
    return next(root.glob("**/*.parquet"), None) is not None


def describe_file(path: str | Path) -> str:
    """What a file that is not a DuckDB database looks like, in a few words ("a Parquet
    file", "a text file (CSV)", "an empty file", ...), from its first bytes and suffix."""
    p = Path(path)
    if p.is_dir():
        return "a Parquet dump folder" if is_parquet_dump(p) else "a folder"
    if not p.exists():
        return "missing"
    if not p.is_file():
        return "not a regular file"
    try:
        with open(p, "rb") as fh:
            head = fh.read(4096)
    except OSError as exc:
        return f"unreadable ({exc.strerror})"
    if not head:
        return "an empty file"
    if head[_MAGIC_OFFSET : _MAGIC_OFFSET + 4] == DUCKDB_MAGIC:
        return "a DuckDB database"
    for magic, what in _SIGNATURES:
        if head.startswith(magic):
            return what
    try:
        text = head.decode("utf-8")
    except UnicodeDecodeError:
        # a multi-byte character cut at the 4096-byte boundary is still text
        try:
            text = head[:-3].decode("utf-8")
        except UnicodeDecodeError:
            return "a binary file"
    stripped = text.lstrip()
    suffix = p.suffix.lower()
    if stripped.startswith(("{", "[")):
        return "a JSON file"
    if suffix in (".csv", ".tsv"):
        return f"a text file ({suffix[1:].upper()})"
    return "a text file"


def _is_duckdb(path: Path) -> bool:
    try:
        with open(path, "rb") as fh:
            head = fh.read(_MAGIC_OFFSET + 4)
    except OSError:
        return False
    return head[_MAGIC_OFFSET : _MAGIC_OFFSET + 4] == DUCKDB_MAGIC


def check_database_path(path: str | Path, *, for_write: bool) -> None:
    """Raise :class:`DatabaseFileError` (one line naming the path) unless ``path`` is a
    DuckDB database file, or (``for_write``) a new file in an existing, writable folder.

    Read: a missing path, a folder (a Parquet dump gets the hint to use ``--parquet``) and
    any file that is not a DuckDB database are errors. Write: an existing path must be a
    DuckDB database (an empty file too is refused: it holds nothing, and DuckDB cannot open
    it), and a new file needs its folder to exist. The file is never opened for writing here.
    """
    p = Path(path)
    if p.is_dir():
        if is_parquet_dump(p):
            use = (f"query it in place with --parquet {p}, or load it: tokentrace load {p} --db traces.duckdb"
                   if not for_write else f"give a database file to write, e.g. tokentrace load {p} --db traces.duckdb")
            raise DatabaseFileError(f"{p}: a Parquet dump folder, not a DuckDB database file ({use})")
        raise DatabaseFileError(f"{p}: a folder, not a DuckDB database file")
    if p.exists():
        if not p.is_file():
            raise DatabaseFileError(f"{p}: not a regular file, not a DuckDB database")
        if not _is_duckdb(p):
            what = describe_file(p)
            left = "; left untouched" if for_write else ""
            hint = ""
            if what == "a Parquet file":
                hint = " (a Parquet dump folder is read with --parquet DIR; files load with tokentrace load FILE --db DB)"
            elif what == "an empty file":
                hint = " (remove it, or give another --db)" if for_write else f" ({LOAD_HINT})"
            raise DatabaseFileError(f"{p}: {what}, not a DuckDB database{left}{hint}")
        if for_write and not os.access(p, os.W_OK):
            raise DatabaseFileError(f"{p}: not writable (permission denied)")
        return
    if not for_write:
        raise DatabaseFileError(f"{p}: no such database; {LOAD_HINT}")
    parent = p.parent if str(p.parent) else Path(".")
    if not parent.exists():
        raise DatabaseFileError(f"{p}: folder {parent} does not exist (create it first)")
    if not parent.is_dir():
        raise DatabaseFileError(f"{p}: {parent} is not a folder")
    if not os.access(parent, os.W_OK | os.X_OK):
        raise DatabaseFileError(f"{p}: cannot create a file in {parent} (permission denied)")
