"""Every trace query gives the same rows on DuckDB and on Spark local[2], over one
``tokentrace export`` dump of the SDK-written fixture traces; Spark prunes partitions.

One Spark session for the whole run (session-scoped fixture); skipped with the reason when
pyspark or Java is missing. Floats compare with a relative tolerance of 1e-9.
"""

from __future__ import annotations

import math
import shutil
from pathlib import Path
from typing import Any

import pytest

from analyzer.db.source import open_source
from analyzer.formats.parquet_export import export_parquet
from analyzer.query.runner import list_queries, run_query
from trace_fixtures import ANCHOR_NS, RequestPlan, mixed_trace_id, mixed_world

pytestmark = pytest.mark.spark

DAY_NS = 86_400 * 10**9
SMALL_DATA_CONF = {"spark.sql.codegen.wholeStage": "false", "spark.sql.adaptive.enabled": "false"}
SEED = mixed_trace_id("seed")


@pytest.fixture(scope="session")
def spark():
    pytest.importorskip("pyspark", reason="pyspark is not installed (pip install 'tokentrace[spark]')")
    if shutil.which("java") is None:
        pytest.skip("Java 17+ is not on PATH: Spark cannot start")
    from analyzer.query.spark import get_session, stop_session

    # tiny data: one shuffle partition, no whole-stage code generation (compiling costs more
    # than it saves here); results do not depend on either
    session = get_session(shuffle_partitions=1, conf=SMALL_DATA_CONF)
    yield session
    stop_session()


@pytest.fixture(scope="module")
def dump(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The mixed fixture (every planted case, 2026-01-01) plus one request three days later
    (a second ``date`` partition) and the continuous-engine capture (tests/fixtures/
    continuous_engine, 2026-12-01: engine steps beside the mixed world's step-less traces),
    exported with tokentrace's exporter."""
    from analyzer.formats.load import load_paths

    world = mixed_world()
    world.add(RequestPlan(start_ms=3 * 86_400_000, output_tokens=6))
    con = world.load()
    load_paths(con, [str(CONTINUOUS_CAPTURE / "server.otlp.jsonl"), str(CONTINUOUS_CAPTURE / "client.otlp.jsonl")])
    target = tmp_path_factory.mktemp("spark") / "dump"
    export_parquet(con, target)
    con.close()
    return target


@pytest.fixture(scope="module")
def engines(spark, dump: Path):
    from analyzer.query.spark import open_spark_source

    con = open_source(parquet=dump)
    source = open_spark_source(dump, spark=spark)
    yield con, source
    con.close()


def _request_span(con: Any, trace_id: str) -> str:
    return run_query(con, "requests", {"trace_id": trace_id, "perspective": "server"}).rows[0][3]


CASES: list[tuple[str, dict[str, Any]]] = [
    ("requests", {}),
    ("requests", {"perspective": "client", "trace_id": SEED}),
    ("itl", {}),
    ("itl", {"perspective": "server", "trace_id": mixed_trace_id("multi_token")}),
    ("phases", {}),
    ("phases", {"offset_domains": ["skewed-client"], "offset_ms": [35.0], "tolerance_ms": 0.5}),
    ("summary", {}),
    ("summary", {"perspective": "client", "include_unsuccessful": True}),
    ("window", {}),
    ("window", {"mode": "steady_state", "window_start_ns": ANCHOR_NS + 5 * 10**9,
                "window_end_ns": ANCHOR_NS + 65 * 10**9, "slo_ttft_ms": 200.0, "slo_tpot_ms": 30.0}),
    ("window", {"cancelled_as_failed": True, "count_failed_tokens": True, "perspective": "server"}),
    ("skew_rules", {}),
    ("skew_rules", {"tolerance_ms": 3.0, "trace_id": mixed_trace_id("broken")}),
    ("skew_offsets", {}),
    ("skew_offsets", {"offset_domains": ["skewed-client", "server"], "offset_ms": [35.0, 1.0]}),
    ("report/waterfall", {"trace_id": SEED}),
    ("report/chunk_times", {"trace_id": mixed_trace_id("multi_token")}),
    ("report/decode_steps", {"trace_id": SEED}),
    ("report/throughput_timeline", {"bucket_s": 5.0}),
    ("report/timeline", {}),
    ("report/timeline", {"kinds": ["request", "decode", "token"]}),
    # engine steps: the capture's step rows and the mixed world's NULL rows with their reasons
    ("steps", {}),
    ("steps_summary", {}),
    ("stalls", {}),
    ("stalls_groups", {}),
    ("stalls_slowest", {"per_request": 2}),
]
CONTINUOUS_CAPTURE = Path(__file__).resolve().parent / "fixtures" / "continuous_engine"


def _same(a: Any, b: Any) -> bool:
    if isinstance(a, float) or isinstance(b, float):
        if a is None or b is None:
            return a is b
        return math.isclose(float(a), float(b), rel_tol=1e-9, abs_tol=1e-9)
    if isinstance(a, (list, tuple)) and isinstance(b, (list, tuple)):
        return len(a) == len(b) and all(_same(x, y) for x, y in zip(a, b))
    if isinstance(a, dict) and isinstance(b, dict):
        return a.keys() == b.keys() and all(_same(a[k], b[k]) for k in a)
    return a == b


def test_every_trace_query_has_a_parity_case() -> None:
    covered = {name for name, _ in CASES}
    assert set(list_queries()) | set(list_queries("report")) <= covered


@pytest.mark.parametrize(("name", "params"), CASES, ids=[f"{n}-{i}" for i, (n, _) in enumerate(CASES)])
def test_duckdb_and_spark_agree(engines, name: str, params: dict[str, Any]) -> None:
    con, source = engines
    params = dict(params)
    if name.startswith("report/") and "trace_id" in params:
        params["request_span_id"] = _request_span(con, params["trace_id"])
    expected = run_query(con, name, params)
    got = source.run(name, params)
    assert got.columns == expected.columns
    assert len(got.rows) == len(expected.rows), f"{name}: {len(got.rows)} rows on Spark, {len(expected.rows)} on DuckDB"
    if name != "skew_offsets":  # one fixture case must give rows (skew_offsets: one per domain pair)
        assert expected.rows, f"{name} {params}: the fixture gives no rows to compare"
    for i, (g, e) in enumerate(zip(got.rows, expected.rows)):
        diffs = {c: (gv, ev) for c, gv, ev in zip(expected.columns, g, e) if not _same(gv, ev)}
        assert not diffs, f"{name} row {i}: spark != duckdb {diffs}"


# The pruning tests re-create the session's spans/span_events/span_links views: they come
# after the parity tests (pytest runs a module's tests in file order).


def _scan_nodes(frame: Any) -> str:
    return frame._jdf.queryExecution().executedPlan().toString()


def test_time_window_prunes_date_partitions(spark, dump: Path) -> None:
    from analyzer.query.spark import open_spark_source

    source = open_spark_source(dump, start_ns=ANCHOR_NS, end_ns=ANCHOR_NS + 3_600 * 10**9, spark=spark)
    plan = _scan_nodes(spark.table("spans"))
    assert "PartitionFilters: [" in plan and "date" in plan.split("PartitionFilters: [", 1)[1].split("]", 1)[0]
    days = {r[0] for r in spark.sql("SELECT DISTINCT date FROM tt_raw_spans").collect()}
    assert days == {"2026-01-01", "2026-01-04", "2026-12-01"}  # the dump holds three days...
    starts = [r[0] for r in spark.table("spans").select("start_ns").collect()]
    assert starts and max(starts) < ANCHOR_NS + DAY_NS  # ...the view reads only the first
    assert source.files["spans"] >= 2


def test_service_filter_prunes_service_partitions(spark, dump: Path) -> None:
    from analyzer.query.spark import open_spark_source

    open_spark_source(dump, services=["server"], spark=spark)
    plan = _scan_nodes(spark.table("span_events"))
    filters = plan.split("PartitionFilters: [", 1)[1].split("]", 1)[0]
    assert "service_name" in filters
    assert {r[0] for r in spark.table("spans").select("service_name").distinct().collect()} == {"server"}


def test_export_writes_bigint_times_and_spark_reads_maps(spark, dump: Path) -> None:
    import pyarrow as pa
    import pyarrow.parquet as pq

    schema = pq.read_schema(next((dump / "spans").glob("**/*.parquet")))
    assert schema.field("start_ns").type == pa.int64() and schema.field("end_ns").type == pa.int64()
    assert not any(pa.types.is_timestamp(f.type) for f in schema)
    events = pq.read_schema(next((dump / "span_events").glob("**/*.parquet")))
    assert events.field("time_ns").type == pa.int64()
    types = dict(spark.read.parquet(str(dump / "spans")).dtypes)
    assert types["start_ns"] == "bigint" and types["attr_int"] == "map<string,bigint>"
    assert types["attr_json"] == "map<string,string>" and types["date"] == "string"


def test_cli_requests_engine_spark_prints_what_duckdb_prints(spark, dump: Path) -> None:
    import json

    from click.testing import CliRunner

    from analyzer.cli import cli

    args = ["requests", "--parquet", str(dump), "--perspective", "client", "--format", "json"]
    duck = CliRunner().invoke(cli, args, catch_exceptions=False)
    on_spark = CliRunner().invoke(cli, [*args, "--engine", "spark"], catch_exceptions=False)
    assert duck.exit_code == 0 and on_spark.exit_code == 0, on_spark.output
    assert _same(json.loads(on_spark.output), json.loads(duck.output))


def test_cli_engine_spark_needs_a_parquet_dump() -> None:
    from click.testing import CliRunner

    from analyzer.cli import cli

    result = CliRunner().invoke(cli, ["requests", "--engine", "spark", "--db", "x.duckdb"])
    assert result.exit_code == 1 and "--engine spark reads a Parquet dump" in result.output
    result = CliRunner().invoke(cli, ["skew", "--engine", "spark", "--parquet", "nowhere"])
    assert result.exit_code == 1 and "runs on DuckDB only" in result.output
