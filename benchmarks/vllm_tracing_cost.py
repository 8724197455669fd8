"""What tokentrace's vLLM plugin costs vLLM itself: the same load with the plugin on and off.

One vLLM server per round (``.venv-vllm``, SmolLM2-135M, 127.0.0.1), rounds in ABBA order
(off, on, on, off, ... ``--rounds`` times), so a drift of the shared machine hits both sides
alike. Per round and concurrency: ``--requests-per-stream`` × concurrency streaming chats
with ``ignore_eos`` and ``--max-tokens`` output tokens, after a warm-up. Reported per
concurrency:

- output tokens/s (generated tokens / wall time of the load), median over the rounds of
  each side, and the ratio on / off (goal ≥ 0.98);
- engine-core process CPU time per generated token, µs, all its threads (the sum of
  ``/proc/<pid>/task/*/schedstat``: ns on a CPU, finer than ``/proc/<pid>/stat``'s 10 ms
  ticks), from the load's start to 0.5 s after its end (the plugin's last send, on idle,
  included), median per side, and on − off (goal ≤ 2 µs): the plugin's scheduler hooks
  and its record packing and sending run there; no span is built there;
- the span exporter process (the plugin's child, where spans are built and exported to an
  OTLP/JSON lines file in a temporary folder): its CPU per generated token, µs, counted
  until it stops using CPU (separately: it is not in vLLM's processes, but it shares the
  machine's cores);
- the plugin's own CPU per generated token, µs, as it measures itself
  (``TOKENTRACE_VLLM_STATS``: the engine thread's CPU clock around its step wrappers and
  its sends (packing, the socket, freeing what the rows held), net of the clock read's own
  cost; writing the stats file excluded), and per round its parts per scheduler step: the
  schedule wrapper, the update wrapper, the sends, and of the sends: ``marshal`` packing the
  rows, the socket (with counting the spans they stand for), freeing what the rows held
  (vLLM's per-step lists, their last reference). These are exact where the process
  figures above are not
  (the engine core's CPU time on a shared 2-core machine varies by several times between
  rounds).

The load average (1 min) is printed per round: on a shared machine read the figures next to it.
vLLM's own tracing is off on both sides.

``--model tiny`` serves instead tokentrace's tiny random Llama (instrument/hf/tiny_model.py, built
with 2 query heads of 32 for vLLM's CPU attention; ~0.1 MB of weights) under the same name: a
model step that no longer streams 270 MB of weights through the CPU's caches, as on a host
whose model runs on a GPU, where the engine thread's caches hold vLLM's own code and objects.
What the plugin's per-step work costs depends on that (docs/spans.md "vLLM", cost).

``--gc`` starts both sides with vLLM's GC debugger (``VLLM_GC_DEBUG=1``) and sums, per round,
the engine core's garbage collections during the load: the rows the plugin holds keep
vLLM's per-step lists alive past the young generation, where the collector walks them
(the debugger's own cost, ``gc.get_objects`` per collection, is in its times).

Run:  .venv/bin/python benchmarks/vllm_tracing_cost.py [--rounds 1] [--concurrency 8 32]
      [--max-tokens 16] [--requests-per-stream 2] [--model smollm2|tiny] [--gc]
"""

from __future__ import annotations

import argparse
import json
import os
import re
import signal
import statistics
import subprocess
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx

REPO = Path(__file__).resolve().parents[1]
_GC_LINE = re.compile(r"GC took ([0-9.]+)ms to complete\. Collected \S+ objects \(out of \d+\) in GC generation (\d)")
VLLM_PYTHON = REPO / ".venv-vllm" / "bin" / "python"
PORT = 18767


def _descendants(pid: int) -> list[int]:
    children: dict[int, list[int]] = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                ppid = int((entry / "stat").read_text().rsplit(")", 1)[1].split()[1])
            except (OSError, IndexError, ValueError):
                continue
            children.setdefault(ppid, []).append(int(entry.name))
    found, todo = [], [pid]
    while todo:
        for child in children.get(todo.pop(), []):
            found.append(child)
            todo.append(child)
    return found


def _engine_core_pid(server_pid: int) -> int:
    for pid in _descendants(server_pid):
        try:
            if b"EngineCore" in Path(f"/proc/{pid}/cmdline").read_bytes() or \
                    "EngineCore" in Path(f"/proc/{pid}/comm").read_text():
                return pid
        except OSError:
            continue
    raise RuntimeError("no EngineCore process below the vLLM server")


def _cpu_s(pid: int) -> float:
    """CPU seconds of every live thread of ``pid`` (schedstat: ns on a CPU)."""
    total = 0
    for task in Path(f"/proc/{pid}/task").iterdir():
        try:
            total += int((task / "schedstat").read_text().split()[0])
        except (OSError, IndexError, ValueError):  # the thread ended meanwhile
            continue
    return total / 1e9


def _settled_cpu_s(pid: int, wait_s: float = 20.0) -> float:
    """``pid``'s CPU seconds once it stops using CPU (two reads 0.5 s apart within 1 ms)."""
    deadline = time.monotonic() + wait_s
    last = _cpu_s(pid)
    while time.monotonic() < deadline:
        time.sleep(0.5)
        now = _cpu_s(pid)
        if now - last < 1e-3:
            return now
        last = now
    return last


def _tiny_model(folder: Path) -> Path:
    """tokentrace's tiny Llama built into ``folder`` by vLLM's Python (its transformers reads it)."""
    code = ("import sys; from instrument.hf.tiny_model import build_tiny_model; "
            "build_tiny_model(sys.argv[1], q_heads=2, kv_heads=1)")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")]))}
    subprocess.run([str(VLLM_PYTHON), "-c", code, str(folder)], check=True, env=env, capture_output=True)
    return folder


def _load_average() -> float:
    return os.getloadavg()[0]


def _gc_ms(log: Path, offset: int) -> tuple[int, float, dict[int, float]]:
    """vLLM's GC debugger lines (VLLM_GC_DEBUG=1) written to ``log`` after byte ``offset``:
    (collections, ms in all, ms per generation)."""
    with log.open("rb") as lines:
        lines.seek(offset)
        found = _GC_LINE.findall(lines.read().decode("utf-8", "replace"))
    per: dict[int, float] = {}
    for ms, generation in found:
        per[int(generation)] = per.get(int(generation), 0.0) + float(ms)
    return len(found), sum(per.values()), per


def _start(model: Path, plugin: bool, spans: Path, log: Path, gc_debug: bool = False) -> subprocess.Popen[bytes]:
    env = {**os.environ, "VLLM_CPU_KVCACHE_SPACE": "2", "HF_HUB_OFFLINE": "1"}
    if gc_debug:
        env["VLLM_GC_DEBUG"] = "1"
    env.pop("TOKENTRACE_VLLM_TRACING", None)
    if plugin:
        env.update({"TOKENTRACE_VLLM_TRACING": "1", "TOKENTRACE_OTLP_JSON": str(spans),
                    "TOKENTRACE_VLLM_STATS": str(spans.with_suffix(".stats.json"))})
    server = subprocess.Popen(
        [str(VLLM_PYTHON), "-m", "vllm.entrypoints.openai.api_server", "--model", str(model),
         "--served-model-name", "smollm2", "--host", "127.0.0.1", "--port", str(PORT), "--max-model-len", "2048",
         "--dtype", "bfloat16", "--enforce-eager"],
        stdout=log.open("w"), stderr=subprocess.STDOUT, env=env, start_new_session=True)
    deadline = time.monotonic() + 420
    try:
        while time.monotonic() < deadline:
            if server.poll() is not None:
                raise RuntimeError(f"vLLM exited ({server.returncode}); see {log}")
            try:
                if httpx.get(f"http://127.0.0.1:{PORT}/health", timeout=2).status_code == 200:
                    return server
            except httpx.HTTPError:
                pass
            time.sleep(2)
        raise RuntimeError("vLLM not ready after 420 s")
    except BaseException:  # Ctrl-C included: no server left behind
        _stop(server)
        raise


def _stop(server: subprocess.Popen[bytes]) -> None:
    if server.poll() is None:
        os.killpg(server.pid, signal.SIGTERM)
        try:
            server.wait(60)
        except subprocess.TimeoutExpired:
            os.killpg(server.pid, signal.SIGKILL)
            server.wait(10)


def _one(client: httpx.Client, i: int, max_tokens: int) -> int:
    body = {"model": "smollm2", "messages": [{"role": "user", "content": f"Tell a story number {i}."}],
            "max_tokens": max_tokens, "ignore_eos": True, "stream": True, "stream_options": {"include_usage": True}}
    tokens = 0
    with client.stream("POST", f"http://127.0.0.1:{PORT}/v1/chat/completions", json=body) as resp:
        resp.raise_for_status()
        for line in resp.iter_lines():
            if line.startswith("data: {"):
                usage = json.loads(line[6:]).get("usage")
                tokens = usage["completion_tokens"] if usage else tokens
    return tokens


def _load(concurrency: int, requests: int, max_tokens: int) -> tuple[int, float]:
    """(generated tokens, wall seconds) of ``requests`` streams, ``concurrency`` at a time."""
    limits = httpx.Limits(max_connections=concurrency)
    with httpx.Client(timeout=600, limits=limits) as client, ThreadPoolExecutor(concurrency) as pool:
        start = time.perf_counter()
        tokens = sum(pool.map(lambda i: _one(client, i, max_tokens), range(requests)))
        return tokens, time.perf_counter() - start


def _plugin_stats(spans: Path, tokens_before: int, wait_s: float = 10.0) -> dict[str, int]:
    """The plugin's stats file once it counts more than ``tokens_before`` tokens (written when
    the engine goes idle)."""
    path = spans.with_suffix(".stats.json")
    deadline = time.monotonic() + wait_s
    while time.monotonic() < deadline:
        if path.exists():
            stats = json.loads(path.read_text())
            if stats["tokens"] > tokens_before:
                return stats
        time.sleep(0.2)
    raise SystemExit(f"vllm_tracing_cost: no plugin stats in {path}")


def _exporter_pid(spans: Path, wait_s: float = 30.0) -> int:
    """The pid of the exporter process writing ``spans`` (detached from the engine core, so
    found by its command line, which names the file)."""
    deadline = time.monotonic() + wait_s
    while time.monotonic() < deadline:
        for cmdline in Path("/proc").glob("[0-9]*/cmdline"):
            try:
                text = cmdline.read_bytes().decode(errors="replace")
                state = (cmdline.parent / "stat").read_text().rsplit(")", 1)[1].split()[0]
            except OSError:
                continue
            if "instrument.records.exporter_process" in text and str(spans) in text and state != "Z":
                time.sleep(1.0)  # (the process the engine core starts forks and exits: not that one)
                if (cmdline.parent / "task").exists():
                    return int(cmdline.parent.name)
        time.sleep(0.2)
    raise SystemExit(f"vllm_tracing_cost: no exporter process writing {spans}")


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0],
        epilog="example: .venv/bin/python benchmarks/vllm_tracing_cost.py --rounds 1 --concurrency 8 --max-tokens 64")
    parser.add_argument("--rounds", type=int, default=1, help="ABBA blocks (each: off, on, on, off)")
    parser.add_argument("--concurrency", type=int, nargs="+", default=[8, 32])
    parser.add_argument("--max-tokens", type=int, default=16)
    parser.add_argument("--requests-per-stream", type=int, default=2)
    parser.add_argument("--gc", action="store_true",
                        help="both sides with VLLM_GC_DEBUG=1: the engine core's garbage collections per round")
    parser.add_argument("--model", choices=["smollm2", "tiny"], default="smollm2",
                        help="smollm2 (default) or tiny: tokentrace's 0.1 MB random Llama, a model step "
                             "that leaves the CPU caches to vLLM, as on a GPU host")
    args = parser.parse_args()
    if not VLLM_PYTHON.exists():
        raise SystemExit("vllm_tracing_cost: .venv-vllm absent (scripts/test-vllm BUILD_ONLY=1 builds it)")
    from instrument.hf.smollm2 import smollm2_cache_dir

    model = smollm2_cache_dir()
    if args.model == "smollm2" and not (model / "config.json").exists():
        raise SystemExit(f"vllm_tracing_cost: no SmolLM2 folder at {model} (./scripts/test-vllm converts it)")
    order = [False, True, True, False] * args.rounds
    results: dict[tuple[bool, int], list[tuple[float, float]]] = {}
    own: dict[int, list[tuple[float, float]]] = {}  # concurrency -> (hooks, exporter process) µs per token
    loads: list[float] = []
    gc_us: dict[tuple[bool, int], list[float]] = {}  # (plugin, concurrency) -> GC µs per token (--gc)
    with tempfile.TemporaryDirectory(prefix="vllm-cost-") as tmp:
        if args.model == "tiny":
            model = _tiny_model(Path(tmp) / "tiny-llama")
        print(f"model: {args.model} ({model.name})", flush=True)
        for index, plugin in enumerate(order):
            spans = Path(tmp) / f"spans-{index}.jsonl"
            log = Path(tmp) / f"server-{index}.log"
            server = _start(model, plugin, spans, log, args.gc)
            try:
                core = _engine_core_pid(server.pid)
                _load(4, 4, args.max_tokens)  # warm-up
                last = _plugin_stats(spans, 0) if plugin else {}
                child = _exporter_pid(spans) if plugin else 0
                for concurrency in args.concurrency:
                    child_before = _settled_cpu_s(child) if plugin else 0.0
                    before = _cpu_s(core)
                    log_at = log.stat().st_size
                    tokens, wall = _load(concurrency, concurrency * args.requests_per_stream, args.max_tokens)
                    time.sleep(0.5)  # the engine's idle send
                    cpu = _cpu_s(core) - before
                    load = _load_average()
                    loads.append(load)
                    results.setdefault((plugin, concurrency), []).append((tokens / wall, cpu / tokens * 1e6))
                    extra = detail = ""
                    if plugin:
                        now = _plugin_stats(spans, last["tokens"])
                        seen = now["tokens"] - last["tokens"]
                        child_cpu = _settled_cpu_s(child) - child_before
                        own.setdefault(concurrency, []).append(
                            ((now["hook_cpu_ns"] - last["hook_cpu_ns"]) / seen / 1e3, child_cpu / tokens * 1e6))
                        steps = max(now["steps"] - last["steps"], 1)
                        parts = {k: (now[f"{k}_cpu_ns"] - last[f"{k}_cpu_ns"]) / steps / 1e3
                                 for k in ("hook", "schedule", "send", "pack", "socket", "free")}
                        extra = f" hooks {own[concurrency][-1][0]:.2f} exp {own[concurrency][-1][1]:.1f}"
                        detail = (f"\n    per step: schedule hook {parts['schedule']:.1f} µs, update hook "
                                  f"{parts['hook'] - parts['schedule'] - parts['send']:.1f} µs, sends "
                                  f"{parts['send']:.1f} µs\n    ({seen / steps:.1f} tokens and "
                                  f"{(now['sends'] - last['sends']) / steps:.2f} sends per step)\n    of the "
                                  f"sends: marshal {parts['pack']:.1f}, socket {parts['socket']:.1f}, freeing "
                                  f"the rows {parts['free']:.1f} µs per step")
                        if now["dropped_spans"] or now["dropped_steps"]:
                            print(f"  dropped: {now['dropped_spans']} spans, {now['dropped_steps']} steps")
                        last = now
                    if args.gc:
                        count, ms, per = _gc_ms(log, log_at)
                        gc_us.setdefault((plugin, concurrency), []).append(ms * 1e3 / tokens)
                        detail += (f"\n    GC (vLLM's debugger): {count} collections, {ms * 1e3 / tokens:.2f} µs per "
                                   f"token ({', '.join(f'gen {g} {t:.1f} ms' for g, t in sorted(per.items()))})")
                    print(f"r{index + 1}/{len(order)} {'on ' if plugin else 'off'} c={concurrency}: "
                          f"{tokens / wall:6.1f} tok/s; µs/token core {cpu / tokens * 1e6:.1f}{extra}; "
                          f"load {load:.2f}{detail}", flush=True)
            finally:
                _stop(server)
            if plugin and not spans.exists():
                raise SystemExit("vllm_tracing_cost: the plugin wrote no spans (is it installed in .venv-vllm?)")
    print(f"\nmedians; µs per generated token; load average (1 min) {min(loads):.2f}-{max(loads):.2f}")
    print(f"{'c':>3}  {'off tok/s':>9}  {'on tok/s':>9}  {'ratio':>5}  {'core off':>8}  {'core on':>8}  "
          f"{'added':>6}  {'hooks':>5}  {'exporter':>8}")
    for concurrency in args.concurrency:
        off, on = results[(False, concurrency)], results[(True, concurrency)]
        off_rate, on_rate = statistics.median(r for r, _ in off), statistics.median(r for r, _ in on)
        off_cpu, on_cpu = statistics.median(c for _, c in off), statistics.median(c for _, c in on)
        hooks = statistics.median(h for h, _ in own[concurrency])
        child = statistics.median(c for _, c in own[concurrency])
        print(f"{concurrency:>3}  {off_rate:9.1f}  {on_rate:9.1f}  {on_rate / off_rate:5.3f}  {off_cpu:8.1f}  "
              f"{on_cpu:8.1f}  {on_cpu - off_cpu:6.1f}  {hooks:5.2f}  {child:8.1f}")
    for concurrency in args.concurrency if args.gc else []:
        off_gc = statistics.median(gc_us[(False, concurrency)])
        on_gc = statistics.median(gc_us[(True, concurrency)])
        print(f"c={concurrency}: GC in the engine core {off_gc:.2f} µs per token off, {on_gc:.2f} on\n"
              f"      (medians; vLLM's GC debugger, its own cost included)")


if __name__ == "__main__":
    main()
