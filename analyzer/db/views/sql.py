"""The SQL files of ``queries/views/`` and what their header lines say: where the folder is,
which files are adapters and which are derived (``-- install: after request_facts``), the
unions ``request_facts`` / ``request_chunks`` over the adapters, the view names the files
create, and the ``-- keep:`` / ``-- keep chunks: ... ORDER BY ...`` lines that say which
views are kept as tables (analyzer/db/views/keep.py). No connection state: text in, text out.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Sequence
from importlib import resources
from pathlib import Path

__all__ = [
    "DERIVED_MARKER",
    "UNIONED_VIEWS",
    "kept_order",
    "kept_views",
    "queries_dir",
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
    beside = Path(__file__).resolve().parents[3] / "queries"  # analyzer/db/views/sql.py -> repo
    if (beside / "requests.sql").is_file():
        return beside
    raise FileNotFoundError("tokentrace's queries/ folder is missing from this installation")


def strip_comments(sql: str) -> str:
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



_VIEW_NAME_RE = re.compile(r"CREATE\s+OR\s+REPLACE\s+VIEW\s+([A-Za-z_][A-Za-z0-9_]*)", re.IGNORECASE)


def view_names() -> set[str]:
    """Every view the files of ``queries/views/`` create, and the unions."""
    base, derived = view_files()
    return {m for text in [*base, *derived] for m in _VIEW_NAME_RE.findall(text)} | set(UNIONED_VIEWS)


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
