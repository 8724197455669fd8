"""The query layer: queries/*.sql files parsed, run and streamed on DuckDB (runner), or transpiled to Spark SQL and run on Spark.

``analyzer.query.runner`` runs a query on a connection (``run_query``, ``stream_query``,
``install_views``); ``analyzer.query.spark_sql`` transpiles DuckDB SQL to Spark SQL (sqlglot,
no pyspark needed); ``analyzer.query.spark`` runs it on a local Spark session over a
``tokentrace export`` Parquet dump (needs the ``spark`` extra and Java 17+). See docs/spark.md.
"""

from __future__ import annotations

__all__: list[str] = []
