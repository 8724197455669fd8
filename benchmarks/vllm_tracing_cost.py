"""What tokentrace's vLLM plugin costs vLLM itself: the same load with the plugin on and off.

One vLLM server per round (``.venv-vllm``, SmolLM2-135M, 127.0.0.1), rounds in ABBA order
(off, on, on, off, ... ``--rounds`` times), so a drift of the shared machine hits both sides
alike. Per round and concurrency: ``--requests-per-stream`` × concurrency streaming chats
with ``ignore_eos`` and ``--max-tokens`` output tokens, after a warm-up. Reported per
concurrency:

- output tokens/s (generated tokens / wall time of the load), median over the rounds of
  each side, and the ratio on / off (goal ≥ 0.98);
- engine-core process CPU time (user + system, /proc/<pid>/stat) per generated token, µs,
  median per side, and on − off (goal ≤ 2 µs): the scheduler's hooks and the plugin's
  span-building thread both run in that process.

- the plugin's own CPU per generated token, µs, as it measures itself
  (``TOKENTRACE_VLLM_STATS``: per-thread CPU clocks): its scheduler hooks on vLLM's engine
  thread, and its span-building thread. These are exact where the process figures above are
  not (the engine core's CPU time on a shared 2-core machine varies by 10x between rounds).

The plugin writes its spans to an OTLP/JSON lines file in a temporary folder (encoding and
file writes included, on the SDK's export thread: in the process CPU, not in the plugin's own
figures); vLLM's own tracing is off on both sides.

Run:  .venv/bin/python benchmarks/vllm_tracing_cost.py [--rounds 1] [--concurrency 8 32]
      [--max-tokens 16] [--requests-per-stream 2]
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import statistics
import subprocess
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx

REPO = Path(__file__).resolve().parents[1]
VLLM_PYTHON = REPO / ".venv-vllm" / "bin" / "python"
PORT = 18767
CLOCK_TICKS = os.sysconf("SC_CLK_TCK")


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
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / CLOCK_TICKS  # utime + stime


def _start(model: Path, plugin: bool, spans: Path, log: Path) -> subprocess.Popen[bytes]:
    env = {**os.environ, "VLLM_CPU_KVCACHE_SPACE": "2", "HF_HUB_OFFLINE": "1"}
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
    while time.monotonic() < deadline:
        if server.poll() is not None:
            raise RuntimeError(f"vLLM exited ({server.returncode}); see {log}")
        try:
            if httpx.get(f"http://127.0.0.1:{PORT}/health", timeout=2).status_code == 200:
                return server
        except httpx.HTTPError:
            pass
        time.sleep(2)
    _stop(server)
    raise RuntimeError("vLLM not ready after 420 s")


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


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=1, help="ABBA blocks (each: off, on, on, off)")
    parser.add_argument("--concurrency", type=int, nargs="+", default=[8, 32])
    parser.add_argument("--max-tokens", type=int, default=16)
    parser.add_argument("--requests-per-stream", type=int, default=2)
    args = parser.parse_args()
    if not VLLM_PYTHON.exists():
        raise SystemExit("vllm_tracing_cost: .venv-vllm absent (scripts/test-vllm BUILD_ONLY=1 builds it)")
    from instrument.smollm2 import smollm2_cache_dir

    model = smollm2_cache_dir()
    order = [False, True, True, False] * args.rounds
    results: dict[tuple[bool, int], list[tuple[float, float]]] = {}
    own: dict[int, list[tuple[float, float]]] = {}  # concurrency -> (hook, span) µs per token
    with tempfile.TemporaryDirectory(prefix="vllm-cost-") as tmp:
        for index, plugin in enumerate(order):
            spans = Path(tmp) / f"spans-{index}.jsonl"
            server = _start(model, plugin, spans, Path(tmp) / f"server-{index}.log")
            try:
                core = _engine_core_pid(server.pid)
                _load(4, 4, args.max_tokens)  # warm-up
                last = _plugin_stats(spans, 0) if plugin else {}
                for concurrency in args.concurrency:
                    before = _cpu_s(core)
                    tokens, wall = _load(concurrency, concurrency * args.requests_per_stream, args.max_tokens)
                    cpu = _cpu_s(core) - before
                    results.setdefault((plugin, concurrency), []).append((tokens / wall, cpu / tokens * 1e6))
                    if plugin:
                        now = _plugin_stats(spans, last["tokens"])
                        seen = now["tokens"] - last["tokens"]
                        own.setdefault(concurrency, []).append(
                            ((now["hook_cpu_ns"] - last["hook_cpu_ns"]) / seen / 1e3,
                             (now["span_cpu_ns"] - last["span_cpu_ns"]) / seen / 1e3))
                        last = now
                    print(f"round {index + 1}/{len(order)} plugin {'on ' if plugin else 'off'} c={concurrency}: "
                          f"{tokens / wall:7.1f} tok/s, engine-core CPU {cpu / tokens * 1e6:7.1f} µs/token", flush=True)
            finally:
                _stop(server)
            if plugin and not spans.exists():
                raise SystemExit("vllm_tracing_cost: the plugin wrote no spans (is it installed in .venv-vllm?)")
    print(f"\n{'c':>3}  {'off tok/s':>9}  {'on tok/s':>9}  {'ratio':>6}  {'off µs/tok':>10}  {'on µs/tok':>10}  {'added µs':>8}")
    for concurrency in args.concurrency:
        off, on = results[(False, concurrency)], results[(True, concurrency)]
        off_rate, on_rate = statistics.median(r for r, _ in off), statistics.median(r for r, _ in on)
        off_cpu, on_cpu = statistics.median(c for _, c in off), statistics.median(c for _, c in on)
        print(f"{concurrency:>3}  {off_rate:9.1f}  {on_rate:9.1f}  {on_rate / off_rate:6.3f}  {off_cpu:10.1f}  "
              f"{on_cpu:10.1f}  {on_cpu - off_cpu:8.1f}")
    print(f"\nthe plugin's own CPU per generated token (median over the 'on' rounds), µs:")
    print(f"{'c':>3}  {'engine-thread hooks':>19}  {'span thread':>11}")
    for concurrency in args.concurrency:
        hooks = statistics.median(h for h, _ in own[concurrency])
        build = statistics.median(b for _, b in own[concurrency])
        print(f"{concurrency:>3}  {hooks:19.2f}  {build:11.2f}")


if __name__ == "__main__":
    main()
