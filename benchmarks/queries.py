"""Benchmark: the metric queries over a Parquet dump vs a pandas implementation of the same set.

Synthetic traces of N requests x 150 visible tokens (client + gateway + tokenize + queue +
prefill + 149 decode spans; 150 chunk events on the client and on the gateway span, with
0-6 ms of deterministic jitter per chunk) are written with DuckDB COPY as a
``tokentrace export``-shaped dump (Hive partitions service_name/date). Then, each in a fresh
subprocess so peak memory (ru_maxrss) is its own:

- ``duckdb``: queries/requests.sql, itl.sql and summary.sql through analyzer.engine.open_source
  (parquet=...), results fetched as Arrow (the full metric set: per-request metrics, every
  ITL gap, percentiles); plus each other query alone (window, phases, skew_offsets, skew_rules).
- ``pandas``: the same metric set (per-request TTFT/E2E/TPOT/rates per perspective, every
  ITL gap, count/mean/p50/p90/p95/p99 with numpy's linear percentiles) from the same files,
  read with pyarrow (map values looked up with pyarrow.compute). Only at N <= 1e5.

    .venv/bin/pip install pandas      # benchmark only
    .venv/bin/python benchmarks/queries.py --sizes 10000 100000 [--keep DIR]
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
ANCHOR_NS = 1_767_225_600_000_000_000
MS = "CAST(1000000 AS BIGINT)"  # ns per ms, as SQL (BIGINT arithmetic)
DECODE_STEPS = 149  # 150 visible tokens


def _select(table: str, values: dict[str, str]) -> str:
    """A SELECT of every canonical column of ``table``: given expressions, else typed NULLs."""
    import duckdb

    from analyzer.schema import TABLE_DDL

    con = duckdb.connect()
    con.execute(TABLE_DDL[table])
    cols = con.execute(f"DESCRIBE {table}").fetchall()
    con.close()
    parts = [f"{values[n]} AS {n}" if n in values else f"CAST(NULL AS {t}) AS {n}" for n, t, *_ in cols]
    return ", ".join(parts)


def generate(directory: Path, n: int) -> None:
    """Write the synthetic dump of ``n`` requests under ``directory``."""
    import duckdb

    con = duckdb.connect()
    con.execute("SET preserve_insertion_order = false")
    base = f"(CAST({ANCHOR_NS} AS BIGINT) + r * 10 * {MS})"
    common = {
        "trace_id": "printf('%032x', r + 1)", "scope_name": "'tokentrace'", "scope_version": "'1'",
        "dropped_attributes_count": "0", "dropped_events_count": "0", "dropped_links_count": "0",
        "status_code": "'UNSET'",
    }
    end_client = f"{base} + (190 + 25 * {DECODE_STEPS} + 10) * {MS}"
    roles = [  # (span_no, name, kind, parent_no, start_ms_expr, end_expr, service, attr_int)
        (1, "chat m", "CLIENT", None, "0", end_client, "client",
         "MAP(['gen_ai.usage.output_tokens', 'gen_ai.usage.input_tokens'], [150, 1025])"),
        (2, "gateway", "SERVER", 1, "5", f"{base} + (187 + 25 * {DECODE_STEPS} + 8) * {MS}", "server",
         "MAP(['gen_ai.usage.output_tokens', 'gen_ai.usage.input_tokens'], [150, 1025])"),
        (3, "tokenize", "INTERNAL", 2, "8", f"{base} + 19 * {MS}", "server", "NULL"),
        (4, "queue", "INTERNAL", 2, "20", f"{base} + 45 * {MS}", "server", "NULL"),
        (5, "prefill", "INTERNAL", 2, "45", f"{base} + 185 * {MS}", "server",
         "MAP(['tokentrace.kv.bytes_per_token', 'tokentrace.kv.bytes'], [327680, 327680 * 1025])"),
    ]
    selects = []
    for no, name, kind, parent, start_ms, end_expr, service, attrs in roles:
        values = {**common, "span_id": f"printf('%016x', r * 1000 + {no})", "name": f"'{name}'", "kind": f"'{kind}'",
                  "parent_span_id": "NULL" if parent is None else f"printf('%016x', r * 1000 + {parent})",
                  "start_ns": f"{base} + {start_ms} * {MS}", "end_ns": end_expr,
                  "service_name": f"'{service}'", "service_instance_id": "'1'", "host_name": f"'{service}-host'",
                  "clock_domain": f"'{service}|1|{service}-host'", "attr_int": attrs}
        selects.append(f"SELECT {_select('spans', values)} FROM range({n}) t(r)")
    decode = {**common, "span_id": "printf('%016x', r * 1000 + 5 + k)", "name": "'decode'", "kind": "'INTERNAL'",
              "parent_span_id": "printf('%016x', r * 1000 + 2)",
              "start_ns": f"{base} + (184 + 25 * (k - 1) + 2) * {MS}", "end_ns": f"{base} + (184 + 25 * k) * {MS}",
              "service_name": "'server'", "service_instance_id": "'1'", "host_name": "'server-host'",
              "clock_domain": "'server|1|server-host'",
              "attr_int": "MAP(['tokentrace.step', 'tokentrace.kv.bytes'], [k, 327680 * (1025 + k)])"}
    selects.append(f"SELECT {_select('spans', decode)} FROM range({n}) t(r), range(1, {DECODE_STEPS + 1}) s(k)")
    day = "'2026-01-01'"
    (directory / "spans").mkdir(parents=True)
    con.execute(f"COPY (SELECT *, {day} AS date FROM ({' UNION ALL '.join(selects)})) TO '{directory}/spans' "
                "(FORMAT parquet, PARTITION_BY (service_name, date))")
    jitter = "((r * 31 + i * 17) % 7)"
    events = []
    for no, first_ms, service in ((1, 190, "client"), (2, 187, "server")):
        values = {"trace_id": "printf('%032x', r + 1)", "span_id": f"printf('%016x', r * 1000 + {no})",
                  "event_index": "i", "time_ns": f"{base} + ({first_ms} + 25 * i + CASE WHEN i > 0 THEN {jitter} ELSE 0 END) * {MS}",
                  "name": "'tokentrace.chunk'", "dropped_attributes_count": "0",
                  "attr_int": "MAP(['tokentrace.chunk.index', 'tokentrace.chunk.tokens'], [i, 1])",
                  "attr_bool": "MAP(['tokentrace.chunk.visible'], [true])"}
        events.append(f"SELECT {_select('span_events', values)}, '{service}' AS service_name "
                      f"FROM range({n}) t(r), range(0, {DECODE_STEPS + 1}) c(i)")
    con.execute(f"COPY (SELECT *, {day} AS date FROM ({' UNION ALL '.join(events)})) TO '{directory}/span_events' "
                "(FORMAT parquet, PARTITION_BY (service_name, date))")
    con.close()


def run_duckdb(directory: str, queries: list[str]) -> dict:
    from analyzer.engine import open_source
    from analyzer.queries import install_views, load_query

    con = open_source(parquet=directory)
    install_views(con)
    rows = {}
    t0 = time.perf_counter()
    for name in queries:
        q = load_query(name)
        rows[name] = con.execute(q.sql, q.bind({})).to_arrow_table().num_rows
    return {"seconds": time.perf_counter() - t0, "rows": rows}


def run_pandas(directory: str) -> dict:
    import numpy as np
    import pandas as pd
    import pyarrow.compute as pc
    import pyarrow.dataset as ds

    t0 = time.perf_counter()
    spans = ds.dataset(f"{directory}/spans", format="parquet", partitioning="hive")
    st = spans.to_table(columns=["trace_id", "span_id", "parent_span_id", "name", "kind", "start_ns", "attr_int"],
                        filter=pc.field("name").isin(["chat m", "gateway"]))
    out_tokens = pc.list_element(pc.map_lookup(st["attr_int"], "gen_ai.usage.output_tokens", "all"), 0)
    sp = st.drop(["attr_int"]).append_column("O", out_tokens).to_pandas()
    sp["perspective"] = np.where(sp["kind"] == "CLIENT", "client", "server")
    ev = ds.dataset(f"{directory}/span_events", format="parquet", partitioning="hive").to_table(
        columns=["trace_id", "span_id", "time_ns", "name", "attr_int", "attr_bool"])
    idx = pc.list_element(pc.map_lookup(ev["attr_int"], "tokentrace.chunk.index", "all"), 0)
    tok = pc.list_element(pc.map_lookup(ev["attr_int"], "tokentrace.chunk.tokens", "all"), 0)
    vis = pc.list_element(pc.map_lookup(ev["attr_bool"], "tokentrace.chunk.visible", "all"), 0)
    ev = ev.drop(["attr_int", "attr_bool"]).append_column("chunk_index", idx).append_column("tokens", tok)
    ev = ev.append_column("visible", vis).to_pandas()
    ev = ev[(ev["name"] == "tokentrace.chunk") & ev["visible"].fillna(True)]
    agg = ev.groupby(["trace_id", "span_id"], sort=False)["time_ns"].agg(f_ns="min", e_ns="max").reset_index()
    req = sp.merge(agg, on=["trace_id", "span_id"], how="left")
    req["ttft_ms"] = (req["f_ns"] - req["start_ns"]) / 1e6
    req["e2e_ms"] = (req["e_ns"] - req["start_ns"]) / 1e6
    many = req["O"] > 1
    req["tpot_ms"] = np.where(many, (req["e2e_ms"] - req["ttft_ms"]) / (req["O"] - 1), np.nan)
    req["decode_rate"] = np.where(many & (req["e_ns"] > req["f_ns"]),
                                  (req["O"] - 1) / ((req["e_ns"] - req["f_ns"]) / 1e9), np.nan)
    req["whole_rate"] = np.where(req["e_ns"] > req["start_ns"], req["O"] / ((req["e_ns"] - req["start_ns"]) / 1e9), np.nan)
    ev = ev.sort_values(["trace_id", "span_id", "chunk_index", "time_ns"])
    ev["itl_ms"] = ev.groupby(["trace_id", "span_id"], sort=False)["time_ns"].diff() / 1e6
    gaps = ev.dropna(subset=["itl_ms"]).merge(sp[["trace_id", "span_id", "perspective"]], on=["trace_id", "span_id"])
    gaps["itl_per_token_ms"] = gaps["itl_ms"] / gaps["tokens"]
    summary = []
    for perspective, group in req.groupby("perspective"):
        for metric in ("ttft_ms", "tpot_ms", "e2e_ms", "decode_rate", "whole_rate"):
            v = group[metric].dropna().to_numpy()
            summary.append((metric, perspective, len(v), v.mean(), *np.percentile(v, [50, 90, 95, 99])))
    for perspective, group in gaps.groupby("perspective"):
        for metric in ("itl_ms", "itl_per_token_ms"):
            v = group[metric].to_numpy()
            summary.append((metric, perspective, len(v), v.mean(), *np.percentile(v, [50, 90, 95, 99])))
    return {"seconds": time.perf_counter() - t0, "rows": {"requests": len(req), "itl": len(gaps), "summary": len(summary)}}


def _peak_rss_mib() -> float:
    """This process's peak resident memory (VmHWM: reset at exec, unlike ru_maxrss)."""
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) / 1024
    except OSError:
        pass
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def _child(args: argparse.Namespace) -> None:
    if args.engine == "pandas":
        result = run_pandas(args.dir)
    else:
        result = run_duckdb(args.dir, args.queries.split(","))
    result["peak_rss_mib"] = _peak_rss_mib()
    print(json.dumps(result))


def _measure(engine: str, directory: Path, queries: str = "") -> dict:
    cmd = [sys.executable, __file__, "--child", engine, "--dir", str(directory), "--queries", queries]
    out = subprocess.run(cmd, check=True, capture_output=True, text=True, timeout=900).stdout
    return json.loads(out.strip().splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--sizes", type=int, nargs="+", default=[10_000, 100_000])
    parser.add_argument("--pandas-max", type=int, default=100_000, help="largest size also run with pandas")
    parser.add_argument("--keep", default=None, help="write dumps here (default: a temp dir, removed)")
    parser.add_argument("--child", default=None, help=argparse.SUPPRESS)
    parser.add_argument("--dir", default=None, help=argparse.SUPPRESS)
    parser.add_argument("--queries", default="", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        args.engine = args.child
        _child(args)
        return
    root = Path(args.keep) if args.keep else Path(tempfile.mkdtemp(prefix="tt-bench-"))
    for n in args.sizes:
        directory = root / f"n{n}"
        t0 = time.perf_counter()
        if not (directory / "spans").is_dir():
            generate(directory, n)
        size_mib = sum(f.stat().st_size for f in directory.rglob("*.parquet")) / 2**20
        print(f"\nN = {n:,} requests: {n * (5 + DECODE_STEPS):,} spans, {n * 2 * (DECODE_STEPS + 1):,} events, "
              f"{size_mib:,.0f} MiB Parquet (generated/found in {time.perf_counter() - t0:.1f} s)", flush=True)
        full = _measure("duckdb", directory, "requests,itl,summary")
        print(f"  duckdb full metric set (requests+itl+summary): {full['seconds']:.2f} s, "
              f"peak RSS {full['peak_rss_mib']:,.0f} MiB, rows {full['rows']}", flush=True)
        for q in ("window", "phases", "skew_offsets", "skew_rules"):
            one = _measure("duckdb", directory, q)
            print(f"  duckdb {q:<13} {one['seconds']:.2f} s, peak RSS {one['peak_rss_mib']:,.0f} MiB", flush=True)
        if n <= args.pandas_max:
            pd_res = _measure("pandas", directory)
            print(f"  pandas full metric set: {pd_res['seconds']:.2f} s, peak RSS {pd_res['peak_rss_mib']:,.0f} MiB, "
                  f"rows {pd_res['rows']}  -> duckdb is {pd_res['seconds'] / full['seconds']:.1f}x faster", flush=True)
    if not args.keep:
        import shutil

        shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    os.environ.setdefault("PYTHONHASHSEED", "0")
    main()
