"""Per-connection state of the installed views (a temp table: the data's fingerprint, the
span_events count, and whether the views read a database's derived tables), the tables
kept on the connection, and where a database's derived tables are (schema
:data:`DERIVED_SCHEMA`, written by ``tokentrace load``: analyzer/db/derived.py).

The fingerprint is the row counts of ``spans``, ``span_events``, ``span_links`` and
``loads``, the last load id and the view files' text (analyzer/db/views/install.py's module docstring).
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence

import duckdb

from analyzer.db.views.sql import view_names

__all__ = [
    "BUILDING_PREFIX",
    "CACHE_PREFIX",
    "DERIVED_SCHEMA",
    "STATE_TABLE",
    "derived_location",
    "derived_status",
    "forget_connection_views",
    "installed_span_events",
]

CACHE_PREFIX = "tt_cached_"
BUILDING_PREFIX = "tt_building_"  # a kept table being written range by range (renamed when complete)
STATE_TABLE = "tt_view_state"
#: The schema ``tokentrace load`` writes the views and their kept tables into, once per load
#: (analyzer/db/derived.py): read connections whose data has the fingerprint recorded there read
#: them instead of deriving anything (docs/tables.md, "Derived tables").
DERIVED_SCHEMA = "tokentrace_derived"
_COUNTED_TABLES = ("spans", "span_events", "span_links", "loads")


def _present(con: duckdb.DuckDBPyConnection) -> set[str]:
    """Tables and views reachable by their bare name (this database's and temp objects)."""
    return {
        r[0]
        for r in con.execute(
            "SELECT table_name FROM duckdb_tables() WHERE database_name IN (current_database(), 'temp')"
            " UNION SELECT view_name FROM duckdb_views()"
            " WHERE NOT internal AND database_name IN (current_database(), 'temp')"
        ).fetchall()
    }


def data_fingerprint(con: duckdb.DuckDBPyConnection, base: Sequence[str], derived: Sequence[str]) -> tuple[str, int]:
    """What the installed views and kept tables depend on: row counts of the canonical tables,
    the last load id and the view files' text. Also returns span_events' row count."""
    present = _present(con)
    counted = [t for t in _COUNTED_TABLES if t in present]
    parts = [f"(SELECT count(*) FROM {t})" for t in counted]
    if "loads" in present:
        parts.append("(SELECT max(load_id) FROM loads)")
    values = con.execute(f"SELECT {', '.join(parts)}").fetchall()[0] if parts else ()
    counts = dict(zip(counted, values or ()))
    digest = hashlib.sha256("\x00".join([*base, *derived]).encode()).hexdigest()[:16]
    return f"{list(values or ())}|{digest}", int(counts.get("span_events") or 0)


def state_row(con: duckdb.DuckDBPyConnection) -> tuple[str, int, str | None, str] | None:
    """(fingerprint, span_events rows, derived location or None, derived status) of the views
    installed on this connection, else None."""
    found = con.execute(
        "SELECT count(*) FROM duckdb_tables() WHERE database_name = 'temp' AND table_name = $t", {"t": STATE_TABLE}
    ).fetchall()
    if not found[0][0]:
        return None
    rows = con.execute(f"SELECT fingerprint, span_events, derived, derived_status FROM temp.{STATE_TABLE}").fetchall()
    return (rows[0][0], int(rows[0][1]), rows[0][2], rows[0][3]) if rows else None


def connection_state(con: duckdb.DuckDBPyConnection) -> tuple[str, int] | None:
    """(fingerprint, span_events rows) of the views installed on this connection, else None."""
    row = state_row(con)
    return (row[0], row[1]) if row is not None else None


def installed_span_events(con: duckdb.DuckDBPyConnection) -> int | None:
    """Rows of ``span_events`` under the views installed on this connection (counted when they
    were installed), else None."""
    row = state_row(con)
    return row[1] if row is not None else None


def cached_views(con: duckdb.DuckDBPyConnection) -> set[str]:
    """The views kept as tables for this connection: its temp tables, or, reading a database's
    derived tables, the tables kept there."""
    row = state_row(con)
    if row is not None and row[2] is not None:
        catalog = row[2].split(".")[0].strip('"')
        where, params = "database_name = $c AND schema_name = $s", {"c": catalog, "s": DERIVED_SCHEMA}
    else:
        where, params = "database_name = 'temp'", {}
    return {
        r[0][len(CACHE_PREFIX):]
        for r in con.execute(
            f"SELECT table_name FROM duckdb_tables() WHERE {where} AND starts_with(table_name, $p)",
            {**params, "p": CACHE_PREFIX},
        ).fetchall()
    }


def quoted(name: str) -> str:
    return '"' + name.replace('"', '""') + '"'


def derived_location(con: duckdb.DuckDBPyConnection, fingerprint: str) -> str | None:
    """``"catalog".tokentrace_derived`` when a database on this connection holds derived tables
    built (by ``tokentrace load``) over data with this ``fingerprint``, else None."""
    for (catalog,) in con.execute(
        "SELECT database_name FROM duckdb_tables() WHERE schema_name = $s AND table_name = $t ORDER BY 1",
        {"s": DERIVED_SCHEMA, "t": STATE_TABLE},
    ).fetchall():
        location = f"{quoted(catalog)}.{DERIVED_SCHEMA}"
        rows = con.execute(f"SELECT fingerprint FROM {location}.{STATE_TABLE}").fetchall()
        if rows and rows[0][0] == fingerprint:
            return location
    return None


def has_derived(con: duckdb.DuckDBPyConnection) -> bool:
    return bool(con.execute("SELECT count(*) FROM duckdb_tables() WHERE schema_name = $s AND table_name = $t",
                            {"s": DERIVED_SCHEMA, "t": STATE_TABLE}).fetchall()[0][0])


def derived_status(con: duckdb.DuckDBPyConnection) -> str | None:
    """How this connection's views were installed: ``"read"`` (a database's derived tables,
    nothing derived), ``"stale"`` (the database has derived tables, but of other data or of
    another tokentrace's views: derived on this connection instead), ``"none"`` (no derived
    tables: derived on this connection), or None before :func:`install_views`."""
    row = state_row(con)
    return None if row is None else row[3]


def write_state(con: duckdb.DuckDBPyConnection, fingerprint: str, events: int, derived: str | None,
                 status: str) -> None:
    con.execute(f"DROP TABLE IF EXISTS temp.{STATE_TABLE}")
    con.execute(f"CREATE TEMP TABLE {STATE_TABLE} (fingerprint VARCHAR, span_events BIGINT, derived VARCHAR,"
                " derived_status VARCHAR, search_path_before VARCHAR)")
    before = con.execute("SELECT current_setting('search_path')").fetchall()[0][0]
    con.execute(f"INSERT INTO temp.{STATE_TABLE} VALUES ($f, $e, $d, $s, $p)",
                {"f": fingerprint, "e": events, "d": derived, "s": status, "p": before})



def _drop_left_views(con: duckdb.DuckDBPyConnection) -> None:
    """On a writable connection, drop the views an earlier per-connection install left in the
    database's own schema (they read temp tables of a closed connection, and would shadow the
    derived ones). Only names the view files define; nothing on a read-only database."""
    readonly = con.execute("SELECT readonly FROM duckdb_databases() WHERE database_name = current_database()"
                           ).fetchall()
    if not readonly or readonly[0][0]:
        return
    names = sorted(view_names())
    for (name,) in con.execute(
        "SELECT view_name FROM duckdb_views() WHERE NOT internal AND database_name = current_database()"
        " AND schema_name = current_schema() AND list_contains($names, view_name)", {"names": names},
    ).fetchall():
        con.execute(f"DROP VIEW IF EXISTS {quoted(name)}")


def use_derived(con: duckdb.DuckDBPyConnection, location: str, fingerprint: str, events: int) -> None:
    """Read the derived tables at ``location``: they go last on the search path, so the
    current schema (where a writable connection creates and inserts) stays what it was and
    the canonical tables resolve first."""
    leave_derived(con)
    database = con.execute("SELECT current_database()").fetchall()[0][0]
    if location.startswith(f"{quoted(database)}."):  # a connection to that very file (not an attached copy)
        _drop_left_views(con)
    write_state(con, fingerprint, events, location, "read")
    before = con.execute("SELECT current_setting('search_path')").fetchall()[0][0]
    current = before or f"{quoted(database)}.main"
    con.execute("SET search_path = $p", {"p": f"{current},{location}"})


def forget_connection_views(con: duckdb.DuckDBPyConnection) -> None:
    """Drop what :func:`install_views` kept on this connection (its temp tables and state), so
    the next query installs afresh (and reads derived tables just built, when they fit)."""
    leave_derived(con)
    for view in cached_views(con):
        con.execute(f"DROP TABLE IF EXISTS temp.{CACHE_PREFIX}{view}")
    con.execute(f"DROP TABLE IF EXISTS temp.{STATE_TABLE}")


def leave_derived(con: duckdb.DuckDBPyConnection) -> None:
    """Undo :func:`use_derived` (the data changed on this connection): the search path as it was."""
    row = state_row(con)
    if row is None or row[2] is None:
        return
    before = con.execute(f"SELECT search_path_before FROM temp.{STATE_TABLE}").fetchall()[0][0]
    if before:
        con.execute("SET search_path = $p", {"p": before})
    else:
        con.execute("RESET search_path")
    con.execute(f"DROP TABLE IF EXISTS temp.{STATE_TABLE}")
