"""Engines other than the default DuckDB one that run the same ``queries/`` SQL.

``analyzer.engines.spark_sql`` transpiles DuckDB SQL to Spark SQL (sqlglot, no pyspark
needed); ``analyzer.engines.spark`` runs it on a local Spark session over a ``tokentrace
export`` Parquet dump (needs the ``spark`` extra and Java 17+). See docs/spark.md.
"""

from __future__ import annotations

__all__: list[str] = []
