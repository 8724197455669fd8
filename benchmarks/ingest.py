"""Ingest benchmark: ``tokentrace load`` against the bare DuckDB recipe, a pure-Python loop
and the parse-only floor, on generated OTLP/JSON lines (one run, so ratios compare).

The generator writes what a BatchSpanProcessor sends (up to 512 spans per export line, one
resource per process): per request a CLIENT span and a gateway SERVER span, each with one
``tokentrace.chunk`` event per token, plus tokenize, queue, prefill and G-1 decode spans.

Usage::

    python benchmarks/ingest.py                 # N = 1e5 and 1e6
    python benchmarks/ingest.py --sizes 100000  # one size
    python benchmarks/ingest.py --with-1e7      # adds N = 1e7 (about 10 GB of JSON)
    python benchmarks/ingest.py --repeat 3      # each method 3 times, interleaved: best and median
    python benchmarks/ingest.py --baseline /tmp/tt-main   # also `tokentrace load` of that checkout

Each method runs in its own subprocess; peak RSS is that process's ``ru_maxrss``, CPU its
user + system time (all threads, start-up included). The clock starts after the method's
imports (``import_s``, reported apart). Reported per method: seconds, spans/s, MB/s (input
bytes), CPU seconds and import seconds of its fastest run (--repeat), peak RSS MiB as the
largest over its runs, and the seconds and CPU seconds as ratios to the bare recipe's in the
same run; the load average is printed before and after (the machine is shared: compare
ratios, not seconds).
"""

from __future__ import annotations

import argparse
import json
import os
import random
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

BATCH = 512
TOKENS = 60  # G per request: G + 4 spans and 2 G events per request


def _kv(key: str, value: object) -> dict:
    if isinstance(value, bool):
        return {"key": key, "value": {"boolValue": value}}
    if isinstance(value, int):
        return {"key": key, "value": {"intValue": str(value)}}
    if isinstance(value, float):
        return {"key": key, "value": {"doubleValue": value}}
    return {"key": key, "value": {"stringValue": value}}


def _resource(service: str, instance: str) -> dict:
    return {"attributes": [_kv("service.name", service), _kv("service.instance.id", instance), _kv("host.name", "bench-host"),
                           _kv("telemetry.sdk.name", "opentelemetry"), _kv("telemetry.sdk.language", "python")]}  # fmt: skip


def _span(rng: random.Random, trace: str, parent: str, name: str, kind: int, start: int, end: int, attrs: list, events: list | None = None) -> dict:
    span = {
        "traceId": trace, "spanId": f"{rng.getrandbits(64):016x}", "parentSpanId": parent, "flags": 257, "name": name,
        "kind": kind, "startTimeUnixNano": str(start), "endTimeUnixNano": str(end), "attributes": attrs, "status": {},
    }  # fmt: skip
    if events:
        span["events"] = events
    return span


def _chunks(start: int, step: int) -> list:
    return [{"timeUnixNano": str(start + i * step), "name": "tokentrace.chunk",
             "attributes": [_kv("tokentrace.chunk.index", i), _kv("tokentrace.chunk.tokens", 1), _kv("tokentrace.chunk.visible", True)]}
            for i in range(TOKENS)]  # fmt: skip


def _request(rng: random.Random, t0: int) -> tuple[list, list]:
    """(client spans, server spans) of one request."""
    trace = f"{rng.getrandbits(128):032x}"
    usage = [_kv("gen_ai.operation.name", "chat"), _kv("gen_ai.request.model", "SmolLM2-135M"), _kv("gen_ai.request.max_tokens", TOKENS),
             _kv("gen_ai.usage.input_tokens", 1025), _kv("gen_ai.usage.output_tokens", TOKENS)]  # fmt: skip
    step = 20_000_000
    client = _span(rng, trace, "", "chat SmolLM2-135M", 3, t0, t0 + 60_000_000 + TOKENS * step, usage, _chunks(t0 + 55_000_000, step))
    gw = _span(rng, trace, client["spanId"], "gateway", 2, t0 + 1_000_000, t0 + 59_000_000 + TOKENS * step,
               usage + [_kv("gen_ai.response.id", f"chatcmpl-{rng.getrandbits(48):x}"), _kv("tokentrace.generated_tokens", TOKENS)],
               _chunks(t0 + 54_000_000, step))  # fmt: skip
    gid = gw["spanId"]
    server = [gw, _span(rng, trace, gid, "tokenize", 1, t0 + 2_000_000, t0 + 3_000_000, [_kv("tokentrace.template.sha256", "ab" * 32)]),
              _span(rng, trace, gid, "queue", 1, t0 + 3_000_000, t0 + 4_000_000, [_kv("tokentrace.queue.depth", 2)]),
              _span(rng, trace, gid, "prefill", 1, t0 + 4_000_000, t0 + 50_000_000,
                    [_kv("tokentrace.input_tokens", 1025), _kv("tokentrace.kv.bytes", 335_872_000), _kv("tokentrace.kv.dtype", "bf16")])]  # fmt: skip
    for k in range(1, TOKENS):
        s = t0 + 50_000_000 + (k - 1) * step
        server.append(_span(rng, trace, gid, "decode", 1, s, s + step - 1000,
                            [_kv("tokentrace.step", k), _kv("tokentrace.context_tokens", 1025 + k),
                             _kv("tokentrace.kv.bytes", 327_680 * (1025 + k))]))
    return [client], server


def generate(path: Path, n_spans: int, seed: int = 7) -> tuple[int, int]:
    """Write about ``n_spans`` spans as OTLP/JSON lines; returns (spans, events) written."""
    import orjson

    rng = random.Random(seed)
    res_client, res_server = _resource("bench-client", "client-1"), _resource("bench-gateway", "gw-1")
    scope = {"name": "tokentrace", "version": "1"}
    pending = {"c": [], "s": []}
    spans = events = 0
    t0 = 1_760_000_000_000_000_000
    with open(path, "wb") as out:

        def emit(key: str, force: bool = False) -> None:
            while len(pending[key]) >= BATCH or (force and pending[key]):
                batch, pending[key] = pending[key][:BATCH], pending[key][BATCH:]
                doc = {"resourceSpans": [{"resource": res_client if key == "c" else res_server, "scopeSpans": [{"scope": scope, "spans": batch}]}]}
                out.write(orjson.dumps(doc) + b"\n")

        while spans < n_spans:
            client, server = _request(rng, t0)
            t0 += 7_000_000
            pending["c"].extend(client)
            pending["s"].extend(server)
            spans += len(client) + len(server)
            events += 2 * TOKENS
            emit("c")
            emit("s")
        emit("c", True)
        emit("s", True)
    return spans, events


# --- the methods, each run in a child process -------------------------------------------------

def run_tokentrace(path: str) -> int:
    from analyzer.db.store import connect
    from analyzer.formats.load import load_paths

    with tempfile.TemporaryDirectory() as d:
        con = connect(os.path.join(d, "bench.duckdb"))
        report = load_paths(con, [path])
        return report.total("spans_loaded")


_ATTR = "STRUCT(key VARCHAR, value STRUCT(stringValue VARCHAR, intValue VARCHAR, doubleValue DOUBLE, boolValue BOOLEAN))[]"
_SPAN = (f"STRUCT(traceId VARCHAR, spanId VARCHAR, parentSpanId VARCHAR, flags BIGINT, name VARCHAR, kind INTEGER,"
         f" startTimeUnixNano VARCHAR, endTimeUnixNano VARCHAR, attributes {_ATTR},"
         f" events STRUCT(timeUnixNano VARCHAR, name VARCHAR, attributes {_ATTR})[], status STRUCT(code INTEGER, message VARCHAR))")  # fmt: skip
BARE_SCHEMA = (f"STRUCT(resource STRUCT(attributes {_ATTR}), scopeSpans STRUCT(scope STRUCT(name VARCHAR, version VARCHAR),"
               f" spans {_SPAN}[])[])[]")  # fmt: skip


def run_bare_duckdb(path: str) -> int:
    """read_json with an explicit schema + unnests into flat tables; no validation, no dedupe."""
    import duckdb

    with tempfile.TemporaryDirectory() as d:
        con = duckdb.connect(os.path.join(d, "bare.duckdb"))
        con.execute(f"""
            CREATE TABLE flat_spans AS
            WITH rs AS (SELECT unnest(resourceSpans) AS rs FROM read_json('{path}', format = 'newline_delimited',
                          records = true, sample_size = 1, columns = {{resourceSpans: '{BARE_SCHEMA}'}})),
                 ss AS (SELECT rs.resource AS resource, unnest(rs.scopeSpans) AS ss FROM rs),
                 sp AS (SELECT resource, ss.scope AS scope, unnest(ss.spans) AS sp FROM ss)
            SELECT sp.traceId AS trace_id, sp.spanId AS span_id, sp.parentSpanId AS parent_span_id, sp.name, sp.kind,
                   sp.startTimeUnixNano::BIGINT AS start_ns, sp.endTimeUnixNano::BIGINT AS end_ns, sp.status.code AS status_code,
                   scope.name AS scope_name, resource.attributes AS resource_attributes, sp.attributes, sp.events
            FROM sp""")
        con.execute("""
            CREATE TABLE flat_events AS
            SELECT trace_id, span_id, unnest(range(len(events))) AS event_index, unnest(events) AS ev FROM flat_spans""")
        con.execute("ALTER TABLE flat_spans DROP COLUMN events")
        return con.execute("SELECT count(*) FROM flat_spans").fetchone()[0]


def run_python_loop(path: str) -> int:
    """json.loads + flattening to tuples (spans and events), nothing stored."""
    spans: list = []
    events: list = []
    with open(path, "rb") as f:
        for line in f:
            doc = json.loads(line)
            for rs in doc["resourceSpans"]:
                res = {a["key"]: a["value"] for a in rs["resource"]["attributes"]}
                for ss in rs["scopeSpans"]:
                    for sp in ss["spans"]:
                        attrs = {a["key"]: next(iter(a["value"].values())) for a in sp.get("attributes", [])}
                        spans.append((sp["traceId"], sp["spanId"], sp.get("parentSpanId"), sp["name"], sp.get("kind"),
                                      int(sp["startTimeUnixNano"]), int(sp["endTimeUnixNano"]), attrs, res))  # fmt: skip
                        for i, ev in enumerate(sp.get("events", [])):
                            events.append((sp["traceId"], sp["spanId"], i, int(ev["timeUnixNano"]), ev["name"],
                                           {a["key"]: next(iter(a["value"].values())) for a in ev.get("attributes", [])}))  # fmt: skip
    return len(spans)


def run_parse_floor(path: str) -> int:
    """orjson.loads over every line: the least any JSON reader must spend."""
    import orjson

    n = 0
    with open(path, "rb") as f:
        for line in f:
            n += len(orjson.loads(line)["resourceSpans"][0]["scopeSpans"][0]["spans"])
    return n


METHODS = {"tokentrace load": run_tokentrace, "bare DuckDB recipe": run_bare_duckdb,
           "Python loop": run_python_loop, "parse floor (orjson)": run_parse_floor}  # fmt: skip
# Modules each method imports, loaded before its clock starts: the seconds measure reading
# the file, not interpreter start-up (reported apart as import_s).
IMPORTS = {"tokentrace load": ("analyzer.formats.load", "analyzer.db.store"), "bare DuckDB recipe": ("duckdb",),
           "Python loop": ("json",), "parse floor (orjson)": ("orjson",)}  # fmt: skip


BASELINE = "baseline load"  # tokentrace load with the analyzer of --baseline DIR
METHODS[BASELINE] = run_tokentrace
IMPORTS[BASELINE] = IMPORTS["tokentrace load"]


def _child(method: str, path: str) -> None:
    import importlib

    code = os.environ.get("TT_BENCH_BASELINE_CODE")
    if method == BASELINE and code:  # that checkout's analyzer package, ahead of this one
        sys.path.insert(0, code)

    t = time.perf_counter()
    for module in IMPORTS[method]:
        importlib.import_module(module)
    imported = time.perf_counter()
    n = METHODS[method](path)
    print(json.dumps({"seconds": time.perf_counter() - imported, "import_s": imported - t, "spans": n}))


def _measure(method: str, path: str, baseline: str | None = None) -> dict:
    """One run of ``method`` in a child process: seconds (timed inside the child), spans,
    peak RSS MiB and CPU seconds (user + system, all threads, interpreter start included)."""
    env = {**os.environ, "TT_BENCH_BASELINE_CODE": baseline} if baseline else None
    proc = subprocess.Popen([sys.executable, __file__, "--child", method, path], stdout=subprocess.PIPE, env=env)
    out = proc.stdout.read() if proc.stdout else b""
    _, status, usage = os.wait4(proc.pid, 0)
    if status != 0:
        raise SystemExit(f"{method} failed (status {status})")
    result = json.loads(out)
    result["peak_rss_mib"] = usage.ru_maxrss / 1024  # Linux: KiB
    result["cpu_s"] = usage.ru_utime + usage.ru_stime
    return result


def _best(runs: list[dict]) -> dict:
    """The fastest run, with the median seconds of all runs beside it."""
    best = dict(min(runs, key=lambda r: r["seconds"]))
    best["median_s"] = statistics.median(r["seconds"] for r in runs)
    best["peak_rss_mib"] = max(r["peak_rss_mib"] for r in runs)
    return best


def _load_average() -> str:
    return " ".join(f"{x:.2f}" for x in os.getloadavg())


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--sizes", type=int, nargs="*", default=[100_000, 1_000_000])
    ap.add_argument("--with-1e7", action="store_true", help="also N = 1e7 (about 10 GB of JSON on disk)")
    ap.add_argument("--methods", nargs="*", default=[m for m in METHODS if m != BASELINE])
    ap.add_argument("--baseline", metavar="DIR", default=None,
                    help="also time `tokentrace load` with the analyzer of this checkout (e.g. a git worktree of main), "
                         "as the method 'baseline load', interleaved with the others")
    ap.add_argument("--repeat", type=int, default=1, help="runs per method, interleaved; the best is reported (default 1)")
    ap.add_argument("--child", nargs=2, metavar=("METHOD", "PATH"), help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        _child(*args.child)
        return
    sizes = args.sizes + ([10_000_000] if args.with_1e7 else [])
    baseline = str(Path(args.baseline).resolve()) if args.baseline else None
    if baseline and BASELINE not in args.methods:
        args.methods.insert(1, BASELINE)
    with tempfile.TemporaryDirectory() as d:
        for n in sizes:
            path = Path(d) / f"spans_{n}.jsonl"
            spans, events = generate(path, n)
            mb = path.stat().st_size / 1e6
            print(f"\nN = {spans:,} spans, {events:,} events, {mb:,.0f} MB of OTLP/JSON lines; load average {_load_average()}")
            print(f"{'method':24} {'seconds':>8} {'median':>8} {'spans/s':>11} {'MB/s':>7} {'peak RSS MiB':>13} {'CPU s':>7} {'import s':>9}"
                  f" {'vs bare':>8} {'CPU vs bare':>12}")
            runs: dict[str, list[dict]] = {m: [] for m in args.methods}
            for _ in range(max(1, args.repeat)):  # interleaved, so a busy spell hits every method
                for m in args.methods:
                    runs[m].append(_measure(m, str(path), baseline if m == BASELINE else None))
            results = {m: _best(r) for m, r in runs.items()}
            bare = results.get("bare DuckDB recipe")
            for m, r in results.items():
                ratio = f"{r['seconds'] / bare['seconds']:7.2f}x" if bare else ""
                cpu_ratio = f"{r['cpu_s'] / bare['cpu_s']:7.2f}x" if bare else ""
                print(f"{m:24} {r['seconds']:8.2f} {r['median_s']:8.2f} {r['spans'] / r['seconds']:11,.0f} {mb / r['seconds']:7.1f}"
                      f" {r['peak_rss_mib']:13.0f} {r['cpu_s']:7.2f} {r['import_s']:9.2f} {ratio:>8} {cpu_ratio:>12}")
            print(f"load average after: {_load_average()}")


if __name__ == "__main__":
    main()
