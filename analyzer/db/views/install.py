"""Installing the views of ``queries/views/`` on a connection (:func:`install_views`), and
where they are read from: the connection's own temp views and kept tables, or a database's
derived tables. The package's ``__init__`` says how the parts fit."""


from __future__ import annotations

from collections.abc import Sequence

import duckdb

from analyzer.db.views.keep import (
    keep_view,
)
from analyzer.db.views.sql import (
    UNIONED_VIEWS,
    kept_views,
    union_view_sql,
    view_files,
)
from analyzer.db.views.state import (
    CACHE_PREFIX,
    STATE_TABLE,
    cached_views,
    data_fingerprint,
    derived_location,
    has_derived,
    leave_derived,
    state_row,
    use_derived,
    write_state,
)

__all__ = ["install_views"]


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
    fingerprint, events = data_fingerprint(con, base, derived)
    if persist:
        _install(con, base, derived, persist=True)
        return
    state = state_row(con)
    if not refresh and state is not None and state[0] == fingerprint:
        return
    if not refresh:
        location = derived_location(con, fingerprint)
        if location is not None:
            use_derived(con, location, fingerprint, events)
            return
    leave_derived(con)
    for view in cached_views(con):
        con.execute(f"DROP TABLE IF EXISTS temp.{CACHE_PREFIX}{view}")
    con.execute(f"DROP TABLE IF EXISTS temp.{STATE_TABLE}")
    status = "stale" if has_derived(con) else "none"
    _install(con, base, derived, persist=False)
    write_state(con, fingerprint, events, None, status)


def _install(con: duckdb.DuckDBPyConnection, base: Sequence[str], derived: Sequence[str], *, persist: bool) -> None:
    for text in base:
        con.execute(text)
    rows = {view: keep_view(con, view, persist=persist) for view in kept_views(base)}
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
