"""Where the metric queries read spans from: a tokentrace DuckDB file, or a Parquet dump.

``open_source(db=...)`` opens a database written by ``tokentrace load`` (read-only).
``open_source(parquet=DIR)`` reads a ``tokentrace export`` dump in place, with no load step:
an in-memory DuckDB gets views ``spans``, ``span_events`` and ``span_links`` over
``read_parquet('DIR/<table>/**/*.parquet', hive_partitioning=true)``, selecting the
canonical columns (analyzer.db.schema) so every adapter and query runs unchanged. The dump is
Hive-partitioned by ``service_name`` and ``date`` (UTC day of the span's start); given a
time window, the views keep only the days that can hold it (one day of margin on each side
for requests that cross midnight), so DuckDB skips the other partitions' files.
"""

from __future__ import annotations

import datetime as dt
from pathlib import Path

import duckdb

from analyzer.db.dbfile import check_database_path
from analyzer.db.schema import DEDICATED_COLUMNS, DUMP_FORMAT, FORMAT_KEY, TABLE_DDL, missing_dedicated
from analyzer.errors import DatabaseFileError, SourceError

__all__ = ["DUMP_TABLES", "open_source", "parquet_views", "utc_day_of_ns"]

DUMP_TABLES: tuple[str, ...] = ("spans", "span_events", "span_links")
LOAD_HINT = "load traces first with tokentrace load"


_COLUMNS: dict[str, list[tuple[str, str]]] = {}


def _canonical_columns(table: str, con: duckdb.DuckDBPyConnection | None = None) -> list[tuple[str, str]]:
    """(name, type) of a canonical table's columns, from its DDL (described once per process,
    on ``con`` when given: a new DuckDB instance costs tens of ms)."""
    if table not in _COLUMNS:
        own = con is None
        target = duckdb.connect(":memory:") if con is None else con
        scratch = f"tt_columns_of_{table}"
        try:
            target.execute(TABLE_DDL[table].replace(f"CREATE TABLE IF NOT EXISTS {table} (",
                                                    f"CREATE TEMP TABLE {scratch} (", 1))
            _COLUMNS[table] = [(r[0], r[1]) for r in target.execute(f"DESCRIBE temp.{scratch}").fetchall()]
        finally:
            target.execute(f"DROP TABLE IF EXISTS temp.{scratch}")
            if own:
                target.close()
    return list(_COLUMNS[table])


def _settings(con: duckdb.DuckDBPyConnection) -> duckdb.DuckDBPyConnection:
    """$TOKENTRACE_MEMORY_LIMIT and the like (analyzer.db.store.apply_settings), as a SourceError."""
    from analyzer.db.store import apply_settings

    try:
        return apply_settings(con)
    except ValueError as exc:
        con.close()
        raise SourceError(str(exc)) from None


def utc_day_of_ns(ns: int) -> str:
    """The UTC day (YYYY-MM-DD) of a nanosecond timestamp, as export's ``date`` partitions
    name it. Integer seconds: a float division would round within ~256 ns of midnight."""
    return dt.datetime.fromtimestamp(ns // 1_000_000_000, tz=dt.timezone.utc).date().isoformat()


def parquet_views(
    con: duckdb.DuckDBPyConnection, directory: str | Path, start_ns: int | None = None, end_ns: int | None = None
) -> dict[str, int]:
    """Create the dump's views in ``con``; returns the number of Parquet files per table.

    A table folder without files becomes an empty view of the canonical columns. ``start_ns`` /
    ``end_ns`` (nanoseconds since the Unix epoch) prune ``date`` partitions outside
    [start day - 1, end day + 1].
    """
    root = Path(directory)
    if not root.is_dir():
        if root.is_file():
            from analyzer.db.dbfile import describe_file

            what = describe_file(root)
            hint = f" (a database is read with --db {root})" if what == "a DuckDB database" else ""
            raise SourceError(f"{root}: {what}, not a Parquet dump folder{hint}")
        raise SourceError(f"{root}: no such directory (a tokentrace export dump with spans/, span_events/, span_links/)")
    files: dict[str, int] = {}
    for table in DUMP_TABLES:
        columns = _canonical_columns(table, con)
        found = sorted((root / table).glob("**/*.parquet")) if (root / table).is_dir() else []
        files[table] = len(found)
        if not found:
            if table == "spans":
                raise SourceError(f"{root}: no Parquet files under spans/ (is this a tokentrace export dump?)")
            cols = ", ".join(f"CAST(NULL AS {typ}) AS {name}" for name, typ in columns)
            con.execute(f"CREATE OR REPLACE VIEW {table} AS SELECT {cols} WHERE false")
            continue
        pattern = str(root / table / "**" / "*.parquet").replace("'", "''")
        source = f"read_parquet('{pattern}', hive_partitioning = true, union_by_name = true)"
        available = {r[0] for r in con.execute(f"DESCRIBE SELECT * FROM {source}").fetchall()}
        computed = _dedicated_reads(con, pattern, table, available)
        select = ", ".join(
            computed[name] if name in computed else name if name in available else f"CAST(NULL AS {typ}) AS {name}"
            for name, typ in columns
        )
        where = []
        if "date" in available and start_ns is not None:
            where.append(f"CAST(date AS DATE) >= DATE '{utc_day_of_ns(start_ns)}' - INTERVAL 1 DAY")
        if "date" in available and end_ns is not None:
            where.append(f"CAST(date AS DATE) <= DATE '{utc_day_of_ns(end_ns)}' + INTERVAL 1 DAY")
        clause = f" WHERE {' AND '.join(where)}" if where else ""
        con.execute(f"CREATE OR REPLACE VIEW {table} AS SELECT {select} FROM {source}{clause}")
    return files


def _dedicated_reads(con: duckdb.DuckDBPyConnection, pattern: str, table: str, available: set[str]) -> dict[str, str]:
    """How the view reads each dedicated column (analyzer.db.schema.DEDICATED_COLUMNS) of a
    dump table, by name: absent from the files' schema when none has it (a format-1 dump,
    written before 2026-12): ``attr_int['tokentrace.step'] AS attr_tokentrace_step``, from
    the map; ``coalesce(column, map)`` when only some files have it (a folder collected
    across an upgrade); the column alone (not in the result) when every file has it. Raises
    SourceError for a file of a newer format than this version reads."""
    formats = con.execute(
        f"SELECT decode(value) AS v, min(file_name) FROM parquet_kv_metadata('{pattern}') WHERE decode(key) = $key"
        " GROUP BY v", {"key": FORMAT_KEY}).fetchall()
    for value, file in formats:
        if not (value.isdigit() and 1 <= int(value) <= DUMP_FORMAT):
            raise SourceError(f"{file}: Parquet dump format {value!r}, newer than this tokentrace reads"
                              f" (1 to {DUMP_FORMAT}): upgrade tokentrace (pip install -U tokentrace)")
    wanted = DEDICATED_COLUMNS.get(table, ())
    if not wanted:
        return {}
    # files counted by DuckDB's own glob, as read_parquet reads them
    per_column = ", ".join(f"count(DISTINCT file_name) FILTER (WHERE name = '{c.name}')" for c in wanted)
    total, *having = con.execute(
        f"SELECT count(DISTINCT file_name), {per_column} FROM parquet_schema('{pattern}')").fetchall()[0]
    reads: dict[str, str] = {}
    for c, with_it in zip(wanted, having):
        if c.name not in available or with_it == 0:
            reads[c.name] = f"{c.from_map} AS {c.name}"
        elif with_it < total:
            reads[c.name] = f"coalesce({c.name}, {c.from_map}) AS {c.name}"
    return reads


def open_source(
    db: str | Path | None = None,
    parquet: str | Path | None = None,
    *,
    start_ns: int | None = None,
    end_ns: int | None = None,
) -> duckdb.DuckDBPyConnection:
    """An in-memory connection whose ``spans`` / ``span_events`` / ``span_links`` hold the traces.

    Exactly one of ``db`` (a DuckDB file, attached read-only; it must exist) and ``parquet`` (a
    ``tokentrace export`` directory, read in place) is given. Raises :class:`SourceError`
    with one readable line otherwise.
    """
    if (db is None) == (parquet is None):
        raise SourceError("give either a database (--db) or a Parquet dump (--parquet), not both or neither")
    if parquet is not None:
        con = _settings(duckdb.connect(":memory:"))
        # Parquet footers are read once per file, not at every bind: the adapter and metric
        # views reference `spans` dozens of times, each a read_parquet over the dump.
        con.execute("SET parquet_metadata_cache = true")
        try:
            parquet_views(con, parquet, start_ns, end_ns)
        except duckdb.Error as exc:
            con.close()
            raise SourceError(f"{parquet}: cannot read the Parquet dump: {str(exc).splitlines()[0]}") from None
        except SourceError:
            con.close()
            raise
        for extra in ("loads", "rejects"):  # present so `tokentrace sql` sees every canonical table
            con.execute(TABLE_DDL[extra].replace("CREATE TABLE IF NOT EXISTS", "CREATE TEMP TABLE"))
        return con
    path = Path(db)  # type: ignore[arg-type]  # db is given: the parquet branch returned
    try:  # a folder (a Parquet dump: use --parquet), a CSV, an empty file: one line, untouched
        check_database_path(path, for_write=False)
    except DatabaseFileError as exc:
        raise SourceError(str(exc)) from None
    # The file is attached read-only to an in-memory database: the adapter and metric views
    # are created there, so querying never writes to (or locks for writing) the user's file.
    con = _settings(duckdb.connect(":memory:"))
    try:
        con.execute("ATTACH $path AS tokentrace_db (READ_ONLY)", {"path": str(path)})
    except duckdb.Error as exc:
        con.close()
        raise SourceError(f"{path}: cannot open the database: {str(exc).splitlines()[0]}") from None
    present = {r[0] for r in con.execute(
        "SELECT table_name FROM duckdb_tables() WHERE database_name = 'tokentrace_db'").fetchall()}
    missing = [t for t in DUMP_TABLES if t not in present]
    if missing:
        con.close()
        raise SourceError(f"{path}: not a tokentrace database (no table {', '.join(missing)}); {LOAD_HINT}")
    for table in TABLE_DDL:
        if table in present:
            # a database loaded before a dedicated column existed: computed from the maps
            # (read-only here; the next `tokentrace load` into it rebuilds its tables with them)
            have = {r[0] for r in con.execute(
                "SELECT column_name FROM duckdb_columns() WHERE database_name = 'tokentrace_db'"
                " AND schema_name = 'main' AND table_name = $t", {"t": table}).fetchall()}
            extra = "".join(f", {c.from_map} AS {c.name}" for c in missing_dedicated(table, have))
            con.execute(f"CREATE VIEW {table} AS SELECT *{extra} FROM tokentrace_db.main.{table}")
        else:
            con.execute(TABLE_DDL[table].replace("CREATE TABLE IF NOT EXISTS", "CREATE TEMP TABLE"))
    return con
