"""Benchmark: what a tokentrace command costs beside DuckDB itself, side by side in
one run, load average printed beside every timing.

1. **Fixed cost per command** (``--fixed``): whole-process wall time, median of ``--runs``
   interleaved runs, on a tiny database (5 requests of the synthetic shape below, loaded with
   ``tokentrace load``): the bare connection ``python -c "import duckdb;
   duckdb.connect(db, read_only=True).sql('select count(*) from spans').fetchall()"`` against
   ``tokentrace --help``, ``tokentrace requests --db`` (table and csv, stdout a file: not a
   terminal), ``summary``, ``window``, ``itl`` and ``requests --parquet`` of the same data.
   Goal: <= 1.6x the bare connection.
2. **Reuse of derived tables** (``--reuse N``): ``tokentrace requests|summary|window --db``
   (csv to a file, whole process, median) on N requests loaded by ``tokentrace load``
   (derived tables built) and on the same rows without derived tables, against the
   fixed cost of 1. Goal at 1e4: <= 2x the fixed cost. Also the load: ``tokentrace load
   DUMP --db`` with and without ``--no-derive`` (seconds) and the file sizes.
3. **Each verb against its floor** (``--floor N``): the verb as the CLI runs it (one
   connection: open_source, then the verb's queries through analyzer.query.runner.stream_query
   with keep_chunks=False, every part read as Arrow batches of 1M rows and counted) against
   the hand-written floor queries of benchmarks/floor_queries.py (same source, read the same
   way), each in a fresh process, fastest of ``--runs``; times from the open to the last
   batch. Both sources: the Parquet dump in place (``--parquet``: the verb derives what it
   needs) and the loaded database (``--db``: derived tables). Goal: <= 1.5x. Before timing,
   every floor is checked to give the verb's rows (all columns, floats to 1e-9) on a
   1,000-request dump.

Synthetic traces: benchmarks/queries.py's generator (N requests x 150 visible tokens, 154 spans
and 300 chunk events per request). Usage::

    .venv/bin/python benchmarks/verbs.py --fixed --reuse 10000 --floor 100000 [--keep DIR]
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import math
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
BENCH = Path(__file__).resolve().parent
VERBS = ("requests", "itl", "summary", "window", "phases", "skew")
MEMORY_LIMIT: str | None = None  # --memory-limit: every run's DuckDB memory_limit


def _bench_module(name: str) -> Any:
    spec = importlib.util.spec_from_file_location(f"_bench_{name}", BENCH / f"{name}.py")
    module = importlib.util.module_from_spec(spec)  # type: ignore[arg-type]  # the spec of an existing file
    spec.loader.exec_module(module)  # type: ignore[union-attr]  # a source file spec has a loader
    return module


def _load() -> str:
    return "load " + " ".join(f"{x:.2f}" for x in os.getloadavg())


def _tokentrace() -> list[str]:
    exe = Path(sys.executable).with_name("tokentrace")
    return [str(exe)] if exe.exists() else [sys.executable, "-c", "from analyzer.cli import main; main()"]


def dump(root: Path, n: int) -> Path:
    """The synthetic dump of ``n`` requests under ``root`` (written once, reused)."""
    directory = root / f"n{n}"
    if not (directory / "spans").is_dir():
        _bench_module("queries").generate(directory, n)
    return directory


def load_db(directory: Path, target: Path, derive: bool = True) -> float:
    """``tokentrace load DIR --db target`` (fresh file); seconds."""
    for p in (target, target.with_name(target.name + ".wal")):
        p.unlink(missing_ok=True)
    args = [*_tokentrace(), "load", str(directory), "--db", str(target), "-q"] + ([] if derive else ["--no-derive"])
    t0 = time.perf_counter()
    subprocess.run(args, check=True, timeout=7200, env=_env())
    return time.perf_counter() - t0


def _env() -> dict[str, str]:
    """The environment of every tokentrace command run here: --memory-limit as $TOKENTRACE_MEMORY_LIMIT."""
    return {**os.environ, **({"TOKENTRACE_MEMORY_LIMIT": MEMORY_LIMIT} if MEMORY_LIMIT else {})}


def _wall(cmd: list[str]) -> float:
    t0 = time.perf_counter()
    with open(os.devnull, "wb") as sink:
        subprocess.run(cmd, check=True, stdout=sink, stderr=sink, timeout=7200, env=_env())
    return time.perf_counter() - t0


def _medians(commands: dict[str, list[str]], runs: int) -> dict[str, float]:
    """Median wall seconds per command, runs interleaved (a burst of load hits all alike)."""
    times: dict[str, list[float]] = {k: [] for k in commands}
    for cmd in commands.values():  # warm the page cache and the .pyc files
        _wall(cmd)
    for _ in range(runs):
        for k, cmd in commands.items():
            times[k].append(_wall(cmd))
    return {k: statistics.median(v) for k, v in times.items()}


def fixed_cost(root: Path, runs: int) -> dict[str, float]:
    directory = dump(root, 5)
    db = root / "tiny.duckdb"
    load_db(directory, db)
    t = _tokentrace()
    bare = ("import duckdb; duckdb.connect(" + repr(str(db)) + ", read_only=True)"
            ".sql('select count(*) from spans').fetchall()")
    commands = {
        "bare duckdb connection": [sys.executable, "-c", bare],
        "tokentrace --help": [*t, "--help"],
        "requests --db (table)": [*t, "requests", "--db", str(db)],
        "requests --db --format csv": [*t, "requests", "--db", str(db), "--format", "csv"],
        "summary --db": [*t, "summary", "--db", str(db)],
        "window --db": [*t, "window", "--db", str(db)],
        "itl --db --format csv": [*t, "itl", "--db", str(db), "--format", "csv"],
        "requests --parquet": [*t, "requests", "--parquet", str(directory)],
    }
    result = _medians(commands, runs)
    base = result["bare duckdb connection"]
    print(f"\nFixed cost per command (tiny database, 5 requests; median of {runs}, whole process)  [{_load()}]")
    for k, v in result.items():
        print(f"  {k:<28} {v:6.3f} s   {v / base:4.2f}x the bare connection")
    return result


def reuse(root: Path, n: int, runs: int, fixed: float | None) -> dict[str, Any]:
    directory = dump(root, n)
    derived, plain = root / f"n{n}.duckdb", root / f"n{n}-plain.duckdb"
    loads: dict[bool, list[float]] = {False: [], True: []}
    for _ in range(2):  # interleaved, the faster of two each
        loads[False].append(load_db(directory, plain, derive=False))
        loads[True].append(load_db(directory, derived, derive=True))
    load_plain_s, load_s = min(loads[False]), min(loads[True])
    sizes = {"with derived tables": derived.stat().st_size, "without": plain.stat().st_size}
    t = _tokentrace()
    commands = {}
    for verb in ("requests", "summary", "window"):
        commands[f"{verb} (derived)"] = [*t, verb, "--db", str(derived), "--format", "csv"]
        commands[f"{verb} (no derived)"] = [*t, verb, "--db", str(plain), "--format", "csv"]
    result = _medians(commands, runs)
    print(f"\nReuse at {n:,} requests (median of {runs}, whole process, csv to a file)  [{_load()}]")
    print(f"  load (faster of 2): {load_plain_s:.2f} s --no-derive, {load_s:.2f} s with the derived tables "
          f"(+{load_s - load_plain_s:.2f} s); file {sizes['without'] / 2**20:,.1f} MiB -> "
          f"{sizes['with derived tables'] / 2**20:,.1f} MiB (+{(sizes['with derived tables'] - sizes['without']) / 2**20:,.1f} MiB)")
    for k, v in result.items():
        vs = f"   {v / fixed:4.2f}x the fixed cost" if fixed and "(derived)" in k else ""
        print(f"  {k:<24} {v:7.3f} s{vs}")
    return {"load_s": load_s, "load_no_derive_s": load_plain_s, "sizes": sizes, "seconds": result}


# --- per verb against its floor, each in a fresh process ---------------------------------


def _open(source: str, path: str) -> Any:
    from analyzer.db.source import open_source

    return open_source(parquet=path) if source == "parquet" else open_source(db=path)


def run_child(kind: str, verb: str, source: str, path: str, fetch: str, memory_limit: str | None) -> dict[str, Any]:
    t0 = time.perf_counter()
    con = _open(source, path)
    if memory_limit:  # the same limit for the verb and its floor; spills go to duckdb_tmp beside the data
        con.execute("SET memory_limit = $m", {"m": memory_limit})
        con.execute("SET temp_directory = $d", {"d": str(Path(path).parent / "duckdb_tmp")})
    rows = 0
    tables = []
    if kind == "verb":
        from analyzer.query.runner import stream_query

        names = ["skew_rules", "skew_offsets"] if verb == "skew" else [verb]
        for name in names:
            for part in stream_query(con, name, keep_chunks=False):  # lazily: views kept at the first part
                reader = con.sql(part.sql, params=part.params).to_arrow_reader(1_000_000)
                batches = list(reader) if fetch == "table" else None
                if batches is None:
                    rows += sum(b.num_rows for b in reader)
                else:
                    rows += sum(b.num_rows for b in batches)
                    tables.append(batches)
    else:
        for sql in _bench_module("floor_queries").FLOORS[verb]:
            reader = con.sql(sql).to_arrow_reader(1_000_000)
            if fetch == "table":
                batches = list(reader)
                rows += sum(b.num_rows for b in batches)
                tables.append(batches)
            else:
                rows += sum(b.num_rows for b in reader)
    seconds = time.perf_counter() - t0
    con.close()
    result: dict[str, Any] = {"seconds": seconds, "rows": rows, "peak_rss_mib": _peak_rss_mib()}
    if fetch == "table":
        import pyarrow as pa

        result["tables"] = [pa.Table.from_batches(b).to_pylist() if b else [] for b in tables]
    return result


def _peak_rss_mib() -> float:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) / 1024
    return float("nan")


def _child_cmd(kind: str, verb: str, source: str, path: Path, fetch: str = "count") -> dict[str, Any]:
    cmd = [sys.executable, __file__, "--child", kind, "--verb", verb, "--source", source, "--path", str(path),
           "--fetch", fetch] + (["--memory-limit", MEMORY_LIMIT] if MEMORY_LIMIT else [])
    out = subprocess.run(cmd, check=True, capture_output=True, text=True, timeout=7200).stdout
    return json.loads(out.strip().splitlines()[-1])


def _same(a: Any, b: Any) -> bool:
    if isinstance(a, float) and isinstance(b, float):
        return (math.isnan(a) and math.isnan(b)) or math.isclose(a, b, rel_tol=1e-9, abs_tol=1e-9)
    if isinstance(a, dict) and isinstance(b, dict):
        return list(a) == list(b) and all(_same(a[k], b[k]) for k in a)
    if isinstance(a, list) and isinstance(b, list):
        return len(a) == len(b) and all(_same(x, y) for x, y in zip(a, b))
    return a == b


def floor_differences(verb_tables: list[list[dict]], floor_tables: list[list[dict]]) -> list[str]:
    """Where a floor's rows differ from its verb's: row counts, order and every column the floor
    computes (a column the verb gained later is not compared, and is named)."""
    problems = []
    for i, (a, b) in enumerate(zip(verb_tables, floor_tables)):
        if len(a) != len(b):
            problems.append(f"part {i}: {len(a)} rows from the verb, {len(b)} from the floor")
            continue
        if a and b:
            missing = [c for c in b[0] if c not in a[0]]
            if missing:
                problems.append(f"part {i}: the floor has columns the verb lacks: {missing}")
                continue
        for n, (x, y) in enumerate(zip(a, b)):
            if not _same({c: x[c] for c in y}, y):
                problems.append(f"part {i} row {n}: verb {x} vs floor {y}")
                break
    return problems


def check_floors(root: Path) -> None:
    """Every floor gives the verb's rows (order and values of every floor column) on a small dump."""
    directory = dump(root, 1000)
    for verb in VERBS:
        a = _child_cmd("verb", verb, "parquet", directory, "table")["tables"]
        b = _child_cmd("floor", verb, "parquet", directory, "table")["tables"]
        problems = floor_differences(a, b)
        if problems:
            raise SystemExit(f"floor of {verb} differs from the verb: {problems[0]}")
    print("floors checked: each gives its verb's rows, every floor column, on 1,000 requests")


def _warm(path: Path) -> None:
    """Read every file once, so no timed run pays for the first read from disk."""
    for f in ([path] if path.is_file() else sorted(p for p in path.rglob("*") if p.is_file())):
        with open(f, "rb") as fh:
            while fh.read(1 << 24):
                pass


def floor(root: Path, n: int, runs: int) -> dict[str, Any]:
    directory = dump(root, n)
    db = root / f"n{n}.duckdb"
    if not db.exists():
        load_db(directory, db)
    results: dict[str, Any] = {}
    for source, path in (("parquet", directory), ("db", db)):
        _warm(path)
        print(f"\nEach verb against its floor, {n:,} requests, --{source} (fastest of {runs}, fresh process each, "
              f"open to last Arrow batch)")
        for verb in VERBS:
            verb_runs, floor_runs = [], []
            for _ in range(runs):  # interleaved
                verb_runs.append(_child_cmd("verb", verb, source, path))
                floor_runs.append(_child_cmd("floor", verb, source, path))
            v = min(r["seconds"] for r in verb_runs)
            f = min(r["seconds"] for r in floor_runs)
            rows = (verb_runs[0]["rows"], floor_runs[0]["rows"])
            same = "" if rows[0] == rows[1] else f"  ROWS DIFFER {rows}"
            rss = (max(r["peak_rss_mib"] for r in verb_runs), max(r["peak_rss_mib"] for r in floor_runs))
            print(f"  {verb:<9} verb {v:7.2f} s  floor {f:7.2f} s  ratio {v / f:4.2f}  rows {rows[0]:,}{same}  "
                  f"peak RSS {rss[0]:,.0f} / {rss[1]:,.0f} MiB  [{_load()}]", flush=True)
            results[f"{source}:{verb}"] = {"verb_s": v, "floor_s": f, "ratio": v / f, "rows": rows, "peak_rss_mib": rss}
    return results


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--fixed", action="store_true", help="measure the per-command fixed cost")
    parser.add_argument("--reuse", type=int, default=None, metavar="N", help="reuse of derived tables at N requests")
    parser.add_argument("--floor", type=int, default=None, metavar="N", help="each verb against its floor at N requests")
    parser.add_argument("--runs", type=int, default=5, help="runs per command (median / fastest reported)")
    parser.add_argument("--floor-runs", type=int, default=2, help="runs per verb and floor (the fastest is reported)")
    parser.add_argument("--skip-check", action="store_true", help="do not check the floors against the verbs first")
    parser.add_argument("--keep", default=None, help="keep dumps and databases here (default: a temp dir, removed)")
    parser.add_argument("--memory-limit", default=None,
                        help="DuckDB memory_limit of every verb and floor run, e.g. 12GB (default: DuckDB's, 80%% of RAM)")
    parser.add_argument("--child", default=None, help=argparse.SUPPRESS)
    parser.add_argument("--verb", default=None, help=argparse.SUPPRESS)
    parser.add_argument("--source", default=None, help=argparse.SUPPRESS)
    parser.add_argument("--path", default=None, help=argparse.SUPPRESS)
    parser.add_argument("--fetch", default="count", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        print(json.dumps(run_child(args.child, args.verb, args.source, args.path, args.fetch, args.memory_limit),
                         default=str))
        return
    global MEMORY_LIMIT
    MEMORY_LIMIT = args.memory_limit
    root = Path(args.keep) if args.keep else Path(tempfile.mkdtemp(prefix="tt-verbs-"))
    root.mkdir(parents=True, exist_ok=True)
    report: dict[str, Any] = {}
    try:
        fixed = None
        if args.fixed:
            report["fixed"] = fixed_cost(root, args.runs)
            fixed = report["fixed"]["requests --db --format csv"]
        if args.reuse:
            report["reuse"] = reuse(root, args.reuse, args.runs, fixed)
        if args.floor:
            if not args.skip_check:
                check_floors(root)
            report["floor"] = floor(root, args.floor, max(1, args.floor_runs))
        print(json.dumps(report, indent=1, default=str))
    finally:
        if not args.keep:
            shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    main()
