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

The parts: ``install`` installs the views; ``sql`` reads the files and their header lines;
``state`` keeps the per-connection state and finds the derived tables; ``keep`` keeps the
views a query reads as tables. This package's names below are the public face; the query
files themselves are analyzer.query.runner's concern.
"""

from __future__ import annotations

from analyzer.db.views.install import install_views
from analyzer.db.views.keep import (
    CHUNK_VIEWS,
    MATERIALIZE_MAX_EVENTS,
    MATERIALIZED_VIEWS,
    RANGE_EVENTS,
    materialize_views,
    request_key_ranges,
)
from analyzer.db.views.sql import (
    UNIONED_VIEWS,
    kept_order,
    kept_views,
    queries_dir,
    union_view_sql,
    view_files,
    view_names,
)
from analyzer.db.views.state import (
    BUILDING_PREFIX,
    CACHE_PREFIX,
    DERIVED_SCHEMA,
    STATE_TABLE,
    cached_views,
    derived_location,
    derived_status,
    forget_connection_views,
)

__all__ = [
    "BUILDING_PREFIX",
    "CACHE_PREFIX",
    "CHUNK_VIEWS",
    "DERIVED_SCHEMA",
    "MATERIALIZED_VIEWS",
    "MATERIALIZE_MAX_EVENTS",
    "RANGE_EVENTS",
    "STATE_TABLE",
    "UNIONED_VIEWS",
    "cached_views",
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
