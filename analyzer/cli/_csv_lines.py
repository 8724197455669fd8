"""CSV rows formatted by DuckDB, byte-identical to Python's ``csv.writer`` (the verbs' csv).

Python's writer costs about 0.5 µs per field once the rows are Python objects (which costs as
much again): 20,000 request rows of 38 columns took 0.8 s of a 1.3 s ``requests --format
csv`` (benchmarks/verbs.py), and ``itl`` at 1e5 requests has 30M rows. Here DuckDB builds each
line as one string (vectorized, on every core), ``'\\n'``-terminated; the Arrow array of the
lines holds them back to back in one buffer, written as is. Nothing per value reaches Python.

Same bytes as ``csv.writer(stream, lineterminator="\\n")`` over the rows DuckDB returns
(tests/test_cli_csv_lines.py compares both on every verb's output and on awkward values):
NULL is an empty field; ``True``/``False``; a DOUBLE as Python's ``repr`` (DuckDB's cast to
VARCHAR gives the same shortest round-trip digits and exponent form); integers in decimal; a
string quoted (``"`` doubled) when it holds a character the running Python's writer quotes
(3.11: ``,``, ``"``, ``\\n``), and an empty
string as an empty field. Only for those column types, and two columns or more (a lone empty
field is ``""`` in Python's writer): :func:`csv_line_sql` returns None otherwise, and the
caller writes the rows in Python.

Small outputs skip Arrow: importing pyarrow costs ~0.2-0.6 s per process, more than fetching
a few hundred thousand lines as Python strings (~1 us a line against ~0.45 us through Arrow),
so while ``span_events`` and ``spans`` together hold fewer than :data:`ARROW_MIN_EVENTS`
rows (an output has at most about one line per span, as requests, or per chunk event, as
itl's gaps) the lines come back by ``fetchmany`` (benchmarks/verbs.py, fixed cost).
"""

from __future__ import annotations

import csv
import io
from collections.abc import Iterable, Iterator, Sequence
from typing import Any

import duckdb

__all__ = ["ARROW_MIN_EVENTS", "csv_line_sql", "iter_attached_csv_chunks", "iter_csv_chunks"]

_INTEGERS = {"TINYINT", "SMALLINT", "INTEGER", "BIGINT", "UTINYINT", "USMALLINT", "UINTEGER", "UBIGINT", "HUGEINT"}
_ARROW_BATCH_ROWS = 100_000
#: From this many rows of ``span_events`` plus ``spans`` on, the lines are read as Arrow batches (see above).
ARROW_MIN_EVENTS = 200_000


def _python_quotes(text: str) -> bool:
    buf = io.StringIO()
    csv.writer(buf, lineterminator="\n").writerow([text, "x"])
    return buf.getvalue().startswith('"')


# The characters that make this Python's csv writer quote a field (3.11 quotes no lone "\r"
# with lineterminator "\n"; asked of the running writer, not assumed).
_SPECIAL = "".join(c for c in ',"\n\r\t;' if _python_quotes(f"a{c}b"))


_CLASS = "[" + _SPECIAL.replace("\n", "\\n").replace("\r", "\\r").replace("\t", "\\t").replace("'", "''") + "]"


def _quoted(name: str) -> str:
    return '"' + name.replace('"', '""') + '"'


def _field(name: str, type_name: str) -> str | None:
    column = _quoted(name)
    if type_name in _INTEGERS or type_name == "DOUBLE":
        return f"coalesce(CAST({column} AS VARCHAR), '')"
    if type_name == "BOOLEAN":
        return f"CASE WHEN {column} THEN 'True' WHEN NOT {column} THEN 'False' ELSE '' END"
    if type_name == "VARCHAR":
        return (f"CASE WHEN {column} IS NULL THEN '' "
                f"WHEN regexp_matches({column}, '{_CLASS}') THEN '\"' || replace({column}, '\"', '\"\"') || '\"' "
                f"ELSE {column} END")
    return None


def csv_line_sql(sql: str, columns: Sequence[str], types: Sequence[Any]) -> str | None:
    """A query over ``sql`` (a SELECT) giving one VARCHAR column ``line``: each row's CSV text
    and ``\\n``; None when a column's type is not one this formats like Python (or fewer than
    two columns)."""
    if len(columns) < 2:
        return None
    found = [_field(c, str(t)) for c, t in zip(columns, types)]
    fields = [f for f in found if f is not None]
    if len(fields) < len(found):
        return None
    body = sql.rstrip().rstrip(";")
    return "SELECT concat(" + ", ',', ".join(fields) + ", chr(10)) AS line FROM (\n" + body + "\n)"


def iter_csv_chunks(
    con: duckdb.DuckDBPyConnection, line_sql: str, params: Any, *, arrow: bool = True
) -> Iterator[tuple[int, bytes]]:
    """The CSV text of ``line_sql``'s rows as (rows, UTF-8 bytes) chunks of up to 100,000 rows,
    in the query's row order: one per Arrow batch, or, with ``arrow=False`` (a small output:
    no pyarrow import), fetched as Python strings."""
    if not arrow:
        cursor = con.execute(line_sql, params)
        while rows := cursor.fetchmany(_ARROW_BATCH_ROWS):
            yield len(rows), "".join(row[0] for row in rows).encode("utf-8")
        return
    reader = con.sql(line_sql, params=params).to_arrow_reader(_ARROW_BATCH_ROWS)
    for batch in reader:
        if batch.num_rows == 0:
            continue
        lines = batch.column(0)
        if str(lines.type) not in ("string", "large_string"):  # e.g. string_view (DuckDB's arrow_output_version)
            import pyarrow as pa

            lines = lines.cast(pa.large_string())
        offsets = lines.buffers()[1]
        data = lines.buffers()[2]
        kind = 8 if str(lines.type) == "large_string" else 4
        start = int.from_bytes(memoryview(offsets)[lines.offset * kind:(lines.offset + 1) * kind], "little")
        end_at = (lines.offset + len(lines)) * kind
        end = int.from_bytes(memoryview(offsets)[end_at:end_at + kind], "little")
        yield batch.num_rows, memoryview(data)[start:end].tobytes()


_BATCH_VIEW = "tt_csv_attached_batch"


def iter_attached_csv_chunks(
    batches: Iterable[Any], columns: Sequence[str], types: Sequence[Any],
) -> Iterator[tuple[int, bytes]]:
    """The CSV text of pyarrow record batches in their order, as :func:`iter_csv_chunks`
    gives it (same bytes): each batch is registered with an in-memory DuckDB connection,
    which builds its lines.
    For ``QueryPart.arrow_batches`` (itl's rows with their names attached after an integer
    sort, analyzer/query/attach.py), whose rows a SELECT cannot give in order. ``columns``
    and ``types``: the query's (the batches may hold more columns; these are written)."""
    names = ", ".join(_quoted(c) for c in columns)
    line_sql = csv_line_sql(f"SELECT {names} FROM {_BATCH_VIEW}", columns, types)
    if line_sql is None:
        raise ValueError(f"csv lines: a column type of {list(columns)} is not one DuckDB formats like Python")
    # Lines are built on a connection of their own: the batches come from an open result on
    # ``con``, and a connection runs one result at a time.
    lines = duckdb.connect()
    try:
        for batch in batches:
            lines.register(_BATCH_VIEW, batch)  # a scan of one table keeps the batch's row order
            yield from iter_csv_chunks(lines, line_sql, None, arrow=True)
            lines.unregister(_BATCH_VIEW)
    finally:
        lines.close()
