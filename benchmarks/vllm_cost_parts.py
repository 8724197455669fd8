"""benchmarks/vllm_tracing_cost.py's parts: the vLLM server, its load, its processes' CPU
time, the plugin's stats file and what the exporter wrote (OTLP/JSON lines, re-encoded as
the OTLP protobuf ``ExportTraceServiceRequest`` an OTLP exporter sends)."""

from __future__ import annotations

import importlib.util
import json
import os
import re
import signal
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import httpx

REPO = Path(__file__).resolve().parents[1]
PORT = 18767
_GC_LINE = re.compile(r"GC took ([0-9.]+)ms to complete\. Collected \S+ objects \(out of \d+\) in GC generation (\d)")


def _has_vllm(python: str) -> bool:
    if python == sys.executable:
        return importlib.util.find_spec("vllm") is not None
    code = "import importlib.util, sys; sys.exit(importlib.util.find_spec('vllm') is None)"
    try:
        return subprocess.run([python, "-c", code], capture_output=True, timeout=60).returncode == 0
    except OSError:
        return False


def vllm_python(option: str | None) -> str:
    """The Python that runs vLLM: ``option``, else this one if it has vLLM, else the repo's
    ``.venv-vllm``; exits with one line when none has vLLM."""
    candidates = [option] if option else [sys.executable, str(REPO / ".venv-vllm" / "bin" / "python")]
    for python in candidates:
        if _has_vllm(python):
            return python
    raise SystemExit(f"vllm_tracing_cost: no vLLM in {' nor in '.join(candidates)} (pass --vllm-python PATH; "
                     "scripts/test-vllm BUILD_ONLY=1 builds .venv-vllm)")


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


def engine_core_pid(server_pid: int) -> int:
    for pid in _descendants(server_pid):
        try:
            if b"EngineCore" in Path(f"/proc/{pid}/cmdline").read_bytes() or \
                    "EngineCore" in Path(f"/proc/{pid}/comm").read_text():
                return pid
        except OSError:
            continue
    raise RuntimeError("no EngineCore process below the vLLM server")


def cpu_s(pid: int) -> float:
    """CPU seconds of every live thread of ``pid`` (schedstat: ns on a CPU)."""
    total = 0
    for task in Path(f"/proc/{pid}/task").iterdir():
        try:
            total += int((task / "schedstat").read_text().split()[0])
        except (OSError, IndexError, ValueError):  # the thread ended meanwhile
            continue
    return total / 1e9


def settled_cpu_s(pid: int, wait_s: float = 20.0) -> float:
    """``pid``'s CPU seconds once it stops using CPU (two reads 0.5 s apart within 1 ms)."""
    deadline = time.monotonic() + wait_s
    last = cpu_s(pid)
    while time.monotonic() < deadline:
        time.sleep(0.5)
        now = cpu_s(pid)
        if now - last < 1e-3:
            return now
        last = now
    return last


def tiny_model(python: str, folder: Path) -> Path:
    """tokentrace's tiny Llama built into ``folder`` by vLLM's Python (its transformers reads it)."""
    code = ("import sys; from instrument.hf.tiny_model import build_tiny_model; "
            "build_tiny_model(sys.argv[1], q_heads=2, kv_heads=1)")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")]))}
    subprocess.run([python, "-c", code, str(folder)], check=True, env=env, capture_output=True)
    return folder


def gc_ms(log: Path, offset: int) -> tuple[int, float, dict[int, float]]:
    """vLLM's GC debugger lines (VLLM_GC_DEBUG=1) written to ``log`` after byte ``offset``:
    (collections, ms in all, ms per generation)."""
    with log.open("rb") as lines:
        lines.seek(offset)
        found = _GC_LINE.findall(lines.read().decode("utf-8", "replace"))
    per: dict[int, float] = {}
    for ms, generation in found:
        per[int(generation)] = per.get(int(generation), 0.0) + float(ms)
    return len(found), sum(per.values()), per


def start(python: str, model: Path, traced: dict[str, str] | None, log: Path,
          gc_debug: bool) -> subprocess.Popen[bytes]:
    """A vLLM server on PORT, ready; ``traced``: the plugin's variables (None: plugin off)."""
    env = {**os.environ, "VLLM_CPU_KVCACHE_SPACE": "2", "HF_HUB_OFFLINE": "1"}
    if gc_debug:
        env["VLLM_GC_DEBUG"] = "1"
    for name in ("TOKENTRACE_VLLM_TRACING", "OTEL_TRACES_EXPORTER", "OTEL_TRACES_SAMPLER", "OTEL_TRACES_SAMPLER_ARG",
                 "TOKENTRACE_VLLM_STEP_SAMPLE_RATIO"):
        env.pop(name, None)
    env.update(traced or {})
    server = subprocess.Popen(
        [python, "-m", "vllm.entrypoints.openai.api_server", "--model", str(model),
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
        stop(server)
        raise


def stop(server: subprocess.Popen[bytes]) -> None:
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
            # only the last chunk's usage is read: a random model's text may hold characters
            # iter_lines splits a line at (U+2028, U+0085), leaving pieces that are not JSON
            if line.startswith("data: {") and '"usage":{' in line.replace(" ", ""):
                usage = json.loads(line[6:]).get("usage")
                tokens = usage["completion_tokens"] if usage else tokens
    return tokens


def load(concurrency: int, requests: int, max_tokens: int) -> tuple[int, float]:
    """(generated tokens, wall seconds) of ``requests`` streams, ``concurrency`` at a time."""
    limits = httpx.Limits(max_connections=concurrency)
    with httpx.Client(timeout=600, limits=limits) as client, ThreadPoolExecutor(concurrency) as pool:
        began = time.perf_counter()
        tokens = sum(pool.map(lambda i: _one(client, i, max_tokens), range(requests)))
        return tokens, time.perf_counter() - began


def plugin_stats(path: Path, tokens_before: int, wait_s: float = 30.0) -> dict[str, Any]:
    """The plugin's stats file once it counts more than ``tokens_before`` tokens (written when
    the engine goes idle)."""
    deadline = time.monotonic() + wait_s
    while time.monotonic() < deadline:
        if path.exists():
            stats = json.loads(path.read_text())
            if stats["tokens"] > tokens_before:
                return stats
        time.sleep(0.2)
    raise RuntimeError(f"no plugin stats counting more than {tokens_before} tokens in {path.name} after {wait_s:g} s")


def _state(pid: int) -> str | None:
    """``pid``'s state letter (None: no such process)."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return None


def exporter_pid(stats_path: Path, spans: Path, wait_s: float = 30.0) -> int:
    """The pid of the exporter process writing ``spans``: the one the plugin's stats name,
    else found by its command line, which names the file (it is detached from the engine
    core: the process the engine core starts forks and exits)."""
    deadline, named = time.monotonic() + wait_s, None
    while time.monotonic() < deadline:
        try:
            named = json.loads(stats_path.read_text()).get("exporter_pid")
        except (OSError, ValueError):
            pass
        if named and _state(named) not in (None, "Z"):
            return named
        for cmdline in Path("/proc").glob("[0-9]*/cmdline"):
            try:
                text = cmdline.read_bytes().decode(errors="replace")
            except OSError:
                continue
            if "instrument.records.exporter_child" in text and str(spans) in text:
                pid = int(cmdline.parent.name)
                time.sleep(1.0)  # (the process started exits at once, then is a zombie until reaped)
                if _state(pid) not in (None, "Z"):
                    return pid
        time.sleep(0.2)
    raise RuntimeError(f"no exporter process writing {spans.name} (the plugin's stats name pid {named}, "
                       f"state {_state(named) if named else None})")


def file_end(path: Path) -> int:
    """The byte after the last complete line of ``path`` (0: no file yet)."""
    if not path.exists():
        return 0
    data = path.read_bytes()
    return data.rfind(b"\n") + 1


def otlp_figures(path: Path, begin: int, end: int) -> dict[str, Any]:
    """What the OTLP/JSON lines of ``path`` between bytes ``begin`` and ``end`` hold: their
    bytes (``json_bytes``), the same ExportTraceServiceRequests' protobuf size
    (``proto_bytes``, one request per line, as the exporter's slices), ``spans``,
    ``sampled_tokens`` (``gen_ai.usage.output_tokens`` summed over engine_request spans),
    ``sampled_requests``, ``kept_requests`` (those kept whole: under a keep policy, every
    request has an engine_request span, its summary), ``engine_step_spans`` and
    ``steps_named`` (distinct ``tokentrace.engine.step`` values: steps the spans show were
    recorded)."""
    from google.protobuf import json_format
    from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest

    sys.path.insert(0, str(REPO))
    from instrument.otel.otlp_json import otlp_json_ids_to_base64

    out = {"json_bytes": max(end - begin, 0), "proto_bytes": 0, "spans": 0, "sampled_tokens": 0,
           "sampled_requests": 0, "engine_step_spans": 0, "steps_named": 0, "kept_requests": 0}
    if end <= begin:
        return out
    with path.open("rb") as lines:
        lines.seek(begin)
        text = lines.read(end - begin).decode()
    steps: set[int] = set()
    for line in text.splitlines():
        if not line.strip():
            continue
        request = json.loads(line)
        out["proto_bytes"] += json_format.ParseDict(otlp_json_ids_to_base64(request),
                                                    ExportTraceServiceRequest()).ByteSize()
        for resource in request.get("resourceSpans", ()):
            for scope in resource.get("scopeSpans", ()):
                for span in scope.get("spans", ()):
                    out["spans"] += 1
                    attributes = {a["key"]: a.get("value", {}) for a in span.get("attributes", ())}
                    step = attributes.get("tokentrace.engine.step", {}).get("intValue")
                    if step is not None:
                        steps.add(int(step))
                    if span.get("name") == "engine_request":
                        out["sampled_requests"] += 1
                        out["sampled_tokens"] += int(attributes.get("gen_ai.usage.output_tokens", {})
                                                     .get("intValue", 0))
                        reason = attributes.get("tokentrace.sampling.reason", {}).get("stringValue", "head")
                        out["kept_requests"] += reason != "summary"
                    elif span.get("name") == "engine_step":
                        out["engine_step_spans"] += 1
    out["steps_named"] = len(steps)
    return out
