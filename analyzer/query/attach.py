"""A ranged query's per-request names attached after an integer sort, per Arrow batch.

itl's rows (one per gap, ~150 per request) were sorted with their request's four name
columns as the sort's payload (source, perspective, trace_id, request_span_id): most of the
query's time at 1e5 requests (benchmarks/RESULTS.md). A query listed in :data:`SPLITS` runs,
for each request_key range of :func:`analyzer.query.runner.stream_query`, as two queries:

- its rows without the names, ``request_key`` first, sorted on integers (e.g.
  ``queries/keep/itl_gaps.sql``);
- the names, one row per request_key of the range in key order (``queries/keep/itl_names.sql``:
  view request_keys numbers the request perspectives 1, 2, ... without a hole).

:func:`arrow_batches` reads the first as Arrow batches in its order and puts the names
back by position (``take`` at ``request_key - low``): a column lookup, no join, so the order
is the sort's. The columns come out in the order of the query itself; the rows equal its
rows (tests/test_itl_attach.py). A column added to the query's per-request part is added to
the names file (and to the query's own SQL, which callers reading ``QueryPart.sql`` run).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import duckdb

if TYPE_CHECKING:  # pyarrow is imported where batches are made
    import pyarrow as pa

__all__ = ["SPLITS", "NamesAttach", "arrow_batches", "names_attach"]

#: query name -> (its rows sorted on integers with request_key first, its per-request names)
SPLITS: dict[str, tuple[str, str]] = {"itl": ("keep/itl_gaps", "keep/itl_names")}
_KEY = "request_key"


@dataclass(frozen=True)
class NamesAttach:
    """One range's two queries (bound parameters included) and the output columns in order."""

    rows_sql: str
    rows_params: dict[str, Any]
    names_sql: str
    names_params: dict[str, Any]
    low: int
    high: int
    columns: tuple[str, ...]


def names_attach(
    con: duckdb.DuckDBPyConnection, name: str, sql: str, bound: dict[str, Any], low: int, high: int,
    load_query: Callable[[str], Any],
) -> NamesAttach | None:
    """How query ``name`` (its SQL ``sql``, parameters ``bound``) is made for the request_key
    range ``low .. high`` from its split (:data:`SPLITS`, read with ``load_query``: the
    runner's, handed in so this module imports nothing of it), or None when it has none.
    Raises ValueError when the split's columns are not the query's (a column added to one
    file and not the other)."""
    files = SPLITS.get(name)
    if files is None:
        return None
    rows_q, names_q = (load_query(f) for f in files)
    given = {**bound, "request_key_from": low, "request_key_to": high}
    rows_params = rows_q.bind({k: v for k, v in given.items() if k in {p.name for p in rows_q.params}})
    names_params = names_q.bind({k: v for k, v in given.items() if k in {p.name for p in names_q.params}})
    columns = tuple(con.sql(sql, params=given).columns)
    rows_columns = con.sql(rows_q.sql, params=rows_params).columns
    names_columns = con.sql(names_q.sql, params=names_params).columns
    if (rows_columns[:1] != [_KEY] or names_columns[:1] != [_KEY]
            or sorted(rows_columns[1:] + names_columns[1:]) != sorted(columns)):
        raise ValueError(f"{files[0]} and {files[1]}: their columns are not those of {name}.sql: "
                         f"{rows_columns[1:]} + {names_columns[1:]} != {list(columns)}")
    return NamesAttach(rows_q.sql, rows_params, names_q.sql, names_params, low, high, columns)


def arrow_batches(con: duckdb.DuckDBPyConnection, attach: NamesAttach, batch_rows: int) -> Iterator[pa.RecordBatch]:
    """The range's rows as Arrow record batches of up to ``batch_rows`` rows, in the sorted
    order, each with its names taken by request_key and the columns in the query's order."""
    import pyarrow as pa
    import pyarrow.compute as pc

    names = con.sql(attach.names_sql, params=attach.names_params).to_arrow_table().combine_chunks()
    keys = names.column(_KEY)
    if names.num_rows != attach.high - attach.low + 1 or (
            names.num_rows and (keys[0].as_py() != attach.low or keys[-1].as_py() != attach.high)):
        raise ValueError(f"request keys {attach.low}..{attach.high} are not numbered without a hole")
    lookup = {c: names.column(c).chunk(0) if names.column(c).num_chunks else names.column(c).combine_chunks()
              for c in names.column_names[1:]}
    low = pa.scalar(attach.low, pa.int64())
    for batch in con.sql(attach.rows_sql, params=attach.rows_params).to_arrow_reader(batch_rows):
        if batch.num_rows == 0:
            continue
        position = pc.subtract(batch.column(0), low)
        arrays = {c: batch.column(c) for c in batch.schema.names[1:]}
        arrays.update({c: array.take(position) for c, array in lookup.items()})
        yield pa.RecordBatch.from_arrays([arrays[c] for c in attach.columns], names=list(attach.columns))
