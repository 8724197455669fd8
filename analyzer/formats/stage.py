"""Staging tables and deduplication: the step between readers and the canonical tables.

Each input file is staged in temporary tables (``_stage_spans`` / ``_stage_events`` /
``_stage_links``, the canonical columns plus ``_ord`` and ``_line``). :func:`commit_stage`
then classifies every staged span by its key (trace_id, span_id), in SQL:

- ``kept``: the first occurrence of a key not yet in the database;
- ``identical``: the same key and the same content as the kept/stored span (an exporter retry);
- ``conflicting``: the same key with different content (a reject, reason ``conflicting_duplicate``).

Content is compared with a fingerprint: a hash of every span column except ``load_id``,
combined with a hash of its events and links. Only ``kept`` spans (with their events and
links) are inserted, so memory grows with the staged rows of one file, never the JSON.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import duckdb
import pyarrow as pa

from analyzer.formats.canonical import EVENT_COLUMNS, LINK_COLUMNS, SPAN_COLUMNS

__all__ = ["StageResult", "adopt_stage", "append_stage", "classify", "commit_stage", "create_stage", "drop_stage", "stage_schemas"]

_STAGE = {"spans": "_stage_spans", "span_events": "_stage_events", "span_links": "_stage_links"}


def adopt_stage(con: duckdb.DuckDBPyConnection, prefix: str) -> None:
    """Make the temp tables ``<prefix>spans/events/links`` the staging tables (no copy).
    They need the staging columns (extra columns are ignored: every query names its columns)."""
    drop_stage(con)
    for short, table in (("spans", "_stage_spans"), ("events", "_stage_events"), ("links", "_stage_links")):
        con.execute(f"ALTER TABLE {prefix}{short} RENAME TO {table}")


def create_stage(con: duckdb.DuckDBPyConnection) -> None:
    """(Re)create the empty staging tables."""
    drop_stage(con)
    spans = ", ".join(SPAN_COLUMNS)
    con.execute(f"CREATE TEMP TABLE _stage_spans AS SELECT {spans}, 0::BIGINT AS _ord, 0::BIGINT AS _line FROM spans LIMIT 0")
    con.execute(f"CREATE TEMP TABLE _stage_events AS SELECT 0::BIGINT AS _ord, {', '.join(EVENT_COLUMNS)} FROM span_events LIMIT 0")
    con.execute(f"CREATE TEMP TABLE _stage_links AS SELECT 0::BIGINT AS _ord, {', '.join(LINK_COLUMNS)} FROM span_links LIMIT 0")


def drop_stage(con: duckdb.DuckDBPyConnection) -> None:
    for name in (*_STAGE.values(), "_stage_class", "_stage_keys"):
        con.execute(f"DROP TABLE IF EXISTS temp.{name}")


def stage_schemas(con: duckdb.DuckDBPyConnection) -> tuple[pa.Schema, pa.Schema, pa.Schema]:
    """Arrow schemas of the three staging tables (create them first)."""
    spans, events, links = (con.sql(f"SELECT * FROM {t} LIMIT 0").to_arrow_table().schema for t in _STAGE.values())
    return spans, events, links


def _to_arrow(rows: list, schema: pa.Schema) -> pa.Table:
    columns: list[Any] = list(zip(*rows)) if rows else [[] for _ in schema]
    return pa.Table.from_arrays([pa.array(col, type=f.type) for col, f in zip(columns, schema)], schema=schema)


def append_stage(
    con: duckdb.DuckDBPyConnection, schemas: tuple[pa.Schema, pa.Schema, pa.Schema], spans: list, events: list, links: list
) -> None:
    """Append Python row tuples (column order of ``canonical.STAGE_*_COLUMNS``) to the stage."""
    for rows, schema, table in zip((spans, events, links), schemas, _STAGE.values()):
        if rows:
            batch = _to_arrow(rows, schema)
            con.register("_stage_batch", batch)
            try:
                con.execute(f"INSERT INTO {table} SELECT * FROM _stage_batch")
            finally:
                con.unregister("_stage_batch")


_CONTENT = [c for c in SPAN_COLUMNS if c not in ("trace_id", "span_id")]
_EV_CONTENT = [c for c in EVENT_COLUMNS if c not in ("trace_id", "span_id")]
_LN_CONTENT = [c for c in LINK_COLUMNS if c not in ("trace_id", "span_id")]


def _fingerprints(spans: str, events: str, links: str, key: str, keys_filter: str) -> str:
    """SELECT trace_id, span_id, ``key``, fp: one content fingerprint per span of ``spans``."""
    sc = ", ".join("s." + c for c in _CONTENT)
    ec = ", ".join(_EV_CONTENT)
    lc = ", ".join(_LN_CONTENT)
    return f"""
    SELECT s.trace_id, s.span_id, {key} AS _ord,
           hash(hash({sc}), coalesce(ev.h, 0), coalesce(ln.h, 0)) AS fp
    FROM (SELECT * FROM {spans} {keys_filter}) s
    LEFT JOIN (SELECT {key.replace('s.', '')} AS k, trace_id, span_id, bit_xor(hash({ec})) AS h
               FROM {events} {keys_filter} GROUP BY ALL) ev
           ON ev.trace_id = s.trace_id AND ev.span_id = s.span_id AND ev.k IS NOT DISTINCT FROM {key}
    LEFT JOIN (SELECT {key.replace('s.', '')} AS k, trace_id, span_id, bit_xor(hash({lc})) AS h
               FROM {links} {keys_filter} GROUP BY ALL) ln
           ON ln.trace_id = s.trace_id AND ln.span_id = s.span_id AND ln.k IS NOT DISTINCT FROM {key}"""


@dataclass
class StageResult:
    """What :func:`commit_stage` did with one file's staged spans."""

    spans_loaded: int
    duplicates_identical: int
    conflicting: list[tuple[int | None, int, str, str, str]]  # (_line, _ord, trace_id, span_id, raw row JSON)


_IN_KEYS = "WHERE (trace_id, span_id) IN (SELECT (trace_id, span_id) FROM _stage_keys)"


def classify(con: duckdb.DuckDBPyConnection) -> dict[str, int]:
    """Classify staged spans; returns counts by class (see the module docstring).

    Only keys that repeat within the stage or are already stored need a content comparison;
    their spans get a row in ``_stage_class(_ord, cls)``. Every other staged span is kept.
    """
    con.execute("""
        CREATE OR REPLACE TEMP TABLE _stage_keys AS
        SELECT trace_id, span_id FROM _stage_spans GROUP BY ALL HAVING count(*) > 1
        UNION
        SELECT trace_id, span_id FROM spans WHERE (trace_id, span_id) IN (SELECT (trace_id, span_id) FROM _stage_spans)""")
    staged = _fingerprints("_stage_spans", "_stage_events", "_stage_links", "s._ord", _IN_KEYS)
    stored = _fingerprints("spans", "span_events", "span_links", "NULL::BIGINT", _IN_KEYS)
    con.execute(f"""
    CREATE OR REPLACE TEMP TABLE _stage_class AS
    WITH staged AS ({staged}),
         stored AS (SELECT trace_id, span_id, min(fp) AS fp FROM ({stored}) GROUP BY ALL),
         ranked AS (
           SELECT st.*, row_number() OVER w AS rn, first_value(st.fp) OVER w AS first_fp
           FROM staged st WINDOW w AS (PARTITION BY trace_id, span_id ORDER BY _ord))
    SELECT r._ord,
           CASE WHEN db.fp IS NOT NULL THEN (CASE WHEN r.fp = db.fp THEN 'identical' ELSE 'conflicting' END)
                WHEN r.rn = 1 THEN 'kept'
                WHEN r.fp = r.first_fp THEN 'identical'
                ELSE 'conflicting' END AS cls
    FROM ranked r LEFT JOIN stored db USING (trace_id, span_id)""")
    counts = dict(con.execute("SELECT cls, count(*) FROM _stage_class GROUP BY cls").fetchall())
    total = con.execute("SELECT count(*) FROM _stage_spans").fetchall()[0][0]
    counts["kept"] = total - counts.get("identical", 0) - counts.get("conflicting", 0)
    return counts


def commit_stage(con: duckdb.DuckDBPyConnection, load_id: int, *, insert_if_conflicts: bool = True) -> StageResult | None:
    """Classify the staged spans, insert the kept ones under ``load_id``, report the rest.

    The caller decides what conflicting duplicates mean (strict: an error; lenient: rejects).
    With ``insert_if_conflicts`` False, a stage holding conflicts is left uninserted and
    None returned (the bulk reader's rows carry no line numbers: the caller re-reads).
    """
    counts = classify(con)
    conflicting: list = []
    if counts.get("conflicting") and not insert_if_conflicts:
        return None
    if counts.get("conflicting"):
        conflicting = con.execute("""
            SELECT s._line, s._ord, s.trace_id, s.span_id, to_json(r)::VARCHAR
            FROM _stage_spans s JOIN _stage_class c USING (_ord)
            JOIN (SELECT _ord AS o, COLUMNS(* EXCLUDE (_ord, _line)) FROM _stage_spans) r ON r.o = s._ord
            WHERE c.cls = 'conflicting' ORDER BY s._ord""").fetchall()
    spans_cols = ", ".join(SPAN_COLUMNS)
    skip = "" if counts["kept"] == sum(counts.values()) else "WHERE _ord NOT IN (SELECT _ord FROM _stage_class WHERE cls <> 'kept')"
    con.execute(f"INSERT INTO spans ({spans_cols}, load_id) SELECT {spans_cols}, $load_id FROM _stage_spans {skip}", {"load_id": load_id})
    for table, cols in (("span_events", EVENT_COLUMNS), ("span_links", LINK_COLUMNS)):
        c = ", ".join(cols)
        con.execute(f"INSERT INTO {table} ({c}) SELECT {c} FROM {_STAGE[table]} {skip}")
    conflicting = [(line, o, t, s, _drop_key(raw, "o")) for line, o, t, s, raw in conflicting]
    return StageResult(int(counts["kept"]), int(counts.get("identical", 0)), conflicting)


def _drop_key(raw: str, key: str) -> str:
    import json

    obj = json.loads(raw)
    obj.pop(key, None)
    return json.dumps(obj, separators=(",", ":"))


def staged_counts(con: duckdb.DuckDBPyConnection) -> tuple[int, ...]:
    """(spans, events, links) currently staged — for tests and progress."""
    return tuple(con.execute(f"SELECT count(*) FROM {t}").fetchall()[0][0] for t in _STAGE.values())
