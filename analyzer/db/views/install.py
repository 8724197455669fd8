"""The views of ``queries/views/`` on a DuckDB connection: installing them, keeping the views
the metric queries read as tables, and reading a database's derived tables.

The adapter files are installed in file-name order, then the unions ``request_facts`` and
``request_chunks`` (:data:`UNIONED_VIEWS`), then the derived files (header line ``-- install:
after request_facts``). Per connection they are installed once, and the request-level views a
query needs (:data:`MATERIALIZED_VIEWS`) are kept as temp tables, so the next query reads them
instead of deriving them from the spans again; the per-chunk ones too, at every size (beyond
DuckDB's ``memory_limit`` their blocks are evicted to its ``temp_directory``). Both are keyed
on the data: the row counts of ``spans``, ``span_events``, ``span_links`` and ``loads`` (every
``tokentrace load`` appends a ``loads`` row) and the view files' text. A change that keeps
every count (an UPDATE, a DELETE and an INSERT of as many rows) must call
:func:`install_views` with ``refresh=True``. A database written by ``tokentrace load`` holds
the same views and kept tables in its schema :data:`DERIVED_SCHEMA` (analyzer/db/derived.py):
a connection over the same data reads those and derives nothing.

This module installs the views; the files and their header lines are analyzer/db/view_sql.py,
the per-connection state and the derived tables' location analyzer/db/view_state.py, and the
kept tables analyzer/db/view_keep.py. analyzer.query.runner re-exports the public names; the query
files themselves are its concern.
"""


from __future__ import annotations

from typing import Sequence

import duckdb

from analyzer.db.view_keep import (
    CHUNK_VIEWS,
    MATERIALIZE_MAX_EVENTS,
    MATERIALIZED_VIEWS,
    RANGE_EVENTS,
    _keep,
    materialize_views,
    request_key_ranges,
)
from analyzer.db.view_sql import (
    UNIONED_VIEWS,
    kept_order,
    kept_views,
    queries_dir,
    union_view_sql,
    view_files,
    view_names,
)
from analyzer.db.view_state import (
    CACHE_PREFIX,
    DERIVED_SCHEMA,
    STATE_TABLE,
    _cached,
    _fingerprint,
    _has_derived,
    _leave_derived,
    _state_row,
    _use_derived,
    _write_state,
    derived_location,
    derived_status,
    forget_connection_views,
)

__all__ = [
    "CHUNK_VIEWS",
    "DERIVED_SCHEMA",
    "MATERIALIZED_VIEWS",
    "MATERIALIZE_MAX_EVENTS",
    "RANGE_EVENTS",
    "UNIONED_VIEWS",
    "derived_location",
    "derived_status",
    "forget_connection_views",
    "install_views",
    "kept_order",
    "kept_views",
    "materialize_views",
    "queries_dir",
    "request_key_ranges",
    "union_view_sql",
    "view_files",
    "view_names",
]


def install_views(con: duckdb.DuckDBPyConnection, *, refresh: bool = False, persist: bool = False) -> None:
    """Create or replace the adapter views, then ``request_facts`` and ``request_chunks``, then
    the derived views (files whose header has the line ``-- install: after request_facts``:
    per-request metrics, gaps and clock offsets, computed once over the unions).

    The adapters' ``-- keep:`` views (their request spans) are kept as temp tables, and an
    adapter whose ``<prefix>_request_spans`` has no row is left out of the unions (it would
    add no row). Does nothing when this connection's views were installed over the same data
    (see the module docstring); otherwise, or with ``refresh``, drops every kept table first.

    When a database on the connection holds derived tables (``tokentrace load``,
    :data:`DERIVED_SCHEMA`) built over data with the same fingerprint, nothing is created or
    derived: the derived schema goes last on the search path and every view and kept table is
    read from there (``refresh`` skips them). ``persist`` (analyzer.db.derived.build_derived
    only): create the views and keep their tables in the current schema, not in ``temp``, and
    write no per-connection state."""
    base, derived = view_files()
    fingerprint, events = _fingerprint(con, base, derived)
    if persist:
        _install(con, base, derived, persist=True)
        return
    state = _state_row(con)
    if not refresh and state is not None and state[0] == fingerprint:
        return
    if not refresh:
        location = derived_location(con, fingerprint)
        if location is not None:
            _use_derived(con, location, fingerprint, events)
            return
    _leave_derived(con)
    for view in _cached(con):
        con.execute(f"DROP TABLE IF EXISTS temp.{CACHE_PREFIX}{view}")
    con.execute(f"DROP TABLE IF EXISTS temp.{STATE_TABLE}")
    status = "stale" if _has_derived(con) else "none"
    _install(con, base, derived, persist=False)
    _write_state(con, fingerprint, events, None, status)


def _install(con: duckdb.DuckDBPyConnection, base: Sequence[str], derived: Sequence[str], *, persist: bool) -> None:
    for text in base:
        con.execute(text)
    rows = {view: _keep(con, view, persist=persist) for view in kept_views(base)}
    views = {
        row[0]
        for row in con.execute(
            "SELECT view_name FROM duckdb_views() WHERE NOT internal AND schema_name = current_schema()"
            " AND database_name = current_database()"
        ).fetchall()
    }
    for union in UNIONED_VIEWS:
        reference = f"tt_{union}"
        columns = [
            row[0]
            for row in con.execute(
                "SELECT column_name FROM duckdb_columns() WHERE table_name = $t AND schema_name = current_schema()"
                " AND database_name = current_database() ORDER BY column_index",
                {"t": reference},
            ).fetchall()
        ]
        parts = [v for v in views if v.endswith("_" + union) and v != union]
        with_rows = [v for v in parts if rows.get(v[: -len(union)] + "request_spans", 1) > 0]
        con.execute(union_view_sql(union, with_rows or [reference], columns))
    for text in derived:
        con.execute(text)
