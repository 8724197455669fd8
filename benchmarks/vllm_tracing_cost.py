"""What tokentrace's vLLM plugin costs vLLM, untraced and at several sampling ratios.

The numbers a deployment is sized with. Sides: ``off`` (the plugin off) and one per
``--sampling`` ratio R (default 1.0, 0.1, 0.01): the plugin on with
``OTEL_TRACES_SAMPLER=traceidratio``, ``OTEL_TRACES_SAMPLER_ARG=R`` (requests, decided at
arrival) and ``TOKENTRACE_VLLM_STEP_SAMPLE_RATIO=R`` (engine_step spans). One vLLM server
per side and round (127.0.0.1), the sides interleaved in each round and then in reverse
(off, 1.0, 0.1, 0.01, 0.01, 0.1, 1.0, off: ``--rounds`` times), so a drift of the shared
machine hits every side alike. Per server and concurrency: ``--requests-per-stream`` ×
concurrency streaming chats with ``ignore_eos`` and ``--max-tokens`` output tokens, after a
warm-up (loads of 4 chats, repeated until the plugin has sent: it starts its exporter process
at its first send of something sampled). Reported per side and concurrency, medians over its servers:

- output tokens/s (generated tokens / wall time of the load) and its ratio to ``off``;
- engine-core process CPU per generated token, µs, all its threads (``/proc/<pid>/task/*/
  schedstat``), from the load's start to 0.5 s after its end, and its difference to ``off``
  (on a shared 2-core machine this varies by several times between servers);
- the engine thread's CPU in the plugin, as the plugin measures it
  (``TOKENTRACE_VLLM_STATS``: its step wrappers, finish hook and sends, net of the clock's
  own cost; not its arrival, preemption and free hooks), per scheduler step with requests and
  per generated token;
  its parts per step (schedule hook, update hook, sends) and the fraction of steps the
  written spans name (``tokentrace.engine.step``: a lower bound of the steps recorded);
- the span exporter process's CPU (the plugin's detached child, counted until it stops using
  CPU) per *sampled* generated token: the sum of ``gen_ai.usage.output_tokens`` over the
  engine_request spans written (to an OTLP/JSON lines file in a temporary folder);
- OTLP bytes per sampled generated token: JSON (the file's bytes) and protobuf (each line
  re-encoded as the ``ExportTraceServiceRequest`` an OTLP exporter sends, serialized), and
  spans per sampled generated token.

``--keep`` adds a side ``keep``: a keep policy, "slowest 1 % + 1 % random"
(``TOKENTRACE_KEEP_SLOWEST=0.01``, requests and engine steps sampled at 0.01): the engine thread
records every request whole, as at 1.0, and the exporter process decides each request's detail
at its end; there a "sampled" token is every generated token (every request leaves its summary
span), and ``kept`` is the fraction of requests kept whole. The engine thread's wall time in
the hooks is printed beside its CPU time.

Goals on this machine (engine thread µs per step): at 1.0, ≤ 25 at concurrency 8; at 0.01,
≤ 5 at every concurrency; ``keep``: ≤ 25 / 35 / 50 at concurrency 8 / 32 / 64. The load average (1 min) is printed per load: on a shared machine
read the figures next to it. vLLM's own tracing is off on every side.

``--baseline DIR``: another checkout of tokentrace (a ``git worktree`` of an earlier commit)
measured in the same run: each traced side R runs twice per block, as ``R`` (this checkout)
and ``Rb`` (DIR first on vLLM's ``PYTHONPATH``, ahead of the editable install), in turn.

``--vllm-python`` runs vLLM: by default this Python if it has vLLM, else the repo's
``.venv-vllm``. ``--model tiny`` (use it for these numbers) serves tokentrace's tiny random
Llama (instrument/hf/tiny_model.py, 2 query heads for vLLM's CPU attention, ~0.1 MB): a model
step that leaves the CPU's caches to vLLM's own code, as on a host whose model runs on a GPU;
``smollm2`` streams 270 MB of weights through them every step. ``--gc``: every side with
vLLM's GC debugger (``VLLM_GC_DEBUG=1``), the engine core's collections summed per load.
``--json FILE``: every load's figures and the medians.

Run:  .venv/bin/python benchmarks/vllm_tracing_cost.py --model tiny [--rounds 1]
      [--concurrency 8 32 64] [--sampling 1.0 0.1 0.01] [--max-tokens 64]
      [--requests-per-stream 2] [--vllm-python PATH] [--json FILE] [--gc] [--baseline DIR] [--keep]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run from a checkout without installing
sys.path.insert(0, str(Path(__file__).resolve().parent))

import vllm_cost_parts as parts

COUNTERS = ("steps", "tokens", "hook_cpu_ns", "schedule_cpu_ns", "send_cpu_ns", "pack_cpu_ns", "socket_cpu_ns",
            "free_cpu_ns", "sends", "stats_cpu_ns", "dropped_steps", "sent_spans", "dropped_spans",
            "dropped_messages", "hook_wall_ns")
# (side, concurrencies (None: all), µs per step at most)
GOALS = (("1.0", (8,), 25.0), ("0.01", None, 5.0), ("keep", (8,), 25.0), ("keep", (32,), 35.0),
         ("keep", (64,), 50.0))
KEEP = "keep"  # the side with a keep policy: "slowest 1 % + 1 % random" (KEEP_ENV)
KEEP_RATIO = "0.01"
KEEP_ENV = {"TOKENTRACE_KEEP_SLOWEST": "0.01"}


def _ratio(text: str) -> str:
    try:
        value = float(text)
    except ValueError:
        value = -1.0
    if not 0.0 <= value <= 1.0:
        raise argparse.ArgumentTypeError(f"{text!r} is not a ratio in [0, 1]")
    return text


def _side_ratio(side: str) -> float:
    """A traced side's sampling ratio (``0.01``; ``0.01b``: the same on the baseline checkout;
    ``keep``: ``KEEP_RATIO``)."""
    side = side.rstrip("b")
    return float(KEEP_RATIO if side == KEEP else side)


def _traced_env(side: str, spans: Path, baseline: Path | None) -> dict[str, str]:
    ratio = str(_side_ratio(side))
    env = {"TOKENTRACE_VLLM_TRACING": "1", "TOKENTRACE_OTLP_JSON": str(spans),
           "TOKENTRACE_VLLM_STATS": str(spans.with_suffix(".stats.json")),
           "OTEL_TRACES_SAMPLER": "traceidratio", "OTEL_TRACES_SAMPLER_ARG": ratio,
           "TOKENTRACE_VLLM_STEP_SAMPLE_RATIO": ratio}
    if side.rstrip("b") == KEEP:  # every request recorded, its detail decided at its end
        env.update(KEEP_ENV)
    if side.endswith("b"):
        if baseline is None:
            raise ValueError(f"side {side}: no --baseline checkout")
        env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(baseline), os.environ.get("PYTHONPATH")]))
    return env


def _per(value: float, count: float, scale: float = 1.0) -> float | None:
    return value * scale / count if count else None


def _derive(run: dict[str, Any]) -> None:
    """Per-token and per-step figures of one load, in place."""
    run["tok_s"] = run["tokens"] / run["wall_s"]
    run["core_us_per_token"] = run["core_cpu_s"] * 1e6 / run["tokens"]
    plugin = run.get("plugin")
    if plugin is None:
        return
    steps = plugin["steps"]
    run["engine_us_per_step"] = _per(plugin["hook_cpu_ns"], steps, 1e-3)
    run["engine_wall_us_per_step"] = _per(plugin["hook_wall_ns"], steps, 1e-3)
    run["engine_us_per_token"] = _per(plugin["hook_cpu_ns"], plugin["tokens"], 1e-3)
    run["schedule_us_per_step"] = _per(plugin["schedule_cpu_ns"], steps, 1e-3)
    run["sends_us_per_step"] = _per(plugin["send_cpu_ns"], steps, 1e-3)
    run["update_us_per_step"] = _per(plugin["hook_cpu_ns"] - plugin["schedule_cpu_ns"] - plugin["send_cpu_ns"],
                                     steps, 1e-3)
    run["steps_named_fraction"] = _per(run["otlp"]["steps_named"], steps)
    sampled = run["otlp"]["sampled_tokens"]
    run["exporter_us_per_sampled_token"] = _per(run["exporter_cpu_s"], sampled, 1e6)
    run["json_bytes_per_sampled_token"] = _per(run["otlp"]["json_bytes"], sampled)
    run["proto_bytes_per_sampled_token"] = _per(run["otlp"]["proto_bytes"], sampled)
    run["spans_per_sampled_token"] = _per(run["otlp"]["spans"], sampled)
    run["kept_fraction"] = _per(run["otlp"]["kept_requests"], run["otlp"]["sampled_requests"])


def _measure(args: argparse.Namespace, python: str, model: Path, tmp: Path, index: int, side: str,
             total: int, failures: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """One server of ``side`` and its loads, one per concurrency (a server that fails: its
    log kept, the failure in ``failures``, the loads measured so far returned)."""
    spans, log = tmp / f"spans-{index}.jsonl", tmp / f"server-{index}.log"
    stats_path = spans.with_suffix(".stats.json")
    traced = None if side == "off" else _traced_env(side, spans, args.baseline)
    runs = []
    server = parts.start(python, model, traced, log, args.gc)
    try:
        core = parts.engine_core_pid(server.pid)
        last, child, warm_ups = _warm_up(args, stats_path, spans, traced is not None)
        if warm_ups > 1:
            print(f"{index + 1}/{total} {side:>5} warm-up: {warm_ups} loads of 4 until the plugin sent", flush=True)
        for concurrency in args.concurrency:
            child_before = parts.settled_cpu_s(child) if child else 0.0
            at, log_at = parts.file_end(spans), log.stat().st_size
            before = parts.cpu_s(core)
            tokens, wall = parts.load(concurrency, concurrency * args.requests_per_stream, args.max_tokens)
            time.sleep(0.5)  # the engine's idle send
            run: dict[str, Any] = {"side": side, "server": index + 1, "concurrency": concurrency, "tokens": tokens,
                                   "wall_s": wall, "core_cpu_s": parts.cpu_s(core) - before,
                                   "load_average": os.getloadavg()}
            if traced:
                now = parts.plugin_stats(stats_path, last["tokens"])
                run["plugin"] = {k: now[k] - last[k] for k in COUNTERS}
                if not child and now["sends"]:  # started during this load: its start-up CPU counted here
                    child, run["exporter_started"] = parts.exporter_pid(stats_path, spans), True
                run["exporter_cpu_s"] = parts.settled_cpu_s(child) - child_before if child else 0.0
                run["otlp"] = parts.otlp_figures(spans, at, parts.file_end(spans))
                last = now
            if args.gc:
                count, ms, per = parts.gc_ms(log, log_at)
                run["gc"] = {"collections": count, "ms": ms, "ms_per_generation": per}
            _derive(run)
            runs.append(run)
            _print_run(run, total)
    except RuntimeError as exc:
        kept = Path(tempfile.gettempdir()) / f"vllm-cost-server-{index + 1}-{side}.log"
        shutil.copyfile(log, kept)
        lines = [line for line in log.read_text(errors="replace").splitlines() if "tokentrace" in line]
        failures.append({"server": index + 1, "side": side, "error": str(exc), "log": str(kept), "lines": lines[-5:]})
        print(f"{index + 1}/{total} {side:>5} FAILED: {exc}\n    log kept: {kept}", flush=True)
        for line in lines[-5:]:
            print(f"    {line[:76]}")
    finally:
        parts.stop(server)
    if side != "off" and _side_ratio(side) == 1.0 and not spans.exists():
        raise SystemExit(f"vllm_tracing_cost: the plugin wrote no spans (is tokentrace installed in {python}?)")
    return runs


def _warm_up(args: argparse.Namespace, stats_path: Path, spans: Path,
             traced: bool) -> tuple[dict[str, Any], int, int]:
    """Warm-up loads of 4 requests, repeated (at most 20) until the plugin has sent (it starts
    its exporter process at the first send of something sampled): (its stats, the exporter
    process's pid (0: not started), loads)."""
    stats: dict[str, Any] = {}
    for count in range(1, 21):
        parts.load(4, 4, args.max_tokens)
        if not traced:
            return stats, 0, count
        stats = parts.plugin_stats(stats_path, stats.get("tokens", 0))
        if stats["sends"]:
            return stats, parts.exporter_pid(stats_path, spans), count
    return stats, 0, count


def _print_run(run: dict[str, Any], total: int) -> None:
    print(f"{run['server']}/{total} {run['side']:>5} c={run['concurrency']:<3} {run['tok_s']:7.1f} tok/s, "
          f"core {run['core_us_per_token']:6.1f} µs/token, load {run['load_average'][0]:.2f}", flush=True)
    if "plugin" in run:
        plugin, otlp = run["plugin"], run["otlp"]
        print(f"    engine thread {run['engine_us_per_step'] or 0:.2f} µs/step (schedule "
              f"{run['schedule_us_per_step'] or 0:.2f}, update {run['update_us_per_step'] or 0:.2f}, sends "
              f"{run['sends_us_per_step'] or 0:.2f})\n    {run['engine_us_per_token'] or 0:.3f} µs/token; steps "
              f"named in spans {otlp['steps_named']}/{plugin['steps']}; sends {plugin['sends']}\n"
              f"    sampled {otlp['sampled_requests']} requests, {otlp['sampled_tokens']} tokens; exporter CPU "
              f"{run['exporter_cpu_s'] * 1e3:.1f} ms\n    {otlp['spans']} spans, {otlp['json_bytes']} B JSON, "
              f"{otlp['proto_bytes']} B protobuf", flush=True)
        if run.get("exporter_started"):
            print("    (the exporter process started during this load: its start-up CPU is in it)")
        if _side_ratio(run["side"]) == 1.0 and otlp["sampled_tokens"] != run["tokens"]:
            print(f"    NOTE: the spans say {otlp['sampled_tokens']} tokens of {run['tokens']} generated")
        if plugin["dropped_spans"] or plugin["dropped_steps"] or plugin["dropped_messages"]:
            print(f"    dropped: {plugin['dropped_spans']} spans, {plugin['dropped_steps']} steps, "
                  f"{plugin['dropped_messages']} messages")
    if "gc" in run:
        gc = run["gc"]
        print(f"    GC (vLLM's debugger): {gc['collections']} collections, "
              f"{gc['ms'] * 1e3 / run['tokens']:.2f} µs/token", flush=True)


def _median(runs: list[dict[str, Any]], key: str) -> float | None:
    values = [r[key] for r in runs if r.get(key) is not None]
    return statistics.median(values) if values else None


MEDIANS = ("tok_s", "core_us_per_token", "engine_us_per_step", "engine_us_per_token", "schedule_us_per_step",
           "update_us_per_step", "sends_us_per_step", "steps_named_fraction", "exporter_us_per_sampled_token",
           "json_bytes_per_sampled_token", "proto_bytes_per_sampled_token", "spans_per_sampled_token",
           "engine_wall_us_per_step", "kept_fraction")


def _summary(runs: list[dict[str, Any]], sides: list[str], concurrencies: list[int]) -> list[dict[str, Any]]:
    out = []
    for concurrency in concurrencies:
        off = [r for r in runs if r["side"] == "off" and r["concurrency"] == concurrency]
        off_rate, off_cpu = _median(off, "tok_s"), _median(off, "core_us_per_token")
        for side in sides:
            mine = [r for r in runs if r["side"] == side and r["concurrency"] == concurrency]
            row: dict[str, Any] = {"side": side, "concurrency": concurrency, "servers": len(mine)}
            row.update({key: _median(mine, key) for key in MEDIANS})
            row["tok_s_ratio"] = row["tok_s"] / off_rate if off_rate and row["tok_s"] is not None else None
            row["core_us_per_token_added"] = (row["core_us_per_token"] - off_cpu
                                              if off_cpu is not None and row["core_us_per_token"] is not None else None)
            if side != "off":
                row["sampled_tokens"] = sum(r["otlp"]["sampled_tokens"] for r in mine)
            out.append(row)
    return out


def _cell(value: float | None, spec: str, width: int) -> str:
    sign, spec = ("+", spec[1:]) if spec.startswith("+") else ("", spec)
    return "-".rjust(width) if value is None else format(value, f"{sign}{width}{spec}")


# (heading, key, format, width); group headings over the columns they end at
COLUMNS = (("c", "concurrency", "d", 3), ("side", "side", "s", 5), ("tok/s", "tok_s", ".0f", 6),
           ("ratio", "tok_s_ratio", ".3f", 5), ("µs/tok", "core_us_per_token", ".1f", 6),
           ("added", "core_us_per_token_added", "+.1f", 6), ("µs/stp", "engine_us_per_step", ".2f", 6),
           ("µs/tok", "engine_us_per_token", ".3f", 6), ("µs/stok", "exporter_us_per_sampled_token", ".1f", 8),
           ("JSON", "json_bytes_per_sampled_token", ".0f", 6), ("proto", "proto_bytes_per_sampled_token", ".0f", 5),
           ("/stok", "spans_per_sampled_token", ".2f", 5))
GROUPS = (("engine core", 5), ("engine thread", 7), ("exporter", 8), ("OTLP B/stok", 10), ("spans", 11))
PARTS = (("c", "concurrency", "d", 3), ("side", "side", "s", 5), ("sched", "schedule_us_per_step", ".2f", 6),
         ("update", "update_us_per_step", ".2f", 6), ("sends", "sends_us_per_step", ".2f", 6),
         ("named", "steps_named_fraction", ".3f", 6), ("wall", "engine_wall_us_per_step", ".2f", 6),
         ("kept", "kept_fraction", ".3f", 5))


def _table(rows: list[dict[str, Any]], columns: tuple[Any, ...], groups: tuple[Any, ...] = ()) -> str:
    ends, at = [], -1
    for _, _, _, width in columns:
        at += width + 1
        ends.append(at)
    top = [" "] * (ends[-1] + 1)
    for label, last in groups:  # right-aligned over the column it ends at
        top[ends[last] + 1 - len(label):ends[last] + 1] = label
    lines = ["".join(top)] if groups else []
    lines.append(" ".join(name.rjust(width) for name, _, _, width in columns))
    for row in rows:
        lines.append(" ".join(str(row[key]).rjust(width) if spec in ("s", "d") else _cell(row[key], spec, width)
                              for _, key, spec, width in columns))
    return "\n".join(line.rstrip() for line in lines)


def _goals(summary: list[dict[str, Any]]) -> list[dict[str, Any]]:
    found = []
    for side, concurrencies, most in GOALS:
        for row in summary:
            if row["side"] == side and (concurrencies is None or row["concurrency"] in concurrencies):
                value = row["engine_us_per_step"]
                found.append({"sampling": row["side"], "concurrency": row["concurrency"], "most_us_per_step": most,
                              "us_per_step": value, "met": value is not None and value <= most})
    return found


def _revision(checkout: Path = parts.REPO) -> str:
    """The checkout's commit, and whether instrument/ differs from it (the plugin measured)."""
    def git(*argv: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(["git", "-C", str(checkout), *argv], capture_output=True, text=True)

    try:
        head = git("rev-parse", "--short", "HEAD").stdout.strip() or "unknown"
        return head + (" (instrument/ modified)" if git("diff", "--quiet", "HEAD", "--", "instrument").returncode
                       else "")
    except OSError:
        return "unknown"


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0],
        epilog="example: .venv/bin/python benchmarks/vllm_tracing_cost.py --model tiny --max-tokens 64")
    parser.add_argument("--rounds", type=int, default=1, help="blocks of every side, forth and back")
    parser.add_argument("--concurrency", type=int, nargs="+", default=[8, 32, 64])
    parser.add_argument("--sampling", type=_ratio, nargs="+", default=["1.0", "0.1", "0.01"],
                        help="traced sides: the request and engine_step sampling ratio of each")
    parser.add_argument("--keep", action="store_true",
                        help="a side 'keep' besides: a keep policy, slowest 1 %% + 1 %% random (every request "
                             "recorded whole, its detail decided in the exporter process)")
    parser.add_argument("--max-tokens", type=int, default=64)
    parser.add_argument("--requests-per-stream", type=int, default=2)
    parser.add_argument("--vllm-python", metavar="PATH",
                        help="the Python that runs vLLM (default: this one if it has vLLM, else .venv-vllm)")
    parser.add_argument("--json", type=Path, metavar="FILE", help="write every load's figures and the medians")
    parser.add_argument("--gc", action="store_true",
                        help="every side with VLLM_GC_DEBUG=1: the engine core's garbage collections per load")
    parser.add_argument("--baseline", type=Path, metavar="DIR",
                        help="another tokentrace checkout (a git worktree) measured beside this one: sides Rb")
    parser.add_argument("--model", choices=["smollm2", "tiny"], default="smollm2",
                        help="smollm2 (default) or tiny: tokentrace's 0.1 MB random Llama, a model step "
                             "that leaves the CPU caches to vLLM, as on a GPU host")
    args = parser.parse_args()
    python = parts.vllm_python(args.vllm_python)
    from instrument.hf.smollm2 import smollm2_cache_dir

    model = smollm2_cache_dir()
    if args.model == "smollm2" and not (model / "config.json").exists():
        raise SystemExit(f"vllm_tracing_cost: no SmolLM2 folder at {model} (./scripts/test-vllm converts it)")
    if args.baseline is not None and not (args.baseline / "instrument" / "vllm").is_dir():
        raise SystemExit(f"vllm_tracing_cost: --baseline {args.baseline} is not a tokentrace checkout")
    ratios = list(dict.fromkeys(args.sampling))
    sides = ["off", *(side for r in ratios + ([KEEP] if args.keep else [])
                      for side in ((r, r + "b") if args.baseline else (r,)))]
    order = (sides + sides[::-1]) * args.rounds
    runs: list[dict[str, Any]] = []
    failures: list[dict[str, Any]] = []
    began, revision = time.monotonic(), _revision()
    with tempfile.TemporaryDirectory(prefix="vllm-cost-") as tmp:
        if args.model == "tiny":
            model = parts.tiny_model(python, Path(tmp) / "tiny-llama")
        if args.baseline is not None:
            revision += f"; baseline (sides Rb) {_revision(args.baseline)}"
        print(f"model: {args.model} ({model.name}); tokentrace {revision}\nvLLM's Python: {python}\n"
              f"order: {' '.join(order)}", flush=True)
        for index, side in enumerate(order):
            runs += _measure(args, python, model, Path(tmp), index, side, len(order), failures)
    if not runs:
        raise SystemExit("vllm_tracing_cost: every server failed (their logs: above)")
    summary = _summary(runs, sides, args.concurrency)
    loads = [r["load_average"][0] for r in runs]
    print(f"\nmedians over {2 * args.rounds} server(s) per side; {time.monotonic() - began:.0f} s; load average "
          f"(1 min) {min(loads):.2f}-{max(loads):.2f}\nµs: CPU µs; stok: a sampled generated token (output tokens "
          f"of the\nengine_request spans written); engine thread: the plugin's hooks (self-timed)\n")
    print(_table(summary, COLUMNS, GROUPS))
    for failure in failures:
        print(f"server {failure['server']} ({failure['side']}) failed: its loads left out of the medians")
    print("\nengine thread µs per step: schedule hook, update hook, sends (CPU); named:\nsteps the spans name / "
          "scheduler steps (at least the fraction recorded);\nwall: the hooks' wall time per step; kept: "
          "requests kept whole / requests\n")
    print(_table([row for row in summary if row["side"] != "off"], PARTS))
    goals = _goals(summary)
    print("\ngoals (engine thread µs per scheduler step, median):")
    for goal in goals:
        value = "-" if goal["us_per_step"] is None else f"{goal['us_per_step']:.2f}"
        print(f"  sampling {goal['sampling']}, c={goal['concurrency']}: {value} µs ≤ {goal['most_us_per_step']:g}: "
              f"{'met' if goal['met'] else 'NOT met'}")
    if not goals:
        print("  (no side at sampling 1.0 or 0.01, nor keep, measured)")
    if args.gc:
        for concurrency in args.concurrency:
            per = {side: [r["gc"]["ms"] * 1e3 / r["tokens"] for r in runs
                          if r["side"] == side and r["concurrency"] == concurrency] for side in sides}
            print(f"c={concurrency}: engine-core GC µs/token "
                  + ", ".join(f"{s} {statistics.median(v):.2f}" for s, v in per.items() if v))
    if args.json:
        options = {k: str(v) if isinstance(v, Path) else v for k, v in vars(args).items()}
        args.json.write_text(json.dumps({"args": options, "vllm_python": python, "revision": revision, "order": order,
                                         "wall_s": time.monotonic() - began, "runs": runs, "summary": summary,
                                         "goals": goals, "failures": failures}, indent=1))
        print(f"\nfull results: {args.json}")


if __name__ == "__main__":
    main()
