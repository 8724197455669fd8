"""Find, describe and run the SQL files in ``queries/``.

Each metric question is one ``queries/<name>.sql`` file with a header of ``--`` comments::

    -- returns: one row per request and perspective ...
    -- param: $perspective VARCHAR default NULL -- client | server | engine; NULL = all
    -- units: *_ms milliseconds; *_per_second tokens per second ...

Parameters are DuckDB's native ``$name`` parameters, bound by name (never formatted into the
SQL). A parameter a caller does not give takes the default from the header. Views in
``queries/views/`` (adapters and ``request_facts``) are installed in file-name order before
any query runs.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from functools import lru_cache
from importlib import resources
from pathlib import Path
from typing import Any, Iterable, Mapping, Sequence

import duckdb

__all__ = [
    "QueryFile",
    "QueryResult",
    "install_views",
    "list_queries",
    "load_query",
    "queries_dir",
    "run_query",
    "union_view_sql",
    "view_files",
]

_PARAM_RE = re.compile(
    r"^--\s*param:\s*\$(?P<name>[A-Za-z_][A-Za-z0-9_]*)\s+(?P<type>[A-Z_\[\]]+)\s+default\s+(?P<default>\S+)"
    r"(?:\s*--\s*(?P<doc>.*))?$"
)


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
        used = set(re.findall(r"\$([A-Za-z_][A-Za-z0-9_]*)", _strip_comments(self.sql)))
        return {k: v for k, v in bound.items() if k in used}


def _strip_comments(sql: str) -> str:
    return "\n".join(line.split("--", 1)[0] for line in sql.splitlines())


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


@lru_cache(maxsize=None)
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


def install_views(con: duckdb.DuckDBPyConnection) -> None:
    """Create or replace the adapter views, then ``request_facts`` and ``request_chunks``, then
    the derived views (files whose header has the line ``-- install: after request_facts``:
    per-request metrics, gaps and clock offsets, computed once over the unions)."""
    base, derived = view_files()
    for text in base:
        con.execute(text)
    views = {
        row[0]
        for row in con.execute(
            "SELECT view_name FROM duckdb_views() WHERE NOT internal AND schema_name = current_schema()"
        ).fetchall()
    }
    for union in UNIONED_VIEWS:
        reference = f"tt_{union}"
        columns = [
            row[0]
            for row in con.execute(
                "SELECT column_name FROM duckdb_columns() WHERE table_name = $t AND schema_name = current_schema()"
                " ORDER BY column_index",
                {"t": reference},
            ).fetchall()
        ]
        con.execute(union_view_sql(union, views, columns))
    for text in derived:
        con.execute(text)


@dataclass
class QueryResult:
    """Rows of one query, with its column names."""

    name: str
    columns: list[str]
    rows: list[tuple[Any, ...]]

    def dicts(self) -> list[dict[str, Any]]:
        return [dict(zip(self.columns, r)) for r in self.rows]


def run_query(
    con: duckdb.DuckDBPyConnection,
    name: str,
    params: Mapping[str, Any] | None = None,
    *,
    views: bool = True,
) -> QueryResult:
    """Run ``queries/<name>.sql`` with its parameters bound by name."""
    query = load_query(name)
    if views:
        install_views(con)
    cur = con.execute(query.sql, query.bind(params))
    columns = [d[0] for d in cur.description]
    return QueryResult(name, columns, cur.fetchall())
