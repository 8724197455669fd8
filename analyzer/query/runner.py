"""Find, describe and run the SQL files in ``queries/``.

Each metric question is one ``queries/<name>.sql`` file with a header of ``--`` comments::

    -- returns: one row per request and perspective ...
    -- param: $perspective VARCHAR default NULL -- client | server | engine; NULL = all
    -- units: *_ms milliseconds; *_per_second tokens per second ...

Parameters are DuckDB's native ``$name`` parameters, bound by name (never formatted into the
SQL). A parameter a caller does not give takes the default from the header. Before a query
runs, the views of ``queries/views/`` are installed on the connection and the ones it reads
are kept as tables, or a database's derived tables are read instead: analyzer/db/views/
(import the view machinery's names from there; this module's names are the query files').
"""

from __future__ import annotations

import re
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from functools import cache
from pathlib import Path
from typing import Any

import duckdb

from analyzer.db import views
from analyzer.db.views import CHUNK_VIEWS, install_views, materialize_views, queries_dir, request_key_ranges
from analyzer.db.views.sql import strip_comments
from analyzer.query.attach import SPLITS, NamesAttach, names_attach
from analyzer.query.attach import arrow_batches as attach_batches

__all__ = [
    "QueryFile",
    "QueryPart",
    "QueryResult",
    "list_queries",
    "load_query",
    "run_query",
    "stream_query",
]

_PARAM_RE = re.compile(
    r"^--\s*param:\s*\$(?P<name>[A-Za-z_][A-Za-z0-9_]*)\s+(?P<type>[A-Z_\[\]]+)\s+default\s+(?P<default>\S+)"
    r"(?:\s*--\s*(?P<doc>.*))?$"
)


@dataclass(frozen=True)
class QueryParam:
    name: str
    sql_type: str
    default: Any
    doc: str


@dataclass(frozen=True)
class QueryFile:
    """One ``queries/*.sql`` file: its name, SQL, header text and declared parameters."""

    name: str
    path: Path
    sql: str
    returns: str
    units: str
    params: tuple[QueryParam, ...] = field(default_factory=tuple)

    def bind(self, given: Mapping[str, Any] | None) -> dict[str, Any]:
        """Parameters for DuckDB: the given ones over the header defaults. Unknown names raise."""
        given = dict(given or {})
        known = {p.name for p in self.params}
        unknown = sorted(set(given) - known)
        if unknown:
            raise ValueError(
                f"query {self.name!r} has no parameter {', '.join('$' + u for u in unknown)}; "
                f"it takes: {', '.join('$' + k for k in sorted(known)) or 'none'}"
            )
        bound = {p.name: p.default for p in self.params}
        bound.update(given)
        used = set(re.findall(r"\$([A-Za-z_][A-Za-z0-9_]*)", strip_comments(self.sql)))
        return {k: v for k, v in bound.items() if k in used}


def _parse_default(raw: str) -> Any:
    if raw.upper() == "NULL":
        return None
    if raw.lower() in ("true", "false"):
        return raw.lower() == "true"
    if raw.startswith("'") and raw.endswith("'"):
        return raw[1:-1]
    try:
        return int(raw)
    except ValueError:
        return float(raw)


def _parse(name: str, path: Path) -> QueryFile:
    sql = path.read_text()
    returns: list[str] = []
    units: list[str] = []
    params: list[QueryParam] = []
    current: list[str] | None = None
    for line in sql.splitlines():
        if not line.startswith("--"):
            break
        body = line[2:].strip()
        m = _PARAM_RE.match(line)
        if m:
            params.append(
                QueryParam(m["name"], m["type"], _parse_default(m["default"]), (m["doc"] or "").strip())
            )
            current = None
        elif body.startswith("returns:"):
            current = returns
            returns.append(body[len("returns:") :].strip())
        elif body.startswith("units:"):
            current = units
            units.append(body[len("units:") :].strip())
        elif current is not None and body:
            current.append(body)
    if not returns:
        raise ValueError(f"{path}: header has no '-- returns:' line")
    return QueryFile(name, path, sql, " ".join(returns), " ".join(units), tuple(params))


@cache
def load_query(name: str) -> QueryFile:
    """The query ``queries/<name>.sql``; ValueError naming the known queries otherwise.

    ``name`` may name one subfolder, e.g. ``"audit/vllm_values"`` for
    ``queries/audit/vllm_values.sql`` (the audit's queries; ``views/`` is not a query folder).
    """
    if not re.fullmatch(r"(?:[a-z][a-z0-9_]*/)?[a-z][a-z0-9_]*", name) or name.startswith("views/"):
        raise ValueError(f"invalid query name {name!r}")
    path = queries_dir() / f"{name}.sql"
    if not path.is_file():
        folder = name.rpartition("/")[0]
        known = list_queries(folder) if folder else list_queries()
        raise ValueError(f"no query named {name!r}; known: {', '.join(known)}")
    return _parse(name, path)


def list_queries(folder: str | None = None) -> list[str]:
    """Names of the metric queries (``queries/*.sql``, views excluded).

    With ``folder`` (e.g. ``"audit"``): the queries of that subfolder, as ``"audit/<name>"``.
    """
    if folder is None:
        return sorted(p.stem for p in queries_dir().glob("*.sql"))
    return sorted(f"{folder}/{p.stem}" for p in (queries_dir() / folder).glob("*.sql"))


@dataclass
class QueryResult:
    """Rows of one query, with its column names."""

    name: str
    columns: list[str]
    rows: list[tuple[Any, ...]]

    def dicts(self) -> list[dict[str, Any]]:
        return [dict(zip(self.columns, r)) for r in self.rows]


def _prepare(
    con: duckdb.DuckDBPyConnection,
    name: str,
    params: Mapping[str, Any] | None,
    *,
    views: bool,
    keep: bool,
    keep_chunks: bool,
) -> tuple[QueryFile, dict[str, Any], bool]:
    """What run_query and stream_query do before running: bind, install the views, keep what
    the query reads unless it is narrowed to one trace or request. Returns the query, its
    bound parameters and whether it was narrowed."""
    query = load_query(name)
    bound = query.bind(params)
    if views:
        install_views(con)
    narrowed = bound.get("trace_id") is not None or bound.get("request_span_id") is not None
    if keep and not narrowed:
        materialize_views(con, query.sql, keep_chunks=keep_chunks)
    return query, bound, narrowed


def run_query(
    con: duckdb.DuckDBPyConnection,
    name: str,
    params: Mapping[str, Any] | None = None,
    *,
    views: bool = True,
    keep: bool = True,
    keep_chunks: bool = True,
) -> QueryResult:
    """Run ``queries/<name>.sql`` with its parameters bound by name.

    ``views``: install the views first (a no-op when they are current, see
    :func:`install_views`). ``keep``: unless the query is narrowed to one trace or request (a
    non-NULL ``$trace_id`` / ``$request_span_id``), the views it reads are kept for the next
    query (:func:`materialize_views`, with ``keep_chunks``); with ``keep=False`` it reads the
    views as they are."""
    query, bound, _ = _prepare(con, name, params, views=views, keep=keep, keep_chunks=keep_chunks)
    cur = con.execute(query.sql, bound)
    columns = [d[0] for d in cur.description]
    return QueryResult(name, columns, cur.fetchall())


_RANGE_PARAMS = ("request_key_from", "request_key_to")


@dataclass(frozen=True)
class QueryPart:
    """One part of a query's result (:func:`stream_query`): its SQL and bound parameters, for
    ``con.execute(part.sql, part.params)`` (then ``fetchmany``) or ``con.sql(part.sql,
    params=part.params)`` (then ``to_arrow_reader``); or, faster where ``attach`` is set, the
    same rows as Arrow batches from :meth:`arrow_batches` (names attached after an integer
    sort: analyzer/query/attach.py)."""

    sql: str
    params: dict[str, Any] | None
    attach: NamesAttach | None = None

    def arrow_batches(self, con: duckdb.DuckDBPyConnection, batch_rows: int) -> Iterator[Any]:
        """This part's rows as pyarrow record batches of up to ``batch_rows`` rows, in order."""
        if self.attach is not None:
            yield from attach_batches(con, self.attach, batch_rows)
            return
        yield from con.sql(self.sql, params=self.params).to_arrow_reader(batch_rows)


def stream_query(
    con: duckdb.DuckDBPyConnection,
    name: str,
    params: Mapping[str, Any] | None = None,
    *,
    keep: bool = True,
    keep_chunks: bool = True,
) -> Iterator[QueryPart]:
    """``queries/<name>.sql`` as consecutive parts whose rows, read in turn, are the query's
    rows in its order, so a caller can write them out without holding them all (itl has
    ~150 gaps per request).

    A query with ``$request_key_from`` / ``$request_key_to`` parameters (itl.sql), when the
    caller sets neither and does not narrow it to one trace, runs once per
    :func:`request_key_ranges` range over the kept, request_key-clustered gap table: each
    part sorts one range in memory instead of one sort of every gap; a query with a names
    split (analyzer/query/attach.py: itl) then has parts with ``attach`` set, even for one
    range, whose :meth:`QueryPart.arrow_batches` sort on integers and attach the names after.
    Otherwise there is one part, the query itself. At least one part is yielded. Views are installed and kept as
    in :func:`run_query`, when the first part is asked for."""
    query, bound, narrowed = _prepare(con, name, params, views=True, keep=keep, keep_chunks=keep_chunks)
    ranged = (
        all(p in bound for p in _RANGE_PARAMS)
        and all(bound[p] is None for p in _RANGE_PARAMS)
        and not narrowed
        and all(v in views.cached_views(con) for v in CHUNK_VIEWS)  # clustered by request_key: a part reads its range
    )
    ranges = request_key_ranges(con) if ranged else []
    split = ranged and bool(ranges) and name in SPLITS
    if len(ranges) <= 1 and not split:
        yield QueryPart(query.sql, bound or None)
        return
    for low, high in ranges:
        part_params = {**bound, "request_key_from": low, "request_key_to": high}
        yield QueryPart(query.sql, part_params,
                        names_attach(con, name, query.sql, bound, low, high, load_query) if split else None)
