"""Benchmark: the metric queries over a Parquet dump vs a pandas implementation of the same set.

Synthetic traces of N requests x 150 visible tokens (client + gateway + tokenize + queue +
prefill + 149 decode spans; 150 chunk events on the client and on the gateway span, with
0-6 ms of deterministic jitter per chunk) are written with DuckDB COPY as a
``tokentrace export``-shaped dump (Hive partitions service_name/date). Then, each in a fresh
subprocess so peak memory (VmHWM) is its own:

- ``duckdb``: the full metric set as the library runs it (analyzer.query.runner: install_views,
  then per query materialize_views and the query): queries/requests.sql, itl.sql and
  summary.sql through analyzer.db.source.open_source(parquet=...). requests and summary are
  fetched as Arrow tables. itl (--itl-fetch): ``stream`` (default) reads the ordered result
  as the library streams it (analyzer.query.runner.stream_query: one part per request_key range
  of ~32M span events, as ``tokentrace itl --format csv|json`` writes its rows out), each
  part as Arrow record batches of 1M rows (``QueryPart.arrow_batches``: the names attached
  after an integer sort, analyzer/query/attach.py, where the checkout has it), counted and
  dropped: every gap and column is
  computed, ordered and converted to Arrow, nothing is held; ``table`` keeps it as one Arrow table in memory (298M gaps at 1e6
  requests do not fit: that size always streams). Timed from the open, views included.
  Also reported: the peak size of DuckDB's temp directory (allocated bytes, sampled every
  0.5 s: spilled sorts and the kept per-chunk tables evicted beyond --memory-limit) and the
  kept tables' bytes in memory / evicted at the end.
  Then each other query alone in a fresh process (window, phases, skew_offsets, skew_rules),
  as a CLI command runs it: one query per connection (keep_chunks=False: the chunk table is
  kept only to build the gap table).
- ``pandas``: the same metric set, column for column, from the same files read with pyarrow
  (map values looked up with pyarrow.compute): requests (per perspective s/f/e, tokens,
  finish reason, status, outcome, TTFT, E2E, TPOT, both rates, KV bytes per token / prompt /
  stop and MiB, null_reason; ordered like requests.sql), every ITL gap (gap_index, chunk,
  times, tokens, itl_ms, itl_per_token_ms, null_reason; ordered like itl.sql) and the
  summary (count, null_count, mean, std_pop, min, p50/p90/p95/p99 with numpy's linear
  percentiles, max, succeeded requests only). Written as well as pandas allows: requests
  are numbered with factorize so the gap sort is on integers, as DuckDB's request_key. Only
  at N <= --pandas-max.

The parent checks that both engines gave the same row counts and the same summary numbers
(relative 1e-9) before printing the ratio. Load average is printed beside every timing.

    .venv/bin/python benchmarks/queries.py --sizes 10000 100000 [--keep DIR]
    .venv/bin/python benchmarks/queries.py --sizes 1000000 --keep /tmp/tt-bench   # DuckDB only
    git worktree add /tmp/tt-main main && .venv/bin/python benchmarks/queries.py --baseline /tmp/tt-main
"""

from __future__ import annotations

import argparse
import json
import math
import os
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
ANCHOR_NS = 1_767_225_600_000_000_000
MS = "CAST(1000000 AS BIGINT)"  # ns per ms, as SQL (BIGINT arithmetic)
DECODE_STEPS = 149  # 150 visible tokens
FULL_SET = ("requests", "itl", "summary")
OTHERS = ("window", "phases", "skew_offsets", "skew_rules")
SUMMARY_NUMBERS = ("count", "null_count", "mean", "std_pop", "min", "p50", "p90", "p95", "p99", "max")


def _select(table: str, values: dict[str, str]) -> str:
    """A SELECT of every canonical column of ``table``: given expressions, else typed NULLs."""
    import duckdb

    from analyzer.db.schema import TABLE_DDL

    con = duckdb.connect()
    con.execute(TABLE_DDL[table])
    cols = con.execute(f"DESCRIBE {table}").fetchall()
    con.close()
    parts = [f"{values[n]} AS {n}" if n in values else f"CAST(NULL AS {t}) AS {n}" for n, t, *_ in cols]
    return ", ".join(parts)


def generate(directory: Path, n: int) -> None:
    """Write the synthetic dump of ``n`` requests under ``directory`` (the dedicated columns
    filled from the maps, as ``tokentrace export`` writes them)."""
    import duckdb

    from analyzer.db.schema import dedicated_select

    con = duckdb.connect()
    con.execute("SET preserve_insertion_order = false")
    con.execute("SET enable_progress_bar = false")
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
    con.execute(f"COPY (SELECT * REPLACE ({dedicated_select('spans')}), {day} AS date FROM ({' UNION ALL '.join(selects)}))"
                f" TO '{directory}/spans' (FORMAT parquet, PARTITION_BY (service_name, date))")
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
    con.execute(f"COPY (SELECT * REPLACE ({dedicated_select('span_events')}), {day} AS date"
                f" FROM ({' UNION ALL '.join(events)})) TO '{directory}/span_events'"
                " (FORMAT parquet, PARTITION_BY (service_name, date))")
    con.close()


def run_duckdb(directory: str, queries: list[str], stream_itl: bool, memory_limit: str | None = None) -> dict[str, Any]:
    """The queries as analyzer.query.runner runs them on one connection; seconds per query
    (including the views it was the first to need) and in all, from the open."""
    from analyzer.db.source import open_source
    from analyzer.db.views import install_views, materialize_views
    from analyzer.query.runner import load_query, stream_query

    t0 = time.perf_counter()
    con = open_source(parquet=directory)
    if memory_limit:  # DuckDB's default is 80% of RAM; beyond the limit it spills to its temp directory
        con.execute("SET memory_limit = $m", {"m": memory_limit})
    temp = Path(directory).parent / "duckdb_tmp"
    con.execute("SET temp_directory = $d", {"d": str(temp)})  # not ./.tmp
    spill = _SpillWatch(temp)
    install_views(con)
    seconds: dict[str, float] = {"open+views": time.perf_counter() - t0}
    cpu: dict[str, float] = {"open+views": time.process_time()}  # whole process, imports included
    rows: dict[str, int] = {}
    summary: list[dict[str, Any]] = []
    for name in queries:
        start, cpu_start = time.perf_counter(), time.process_time()
        query = load_query(name)
        if name == "itl" and stream_itl:  # as `tokentrace itl --format csv|json`: range by range
            rows[name] = 0
            for part in stream_query(con, name):
                if hasattr(part, "arrow_batches"):  # names attached after an integer sort
                    reader = part.arrow_batches(con, 1_000_000)
                else:  # a --baseline checkout from before analyzer/query/attach.py
                    reader = con.sql(part.sql, params=part.params).to_arrow_reader(1_000_000)
                rows[name] += sum(batch.num_rows for batch in reader)
        else:
            materialize_views(con, query.sql, keep_chunks=len(queries) > 1)  # one query: as the CLI
            relation = con.sql(query.sql, params=query.bind({}) or None)
            table = relation.to_arrow_table()
            rows[name] = table.num_rows
            if name == "summary":
                summary = table.to_pylist()
        seconds[name] = time.perf_counter() - start
        cpu[name] = time.process_time() - cpu_start
    seconds["total"] = time.perf_counter() - t0
    kept = con.execute(
        "SELECT memory_usage_bytes, temporary_storage_bytes FROM duckdb_memory() WHERE tag = 'IN_MEMORY_TABLE'"
    ).fetchall()
    return {"seconds": seconds, "cpu_seconds": cpu, "rows": rows, "summary": summary,
            "temp_peak_gib": spill.stop() / 2**30,
            "kept_tables_gib": {"in_memory": kept[0][0] / 2**30, "spilled": kept[0][1] / 2**30} if kept else None}


class _SpillWatch:
    """Peak size of DuckDB's temp directory (spilled sorts, hash tables and evicted kept
    tables), sampled every half second in a thread."""

    def __init__(self, folder: Path) -> None:
        import threading

        self.folder, self.peak, self._done = folder, 0, threading.Event()
        self._thread = threading.Thread(target=self._watch, daemon=True)
        self._thread.start()

    def _size(self) -> int:
        total = 0
        try:
            for f in self.folder.iterdir():
                try:
                    total += f.stat().st_blocks * 512  # allocated bytes (temp files can have holes)
                except OSError:  # removed meanwhile
                    pass
        except OSError:  # no temp directory (yet)
            pass
        return total

    def _watch(self) -> None:
        while not self._done.wait(0.5):
            self.peak = max(self.peak, self._size())

    def stop(self) -> int:
        self._done.set()
        self._thread.join()
        return max(self.peak, self._size())


def _lookup(column: Any, key: str) -> Any:
    import pyarrow.compute as pc

    return pc.map_lookup(column, key, "first")


def run_pandas(directory: str) -> dict[str, Any]:
    """requests, itl and summary with pandas/numpy: the columns of requests.sql / itl.sql /
    summary.sql for tokentrace's span contract (client and server perspectives)."""
    import numpy as np
    import pandas as pd
    import pyarrow.compute as pc
    import pyarrow.dataset as ds

    t0 = time.perf_counter()
    spans = ds.dataset(f"{directory}/spans", format="parquet", partitioning="hive")
    ours = pc.field("scope_name") == "tokentrace"
    # --- request spans: CLIENT spans and gateway SERVER spans, with their attributes
    st = spans.to_table(
        columns=["trace_id", "span_id", "parent_span_id", "name", "kind", "start_ns", "end_ns", "status_code",
                 "clock_domain", "dropped_events_count", "attr_int", "attr_str", "attr_bool", "attr_json"],
        filter=ours & ((pc.field("kind") == "CLIENT") | ((pc.field("name") == "gateway") & (pc.field("kind") == "SERVER"))))
    ints = {k: _lookup(st["attr_int"], k) for k in (
        "gen_ai.usage.input_tokens", "gen_ai.usage.prompt_tokens", "gen_ai.usage.output_tokens",
        "gen_ai.usage.completion_tokens", "tokentrace.generated_tokens")}
    rs = st.select(["trace_id", "span_id", "parent_span_id", "kind", "start_ns", "end_ns", "status_code",
                    "clock_domain", "dropped_events_count"]).to_pandas()
    for k, v in ints.items():
        rs[k] = v.to_pandas().astype("Int64")
    rs["finish_reason"] = _lookup(st["attr_json"], "gen_ai.response.finish_reasons").to_pandas().str.extract(
        r'^\["([^"]*)"', expand=False)
    rs["error_type"] = _lookup(st["attr_str"], "error.type").to_pandas()
    rs["synthetic"] = _lookup(st["attr_bool"], "tokentrace.synthetic").to_pandas().fillna(False).astype(bool)
    # --- phase spans under each gateway: prefill KV and the last decode step's KV
    pre = spans.to_table(columns=["trace_id", "parent_span_id", "attr_int"], filter=ours & (pc.field("name") == "prefill"))
    prefill = pre.select(["trace_id", "parent_span_id"]).to_pandas()
    prefill["kv_bytes_per_token"] = _lookup(pre["attr_int"], "tokentrace.kv.bytes_per_token").to_pandas()
    prefill["prompt_kv_bytes"] = _lookup(pre["attr_int"], "tokentrace.kv.bytes").to_pandas()
    prefill = prefill.groupby(["trace_id", "parent_span_id"], sort=False).max()
    dec = spans.to_table(columns=["trace_id", "parent_span_id", "attr_int"], filter=ours & (pc.field("name") == "decode"))
    decode = dec.select(["trace_id", "parent_span_id"]).to_pandas()
    decode["stop_kv_bytes"] = _lookup(dec["attr_int"], "tokentrace.kv.bytes").to_pandas()
    decode = decode.groupby(["trace_id", "parent_span_id"], sort=False).agg(
        stop_kv_bytes=("stop_kv_bytes", "max"), decode_spans=("stop_kv_bytes", "size"))
    kv = prefill.join(decode, how="outer").reset_index().rename(columns={"parent_span_id": "server_span_id"})
    # --- visible chunk events
    et = ds.dataset(f"{directory}/span_events", format="parquet", partitioning="hive").to_table(
        columns=["trace_id", "span_id", "event_index", "time_ns", "attr_int", "attr_bool"],
        filter=pc.field("name") == "tokentrace.chunk")
    visible = pc.fill_null(_lookup(et["attr_bool"], "tokentrace.chunk.visible"), True)
    idx = pc.coalesce(_lookup(et["attr_int"], "tokentrace.chunk.index"), pc.cast(et["event_index"], "int64"))
    tok = pc.fill_null(_lookup(et["attr_int"], "tokentrace.chunk.tokens"), 1)
    et = et.select(["trace_id", "span_id", "time_ns"]).append_column("chunk_index", idx).append_column(
        "chunk_tokens", tok).filter(visible)
    ev = et.to_pandas()
    chunk_agg = ev.groupby(["trace_id", "span_id"], sort=False).agg(
        first_ns=("time_ns", "min"), last_ns=("time_ns", "max"), visible_chunk_tokens=("chunk_tokens", "sum")
    ).reset_index()
    # --- one row per request perspective (client, server)
    gw = rs[rs["kind"] == "SERVER"]
    cl = rs[rs["kind"] == "CLIENT"]
    server = gw[["trace_id", "span_id", "parent_span_id"]].merge(
        cl[["trace_id", "span_id"]].rename(columns={"span_id": "client_span_id"}),
        left_on=["trace_id", "parent_span_id"], right_on=["trace_id", "client_span_id"], how="left")
    server = server.assign(perspective="server", request_span_id=server["span_id"], perspective_span_id=server["span_id"],
                           server_span_id=server["span_id"])
    client = cl[["trace_id", "span_id"]].merge(
        gw[["trace_id", "span_id", "parent_span_id"]].rename(columns={"span_id": "server_span_id"}),
        left_on=["trace_id", "span_id"], right_on=["trace_id", "parent_span_id"], how="left")
    client = client.assign(perspective="client", request_span_id=client["server_span_id"].fillna(client["span_id"]),
                           perspective_span_id=client["span_id"], client_span_id=client["span_id"])
    keys = ["trace_id", "request_span_id", "perspective", "perspective_span_id", "server_span_id"]
    req = pd.concat([server[keys], client[keys]], ignore_index=True)
    p = rs.rename(columns=lambda c: c if c == "trace_id" else "p_" + c)
    sv = rs.rename(columns=lambda c: c if c == "trace_id" else "sv_" + c)
    req = req.merge(p, left_on=["trace_id", "perspective_span_id"], right_on=["trace_id", "p_span_id"])
    req = req.merge(sv, left_on=["trace_id", "server_span_id"], right_on=["trace_id", "sv_span_id"], how="left")
    req = req.merge(chunk_agg, left_on=["trace_id", "perspective_span_id"], right_on=["trace_id", "span_id"], how="left")
    req = req.merge(kv, on=["trace_id", "server_span_id"], how="left")
    complete = req["p_dropped_events_count"] == 0
    out = pd.DataFrame({"source": "tokentrace", "perspective": req["perspective"], "trace_id": req["trace_id"],
                        "request_span_id": req["request_span_id"], "clock_domain": req["p_clock_domain"],
                        "s_ns": req["p_start_ns"]})
    out["f_ns"] = req["first_ns"].where(complete)
    out["e_ns"] = req["last_ns"].where(complete)
    out["input_tokens"] = req["p_gen_ai.usage.input_tokens"].fillna(req["p_gen_ai.usage.prompt_tokens"]).fillna(
        req["sv_gen_ai.usage.input_tokens"]).fillna(req["sv_gen_ai.usage.prompt_tokens"])
    out["output_tokens"] = req["p_gen_ai.usage.output_tokens"].fillna(req["p_gen_ai.usage.completion_tokens"]).fillna(
        req["sv_gen_ai.usage.output_tokens"]).fillna(req["sv_gen_ai.usage.completion_tokens"]).fillna(
        req["visible_chunk_tokens"].fillna(0).where(complete).astype("Int64"))
    out["generated_tokens"] = req["sv_tokentrace.generated_tokens"].fillna(req["p_tokentrace.generated_tokens"])
    out["finish_reason"] = req["p_finish_reason"].fillna(req["sv_finish_reason"])
    out["status_code"] = req["p_status_code"]
    n_out = out["output_tokens"].astype("float64")
    f, e, s = out["f_ns"], out["e_ns"], out["s_ns"]
    out["ttft_ms"] = (f - s) / 1e6
    out["e2e_ms"] = (e - s) / 1e6
    out["tpot_ms"] = ((e - f) / 1e6 / (n_out - 1)).where((n_out > 1) & (e > f))
    out["decode_output_tokens_per_second"] = ((n_out - 1) / ((e - f) / 1e9)).where((n_out > 1) & (e > f))
    out["whole_request_output_tokens_per_second"] = (n_out / ((e - s) / 1e9)).where(e > s)
    out["kv_bytes_per_token"] = req["kv_bytes_per_token"]
    out["prompt_kv_bytes"] = req["prompt_kv_bytes"]
    out["prompt_kv_mib"] = req["prompt_kv_bytes"] / 1048576.0
    one_token = req["decode_spans"].fillna(0).eq(0) & out["generated_tokens"].eq(1)
    out["stop_kv_bytes"] = req["stop_kv_bytes"].fillna(req["prompt_kv_bytes"].where(one_token))
    out["stop_kv_mib"] = out["stop_kv_bytes"] / 1048576.0
    out["synthetic"] = req["p_synthetic"]
    failed = out["finish_reason"].eq("error") | out["status_code"].eq("ERROR") | req["sv_status_code"].eq("ERROR")
    out["outcome"] = np.select([out["finish_reason"].eq("cancelled"), failed], ["cancelled", "failed"], "succeeded")
    dropped = req["p_dropped_events_count"]
    # every reason that applies, joined by '; ' in the order of 90_request_metrics.sql
    reasons = [
        np.select([dropped > 0, req["first_ns"].isna()],
                  ["f/e unknown: " + dropped.astype(str) + " events dropped by the span event limit",
                   "no visible chunk events"], ""),
        np.where(n_out.isna(), "output token count unknown", ""),
        np.where(n_out <= 1, "tpot_ms and decode rate need more than one output token", ""),
        np.where((n_out > 1) & (e <= f), "tpot_ms and decode rate need e > f (the output arrived in one write: no per-token timing)", ""),
        np.where(e <= s, "whole-request rate needs e > s", ""),
    ]
    joined = pd.Series(reasons[0], index=out.index, dtype=object)
    for part in reasons[1:]:
        piece = pd.Series(part, index=out.index, dtype=object)
        joined = joined.where(piece.eq(""), joined.where(joined.eq(""), joined + "; ") + piece)
    out["null_reason"] = joined.where(joined.ne(""), None)
    requests = out.sort_values(["s_ns", "trace_id", "request_span_id", "perspective"], ignore_index=True)
    # --- every gap. The request perspectives are numbered in (trace, request span,
    # perspective) order (request_key); chunks are sorted on integers with numpy, the gap is
    # the difference to the previous chunk of the same request; strings are attached last.
    order = req[["trace_id", "request_span_id", "perspective", "perspective_span_id", "p_dropped_events_count"]]
    order = order.sort_values(["trace_id", "request_span_id", "perspective"], ignore_index=True)
    order["request_key"] = np.arange(len(order))
    key_of = ev[["trace_id", "span_id"]].merge(
        order[["trace_id", "perspective_span_id", "request_key"]], how="left",
        left_on=["trace_id", "span_id"], right_on=["trace_id", "perspective_span_id"])["request_key"]
    has_key = key_of.notna().to_numpy()
    rk = key_of.to_numpy(dtype="float64")[has_key].astype(np.int64)
    cidx = ev["chunk_index"].to_numpy(dtype=np.int64)[has_key]
    tns = ev["time_ns"].to_numpy(dtype=np.int64)[has_key]
    ctok = ev["chunk_tokens"].to_numpy(dtype=np.int64)[has_key]
    sort = np.lexsort((tns, cidx, rk))
    rk, cidx, tns, ctok = rk[sort], cidx[sort], tns[sort], ctok[sort]
    starts = np.r_[True, rk[1:] != rk[:-1]]
    position = np.arange(len(rk)) - np.maximum.accumulate(np.where(starts, np.arange(len(rk)), 0))
    later = ~starts
    g_key, g_prev, g_time, g_tok = rk[later], tns[:-1][later[1:]], tns[later], ctok[later]
    g_dropped = order["p_dropped_events_count"].to_numpy(dtype=np.int64)[g_key]
    known = g_dropped == 0
    itl_ms = np.where(known, (g_time - g_prev) / 1e6, np.nan)
    itl_per_token_ms = np.where(known & (g_tok > 0), itl_ms / np.where(g_tok > 0, g_tok, 1), np.nan)
    reason = np.full(len(g_key), None, dtype=object)
    if (~known).any():
        reason[~known] = ["gap unknown: " + str(d) + " events dropped by the span event limit, chunks are missing"
                          for d in g_dropped[~known]]
    reason[known & (g_tok == 0)] = "itl_per_token_ms needs a chunk with tokens"
    gaps = pd.DataFrame({
        "source": pd.Series(["tokentrace"], dtype=order["perspective"].dtype).take(np.zeros(len(g_key), np.int64)).array,
        "perspective": order["perspective"].take(g_key).array,
        "trace_id": order["trace_id"].take(g_key).array,
        "request_span_id": order["request_span_id"].take(g_key).array,
        "gap_index": position[later], "chunk_index": cidx[later], "prev_time_ns": g_prev, "time_ns": g_time,
        "chunk_tokens": g_tok, "itl_ms": itl_ms, "itl_per_token_ms": itl_per_token_ms,
        "null_reason": pd.Series(reason, dtype=object).array}, copy=False)
    # --- summary over succeeded requests (per perspective)
    ok = requests[requests["outcome"] == "succeeded"]
    ok_keys = order.merge(ok[["trace_id", "request_span_id", "perspective"]],
                          on=["trace_id", "request_span_id", "perspective"])["request_key"].to_numpy()
    ok_gap = np.isin(g_key, ok_keys)
    gap_perspective = order["perspective"].to_numpy()[g_key]
    summary = []
    for metric in ("ttft_ms", "tpot_ms", "e2e_ms", "itl_ms", "itl_per_token_ms", "decode_output_tokens_per_second",
                   "whole_request_output_tokens_per_second"):
        for perspective in sorted(ok["perspective"].unique()):
            if metric.startswith("itl"):
                values = (itl_ms if metric == "itl_ms" else itl_per_token_ms)[ok_gap & (gap_perspective == perspective)]
            else:
                values = ok.loc[ok["perspective"] == perspective, metric].to_numpy(dtype="float64", na_value=np.nan)
            v = values[~np.isnan(values)]
            pct = np.percentile(v, [50, 90, 95, 99]) if len(v) else [None] * 4
            summary.append({"metric": metric, "perspective": perspective, "count": len(v),
                            "null_count": int(len(values) - len(v)), "mean": v.mean() if len(v) else None,
                            "std_pop": v.std() if len(v) else None, "min": v.min() if len(v) else None,
                            "p50": pct[0], "p90": pct[1], "p95": pct[2], "p99": pct[3],
                            "max": v.max() if len(v) else None})
    seconds = time.perf_counter() - t0
    return {"seconds": {"total": seconds}, "summary": summary,
            "rows": {"requests": len(requests), "itl": len(gaps), "summary": len(summary)}}


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
    if args.code:  # --baseline: this checkout's analyzer package, not the one beside this file
        sys.path.insert(0, args.code)
    if args.child == "pandas":
        result = run_pandas(args.dir)
    else:
        result = run_duckdb(args.dir, args.queries.split(","), args.stream_itl, args.memory_limit)
    result["peak_rss_mib"] = _peak_rss_mib()
    usage = resource.getrusage(resource.RUSAGE_SELF)
    result["cpu_s"] = usage.ru_utime + usage.ru_stime  # whole process: imports and reads included
    print(json.dumps(result, default=str))


def _measure(engine: str, directory: Path, queries: str = "", stream_itl: bool = False,
             memory_limit: str | None = None, code: str | None = None) -> dict[str, Any]:
    cmd = [sys.executable, __file__, "--child", engine, "--dir", str(directory), "--queries", queries]
    if code:
        cmd += ["--code", code]
    if stream_itl:
        cmd.append("--stream-itl")
    if memory_limit:
        cmd += ["--memory-limit", memory_limit]
    out = subprocess.run(cmd, check=True, capture_output=True, text=True, timeout=7200).stdout
    return json.loads(out.strip().splitlines()[-1])


def _cpu_of(result: dict[str, Any], query: str) -> str:
    """`` (cpu X s)``: the process's CPU seconds in that step, on a shared machine the steadier figure."""
    cpu = result.get("cpu_seconds", {}).get(query)
    return "" if cpu is None else f" (cpu {cpu:.2f} s)"


def _load() -> str:
    return "load " + " ".join(f"{x:.2f}" for x in os.getloadavg())


def _same_summary(a: list[dict[str, Any]], b: list[dict[str, Any]]) -> list[str]:
    """Differences between two summaries (metric, perspective, numbers; relative 1e-9)."""
    index = {(r["metric"], r["perspective"]): r for r in b}
    diffs = []
    for row in a:
        other = index.get((row["metric"], row["perspective"]))
        if other is None:
            diffs.append(f"{row['metric']}/{row['perspective']}: missing")
            continue
        for k in SUMMARY_NUMBERS:
            x, y = row[k], other[k]
            if (x is None) != (y is None) or (x is not None and not math.isclose(float(x), float(y), rel_tol=1e-9, abs_tol=1e-9)):
                diffs.append(f"{row['metric']}/{row['perspective']} {k}: {x} != {y}")
    if len(a) != len(b):
        diffs.append(f"{len(a)} summary rows != {len(b)}")
    return diffs


def _print_baseline(base: dict[str, Any], full: dict[str, Any], runs: list[dict[str, Any]]) -> None:
    """The baseline checkout's full metric set beside this one's: seconds per query, the
    ratio, peak memory, and whether both gave the same rows and summary numbers."""
    per_query = "  ".join(f"{k} {v:.2f} s" + _cpu_of(base, k) for k, v in base["seconds"].items() if k != "total")
    print(f"  baseline full metric set: {base['seconds']['total']:.2f} s ({per_query}), cpu {base['cpu_s']:.1f} s, "
          f"peak RSS {base['peak_rss_mib']:,.0f} MiB, temp dir peak {base.get('temp_peak_gib', 0):.2f} GiB; "
          f"all runs {[round(r['seconds']['total'], 2) for r in runs]}  [{_load()}]", flush=True)
    diffs = _same_summary(full["summary"], base["summary"])
    same_rows = full["rows"] == base["rows"]
    print(f"  vs baseline: {base['seconds']['total'] / full['seconds']['total']:.2f}x faster (fastest runs; cpu "
          f"{base['cpu_s'] / full['cpu_s']:.2f}x; per query "
          + ", ".join(f"{q} {base['seconds'][q] / full['seconds'][q]:.2f}x" for q in FULL_SET)
          + f"); results {'agree' if not diffs and same_rows else 'DIFFER: ' + '; '.join(diffs[:5])}"
          f"{'' if same_rows else ' rows ' + str(base['rows']) + ' != ' + str(full['rows'])}", flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--sizes", type=int, nargs="+", default=[10_000, 100_000])
    parser.add_argument("--pandas-max", type=int, default=100_000, help="largest size also run with pandas")
    parser.add_argument("--repeat", type=int, default=1, help="runs per engine and size (the fastest is reported)")
    parser.add_argument("--skip-others", action="store_true", help="only the full metric set")
    parser.add_argument("--itl-fetch", choices=["stream", "table"], default="stream",
                        help="DuckDB's itl result: streamed Arrow batches (counted) or one Arrow table")
    parser.add_argument("--keep", default=None, help="write dumps here (default: a temp dir, removed)")
    parser.add_argument("--memory-limit", default=None, help="DuckDB memory_limit, e.g. 12GB (default: DuckDB's, 80%% of RAM)")
    parser.add_argument("--baseline", default=None, metavar="DIR",
                        help="also run DuckDB's full metric set with the analyzer of this checkout (e.g. a git "
                             "worktree of main), interleaved round by round; prints the ratio and checks that "
                             "both give the same rows and summary")
    parser.add_argument("--code", default=None, help=argparse.SUPPRESS)
    parser.add_argument("--child", default=None, help=argparse.SUPPRESS)
    parser.add_argument("--dir", default=None, help=argparse.SUPPRESS)
    parser.add_argument("--queries", default="", help=argparse.SUPPRESS)
    parser.add_argument("--stream-itl", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        _child(args)
        return
    root = Path(args.keep) if args.keep else Path(tempfile.mkdtemp(prefix="tt-bench-"))
    results: list[dict[str, Any]] = []
    for n in args.sizes:
        directory = root / f"n{n}"
        t0 = time.perf_counter()
        if not (directory / "spans").is_dir():
            generate(directory, n)
        spans = n * (5 + DECODE_STEPS)
        size_mib = sum(f.stat().st_size for f in directory.rglob("*.parquet")) / 2**20
        print(f"\nN = {n:,} requests: {spans:,} spans, {n * 2 * (DECODE_STEPS + 1):,} events, "
              f"{size_mib:,.0f} MiB Parquet (generated/found in {time.perf_counter() - t0:.1f} s)", flush=True)
        stream = args.itl_fetch == "stream" or n > args.pandas_max
        with_pandas = n <= args.pandas_max
        duck_runs: list[dict[str, Any]] = []
        pandas_runs: list[dict[str, Any]] = []
        base_runs: list[dict[str, Any]] = []
        for _ in range(args.repeat):  # interleaved, so a burst of load on the machine hits both
            if args.baseline:
                base_runs.append(_measure("duckdb", directory, ",".join(FULL_SET), stream, args.memory_limit,
                                          str(Path(args.baseline).resolve())))
            duck_runs.append(_measure("duckdb", directory, ",".join(FULL_SET), stream, args.memory_limit))
            if with_pandas:
                pandas_runs.append(_measure("pandas", directory))
        full = min(duck_runs, key=lambda r: r["seconds"]["total"])
        per_query = "  ".join(f"{k} {v:.2f} s" + _cpu_of(full, k) for k, v in full["seconds"].items() if k != "total")
        print(f"  duckdb full metric set: {full['seconds']['total']:.2f} s ({per_query}), cpu {full['cpu_s']:.1f} s, "
              f"{full['seconds']['total'] / spans * 1e6:.3f} s per 1M spans, peak RSS {full['peak_rss_mib']:,.0f} MiB, "
              f"temp dir peak {full.get('temp_peak_gib', 0):.2f} GiB, kept tables {full.get('kept_tables_gib')}, "
              f"rows {full['rows']}, itl {'streamed' if stream else 'Arrow table'}; "
              f"all runs {[round(r['seconds']['total'], 2) for r in duck_runs]}  [{_load()}]", flush=True)
        entry: dict[str, Any] = {"requests": n, "spans": spans, "duckdb": full}
        if base_runs:
            entry["baseline"] = base = min(base_runs, key=lambda r: r["seconds"]["total"])
            _print_baseline(base, full, base_runs)
        if with_pandas:
            pd_res = min(pandas_runs, key=lambda r: r["seconds"]["total"])
            diffs = _same_summary(full["summary"], pd_res["summary"])
            counts = {k: (full["rows"][k], pd_res["rows"][k]) for k in ("requests", "itl")}
            agree = not diffs and all(a == b for a, b in counts.values())
            ratio = pd_res["seconds"]["total"] / full["seconds"]["total"]
            print(f"  pandas full metric set: {pd_res['seconds']['total']:.2f} s, cpu {pd_res['cpu_s']:.1f} s, "
                  f"peak RSS {pd_res['peak_rss_mib']:,.0f} MiB, rows {pd_res['rows']}; "
                  f"all runs {[round(r['seconds']['total'], 2) for r in pandas_runs]}  [{_load()}]", flush=True)
            print(f"  results {'agree' if agree else 'DIFFER: ' + '; '.join(diffs[:5]) + str(counts)}; "
                  f"duckdb is {ratio:.1f}x faster than pandas (fastest runs; cpu "
                  f"{pd_res['cpu_s'] / full['cpu_s']:.1f}x less)", flush=True)
            entry.update(pandas=pd_res, ratio=ratio, agree=agree)
        if not args.skip_others:
            for q in OTHERS:
                one = _measure("duckdb", directory, q, memory_limit=args.memory_limit)
                entry[q] = one
                print(f"  duckdb {q:<13} {one['seconds']['total']:.2f} s (open+views {one['seconds']['open+views']:.2f} s), "
                      f"peak RSS {one['peak_rss_mib']:,.0f} MiB  [{_load()}]", flush=True)
        for engine in ("duckdb", "pandas", "baseline"):
            if engine in entry:
                entry[engine].pop("summary", None)
        results.append(entry)
    print(json.dumps(results, indent=1, default=str))
    if not args.keep:
        import shutil

        shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    os.environ.setdefault("PYTHONHASHSEED", "0")
    main()
