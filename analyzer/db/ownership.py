"""Whose database a ``--db`` file is: tokentrace writes only into a database it created.

Every write connection (:func:`analyzer.db.store.connect`, so ``load``, ``bench --db``,
``timeline --db``, ``demo``) checks an existing file first, opening it read-only, and refuses
with one line naming what it found before anything is written. A database is tokentrace's when

- it holds the marker table :data:`SCHEMA_TABLE` (written by every write connection, one
  row: the schema version and the tokentrace that wrote it first) with a version this
  tokentrace writes (:data:`SCHEMA_VERSION` or older);
- it holds no table or view at all (an empty DuckDB database: nothing in it to damage);
- it has no marker but was written by a tokentrace from before the marker: every table and
  view outside the derived schema is one of the canonical tables, ``spans`` and ``loads``
  among them, and each has every column this tokentrace writes (older ones without the
  generated dedicated columns are rebuilt with them, rows unchanged). The marker is added.

Anything else (another program's tables, a ``spans`` table of another shape, a marker from a
newer tokentrace) is a :class:`~analyzer.errors.DatabaseFileError`, the file untouched.
docs/tables.md, "Which databases tokentrace writes into".
"""

from __future__ import annotations

from importlib.metadata import PackageNotFoundError, version
from pathlib import Path

import duckdb

from analyzer.db.dbfile import check_database_path
from analyzer.db.schema import DEDICATED_COLUMNS, TABLE_DDL
from analyzer.db.views.state import DERIVED_SCHEMA
from analyzer.errors import DatabaseFileError

__all__ = ["SCHEMA_TABLE", "SCHEMA_VERSION", "check_owned", "check_writable", "write_marker"]

SCHEMA_TABLE = "tokentrace_schema"
SCHEMA_VERSION = 1  # the canonical tables as schema.TABLE_DDL creates them
_REQUIRED = ("spans", "loads")
_NAMED_AT_MOST = 5
_REFUSAL_TAIL = "; left untouched (tokentrace writes only into a new file or a database it created: give another --db)"


def _tokentrace_version() -> str:
    try:
        return version("tokentrace")
    except PackageNotFoundError:  # a checkout on the path, not installed
        return "unknown"


def write_marker(con: duckdb.DuckDBPyConnection) -> None:
    """Create the marker table (idempotent) and its one row when it has none."""
    con.execute(f"CREATE TABLE IF NOT EXISTS {SCHEMA_TABLE} (schema_version INTEGER NOT NULL, "
                "created_by VARCHAR NOT NULL)")
    if not con.execute(f"SELECT count(*) FROM {SCHEMA_TABLE}").fetchall()[0][0]:
        con.execute(f"INSERT INTO {SCHEMA_TABLE} VALUES ($v, $by)",
                    {"v": SCHEMA_VERSION, "by": f"tokentrace {_tokentrace_version()}"})


def _names(names: list[str]) -> str:
    shown = ", ".join(names[:_NAMED_AT_MOST])
    return shown + (f" and {len(names) - _NAMED_AT_MOST} more" if len(names) > _NAMED_AT_MOST else "")


def _canonical_columns() -> dict[str, set[str]]:
    """Each canonical table's stored columns (the generated dedicated ones left out)."""
    con = duckdb.connect(":memory:")
    try:
        for ddl in TABLE_DDL.values():
            con.execute(ddl)
        rows = con.execute("SELECT table_name, column_name FROM duckdb_columns() WHERE schema_name = 'main'").fetchall()
    finally:
        con.close()
    generated = {c.name for cols in DEDICATED_COLUMNS.values() for c in cols}
    columns: dict[str, set[str]] = {}
    for table, column in rows:
        if column not in generated:
            columns.setdefault(table, set()).add(column)
    return columns


def _problem(con: duckdb.DuckDBPyConnection) -> str | None:
    """What the open database is when tokentrace may not write into it ("not a tokentrace database
    (...)"), in a few words; None when it may."""
    objects = con.execute(
        "SELECT schema_name, table_name, 'table' FROM duckdb_tables() WHERE database_name = current_database() "
        "UNION ALL SELECT schema_name, view_name, 'view' FROM duckdb_views() "
        "WHERE database_name = current_database() AND NOT internal ORDER BY 1, 2").fetchall()
    objects = [(s, n, k) for s, n, k in objects if s != DERIVED_SCHEMA]
    names = [n if s == "main" else f"{s}.{n}" for s, n, _ in objects]
    if ("main", SCHEMA_TABLE, "table") in objects:
        try:
            found = con.execute(f"SELECT max(schema_version) FROM {SCHEMA_TABLE}").fetchall()[0][0]
        except duckdb.Error:
            return f"not a tokentrace database (a {SCHEMA_TABLE} table of another shape)"
        if found is not None and found > SCHEMA_VERSION:
            return (f"a tokentrace database of schema version {found}, written by a newer tokentrace "
                    f"(this one writes version {SCHEMA_VERSION})")
        return None
    if not objects:
        return None
    foreign = [name for name, (s, n, k) in zip(names, objects) if s != "main" or k != "table" or n not in TABLE_DDL]
    if foreign:
        return f"not a tokentrace database (tables or views tokentrace does not write: {_names(foreign)})"
    present = {n for _, n, _ in objects}
    canonical = _canonical_columns()
    for table in sorted(present):
        have = {r[0] for r in con.execute(
            "SELECT column_name FROM duckdb_columns() WHERE database_name = current_database() "
            "AND schema_name = 'main' AND table_name = $t", {"t": table}).fetchall()}
        lacking = sorted(canonical[table] - have)
        if lacking:
            return f"not a tokentrace database (a {table} table of another shape: no column {_names(lacking)})"
    missing_tables = [t for t in _REQUIRED if t not in present]
    if missing_tables:
        return f"not a tokentrace database (no {' or '.join(missing_tables)} table; its tables: {_names(names)})"
    return None


def check_owned(path: str) -> None:
    """Raise :class:`DatabaseFileError` (one line naming ``path`` and what it holds) unless the
    existing DuckDB database file ``path`` is one tokentrace may write into (module docstring).
    The file is opened read-only and never written."""
    try:
        con = duckdb.connect(path, read_only=True)
    except duckdb.Error as exc:  # e.g. locked by a writer in another process
        raise DatabaseFileError(f"{path}: cannot open the database: {str(exc).splitlines()[0]}") from None
    try:
        problem = _problem(con)
    finally:
        con.close()
    if problem is not None:
        raise DatabaseFileError(f"{path}: {problem}{_REFUSAL_TAIL}")


def check_writable(path: str | Path) -> None:
    """Everything a write verb checks of its ``--db`` path before opening it (a verb that works
    a while before it writes, such as ``bench --db``, calls it first): a new file in an existing,
    writable folder, or a DuckDB database tokentrace created (:func:`check_owned`)."""
    check_database_path(path, for_write=True)
    if Path(path).exists():
        check_owned(str(path))
