"""DuckDB SQL of ``queries/`` -> Spark SQL, at run time, with sqlglot (no second copy of a metric).

``sqlglot.transpile(sql, read="duckdb", write="spark")`` does most of the work; the rules below
fix what it gets wrong or leaves ambiguous for tokentrace's queries. Each rule is one AST
transform on the DuckDB parse tree, applied before Spark SQL is generated, with the reason
in its docstring. The parity tests (tests/test_spark_parity.py) run every query on both
engines and catch any new drift (a new sqlglot release, a new function in a query).

Rules applied (:func:`to_spark`):

1. ``quantile_cont(x, p)`` / ``percentile_cont(p) WITHIN GROUP (ORDER BY x)`` / ``median(x)``
   -> ``percentile(x, p)``: Spark's exact, linearly interpolated percentile (numpy 'linear',
   like DuckDB's quantile_cont). sqlglot emits ``PERCENTILE_CONT(x, p)`` (rejected by Spark)
   or ``PERCENTILE_APPROX`` (silently approximate).
2. Decimal literals (``1048576.0``) -> ``CAST(... AS DOUBLE)``: DuckDB divides BIGINT by a
   DECIMAL literal in DOUBLE; Spark would stay in DECIMAL (other rounding, Decimal results).
3. Two or more ``unnest()`` in one SELECT list -> one ``inline(arrays_zip(a, b)) AS (x, y)``:
   DuckDB zips them row by row (padding with NULL); Spark allows one generator per SELECT.
   ``arrays_zip`` pads with NULL too, and a NULL array gives no rows in both engines.
4. ``$name`` parameters -> ``CAST(:name AS <declared type>)``: Spark named parameter markers,
   bound by ``spark.sql(query, args=...)`` (never formatted in); the cast gives them the type
   of the query header's ``-- param:`` line (a NULL default is typed, a Python int is BIGINT,
   ``VARCHAR[]`` is ``ARRAY<STRING>``).
5. ``CREATE [OR REPLACE] VIEW`` -> ``CREATE OR REPLACE TEMPORARY VIEW``: views live in the
   Spark session only (nothing is written to a metastore), replaced like DuckDB's.

Handled by sqlglot itself, checked by the parity tests: ``m['k']`` map access (NULL for a
missing key on both engines), ``json_extract_string`` -> ``get_json_object``, ``count(*)
FILTER (WHERE ...)`` (Spark 3+), ``split_part`` (Spark 3.3+), ``unnest`` -> ``explode``,
``list`` -> ``collect_list``, ``//`` -> ``DIV``, ``VARCHAR`` -> ``STRING``, ``a || b``, and
``ORDER BY`` null order (DuckDB sorts NULLs last; sqlglot writes ``NULLS LAST`` explicitly).

Semantics left to the session (analyzer.query.spark): ``/`` is floating-point division on
both engines (DuckDB: DOUBLE for integers; Spark: DOUBLE). Integer overflow raises on both
(Spark's ANSI mode is kept on). Division by zero differs: DuckDB 2 returns +-inf (or NULL),
ANSI Spark raises; every division in queries/ is guarded (``CASE WHEN ... > 0``), so a new
unguarded division shows up as a Spark error, not as a silent difference.
"""

from __future__ import annotations

from collections.abc import Mapping

import sqlglot
from sqlglot import exp

from analyzer.errors import TranspileError

__all__ = ["spark_type", "to_spark", "to_spark_statements"]


def spark_type(duckdb_type: str) -> str:
    """A DuckDB type name (``VARCHAR``, ``DOUBLE[]``, ``MAP(VARCHAR, BIGINT)``) as Spark SQL
    (``STRING``, ``ARRAY<DOUBLE>``, ``MAP<STRING, BIGINT>``)."""
    return exp.DataType.build(duckdb_type, dialect="duckdb").sql("spark")


def _percentile(node: exp.Expression) -> exp.Expression:
    """Rule 1: every exact-percentile spelling -> Spark's exact ``percentile(x, p)``."""
    if isinstance(node, exp.WithinGroup) and isinstance(node.this, exp.PercentileCont):
        order = node.expression
        keys = order.expressions if isinstance(order, exp.Order) else []
        if len(keys) != 1:
            raise TranspileError(f"percentile_cont WITHIN GROUP needs one ORDER BY key: {node.sql('duckdb')}")
        key = keys[0]
        if key.args.get("desc"):
            raise TranspileError(f"percentile_cont over a descending order is not mapped: {node.sql('duckdb')}")
        return exp.Anonymous(this="percentile", expressions=[key.this.copy(), node.this.this.copy()])
    if isinstance(node, exp.PercentileCont) and node.expression is not None:
        return exp.Anonymous(this="percentile", expressions=[node.this.copy(), node.expression.copy()])
    if isinstance(node, exp.Median):
        return exp.Anonymous(this="percentile", expressions=[node.this.copy(), exp.Literal.number("0.5")])
    if isinstance(node, (exp.PercentileCont, exp.ApproxQuantile)):
        raise TranspileError(f"percentile form not mapped to Spark: {node.sql('duckdb')}")
    return node


def _decimal_literal(node: exp.Expression) -> exp.Expression:
    """Rule 2: ``1048576.0`` -> ``CAST(1048576.0 AS DOUBLE)`` (DOUBLE arithmetic, as in DuckDB)."""
    if isinstance(node, exp.Literal) and not node.is_string:
        text = str(node.this)
        if "." in text and "e" not in text.lower() and not isinstance(node.parent, exp.Cast):
            return exp.Cast(this=node.copy(), to=exp.DataType.build("DOUBLE"))
    return node


def _zip_unnests(select: exp.Expression) -> exp.Expression:
    """Rule 3: ``SELECT unnest(a) AS x, unnest(b) AS y`` -> ``SELECT inline(arrays_zip(a, b)) AS (x, y)``."""
    if not isinstance(select, exp.Select):
        return select
    generators = [
        e for e in select.expressions
        if isinstance(e, exp.Alias) and isinstance(e.this, (exp.Explode, exp.Unnest))
    ]
    if len(generators) < 2:
        return select
    if len(generators) != len(select.expressions):
        raise TranspileError(
            "a SELECT mixing several unnest() with other columns is not mapped to Spark: " + select.sql("duckdb")[:200]
        )
    arrays = [g.this.this.copy() for g in generators]
    zipped = exp.Anonymous(this="inline", expressions=[exp.Anonymous(this="arrays_zip", expressions=arrays)])
    select.set("expressions", [exp.Aliases(this=zipped, expressions=[exp.to_identifier(g.alias) for g in generators])])
    return select


def _typed_placeholders(tree: exp.Expression, types: Mapping[str, str]) -> exp.Expression:
    """Rule 4: ``$name`` -> ``CAST(:name AS <type>)`` with the header's declared type."""
    def cast(node: exp.Expression) -> exp.Expression:
        if isinstance(node, exp.Placeholder) and node.this and node.this in types:
            if isinstance(node.parent, exp.Cast) and node.parent.this is node:
                return node  # already cast in the query (e.g. CAST($offset_ms AS DOUBLE[]))
            return exp.Cast(this=node.copy(), to=exp.DataType.build(types[node.this], dialect="duckdb"))
        return node

    return tree.transform(cast, copy=False)


def _temporary_view(tree: exp.Expression) -> exp.Expression:
    """Rule 5: a DuckDB view becomes a Spark session temp view (CREATE OR REPLACE TEMPORARY VIEW)."""
    if isinstance(tree, exp.Create) and str(tree.args.get("kind", "")).upper() == "VIEW":
        tree.set("replace", True)
        tree.set("properties", exp.Properties(expressions=[exp.TemporaryProperty()]))
    return tree


def _rewrite(tree: exp.Expression, param_types: Mapping[str, str]) -> str:
    tree = tree.transform(_percentile, copy=False)
    tree = tree.transform(_decimal_literal, copy=False)
    tree = tree.transform(_zip_unnests, copy=False)
    tree = _typed_placeholders(tree, param_types)
    tree = _temporary_view(tree)
    return tree.sql(dialect="spark")


def to_spark_statements(sql: str, param_types: Mapping[str, str] | None = None) -> list[str]:
    """Every statement of a DuckDB SQL text (a ``queries/views/*.sql`` file may hold several)
    as Spark SQL. ``param_types`` maps a ``$name`` parameter to its DuckDB type."""
    try:
        trees = sqlglot.parse(sql, read="duckdb")
    except sqlglot.errors.ParseError as exc:
        raise TranspileError(f"sqlglot cannot parse the DuckDB SQL: {str(exc).splitlines()[0]}") from None
    return [_rewrite(t, param_types or {}) for t in trees if isinstance(t, exp.Expression)]


def to_spark(sql: str, param_types: Mapping[str, str] | None = None) -> str:
    """One DuckDB statement (a ``queries/*.sql`` file) as one Spark SQL statement."""
    statements = to_spark_statements(sql, param_types)
    if len(statements) != 1:
        raise TranspileError(f"expected one statement, found {len(statements)}")
    return statements[0]
