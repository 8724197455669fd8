"""Export the canonical span tables to Hive-partitioned Parquet that ``tokentrace load`` reads back.

Layout (``DIR`` given by the user)::

    DIR/spans/service_name=<svc>/date=<YYYY-MM-DD>/data_0.parquet
    DIR/span_events/service_name=<svc>/date=<YYYY-MM-DD>/data_0.parquet
    DIR/span_links/service_name=<svc>/date=<YYYY-MM-DD>/data_0.parquet

``date`` is the UTC day of the span's start; events and links are partitioned like their
span, so a partition directory holds whole spans. Times stay BIGINT nanoseconds (Spark cannot
read DuckDB's TIMESTAMP_NS Parquet). ``load_id`` is not exported: a reload gets its own.
A NULL service name is written as ``__HIVE_DEFAULT_PARTITION__`` and reads back as NULL.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import duckdb

from analyzer.db.schema import DEDICATED_COLUMNS, DUMP_FORMAT, FORMAT_KEY
from analyzer.errors import ExportError
from analyzer.formats.canonical import EVENT_COLUMNS, LINK_COLUMNS, SPAN_COLUMNS

__all__ = ["ExportReport", "export_parquet"]

_DATE = "strftime(make_timestamp(s.start_ns // 1000), '%Y-%m-%d')"


@dataclass
class ExportReport:
    """Rows written per table, and the directory."""

    directory: str
    spans: int
    span_events: int
    span_links: int


def _quote(s: str) -> str:
    return s.replace("'", "''")


def export_parquet(con: duckdb.DuckDBPyConnection, directory: str | Path, *, overwrite: bool = False) -> ExportReport:
    """Write spans, span_events and span_links under ``directory`` (Hive partitions
    ``service_name`` and ``date``). Refuses a non-empty directory unless ``overwrite``."""
    target = Path(directory)
    if target.exists() and not target.is_dir():
        raise ExportError(f"{target}: exists and is not a directory")
    if target.is_dir() and any(target.iterdir()):
        if not overwrite:
            raise ExportError(f"{target}: directory is not empty (use --overwrite to replace its tables)")
    target.mkdir(parents=True, exist_ok=True)
    span_cols = ", ".join([*(f"s.{c}" for c in SPAN_COLUMNS if c != "service_name"), *_dedicated(con, "spans", "s")])
    queries = {
        "spans": f"SELECT {span_cols}, s.service_name, {_DATE} AS date FROM spans s ORDER BY s.trace_id, s.start_ns, s.span_id",
        "span_events": _child("span_events", EVENT_COLUMNS, "event_index", _dedicated(con, "span_events", "c")),
        "span_links": _child("span_links", LINK_COLUMNS, "link_index", _dedicated(con, "span_links", "c")),
    }
    counts = {}
    for table, query in queries.items():
        out = target / table
        counts[table] = con.execute(f"SELECT count(*) FROM {table}").fetchall()[0][0]
        if counts[table] == 0 and table != "spans":
            continue
        con.execute(
            f"COPY ({query}) TO '{_quote(str(out))}' "
            "(FORMAT parquet, PARTITION_BY (service_name, date), OVERWRITE_OR_IGNORE true, COMPRESSION zstd,"
            f" KV_METADATA {{'{FORMAT_KEY}': '{DUMP_FORMAT}'}})"
        )
    return ExportReport(str(target), counts["spans"], counts["span_events"], counts["span_links"])


def _dedicated(con: duckdb.DuckDBPyConnection, table: str, alias: str) -> list[str]:
    """The dedicated columns of ``table`` as select items: the column, or computed from its map
    in a database loaded before it existed (opened read-only: not rebuilt yet)."""
    have = {r[0] for r in con.execute(f"DESCRIBE {table}").fetchall()}
    return [f"{alias}.{c.name}" if c.name in have else f"{alias}.{c.from_map} AS {c.name}"
            for c in DEDICATED_COLUMNS.get(table, ())]


def _child(table: str, columns: list[str], order: str, dedicated: list[str]) -> str:
    cols = ", ".join([*(f"c.{x}" for x in columns), *dedicated])
    return (
        f"SELECT {cols}, s.service_name, {_DATE} AS date FROM {table} c"
        f" JOIN (SELECT DISTINCT ON (trace_id, span_id) trace_id, span_id, service_name, start_ns FROM spans) s"
        f" ON s.trace_id = c.trace_id AND s.span_id = c.span_id ORDER BY c.trace_id, c.span_id, c.{order}"
    )
