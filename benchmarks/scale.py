"""The same metric queries on DuckDB and on Spark local[2], over synthetic Parquet dumps of
1e5 and 1e6 decode spans (1e7 with --huge), and the effect of partition pruning.

Traces follow tokentrace's span contract (docs/spans.md), written straight into the
canonical tables with SQL (no SDK): each request is a gateway SERVER span with a prefill
span, ``--steps`` decode spans and one ``tokentrace.chunk`` event per token, requests spread
over ``--days`` UTC days (so the dump has that many ``date`` partitions). The dump is written
by ``analyzer.formats.parquet_export.export_parquet`` (the ``tokentrace export`` code path).

Timings (seconds, wall clock): ``open`` = views over the dump (+ Spark: adapter views),
``<query>`` = one run of queries/<query>.sql, ``window_day0`` = window.sql over the first
day with the time window given to the source (pruned to 2 of ``--days`` partitions) vs
``window_day0_unpruned`` (same answer, every partition read). Spark's session start-up is
reported once. Usage::

    python benchmarks/scale.py                 # 1e5 and 1e6 decode spans
    python benchmarks/scale.py --sizes 100000  # one size
    python benchmarks/scale.py --huge          # adds 1e7 (about 3 GB of Parquet; slow on 2 cores)
"""

from __future__ import annotations

import argparse
import json
import re
import shutil
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

ANCHOR_NS = 1_767_225_600_000_000_000  # 2026-01-01T00:00:00Z
DAY_NS = 86_400 * 10**9
QUERIES = ("requests", "summary", "window")
FINISH_JSON = """MAP {'gen_ai.response.finish_reasons': '["length"]'}"""


def build_dump(decode_spans: int, steps: int, days: int, target: Path) -> dict[str, int]:
    """Write a dump of ``decode_spans`` decode spans (``decode_spans // steps`` requests)."""
    from analyzer.db.store import connect
    from analyzer.formats.parquet_export import export_parquet

    requests = max(1, decode_spans // steps)
    con = connect(None)
    per_day = max(1, -(-requests // days))
    params = {"n": requests, "steps": steps, "anchor": ANCHOR_NS, "per_day": per_day, "day": DAY_NS}
    # request r: starts at anchor + (r // per_day) days + (r % per_day) * 50 ms; prefill 0-100 ms,
    # decode step k (1..steps) ends at 100 + 20 k ms and emits chunk k; chunk 0 at 101 ms
    _execute(con, """
    CREATE TEMP TABLE req AS
    SELECT r, printf('%032x', r + 1) AS trace_id, printf('%016x', r * (($steps + 2)) + 1) AS gw_id,
           $anchor + (r // $per_day) * $day + (r % $per_day) * 50000000 AS s
    FROM range($n) t(r)""", params)
    common = ("NULL, NULL, {cols}, 'UNSET', NULL, 'server', 's-1', 'gpu-1', 'server|s-1|gpu-1', 'tokentrace', '1', "
              "MAP(), {ints}, MAP(), MAP(), {json}, MAP(), MAP(), MAP(), MAP(), MAP(), NULL, 0, 0, 0, NULL")
    _execute(con, f"""
    INSERT INTO spans SELECT trace_id, gw_id, NULL, {common.format(
        cols="'gateway', 'SERVER', s, s + (101 + 20 * $steps + 1) * 1000000",
        ints="MAP {'gen_ai.usage.input_tokens': 512, 'gen_ai.usage.output_tokens': $steps + 1}",
        json=FINISH_JSON)} FROM req""", params)
    _execute(con, f"""
    INSERT INTO spans SELECT trace_id, printf('%016x', r * ($steps + 2) + 2), gw_id, {common.format(
        cols="'prefill', 'INTERNAL', s, s + 100000000",
        ints="MAP {'tokentrace.kv.bytes_per_token': 327680, 'tokentrace.kv.bytes': 327680 * 512}", json="MAP()")}
    FROM req""", params)
    _execute(con, f"""
    INSERT INTO spans SELECT trace_id, printf('%016x', r * ($steps + 2) + 2 + k), gw_id, {common.format(
        cols="'decode', 'INTERNAL', s + (80 + 20 * k) * 1000000, s + (100 + 20 * k) * 1000000",
        ints="MAP {'tokentrace.step': k, 'tokentrace.kv.bytes': 327680 * (512 + k)}", json="MAP()")}
    FROM req, range(1, $steps + 1) t(k)""", params)
    _execute(con, """
    INSERT INTO span_events SELECT trace_id, gw_id, k, s + (101 + 20 * k) * 1000000, 'tokentrace.chunk',
        MAP(), MAP {'tokentrace.chunk.index': k, 'tokentrace.chunk.tokens': 1}, MAP(),
        MAP {'tokentrace.chunk.visible': true}, MAP(), 0
    FROM req, range(0, $steps + 1) t(k)""", params)
    report = export_parquet(con, target)
    con.close()
    return {"spans": report.spans, "span_events": report.span_events, "requests": requests}


def _execute(con: Any, sql: str, params: dict[str, int]) -> None:
    """DuckDB wants exactly the parameters a statement uses."""
    used = set(re.findall(r"\$([a-z_]+)", sql))
    con.execute(sql, {k: v for k, v in params.items() if k in used})


def _timed(fn: Callable[[], Any]) -> tuple[float, Any]:
    start = time.perf_counter()
    value = fn()
    return time.perf_counter() - start, value


def run_duckdb(dump: Path) -> dict[str, float]:
    from analyzer.db.source import open_source
    from analyzer.db.views import install_views
    from analyzer.query.runner import run_query

    out: dict[str, float] = {}
    con = open_source(parquet=dump)
    out["open"], _ = _timed(lambda: install_views(con))
    for q in QUERIES:
        out[q], _ = _timed(lambda: run_query(con, q, views=False))  # noqa: B023 - called in this iteration
    con.close()
    out.update(_window_day0(lambda pruned: _duck_window(dump, pruned)))
    return out


def _duck_window(dump: Path, pruned: bool) -> Any:
    from analyzer.db.source import open_source
    from analyzer.query.runner import run_query

    window = {"window_start_ns": ANCHOR_NS, "window_end_ns": ANCHOR_NS + DAY_NS // 2}
    con = open_source(parquet=dump, **({"start_ns": window["window_start_ns"], "end_ns": window["window_end_ns"]}
                                        if pruned else {}))
    rows = run_query(con, "window", window).rows
    con.close()
    return rows


def run_spark(dump: Path) -> dict[str, float]:
    from analyzer.query.spark import open_spark_source

    out: dict[str, float] = {}
    source = open_spark_source(dump)
    out["open"], _ = _timed(source.install_views)
    for q in QUERIES:
        out[q], _ = _timed(lambda: source.run(q))  # noqa: B023 - called in this iteration
    out.update(_window_day0(lambda pruned: _spark_window(dump, pruned)))
    return out


def _spark_window(dump: Path, pruned: bool) -> Any:
    from analyzer.query.spark import open_spark_source

    window = {"window_start_ns": ANCHOR_NS, "window_end_ns": ANCHOR_NS + DAY_NS // 2}
    bounds = {"start_ns": window["window_start_ns"], "end_ns": window["window_end_ns"]} if pruned else {}
    return open_spark_source(dump, **bounds).run("window", window).rows


def _window_day0(run: Callable[[bool], Any]) -> dict[str, float]:
    pruned_s, pruned_rows = _timed(lambda: run(True))
    full_s, full_rows = _timed(lambda: run(False))
    assert [r[:12] for r in pruned_rows] == [r[:12] for r in full_rows], "pruning changed the window answer"
    return {"window_day0": pruned_s, "window_day0_unpruned": full_s}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--sizes", type=int, nargs="+", default=[100_000, 1_000_000], help="decode spans per dump")
    parser.add_argument("--huge", action="store_true", help="also 1e7 decode spans")
    parser.add_argument("--steps", type=int, default=100, help="decode spans per request")
    parser.add_argument("--days", type=int, default=8, help="UTC days (date partitions) the requests spread over")
    parser.add_argument("--engines", nargs="+", default=["duckdb", "spark"], choices=["duckdb", "spark"])
    args = parser.parse_args()
    sizes = [*args.sizes, *([10_000_000] if args.huge else [])]
    results: list[dict[str, Any]] = []
    if "spark" in args.engines:
        from analyzer.query.spark import get_session

        start_s, _ = _timed(get_session)
        print(f"spark session start-up: {start_s:.1f} s", flush=True)
    for size in sizes:
        work = Path(tempfile.mkdtemp(prefix="tt-scale-"))
        try:
            build_s, counts = _timed(lambda: build_dump(size, args.steps, args.days, work / "dump"))  # noqa: B023 - called here
            mb = sum(f.stat().st_size for f in (work / "dump").rglob("*.parquet")) / 2**20
            print(f"\n{size:,} decode spans: {counts} built+exported in {build_s:.1f} s, {mb:.1f} MiB Parquet", flush=True)
            for engine in args.engines:
                times = (run_duckdb if engine == "duckdb" else run_spark)(work / "dump")
                print(f"  {engine:7s}" + "".join(f"  {k}={v:.2f}s" for k, v in times.items()), flush=True)
                results.append({"decode_spans": size, "engine": engine, **{k: round(v, 3) for k, v in times.items()}})
        finally:
            shutil.rmtree(work, ignore_errors=True)
    print(json.dumps(results, indent=1))


if __name__ == "__main__":
    main()
