"""The metric SQL of ``queries/`` on Spark SQL, over a ``tokentrace export`` Parquet dump.

One source of truth: every ``queries/*.sql`` and ``queries/views/*.sql`` file is transpiled
from DuckDB's dialect at run time (:mod:`analyzer.query.spark_sql`); nothing here restates
a metric. The dump (docs/parquet.md) is read in place: temp views ``spans``, ``span_events``
and ``span_links`` select the canonical columns (analyzer.db.schema) from
``DIR/<table>/service_name=<svc>/date=<YYYY-MM-DD>/*.parquet``, filtered on the partition
columns so Spark prunes partitions (a time window keeps [start day - 1, end day + 1], as
analyzer.db.source does for DuckDB; ``services`` keeps those service folders). Then the adapter
views, the ``request_facts`` / ``request_chunks`` unions (analyzer.db.views.union_view_sql)
and the derived views are created as temp views, in the same order as DuckDB's.

The session is local (``local[2]`` by default, $TOKENTRACE_SPARK_MASTER), started once per
process, UI off, bound to 127.0.0.1, UTC, ANSI mode on, and stopped at exit. Start-up takes
about 4-5 s; a query over a small dump about 1 s.
"""

from __future__ import annotations

import atexit
import datetime as dt
import os
import shutil
import tempfile
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from analyzer.db.schema import DEDICATED_COLUMNS
from analyzer.db.source import DUMP_TABLES, _canonical_columns, utc_day_of_ns
from analyzer.db.views import UNIONED_VIEWS, union_view_sql, view_files
from analyzer.errors import SparkEngineError, TranspileError
from analyzer.query.runner import QueryResult, load_query
from analyzer.query.spark_sql import spark_type, to_spark, to_spark_statements

if TYPE_CHECKING:  # pragma: no cover
    from pyspark.sql import DataFrame, SparkSession

__all__ = [
    "MATERIALIZED_VIEWS",
    "SPARK_MASTER_ENV",
    "SPARK_MEMORY_ENV",
    "SparkSource",
    "get_session",
    "open_spark_source",
    "partition_filters",
    "run_spark_query",
    "spark_verb_rows",
    "stop_session",
]

#: Spark master URL; default ``local[2]`` (two worker threads in this process's JVM).
SPARK_MASTER_ENV = "TOKENTRACE_SPARK_MASTER"
DEFAULT_MASTER = "local[2]"
#: Driver heap, -Xmx (local mode runs everything in the driver JVM); default 6g: 2g ran out
#: of memory on the 1e6-decode-span benchmark dump, 6g finished it (benchmarks/scale.py).
SPARK_MEMORY_ENV = "TOKENTRACE_SPARK_MEMORY"
DEFAULT_MEMORY = "6g"
#: Views materialized (lineage cut with a lazy localCheckpoint) once per source: without it
#: Spark inlines the whole adapter tree into every reference, and a query such as summary
#: (request_metrics referenced seven times) spends tens of seconds planning, or runs out of
#: heap. Each is computed on first use and kept (memory, spilling to disk) for later queries.
MATERIALIZED_VIEWS: tuple[str, ...] = ("request_facts", "request_chunks", "request_metrics", "request_gaps")
INSTALL_HINT = "install the extra: pip install 'tokentrace[spark]' (pyspark 4.3, needs Java 17+)"

# Driver logging: errors only, and no per-query SQL-context dumps (the CLI prints one line).
_LOG4J2 = """rootLogger.level = error
rootLogger.appenderRef.stderr.ref = console
appender.console.type = Console
appender.console.name = console
appender.console.target = SYSTEM_ERR
appender.console.layout.type = PatternLayout
appender.console.layout.pattern = %d{HH:mm:ss} %p %c{1}: %m%n
logger.sqlctx.name = SQLQueryContextLogger
logger.sqlctx.level = off
"""

_SESSION: SparkSession | None = None


def _check_runtime() -> None:
    try:
        import pyspark  # noqa: F401 - imported to check the spark extra is installed
    except ImportError:
        raise SparkEngineError(f"--engine spark needs pyspark: {INSTALL_HINT}") from None
    java_home = os.environ.get("JAVA_HOME")
    if not (java_home and Path(java_home, "bin", "java").exists()) and shutil.which("java") is None:
        raise SparkEngineError("--engine spark needs Java 17+: no java on PATH and JAVA_HOME is not set")


def get_session(
    master: str | None = None, shuffle_partitions: int = 4, conf: Mapping[str, str] | None = None
) -> SparkSession:
    """The process's Spark session (created on first use, cached, stopped at exit).

    ``conf`` adds or overrides Spark settings (e.g. the tests turn whole-stage code
    generation off: on tiny dumps compiling the generated code costs more than it saves)."""
    global _SESSION
    if _SESSION is not None:
        return _SESSION
    _check_runtime()
    from pyspark.sql import SparkSession

    log_conf = Path(tempfile.mkdtemp(prefix="tokentrace-spark-")) / "log4j2.properties"
    log_conf.write_text(_LOG4J2)
    builder = (
        SparkSession.builder.master(master or os.environ.get(SPARK_MASTER_ENV, DEFAULT_MASTER))
        .appName("tokentrace")
        .config("spark.ui.enabled", "false")
        .config("spark.ui.showConsoleProgress", "false")
        .config("spark.driver.host", "127.0.0.1")
        .config("spark.driver.bindAddress", "127.0.0.1")
        .config("spark.sql.session.timeZone", "UTC")
        .config("spark.sql.ansi.enabled", "true")  # integer overflow raises, as in DuckDB
        .config("spark.sql.shuffle.partitions", str(shuffle_partitions))
        .config("spark.default.parallelism", "2")
        # the planner sizes a table by its compressed Parquet bytes; attribute maps inflate
        # several-fold in memory, and the 10 MB default broadcast ran the 2g heap out at 1e6 spans
        .config("spark.sql.autoBroadcastJoinThreshold", "1m")
        .config("spark.driver.memory", os.environ.get(SPARK_MEMORY_ENV, DEFAULT_MEMORY))
        # temp views keep their analyzed plan: the adapter views nest deeply, and re-analyzing
        # the SQL text of every view at every reference took most of the start-up time
        .config("spark.sql.legacy.storeAnalyzedPlanForView", "true")
        # partition values stay strings: service names are never re-typed, dates compare as text
        .config("spark.sql.sources.partitionColumnTypeInference.enabled", "false")
        .config("spark.driver.extraJavaOptions", f"-Dlog4j2.configurationFile=file:{log_conf}")
    )
    for key, value in (conf or {}).items():
        builder = builder.config(key, value)
    try:
        _SESSION = builder.getOrCreate()
    except Exception as exc:  # noqa: BLE001 - the JVM failed to start (Java too old, port, memory): one line
        raise SparkEngineError(f"cannot start Spark: {str(exc).splitlines()[0]}") from None
    _SESSION.sparkContext.setLogLevel("ERROR")
    atexit.register(stop_session)
    return _SESSION


def stop_session() -> None:
    """Stop the cached session (idempotent)."""
    global _SESSION
    if _SESSION is not None:
        _SESSION.stop()
        _SESSION = None


def partition_filters(
    start_ns: int | None = None, end_ns: int | None = None, services: Sequence[str] | None = None
) -> tuple[str, dict[str, Any]]:
    """The WHERE clause on the partition columns (``date`` text, ``service_name``) and its
    named parameters. Days keep one day of margin on each side (requests crossing midnight)."""
    where: list[str] = []
    args: dict[str, Any] = {}
    if start_ns is not None:
        where.append("date >= :tt_first_day")
        args["tt_first_day"] = (dt.date.fromisoformat(utc_day_of_ns(start_ns)) - dt.timedelta(days=1)).isoformat()
    if end_ns is not None:
        where.append("date <= :tt_last_day")
        args["tt_last_day"] = (dt.date.fromisoformat(utc_day_of_ns(end_ns)) + dt.timedelta(days=1)).isoformat()
    if services:
        names = [f":tt_service_{i}" for i in range(len(services))]
        where.append(f"service_name IN ({', '.join(names)})")
        args.update({n[1:]: s for n, s in zip(names, services)})
    return " AND ".join(where), args


@dataclass
class SparkSource:
    """A Spark session whose temp views hold one dump: ``spans``, ``span_events``,
    ``span_links`` (canonical columns) and, once :meth:`install_views` ran, every view."""

    spark: SparkSession
    directory: Path
    files: dict[str, int]
    partition_where: str = ""
    materialize: bool = True
    views_installed: bool = field(default=False)

    def install_views(self) -> None:
        """Adapter views, the two unions, then the derived views (analyzer.query.runner order);
        :data:`MATERIALIZED_VIEWS` are replaced by lazily checkpointed copies as they come."""
        if self.views_installed:
            return
        base, derived = view_files()
        for text in base:
            for statement in to_spark_statements(text):
                self.spark.sql(statement)
        views = {r["viewName"] for r in self.spark.sql("SHOW VIEWS").collect() if r["isTemporary"]}
        for union in UNIONED_VIEWS:
            columns = self.spark.table(f"tt_{union}").columns
            self.spark.sql(to_spark(union_view_sql(union, views, columns)))
            self._materialize(union)
        for text in derived:
            for statement in to_spark_statements(text):
                self.spark.sql(statement)
                created = _created_view(statement)
                if created is not None:
                    self._materialize(created)
        self.views_installed = True

    def _materialize(self, view: str) -> None:
        if self.materialize and view in MATERIALIZED_VIEWS:
            self.spark.table(view).localCheckpoint(eager=False).createOrReplaceTempView(view)

    def query(self, name: str, params: Mapping[str, Any] | None = None) -> DataFrame:
        """``queries/<name>.sql`` as a Spark DataFrame (lazy), parameters bound by name."""
        query = load_query(name)
        bound = query.bind(params)
        self.install_views()
        sql = to_spark(query.sql, {p.name: p.sql_type for p in query.params})
        return self.spark.sql(sql, args=_spark_args(bound))

    def run(self, name: str, params: Mapping[str, Any] | None = None) -> QueryResult:
        """Run ``queries/<name>.sql``: the same columns and row order as DuckDB's run_query."""
        from pyspark.errors import PySparkException

        try:
            frame = self.query(name, params)
            rows = [tuple(r) for r in frame.collect()]
        except PySparkException as exc:
            raise SparkEngineError(f"{name} on Spark: {_first_line(exc)}") from None
        except TranspileError as exc:
            raise SparkEngineError(f"{name}: {exc}") from None
        return QueryResult(name, list(frame.columns), rows)


def _created_view(statement: str) -> str | None:
    """The name of the view a ``CREATE ... VIEW name AS`` statement creates (else None)."""
    import sqlglot
    from sqlglot import exp

    tree = sqlglot.parse_one(statement, read="spark")
    if isinstance(tree, exp.Create) and isinstance(tree.this, exp.Table):
        return tree.this.name
    return None


def _spark_args(bound: Mapping[str, Any]) -> dict[str, Any]:
    """Python values for ``spark.sql(args=...)``: lists/tuples become arrays, None is NULL
    (typed by the CAST the transpiler wraps around every marker)."""
    return {k: list(v) if isinstance(v, tuple) else v for k, v in bound.items()}


def _first_line(exc: BaseException) -> str:
    text = getattr(exc, "getMessage", None)
    message = text() if callable(text) else str(exc)
    return message.strip().splitlines()[0] if message.strip() else type(exc).__name__


def _table_view(spark: SparkSession, root: Path, table: str, where: str, args: dict[str, Any]) -> int:
    """Create temp view ``table`` over ``root/table`` (or an empty one); returns its file count."""
    columns = _canonical_columns(table)
    folder = root / table
    files = sorted(folder.glob("**/*.parquet")) if folder.is_dir() else []
    if not files:
        if table == "spans":
            raise SparkEngineError(f"{root}: no Parquet files under spans/ (is this a tokentrace export dump?)")
        cols = ", ".join(f"CAST(NULL AS {spark_type(t)}) AS {n}" for n, t in columns)
        spark.sql(f"CREATE OR REPLACE TEMPORARY VIEW {table} AS SELECT {cols} WHERE false")
        return 0
    frame = spark.read.option("mergeSchema", "true").option("basePath", str(folder)).parquet(str(folder))
    available = set(frame.columns)
    raw = f"tt_raw_{table}"
    frame.createOrReplaceTempView(raw)
    # a dedicated column (analyzer.db.schema) absent from a format-1 dump is read from its
    # map; where present, the map fills the rows of older files merged into the same folder
    dedicated = {c.name: c for c in DEDICATED_COLUMNS.get(table, ())}
    select = ", ".join(
        (f"coalesce({n}, {dedicated[n].from_map}) AS {n}" if n in available else f"{dedicated[n].from_map} AS {n}")
        if n in dedicated else n if n in available else f"CAST(NULL AS {spark_type(t)}) AS {n}"
        for n, t in columns
    )
    clause = ""
    if where and {"date", "service_name"} <= available:
        clause = f" WHERE {where}"
    # SQL temp views cannot hold parameter markers: the partition values (days, service
    # names) are bound as named parameters of a query whose DataFrame becomes the view.
    view = spark.sql(f"SELECT {select} FROM {raw}{clause}", args=args or None)
    view.createOrReplaceTempView(table)
    return len(files)


def open_spark_source(
    directory: str | Path,
    *,
    start_ns: int | None = None,
    end_ns: int | None = None,
    services: Sequence[str] | None = None,
    spark: SparkSession | None = None,
) -> SparkSource:
    """Temp views over the dump at ``directory`` in the (cached) Spark session.

    ``start_ns`` / ``end_ns`` (ns since the epoch) keep the ``date`` partitions of
    [start day - 1, end day + 1]; ``services`` keeps those ``service_name`` partitions.
    Raises :class:`SparkEngineError` with one readable line for a missing or foreign dump.
    """
    root = Path(directory)
    if not root.is_dir():
        raise SparkEngineError(f"{root}: no such directory (a tokentrace export dump with spans/, span_events/, span_links/)")
    session = spark or get_session()
    where, args = partition_filters(start_ns, end_ns, services)
    from pyspark.errors import PySparkException

    files: dict[str, int] = {}
    try:
        for table in DUMP_TABLES:
            files[table] = _table_view(session, root, table, where, args)
    except PySparkException as exc:
        raise SparkEngineError(f"{root}: cannot read the Parquet dump: {_first_line(exc)}") from None
    return SparkSource(session, root, files, where)


def run_spark_query(
    name: str,
    params: Mapping[str, Any] | None,
    *,
    parquet: str | Path,
    start_ns: int | None = None,
    end_ns: int | None = None,
) -> QueryResult:
    """Open the dump and run one query (what ``tokentrace <verb> --engine spark`` calls)."""
    return open_spark_source(parquet, start_ns=start_ns, end_ns=end_ns).run(name, params)


def spark_verb_rows(
    query: str,
    params: Mapping[str, Any],
    *,
    db_path: str | None,
    parquet_dir: str | None,
    start_ns: int | None = None,
    end_ns: int | None = None,
) -> QueryResult:
    """``tokentrace <verb> --engine spark``: the rows of one query, or a one-line UserError."""
    from analyzer.errors import UserError

    if db_path or not parquet_dir:
        raise UserError(
            "--engine spark reads a Parquet dump: give --parquet DIR (write one with tokentrace export --db X --parquet DIR)"
        )
    try:
        return run_spark_query(query, params, parquet=parquet_dir, start_ns=start_ns, end_ns=end_ns)
    except (SparkEngineError, ValueError) as exc:
        raise UserError(str(exc)) from None
