"""Reader for Parquet dumps written by ``tokentrace export`` (Hive-partitioned directories
``spans/``, ``span_events/``, ``span_links/``), or a single spans Parquet file.

Rows go straight from Parquet into the staging tables in SQL; ids and times are checked in
SQL too (same reasons as the JSON readers), each failing row counted and, in lenient mode,
kept raw (as JSON) in ``rejects``. Partition columns (``service_name`` comes back from the
directory names; ``date`` is dropped). Here "line" is NULL and ``record_index`` the row number.
"""

from __future__ import annotations

from pathlib import Path

import duckdb

from analyzer.errors import LoadError
from analyzer.formats.canonical import EVENT_COLUMNS, LINK_COLUMNS, SPAN_COLUMNS, Reject, RowSink

__all__ = ["PARTITION_TYPES", "read_parquet_dump"]

PARTITION_TYPES = "{'service_name': VARCHAR, 'date': VARCHAR}"

# Checked in this order; the first failing check names the reason.
_SPAN_CHECKS: list[tuple[str, str]] = [
    ("empty_trace_id", "trace_id IS NULL OR trace_id = '' OR trace_id = repeat('0', 32)"),
    ("invalid_trace_id", "NOT regexp_full_match(trace_id, '[0-9a-f]{32}')"),
    ("empty_span_id", "span_id IS NULL OR span_id = '' OR span_id = repeat('0', 16)"),
    ("invalid_span_id", "NOT regexp_full_match(span_id, '[0-9a-f]{16}')"),
    ("invalid_parent_span_id", "parent_span_id IS NOT NULL AND NOT regexp_full_match(parent_span_id, '[0-9a-f]{16}')"),
    ("missing_start_time", "start_ns IS NULL OR start_ns <= 0"),
    ("missing_end_time", "end_ns IS NULL OR end_ns <= 0"),
    ("end_before_start", "end_ns < start_ns"),
    ("invalid_field", "name IS NULL OR kind IS NULL OR status_code IS NULL"),
]


def _source(path: Path, table: str, dataset: bool) -> str | None:
    if not dataset:
        return f"read_parquet('{_quote(str(path))}')" if table == "spans" else None
    files = sorted((path / table).rglob("*.parquet"))
    if not files:
        return None
    return f"read_parquet('{_quote(str(path / table))}/**/*.parquet', hive_partitioning = true, hive_types = {PARTITION_TYPES})"


def _quote(s: str) -> str:
    return s.replace("'", "''")


def read_parquet_dump(con: duckdb.DuckDBPyConnection, f, sink: RowSink) -> str:
    """Stage a Parquet dump (``f`` an :class:`~analyzer.formats.inputs.InputFile`); returns ``parquet``.

    A damaged file or a column of the wrong type is a :class:`LoadError` (``invalid_parquet``)."""
    try:
        return _read(con, f, sink)
    except (duckdb.Error, UnicodeDecodeError) as e:
        raise LoadError(f.name, None, "invalid_parquet", str(e).split("\n")[0][:300]) from None


def _read(con: duckdb.DuckDBPyConnection, f, sink: RowSink) -> str:
    assert f.path is not None
    src = _source(f.path, "spans", f.dataset_dir)
    try:
        cols = {r[0] for r in con.execute(f"DESCRIBE SELECT * FROM {src}").fetchall()}
    except duckdb.Error as e:
        raise LoadError(f.name, None, "invalid_parquet", str(e).split("\n")[0]) from None
    missing = [c for c in ("trace_id", "span_id", "start_ns", "end_ns", "name") if c not in cols]
    if missing:
        raise LoadError(f.name, None, "not_traces", f"Parquet without span columns {', '.join(missing)}")
    select = ", ".join(c if c in cols else f"NULL AS {c}" for c in SPAN_COLUMNS)
    con.execute(f"CREATE OR REPLACE TEMP TABLE _pq_spans AS SELECT {select}, (row_number() OVER () - 1)::BIGINT AS _ord FROM {src}")
    reason_sql = "CASE " + " ".join(f"WHEN {cond} THEN '{reason}'" for reason, cond in _SPAN_CHECKS) + " END"
    bad = con.execute(f"""
        SELECT _ord, {reason_sql} AS reason, trace_id, span_id, to_json(t)::VARCHAR
        FROM _pq_spans t WHERE {reason_sql} IS NOT NULL ORDER BY _ord""").fetchall()
    total = con.execute("SELECT count(*) FROM _pq_spans").fetchall()[0][0]
    sink.records_read += total
    sink.spans_read += total
    for ordinal, reason, trace_id, span_id, raw in bad:
        sink.reject(Reject(None, ordinal, reason, raw, trace_id, span_id, f"row {ordinal}"))
    bad_ords = [b[0] for b in bad]
    con.execute(
        f"INSERT INTO _stage_spans SELECT {', '.join(SPAN_COLUMNS)}, _ord, NULL FROM _pq_spans"
        " WHERE NOT list_contains($bad, _ord)",
        {"bad": bad_ords},
    )
    # A span can be in a dump more than once (a sender's retry, a receiver crash between
    # compaction and cleanup); its child rows then are too, and nothing says which copy a
    # row came from. Each distinct child row is given to every copy of its span, so copies
    # with the same rows fingerprint as identical duplicates (one kept, no doubled events).
    # Two different rows at one index cannot be told apart per copy: that is refused.
    for table, stage_table, columns, index in (("span_events", "_stage_events", EVENT_COLUMNS, "event_index"),
                                               ("span_links", "_stage_links", LINK_COLUMNS, "link_index")):
        child = _source(f.path, table, f.dataset_dir)
        if child is None:
            continue
        child_cols = ", ".join(columns)
        con.execute(f"CREATE OR REPLACE TEMP TABLE _pq_child AS SELECT DISTINCT {child_cols} FROM {child}")
        clash = con.execute(f"""
            SELECT trace_id, span_id, {index} FROM _pq_child
            GROUP BY ALL HAVING count(*) > 1 ORDER BY ALL LIMIT 1""").fetchone()
        if clash is not None:
            con.execute("DROP TABLE IF EXISTS _pq_child")
            raise LoadError(f.name, None, "conflicting_duplicate",
                            f"{table}: span {clash[0]}/{clash[1]} has two different rows with {index} {clash[2]}")
        c = ", ".join(f"c.{x}" for x in columns)
        con.execute(f"""
            INSERT INTO {stage_table}
            SELECT k._ord, {c} FROM _pq_child c
            JOIN (SELECT trace_id, span_id, _ord FROM _stage_spans) k
              ON k.trace_id = c.trace_id AND k.span_id = c.span_id""")
        con.execute("DROP TABLE IF EXISTS _pq_child")
    con.execute("DROP TABLE IF EXISTS _pq_spans")
    return "parquet"
