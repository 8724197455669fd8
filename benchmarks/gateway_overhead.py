"""Gateway overhead: the traced gateway vs a direct ``traced_generate`` on the same model and prompts.

The gateway runs the sequential engine here (it calls ``traced_generate`` per request, so the
two sides differ by the gateway alone); the continuous engine's gateway overhead against
transformers' manager is benchmarks/engine_throughput.py's ``gateway`` section.

Interleaved in one run (direct, gateway, gateway, direct, ... alternating per round) so drift
and neighbours' load hit both sides alike. Greedy decoding with the same max_tokens, so both
sides generate the same tokens.

- direct:  s = call start of traced_generate (messages in: template + tokenization included),
           f / e = first / last visible token handed to the streamer (perf_counter).
- gateway: s = just before the client sends the HTTP request, f / e = receipt of the first /
           last SSE chunk with non-empty content. The server runs in a subprocess
           (``tokentrace serve``, spans written to an OTLP-JSON lines file) unless --in-process.

Reported (milliseconds; medians over pairs): ttft_added_ms = median(gateway TTFT - direct
TTFT) of each interleaved pair, goal <= 5 ms; e2e_ratio = median(gateway E2E / direct E2E),
goal <= 1.02. To say where the E2E difference comes from:

- per_chunk_added_ms = median over pairs of ((gateway E2E - gateway TTFT) - (direct E2E -
  direct TTFT)) / (C - 1), C = visible chunks the client got: the gateway's cost per streamed
  chunk after the first (ms per chunk).
- e2e_ratio_floor_from_ttft = median(1 + ttft_added / direct E2E): the ratio the fixed
  per-request cost alone gives, even at zero per-chunk cost. A model whose whole answer takes
  about as long as that fixed cost can never reach 1.02 (the TTFT goal allows 5 ms).
- decode_step_ms_median_{direct,gateway}: median decode span duration on each side (the
  gateway's from its OTLP-JSON file): whether the model thread itself ran slower in the server.
- load_average_{start,end}: the machine's 1-minute load average (a shared machine is noisy).

--baseline-ref REF adds a third side to the same interleaved run: the gateway as it was at git
commit REF (its instrument/gateway/ over the current instrument/, so only the gateway differs),
served with uvicorn's --baseline-loop / --baseline-http. Its numbers are under "baseline", and
e2e_gateway_over_baseline_median = median(gateway E2E / baseline E2E) of each round: a
before/after comparison under the same load. Sides rotate through every order.

Usage::

    .venv/bin/python benchmarks/gateway_overhead.py --model tiny --rounds 20 --max-tokens 32
    .venv/bin/python benchmarks/gateway_overhead.py --model smollm2 --rounds 5 --max-tokens 32
    .venv/bin/python benchmarks/gateway_overhead.py --model tiny --baseline-ref 1149bb1 \
        --baseline-loop asyncio --baseline-http h11
"""

from __future__ import annotations

import argparse
import importlib.util
import itertools
import json
import os
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

PROMPTS = (
    "Show me wheelchair-accessible hotels in Kyoto under $200/night with onsen access.",
    "Which Kyoto temples have step-free access?",
    "How do I get from Kansai airport to Kyoto station with luggage?",
)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def direct_once(handle: Any, provider: Any, prompt: str, max_tokens: int) -> tuple[float, float]:
    """(TTFT ms, E2E ms) of one direct traced_generate call."""
    from instrument.hf.generate import traced_generate

    tokenizer = handle.tokenizer
    texts: list[int] = []
    visible_ns: list[int] = []

    class Streamer:
        seen_prompt = False

        def put(self, value: Any) -> None:
            if not self.seen_prompt:
                self.seen_prompt = True
                return
            texts.extend(int(t) for t in value.reshape(-1).tolist())
            if tokenizer.decode(texts[-1:], skip_special_tokens=True):
                visible_ns.append(time.perf_counter_ns())

        def end(self) -> None:
            pass

    start_ns = time.perf_counter_ns()
    traced_generate(handle.model, tokenizer, [{"role": "user", "content": prompt}], tracer_provider=provider,
                    streamer=Streamer(), max_new_tokens=max_tokens, do_sample=False)
    return (visible_ns[0] - start_ns) / 1e6, (visible_ns[-1] - start_ns) / 1e6


def gateway_once(http: Any, url: str, model_id: str, prompt: str, max_tokens: int) -> tuple[float, float, int]:
    """(TTFT ms, E2E ms, visible chunks) of one streaming request through the gateway, seen by the client."""
    body = {"model": model_id, "messages": [{"role": "user", "content": prompt}], "max_tokens": max_tokens,
            "temperature": 0, "stream": True}
    visible_ns: list[int] = []
    start_ns = time.perf_counter_ns()
    with http.stream("POST", url + "/v1/chat/completions", json=body) as resp:
        resp.raise_for_status()
        for line in resp.iter_lines():
            if not line.startswith("data:") or line.endswith("[DONE]"):
                continue
            choices = json.loads(line[5:]).get("choices") or [{}]
            if (choices[0].get("delta") or {}).get("content"):
                visible_ns.append(time.perf_counter_ns())
    return (visible_ns[0] - start_ns) / 1e6, (visible_ns[-1] - start_ns) / 1e6, len(visible_ns)


def _span_durations_ms(spans_path: Path, name: str) -> list[float]:
    """Durations (ms) of the spans called ``name`` in an OTLP-JSON lines file."""
    out: list[float] = []
    if not spans_path.exists():
        return out
    with spans_path.open() as fh:
        for line in fh:
            for rs in json.loads(line).get("resourceSpans", []):
                for ss in rs.get("scopeSpans", []):
                    out.extend((int(sp["endTimeUnixNano"]) - int(sp["startTimeUnixNano"])) / 1e6
                               for sp in ss.get("spans", []) if sp.get("name") == name)
    return out


def _start_subprocess_server(model: str, max_tokens: int, spans_path: Path) -> tuple[subprocess.Popen, str]:
    port = _free_port()
    cmd = [sys.executable, "-c", "from analyzer.cli import main; main()", "serve", "--model", model, "--engine", "sequential",
           "--port", str(port), "--otlp-json", str(spans_path), "--max-tokens-limit", str(max(max_tokens, 64))]
    proc = subprocess.Popen(cmd, cwd=REPO, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                            env={**os.environ, "OTEL_EXPORTER_OTLP_ENDPOINT": ""})
    return proc, f"http://127.0.0.1:{port}"


_BASELINE_SERVER = """
import sys
sys.path.insert(0, sys.argv[1])
import uvicorn
from instrument.client import local_tracer_provider
from instrument.gateway.app import GatewaySettings, create_app
from instrument.hf.model_handle import load_model_handle
model, port, spans, max_tokens, loop, http = sys.argv[2:8]
provider = local_tracer_provider("tokentrace-gateway-baseline", json_path=spans)
app = create_app(load_model_handle(model), provider, GatewaySettings(max_tokens_limit=int(max_tokens), engine="sequential"))
try:
    uvicorn.run(app, host="127.0.0.1", port=int(port), log_level="warning", loop=loop, http=http)
finally:
    provider.shutdown()
"""


def _baseline_source(ref: str, into: Path) -> Path:
    """A copy of the current ``instrument/`` with ``instrument/gateway/`` as of git ``ref``."""
    def git(*args: str) -> str:
        done = subprocess.run(["git", *args], cwd=REPO, capture_output=True, text=True)
        if done.returncode != 0:
            raise SystemExit(f"--baseline-ref {ref}: git {' '.join(args)} failed: {done.stderr.strip()}")
        return done.stdout

    shutil.copytree(REPO / "instrument", into / "instrument", ignore=shutil.ignore_patterns("__pycache__"))
    shutil.rmtree(into / "instrument" / "gateway")
    (into / "instrument" / "gateway").mkdir()
    for path in git("ls-tree", "--name-only", ref, "instrument/gateway/").split():
        (into / path).write_text(git("show", f"{ref}:{path}"))
    return into


def _start_baseline_server(source: Path, model: str, max_tokens: int, spans_path: Path, loop: str,
                           http: str) -> tuple[subprocess.Popen, str]:
    port = _free_port()
    cmd = [sys.executable, "-c", _BASELINE_SERVER, str(source), model, str(port), str(spans_path),
           str(max(max_tokens, 64)), loop, http]
    proc = subprocess.Popen(cmd, cwd=source, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                            env={**os.environ, "OTEL_EXPORTER_OTLP_ENDPOINT": ""})
    return proc, f"http://127.0.0.1:{port}"


def _wait_healthy(http: Any, url: str, timeout_s: float = 300.0) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            if http.get(url + "/health").status_code == 200:
                return
        except Exception:  # noqa: BLE001 - not listening yet, whatever the client raises
            pass
        time.sleep(0.25)
    raise RuntimeError(f"the gateway at {url} did not become healthy in {timeout_s:g} s")


def _side_summary(rows: list[dict[str, tuple[float, ...]]], side: str) -> dict[str, Any]:
    """A gateway side against the direct side of the same rounds: medians over rounds, in ms."""
    per_chunk = [((r[side][1] - r[side][0]) - (r["direct"][1] - r["direct"][0])) / (r[side][2] - 1)
                 for r in rows if r[side][2] > 1]
    return {
        "ttft_ms_median": statistics.median(r[side][0] for r in rows),
        "e2e_ms_median": statistics.median(r[side][1] for r in rows),
        "ttft_added_ms_median": statistics.median(r[side][0] - r["direct"][0] for r in rows),
        "e2e_ratio_median": statistics.median(r[side][1] / r["direct"][1] for r in rows),
        "per_chunk_added_ms_median": statistics.median(per_chunk) if per_chunk else None,
    }


def main(argv: list[str] | None = None) -> dict[str, Any]:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="tiny", help="tiny, smollm2 or a local model folder")
    parser.add_argument("--rounds", type=int, default=20, help="interleaved rounds (each: every prompt, both sides)")
    parser.add_argument("--max-tokens", type=int, default=32)
    parser.add_argument("--warmup", type=int, default=2, help="rounds discarded at the start")
    parser.add_argument("--in-process", action="store_true", help="run the gateway in a thread of this process")
    parser.add_argument("--torch-threads", type=int, default=1,
                        help="torch intra-op threads on both sides (1 is steadiest on a shared machine)")
    parser.add_argument("--baseline-ref", default=None, metavar="GIT_REF",
                        help="also run the gateway as of this commit, interleaved (a before/after comparison)")
    parser.add_argument("--baseline-loop", default="auto", choices=("auto", "asyncio", "uvloop"),
                        help="uvicorn event loop of the baseline gateway")
    parser.add_argument("--baseline-http", default="auto", choices=("auto", "h11", "httptools"),
                        help="uvicorn HTTP implementation of the baseline gateway")
    args = parser.parse_args(argv)
    os.environ["OMP_NUM_THREADS"] = str(args.torch_threads)  # for the server subprocess
    import torch

    torch.set_num_threads(args.torch_threads)

    import httpx
    from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

    from instrument.hf.model_handle import load_model_handle
    from instrument.otel.tracing import setup_tracing

    load_start = os.getloadavg()[0]
    handle = load_model_handle(args.model)
    direct_spans = InMemorySpanExporter()
    provider = setup_tracing("bench-direct", exporter="none", span_exporters=[direct_spans])
    tmp = Path(tempfile.mkdtemp(prefix="tt-overhead-"))
    proc = server = server_provider = baseline = None
    http = httpx.Client(timeout=300.0)
    urls: dict[str, str] = {}
    try:
        if args.in_process:
            from instrument.gateway.app import GatewaySettings, create_app
            from instrument.gateway.server import ServerThread

            server_provider = setup_tracing("bench-gateway", exporter="otlp_json", json_path=tmp / "server.jsonl")
            server = ServerThread(create_app(handle, server_provider, GatewaySettings(engine="sequential"))).start()
            urls["gateway"] = server.url
        else:
            proc, urls["gateway"] = _start_subprocess_server(args.model, args.max_tokens, tmp / "server.jsonl")
        if args.baseline_ref is not None:
            source = _baseline_source(args.baseline_ref, tmp / "baseline-src")
            baseline, urls["baseline"] = _start_baseline_server(source, args.model, args.max_tokens,
                                                                tmp / "baseline.jsonl", args.baseline_loop,
                                                                args.baseline_http)
        for url in urls.values():
            _wait_healthy(http, url)
        model_id = http.get(urls["gateway"] + "/v1/models").json()["data"][0]["id"]
        orders = list(itertools.permutations(["direct", *urls]))
        pairs: list[dict[str, float]] = []
        rows: list[dict[str, tuple[float, ...]]] = []
        for round_index in range(args.warmup + args.rounds):
            for prompt_index, prompt in enumerate(PROMPTS):
                order = orders[(round_index * len(PROMPTS) + prompt_index) % len(orders)]
                got: dict[str, tuple[float, ...]] = {}
                for side in order:
                    if side == "direct":
                        got[side] = direct_once(handle, provider, prompt, args.max_tokens)
                    else:
                        got[side] = gateway_once(http, urls[side], model_id, prompt, args.max_tokens)
                if round_index >= args.warmup:
                    rows.append(got)
                    pairs.append({"direct_ttft_ms": got["direct"][0], "direct_e2e_ms": got["direct"][1],
                                  "gateway_ttft_ms": got["gateway"][0], "gateway_e2e_ms": got["gateway"][1],
                                  "chunks": got["gateway"][2]})
    finally:
        http.close()
        if server is not None:
            server.stop()  # the app's shutdown closes its model worker
            server_provider.shutdown()  # flushes the server's spans to its file
        for child in (proc, baseline):
            if child is not None:
                child.terminate()  # SIGTERM: the server flushes its spans to the file as it exits
                child.wait(30)
        provider.force_flush()
        direct_decode = [(s.end_time - s.start_time) / 1e6 for s in direct_spans.get_finished_spans()
                         if s.name == "decode"]
        gateway_decode = _span_durations_ms(tmp / "server.jsonl", "decode")
        provider.shutdown()
        shutil.rmtree(tmp, ignore_errors=True)

    def med(key: str) -> float:
        return statistics.median(p[key] for p in pairs)

    ttft_added = statistics.median(p["gateway_ttft_ms"] - p["direct_ttft_ms"] for p in pairs)
    e2e_ratio = statistics.median(p["gateway_e2e_ms"] / p["direct_e2e_ms"] for p in pairs)
    per_chunk = [((p["gateway_e2e_ms"] - p["gateway_ttft_ms"]) - (p["direct_e2e_ms"] - p["direct_ttft_ms"]))
                 / (p["chunks"] - 1) for p in pairs if p["chunks"] > 1]
    floor = statistics.median(1 + (p["gateway_ttft_ms"] - p["direct_ttft_ms"]) / p["direct_e2e_ms"] for p in pairs)
    result = {
        "model": model_id, "pairs": len(pairs), "max_tokens": args.max_tokens,
        "gateway": "in-process thread" if args.in_process else "subprocess (tokentrace serve)",
        "torch_threads": args.torch_threads,
        "direct_ttft_ms_median": med("direct_ttft_ms"), "gateway_ttft_ms_median": med("gateway_ttft_ms"),
        "direct_e2e_ms_median": med("direct_e2e_ms"), "gateway_e2e_ms_median": med("gateway_e2e_ms"),
        "ttft_added_ms_median": ttft_added, "ttft_goal_ms": 5.0, "ttft_goal_met": ttft_added <= 5.0,
        "e2e_ratio_median": e2e_ratio, "e2e_ratio_goal": 1.02, "e2e_goal_met": e2e_ratio <= 1.02,
        "visible_chunks_median": statistics.median(p["chunks"] for p in pairs),
        "per_chunk_added_ms_median": statistics.median(per_chunk) if per_chunk else None,
        "e2e_ratio_floor_from_ttft": floor,
        "decode_step_ms_median_direct": statistics.median(direct_decode) if direct_decode else None,
        "decode_step_ms_median_gateway": statistics.median(gateway_decode) if gateway_decode else None,
        "server_http": "httptools" if importlib.util.find_spec("httptools") else "h11",
        "server_loop": "uvloop" if importlib.util.find_spec("uvloop") else "asyncio",
        "load_average_start": load_start, "load_average_end": os.getloadavg()[0],
    }
    if "baseline" in urls:
        result["baseline"] = {
            "ref": args.baseline_ref, "loop": args.baseline_loop, "http": args.baseline_http,
            **_side_summary(rows, "baseline"),
        }
        result["e2e_gateway_over_baseline_median"] = statistics.median(
            r["gateway"][1] / r["baseline"][1] for r in rows)
    print(json.dumps(result, indent=2))
    return result


if __name__ == "__main__":
    main()
