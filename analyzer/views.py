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
the same views and kept tables in its schema :data:`DERIVED_SCHEMA` (analyzer/derived.py):
a connection over the same data reads those and derives nothing.

analyzer.queries re-exports the public names; the query files themselves are its concern.
"""

from __future__ import annotations

import hashlib
import re
from importlib import resources
from pathlib import Path
from typing import Iterable, Mapping, Sequence

import duckdb

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


def queries_dir() -> Path:
    """The folder of ``.sql`` files, wherever tokentrace is installed.

    Installed from a wheel, ``queries/`` is the package data of ``analyzer.sql``; in a
    checkout or an editable install it is ``queries/`` beside ``analyzer/``.
    """
    try:
        found = Path(str(resources.files("analyzer.sql")))
        if (found / "requests.sql").is_file():
            return found
    except (ModuleNotFoundError, TypeError):
        pass
    beside = Path(__file__).resolve().parent.parent / "queries"
    if (beside / "requests.sql").is_file():
        return beside
    raise FileNotFoundError("tokentrace's queries/ folder is missing from this installation")


def _strip_comments(sql: str) -> str:
    return "\n".join(line.split("--", 1)[0] for line in sql.splitlines())


# Each adapter (one file in queries/views/) defines `<source>_request_facts` and
# `<source>_request_chunks` views with the columns of tokentrace's own adapter;
# `request_facts` / `request_chunks` are their UNION ALL, so a new engine is one new file.
UNIONED_VIEWS = ("request_facts", "request_chunks")


DERIVED_MARKER = "-- install: after request_facts"


def view_files() -> tuple[list[str], list[str]]:
    """The SQL of ``queries/views/*.sql`` in file-name order, split in two lists: the adapter
    files (installed first) and the derived files (header line ``-- install: after
    request_facts``, installed after the unions). Shared by every engine."""
    base: list[str] = []
    derived: list[str] = []
    for path in sorted((queries_dir() / "views").glob("*.sql")):
        text = path.read_text()
        (derived if DERIVED_MARKER in text.splitlines() else base).append(text)
    return base, derived


def union_view_sql(union: str, views: Iterable[str], columns: Sequence[str]) -> str:
    """``CREATE OR REPLACE VIEW <union>`` as the UNION ALL of every ``*_<union>`` view in
    ``views`` (sorted by name), each selecting ``columns`` (those of ``tt_<union>``, in order).
    Engine-neutral SQL: the caller lists the views and columns from its own catalog."""
    parts = sorted(v for v in views if v.endswith("_" + union) and v != union)
    if not parts:
        raise ValueError(f"no adapter view defines *_{union}")
    column_list = ", ".join(columns)
    body = "\nUNION ALL\n".join(f"SELECT {column_list} FROM {v}" for v in parts)
    return f"CREATE OR REPLACE VIEW {union} AS\n{body}"


#: Views kept as temp tables once a query on the connection needed them, in dependency order
#: (the Spark engine checkpoints the same request-level views). A kept view ``v`` becomes
#: ``SELECT * FROM tt_cached_v``; the views built on it read the table.
MATERIALIZED_VIEWS: tuple[str, ...] = ("request_facts", "request_metrics", "request_keys", "request_gap_rows")
#: The per-chunk views among them (one row per gap: seven BIGINTs, 56 bytes a row in memory;
#: the view request_gap_times computes the two DOUBLE figures from them as it reads them,
#: rather than keeping 16 more bytes per gap). Each is kept in consecutive ranges of its ``request_key`` column
#: (:func:`request_key_ranges`), one INSERT per range, so its window runs on one range at a
#: time and the table comes out clustered by request_key: a query narrowed to a range of
#: request keys (itl.sql's ``$request_key_from`` / ``$request_key_to``) reads only that
#: range's row groups (DuckDB's min/max zone maps).
CHUNK_VIEWS: tuple[str, ...] = ("request_gap_rows",)
#: About how many span events' worth of requests one request_key range holds (the rows of a
#: range are sorted and windowed in memory). Ranges are cut by request count, assuming the
#: events are spread evenly over requests: n_ranges = ceil(span_events / RANGE_EVENTS).
RANGE_EVENTS: int = 32_000_000
#: Per-chunk views are kept at every size (``None``): a temp table is buffer-managed like a
#: sort, so beyond ``memory_limit`` DuckDB evicts its blocks to ``temp_directory`` and reads
#: them back, and each query stays one pass over the kept rows (linear in spans). Deriving
#: the gaps again in every query instead (the rule above 50M events until 2026-12) cost two
#: rebuilds of the gap window per metric set at 1e6 requests. An int keeps them only while
#: ``span_events`` has at most that many rows.
MATERIALIZE_MAX_EVENTS: int | None = None
CACHE_PREFIX = "tt_cached_"
BUILDING_PREFIX = "tt_building_"  # a kept table being written range by range (renamed when complete)
STATE_TABLE = "tt_view_state"
#: The schema ``tokentrace load`` writes the views and their kept tables into, once per load
#: (analyzer/derived.py): read connections whose data has the fingerprint recorded there read
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


def _fingerprint(con: duckdb.DuckDBPyConnection, base: Sequence[str], derived: Sequence[str]) -> tuple[str, int]:
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


def _state_row(con: duckdb.DuckDBPyConnection) -> tuple[str, int, str | None, str] | None:
    """(fingerprint, span_events rows, derived location or None, derived status) of the views
    installed on this connection, else None."""
    found = con.execute(
        "SELECT count(*) FROM duckdb_tables() WHERE database_name = 'temp' AND table_name = $t", {"t": STATE_TABLE}
    ).fetchall()
    if not found[0][0]:
        return None
    rows = con.execute(f"SELECT fingerprint, span_events, derived, derived_status FROM temp.{STATE_TABLE}").fetchall()
    return (rows[0][0], int(rows[0][1]), rows[0][2], rows[0][3]) if rows else None


def _state(con: duckdb.DuckDBPyConnection) -> tuple[str, int] | None:
    """(fingerprint, span_events rows) of the views installed on this connection, else None."""
    row = _state_row(con)
    return (row[0], row[1]) if row is not None else None


def _cached(con: duckdb.DuckDBPyConnection) -> set[str]:
    """The views kept as tables for this connection: its temp tables, or, reading a database's
    derived tables, the tables kept there."""
    row = _state_row(con)
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


def _quoted(name: str) -> str:
    return '"' + name.replace('"', '""') + '"'


def derived_location(con: duckdb.DuckDBPyConnection, fingerprint: str) -> str | None:
    """``"catalog".tokentrace_derived`` when a database on this connection holds derived tables
    built (by ``tokentrace load``) over data with this ``fingerprint``, else None."""
    for (catalog,) in con.execute(
        "SELECT database_name FROM duckdb_tables() WHERE schema_name = $s AND table_name = $t ORDER BY 1",
        {"s": DERIVED_SCHEMA, "t": STATE_TABLE},
    ).fetchall():
        location = f"{_quoted(catalog)}.{DERIVED_SCHEMA}"
        rows = con.execute(f"SELECT fingerprint FROM {location}.{STATE_TABLE}").fetchall()
        if rows and rows[0][0] == fingerprint:
            return location
    return None


def _has_derived(con: duckdb.DuckDBPyConnection) -> bool:
    return bool(con.execute("SELECT count(*) FROM duckdb_tables() WHERE schema_name = $s AND table_name = $t",
                            {"s": DERIVED_SCHEMA, "t": STATE_TABLE}).fetchall()[0][0])


def derived_status(con: duckdb.DuckDBPyConnection) -> str | None:
    """How this connection's views were installed: ``"read"`` (a database's derived tables,
    nothing derived), ``"stale"`` (the database has derived tables, but of other data or of
    another tokentrace's views: derived on this connection instead), ``"none"`` (no derived
    tables: derived on this connection), or None before :func:`install_views`."""
    row = _state_row(con)
    return None if row is None else row[3]


def _write_state(con: duckdb.DuckDBPyConnection, fingerprint: str, events: int, derived: str | None,
                 status: str) -> None:
    con.execute(f"DROP TABLE IF EXISTS temp.{STATE_TABLE}")
    con.execute(f"CREATE TEMP TABLE {STATE_TABLE} (fingerprint VARCHAR, span_events BIGINT, derived VARCHAR,"
                " derived_status VARCHAR, search_path_before VARCHAR)")
    before = con.execute("SELECT current_setting('search_path')").fetchall()[0][0]
    con.execute(f"INSERT INTO temp.{STATE_TABLE} VALUES ($f, $e, $d, $s, $p)",
                {"f": fingerprint, "e": events, "d": derived, "s": status, "p": before})


_VIEW_NAME_RE = re.compile(r"CREATE\s+OR\s+REPLACE\s+VIEW\s+([A-Za-z_][A-Za-z0-9_]*)", re.IGNORECASE)


def view_names() -> set[str]:
    """Every view the files of ``queries/views/`` create, and the unions."""
    base, derived = view_files()
    return {m for text in [*base, *derived] for m in _VIEW_NAME_RE.findall(text)} | set(UNIONED_VIEWS)


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
        con.execute(f"DROP VIEW IF EXISTS {_quoted(name)}")


def _use_derived(con: duckdb.DuckDBPyConnection, location: str, fingerprint: str, events: int) -> None:
    """Read the derived tables at ``location``: they go last on the search path, so the
    current schema (where a writable connection creates and inserts) stays what it was and
    the canonical tables resolve first."""
    _leave_derived(con)
    database = con.execute("SELECT current_database()").fetchall()[0][0]
    if location.startswith(f"{_quoted(database)}."):  # a connection to that very file (not an attached copy)
        _drop_left_views(con)
    _write_state(con, fingerprint, events, location, "read")
    before = con.execute("SELECT current_setting('search_path')").fetchall()[0][0]
    current = before or f"{_quoted(database)}.main"
    con.execute("SET search_path = $p", {"p": f"{current},{location}"})


def forget_connection_views(con: duckdb.DuckDBPyConnection) -> None:
    """Drop what :func:`install_views` kept on this connection (its temp tables and state), so
    the next query installs afresh (and reads derived tables just built, when they fit)."""
    _leave_derived(con)
    for view in _cached(con):
        con.execute(f"DROP TABLE IF EXISTS temp.{CACHE_PREFIX}{view}")
    con.execute(f"DROP TABLE IF EXISTS temp.{STATE_TABLE}")


def _leave_derived(con: duckdb.DuckDBPyConnection) -> None:
    """Undo :func:`_use_derived` (the data changed on this connection): the search path as it was."""
    row = _state_row(con)
    if row is None or row[2] is None:
        return
    before = con.execute(f"SELECT search_path_before FROM temp.{STATE_TABLE}").fetchall()[0][0]
    if before:
        con.execute("SET search_path = $p", {"p": before})
    else:
        con.execute("RESET search_path")
    con.execute(f"DROP TABLE IF EXISTS temp.{STATE_TABLE}")


_KEEP_RE = re.compile(
    r"^--\s*keep(?P<chunks> chunks)?:\s*(?P<names>[A-Za-z0-9_, ]+?)"
    r"(?:\s+(?i:order\s+by)\s+(?P<order>[A-Za-z0-9_, ]+?))?\s*$",
    re.MULTILINE,
)


def kept_views(texts: Iterable[str], chunks: bool = False) -> list[str]:
    """The views named on the adapter files' header lines, in file order: ``-- keep: a, b``
    (each adapter's request spans, one row per request span: kept as temp tables when the
    views are installed on DuckDB) or, with ``chunks``, ``-- keep chunks: c`` (one row per
    chunk: kept when a query first reads them, see :data:`MATERIALIZE_MAX_EVENTS`)."""
    return [
        name.strip()
        for text in texts
        for m in _KEEP_RE.finditer(text)
        if bool(m["chunks"]) == chunks
        for name in m["names"].split(",")
        if name.strip()
    ]


def kept_order(texts: Iterable[str]) -> dict[str, str]:
    """The row order a ``-- keep chunks: <view> ORDER BY <columns>`` header line asks for, by
    view: the kept table is written in that order, so a query that reads a range of the first
    column skips the other row groups (``tt_candidate_chunks`` is ordered by candidate_key,
    which follows trace_id, as request_key does)."""
    found: dict[str, str] = {}
    for text in texts:
        for m in _KEEP_RE.finditer(text):
            if m["order"] and not m["chunks"]:
                raise ValueError(f"{m[0]!r}: ORDER BY applies to '-- keep chunks:' lines only")
            if m["order"]:
                names = [n.strip() for n in m["names"].split(",") if n.strip()]
                if len(names) != 1:
                    raise ValueError(f"'-- keep chunks: ... ORDER BY' names one view, not {names}")
                found[names[0]] = ", ".join(c.strip() for c in m["order"].split(",") if c.strip())
    return found


def _keep(
    con: duckdb.DuckDBPyConnection,
    view: str,
    *,
    order: str | None = None,
    ranges: Sequence[tuple[int, int]] | None = None,
    persist: bool = False,
) -> int:
    """Replace ``view`` by a temp table of its rows (views built on it read the table); returns
    its row count. ``order``: write the rows in that order (an ORDER BY list). ``ranges``:
    write them one request_key range at a time (``WHERE request_key BETWEEN lo AND hi``, in
    the given order), so the view's work is done per range and the table is clustered.
    ``persist``: a table of the current schema instead (analyzer.derived, writing the
    database's derived tables), read by the view through an unqualified name (a view binds
    names in its own schema first)."""
    temp, kind = ("", "TABLE") if persist else ("temp.", "TEMP TABLE")
    table = f"{temp}{CACHE_PREFIX}{view}"
    if ranges is None:
        ordered = f" ORDER BY {order}" if order else ""
        con.execute(f"CREATE {kind} {CACHE_PREFIX}{view} AS SELECT * FROM {view}{ordered}")
    else:
        # Filled under another name and renamed once complete: an error or an interrupt
        # between two ranges leaves no partial table that would count as kept.
        building = f"{BUILDING_PREFIX}{view}"
        con.execute(f"DROP TABLE IF EXISTS {temp}{building}")
        con.execute(f"CREATE {kind} {building} AS SELECT * FROM {view} WHERE false")
        try:
            for low, high in ranges:
                con.execute(
                    f"INSERT INTO {temp}{building} SELECT * FROM {view} WHERE request_key BETWEEN $low AND $high",
                    {"low": low, "high": high},
                )
        except BaseException:
            con.execute(f"DROP TABLE IF EXISTS {temp}{building}")
            raise
        con.execute(f"ALTER TABLE {temp}{building} RENAME TO {CACHE_PREFIX}{view}")
    con.execute(f"CREATE OR REPLACE VIEW {view} AS SELECT * FROM {table}")
    return int(con.execute(f"SELECT count(*) FROM {table}").fetchall()[0][0])


def request_key_ranges(con: duckdb.DuckDBPyConnection, events: int | None = None) -> list[tuple[int, int]]:
    """Consecutive, inclusive ``(low, high)`` ranges of request_key (view request_keys numbers
    the request perspectives 1..n) that cover every request, each about :data:`RANGE_EVENTS`
    span events' worth of requests; ``[]`` when there is no request. Needs the views of
    :func:`install_views` on this connection. ``events``: span_events' row count (default:
    the one this connection's views were installed over)."""
    state = _state(con)
    requests = int(con.execute("SELECT count(*) FROM request_keys").fetchall()[0][0])
    if requests == 0:
        return []
    if events is None:
        events = state[1] if state is not None else 0
    parts = max(1, -(-events // RANGE_EVENTS))
    per_range = -(-requests // parts)
    return [(low, min(requests, low + per_range - 1)) for low in range(1, requests + 1, per_range)]


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
    read from there (``refresh`` skips them). ``persist`` (analyzer.derived.build_derived
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


def _referenced(sql: str, definitions: Mapping[str, str]) -> set[str]:
    """The views ``sql`` reads, directly or through other views (names matched as words)."""
    found: set[str] = set()
    pending = [_strip_comments(sql)]
    while pending:  # bounded: each view is expanded at most once
        text = pending.pop()
        for name, body in definitions.items():
            if name not in found and re.search(rf"\b{re.escape(name)}\b", text):
                found.add(name)
                pending.append(_strip_comments(body))
    return found


def _read_counts(sql: str, definitions: Mapping[str, str]) -> dict[str, int]:
    """How many times running ``sql`` reads each view: occurrences of its name, multiplied
    along every path through the views that read it (names matched as words)."""
    head = re.compile(r"^\s*CREATE\s+(?:OR\s+REPLACE\s+)?(?:TEMP(?:ORARY)?\s+)?VIEW\s+\S+\s+(?:\([^)]*\)\s*)?AS\s+",
                      re.IGNORECASE)
    # a definition as duckdb_views() stores it starts 'CREATE VIEW <its name> AS': not a read of itself
    stripped = {name: head.sub("", _strip_comments(body), count=1) for name, body in definitions.items()}
    memo: dict[str, dict[str, int]] = {}

    def counts(text: str) -> dict[str, int]:
        found: dict[str, int] = {}
        for name in definitions:
            n = len(re.findall(rf"\b{re.escape(name)}\b", text))
            if n:
                found[name] = found.get(name, 0) + n
                if name not in memo:
                    memo[name] = {}  # a view never reads itself; bounded by the number of views
                    memo[name] = counts(stripped[name])
                for sub, c in memo[name].items():
                    found[sub] = found.get(sub, 0) + n * c
        return found

    return counts(_strip_comments(sql))


def materialize_views(
    con: duckdb.DuckDBPyConnection, sql: str, *, keep_chunks: bool = True, persist_events: int | None = None
) -> list[str]:
    """Keep as temp tables the :data:`MATERIALIZED_VIEWS` that ``sql`` reads (directly or
    through other views) and that are not kept yet; per-chunk views too, unless
    :data:`MATERIALIZE_MAX_EVENTS` is set and span_events has more rows. A chunk view whose
    header names an ORDER BY (:func:`kept_order`) is always written in that order: sorting
    it only once a gap table is needed (unordered for per-request queries) was measured
    slower for the metric set at 1e6 requests (211 s against 200 s: sorting the evicted
    table afterwards costs ~35 s against ~16 s while writing it) and no faster for one
    per-request query (59 s against 60 s). ``keep_chunks=False`` (a connection that runs
    one query, as each CLI command does): a per-chunk adapter view is kept only when the
    query builds the gap table from it, since a table written to be read once only adds a
    write and a read of every chunk; and a per-request view is kept only when the query
    reads it more than once (through every path of views: phases reads request_facts twice)
    or the gap table is built from it: a view read once is cheaper read in place, where
    DuckDB computes only the columns the query uses (skew_offsets at 1e4 requests: 3.8 s
    instead of 7.4 s, request_facts' chunk aggregates never computed). Needs views from
    :func:`install_views` on this
    connection (else does nothing; nothing either when they read a database's derived
    tables: everything is kept there). ``persist_events`` (analyzer.derived only, with the
    span_events row count): keep them as tables of the current schema, at every size.
    Returns the views it materialized."""
    persist = persist_events is not None
    row = None if persist else _state_row(con)
    if not persist and (row is None or row[2] is not None):
        return []
    events = persist_events if persist else row[1]  # type: ignore[index]
    definitions = dict(
        con.execute(
            "SELECT view_name, sql FROM duckdb_views() WHERE NOT internal AND schema_name = current_schema()"
            " AND database_name = current_database()"
        ).fetchall()
    )
    needed = _referenced(sql, definitions)
    cached = set() if persist else _cached(con)
    base = view_files()[0]
    adapter_chunks = kept_views(base, chunks=True)
    orders = kept_order(base)
    builds_gaps = any(v in needed and v not in cached for v in CHUNK_VIEWS)
    reads = _read_counts(sql, definitions) if not keep_chunks else {}
    for_gaps = set().union(*(_referenced(definitions[v], definitions) for v in CHUNK_VIEWS if v in definitions)) \
        if builds_gaps else set()
    made: list[str] = []
    for view in [*adapter_chunks, *MATERIALIZED_VIEWS]:
        if view not in needed or view in cached or view not in definitions:
            continue
        if view in adapter_chunks and not keep_chunks and not builds_gaps:
            continue
        if (not keep_chunks and view not in CHUNK_VIEWS and view not in adapter_chunks and view not in for_gaps
                and reads.get(view, 0) < 2):
            continue  # read once by the one query of this connection: read in place
        limit = MATERIALIZE_MAX_EVENTS
        if not persist and (view in CHUNK_VIEWS or view in adapter_chunks) and limit is not None and events > limit:
            continue
        if view in CHUNK_VIEWS:  # request_keys is kept by now: request_gap_rows reads it
            _keep(con, view, ranges=request_key_ranges(con, events), persist=persist)
        else:
            _keep(con, view, order=orders.get(view), persist=persist)
        made.append(view)
    return made
