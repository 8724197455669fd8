"""Keeping views as tables: the request-level views a query reads (:data:`MATERIALIZED_VIEWS`)
and the per-chunk ones (:data:`CHUNK_VIEWS`, written one request_key range at a time,
:func:`request_key_ranges`), so the next query on the connection reads the table instead of
deriving it from the spans again. docs/metrics.md, "Performance", says why each
rule is there and what it measured.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping, Sequence

import duckdb

from analyzer.db.views.sql import kept_order, kept_views, queries_dir, strip_comments, view_files
from analyzer.db.views.state import BUILDING_PREFIX, CACHE_PREFIX, cached_views, connection_state, state_row

__all__ = [
    "CHUNK_VIEWS",
    "MATERIALIZED_VIEWS",
    "MATERIALIZE_MAX_EVENTS",
    "RANGE_EVENTS",
    "materialize_views",
    "request_key_ranges",
    "streamed_gap_selects",
]

#: Views kept as temp tables once a query on the connection needed them, in dependency order
#: (the Spark engine checkpoints the same request-level views). A kept view ``v`` becomes
#: ``SELECT * FROM tt_cached_v``; the views built on it read the table.
MATERIALIZED_VIEWS: tuple[str, ...] = (
    "request_facts", "request_metrics", "request_keys", "tt_request_keys", "request_gap_rows"
)
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
#: tokentrace's part of the gap table (view tt_request_gap_rows) computed in one ordered pass
#: over the kept chunk table, per request_key range (queries/keep/tt_request_gap_rows.sql),
#: where that table is kept in the order the file's ``-- over:`` line names; the other
#: adapters' part (view adapter_request_gap_rows) is read from its view.
STREAMED_GAPS_SQL: str = "keep/tt_request_gap_rows.sql"

#: One range's INSERT sources: ``(SELECT statement, bound parameters)`` pairs.
RangeSelects = Callable[[int, int], list[tuple[str, dict[str, int]]]]


def keep_view(
    con: duckdb.DuckDBPyConnection,
    view: str,
    *,
    order: str | None = None,
    ranges: Sequence[tuple[int, int]] | None = None,
    persist: bool = False,
    range_selects: RangeSelects | None = None,
) -> int:
    """Replace ``view`` by a temp table of its rows (views built on it read the table); returns
    its row count. ``order``: write the rows in that order (an ORDER BY list). ``ranges``:
    write them one request_key range at a time (``WHERE request_key BETWEEN lo AND hi``, in
    the given order), so the view's work is done per range and the table is clustered.
    ``persist``: a table of the current schema instead (analyzer.db.derived, writing the
    database's derived tables), read by the view through an unqualified name (a view binds
    names in its own schema first). ``range_selects``: with ``ranges``, the SELECTs whose
    rows are one range's rows (default: the view's rows in the range)."""
    if range_selects is not None and ranges is None:
        raise ValueError("keep_view: range_selects needs ranges")
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
                selects = range_selects(low, high) if range_selects else [
                    (f"SELECT * FROM {view} WHERE request_key BETWEEN $low AND $high", {"low": low, "high": high})
                ]
                for select, params in selects:
                    con.execute(f"INSERT INTO {temp}{building} {select}", params)
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
    state = connection_state(con)
    requests = int(con.execute("SELECT count(*) FROM request_keys").fetchall()[0][0])
    if requests == 0:
        return []
    if events is None:
        events = state[1] if state is not None else 0
    parts = max(1, -(-events // RANGE_EVENTS))
    per_range = -(-requests // parts)
    return [(low, min(requests, low + per_range - 1)) for low in range(1, requests + 1, per_range)]


def streamed_gap_selects(
    con: duckdb.DuckDBPyConnection, orders: Mapping[str, str], kept: set[str]
) -> RangeSelects | None:
    """The per-range SELECTs of request_gap_rows with tokentrace's part streamed
    (:data:`STREAMED_GAPS_SQL`), or ``None`` where its conditions do not hold and the views'
    window runs instead: the chunk table named on the file's ``-- over:`` line is kept
    (``kept``) in the order that line names (``orders``: the adapter's ``-- keep chunks:``
    order), tt_request_keys is kept, and DuckDB preserves insertion order. The rows equal the
    view's (tests/test_streamed_gaps.py)."""
    text = (queries_dir() / STREAMED_GAPS_SQL).read_text()
    over = re.match(r"--\s*over:\s*(\w+)\s+ORDER\s+BY\s+(.+)", text)
    if over is None:
        raise ValueError(f"{STREAMED_GAPS_SQL}: its first line must be '-- over: <view> ORDER BY <columns>'")
    table, order = over[1], ", ".join(c.strip() for c in over[2].split(","))
    if f"FROM {CACHE_PREFIX}{table}" not in text:
        raise ValueError(f"{STREAMED_GAPS_SQL}: it must read the kept table {CACHE_PREFIX}{table}")
    if (
        table not in kept
        or orders.get(table) != order
        or "tt_request_keys" not in kept
        or not con.execute("SELECT current_setting('preserve_insertion_order')").fetchall()[0][0]
    ):
        return None

    def selects(low: int, high: int) -> list[tuple[str, dict[str, int]]]:
        bounds = {"request_key_from": low, "request_key_to": high}
        rest = ("SELECT * FROM adapter_request_gap_rows WHERE request_key BETWEEN $low AND $high",
                {"low": low, "high": high})
        first, last = con.execute(
            "SELECT min(perspective_key), max(perspective_key) FROM tt_request_keys"
            " WHERE request_key BETWEEN $request_key_from AND $request_key_to", bounds,
        ).fetchall()[0]
        if first is None:  # no tokentrace request in the range
            return [rest]
        return [(text, {**bounds, "candidate_from": first, "candidate_to": last}), rest]

    return selects


def _referenced(sql: str, definitions: Mapping[str, str]) -> set[str]:
    """The views ``sql`` reads, directly or through other views (names matched as words)."""
    found: set[str] = set()
    pending = [strip_comments(sql)]
    while pending:  # bounded: each view is expanded at most once
        text = pending.pop()
        for name, body in definitions.items():
            if name not in found and re.search(rf"\b{re.escape(name)}\b", text):
                found.add(name)
                pending.append(strip_comments(body))
    return found


def _read_counts(sql: str, definitions: Mapping[str, str]) -> dict[str, int]:
    """How many times running ``sql`` reads each view: occurrences of its name, multiplied
    along every path through the views that read it (names matched as words)."""
    head = re.compile(r"^\s*CREATE\s+(?:OR\s+REPLACE\s+)?(?:TEMP(?:ORARY)?\s+)?VIEW\s+\S+\s+(?:\([^)]*\)\s*)?AS\s+",
                      re.IGNORECASE)
    # a definition as duckdb_views() stores it starts 'CREATE VIEW <its name> AS': not a read of itself
    stripped = {name: head.sub("", strip_comments(body), count=1) for name, body in definitions.items()}
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

    return counts(strip_comments(sql))


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
    tables: everything is kept there). ``persist_events`` (analyzer.db.derived only, with the
    span_events row count): keep them as tables of the current schema, at every size. The
    gap table's tokentrace part comes from one ordered pass over the kept chunk table where
    :func:`streamed_gap_selects` allows it, else from the views' window.
    Returns the views it materialized."""
    persist = persist_events is not None
    row = None if persist else state_row(con)
    if not persist and (row is None or row[2] is not None):
        return []
    events = persist_events if persist_events is not None else row[1]  # type: ignore[index]  # row is read unless persisting
    definitions = dict(
        con.execute(
            "SELECT view_name, sql FROM duckdb_views() WHERE NOT internal AND schema_name = current_schema()"
            " AND database_name = current_database()"
        ).fetchall()
    )
    needed = _referenced(sql, definitions)
    cached = set() if persist else cached_views(con)
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
            selects = streamed_gap_selects(con, orders, cached | set(made))
            keep_view(con, view, ranges=request_key_ranges(con, events), persist=persist, range_selects=selects)
        else:
            keep_view(con, view, order=orders.get(view), persist=persist)
        made.append(view)
    return made
