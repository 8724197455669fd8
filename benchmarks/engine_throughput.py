"""Engines compared: ``tokentrace serve --engine sequential`` vs ``--engine continuous``.

Three sections, each measured side by side in one run (the machine's load hits both alike):

curve     Both engines as real servers (subprocesses, spans to OTLP-JSON files), the same
          model and prompts, closed-loop load at each concurrency (1, 4, 8, 16), engines
          interleaved per level (order alternates). Every answer runs to --max-tokens
          (``ignore_eos``), greedy. Per engine and level, from the client spans through the
          same SQL as ``tokentrace bench --format json``: output tokens/s, request
          throughput, TTFT p50/p99, TPOT p50/p99. Goals (SmolLM2, this 2-core CPU):
          continuous >= 2.5x sequential output tokens/s at concurrency 8, and TTFT p99 at
          concurrency 8 at least 3x lower.
tracing   The continuous engine in this process with its tracing on and off
          (``ContinuousEngine.tracing``), rounds interleaved: each round submits --batch
          sequences at once (each with a ``gateway`` span as its parent, as the gateway passes
          it) and waits for all, then flushes the span processor (OTLP-JSON file exporter), so
          the export thread's encoding is inside the round. Per generated token, engine
          thread vs process CPU and GIL pressure: benchmarks/tracing_cost.py. Time per engine step
          = round wall time / steps. Goal: tracing adds <= 2 % to engine step time.
startup   Where a manager's start-up time goes: transformers' defaults (the cache sized to a share
          of the machine's free memory) against tokentrace's sizing (the KV budget): the
          manager's build, its batch processor (cache tensor, static tensors, the attention
          mask), the first round of --batch sequences, a later round; with the bytes of the
          cache and of the attention mask.
gateway   The continuous engine behind the gateway (a ``tokentrace serve`` subprocess,
          traced, client-side TTFT/E2E over HTTP) vs transformers' manager called directly in
          this process (same sizing, ``add_request(streaming=True)``, TTFT/E2E from add_request
          to the first / last token handed back), one request at a time, sides alternating.
          Goals: TTFT added <= 5 ms, E2E ratio <= 1.05.

stepcost  The continuous engine's decode step against a bare forward + sampling of the same
          batch on the same model, interleaved (benchmarks/engine_step_cost.py; --batch,
          --max-tokens, --rounds). Goal: step <= 1.2x bare.

Usage (needs the ``bench`` extra's packages only through the project's own extras)::

    .venv/bin/python benchmarks/engine_throughput.py --model tiny
    .venv/bin/python benchmarks/engine_throughput.py --model smollm2 --max-tokens 48
    .venv/bin/python benchmarks/engine_throughput.py --model smollm2 --sections tracing,gateway --rounds 8

Prints one JSON object (per section: the numbers, the ratios, whether each goal holds) and
the load average at start and end.
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

PROMPTS = (
    "Show me wheelchair-accessible hotels in Kyoto under $200/night with onsen access.",
    "Which Kyoto temples have step-free access?",
    "Suggest a two-day Kyoto itinerary for a wheelchair user, with the best times to visit each place.",
    "What is an onsen, and are private onsen baths common in ryokan?",
    "How do I get from Kansai airport to Kyoto station with luggage?",
    "List three accessible restaurants near Gion.",
    "Is the Arashiyama bamboo grove accessible by wheelchair? Describe the paths and the slopes.",
    "Compare staying near Kyoto station with staying in Higashiyama for a first visit.",
)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _load() -> float:
    return float(Path("/proc/loadavg").read_text().split()[0]) if Path("/proc/loadavg").exists() else float("nan")


def _pct(values: list[float], q: float) -> float | None:
    if not values:
        return None
    ordered = sorted(values)
    pos = (len(ordered) - 1) * q
    low = int(pos)
    high = min(low + 1, len(ordered) - 1)
    return ordered[low] + (ordered[high] - ordered[low]) * (pos - low)


# --- servers --------------------------------------------------------------------------------
def start_server(model: str, engine: str, spans: Path, max_tokens: int) -> tuple[subprocess.Popen, str]:
    port = _free_port()
    cmd = [sys.executable, "-c", "from analyzer.cli import main; main()", "serve", "--model", model, "--engine",
           engine, "--port", str(port), "--otlp-json", str(spans), "--max-tokens-limit", str(max(max_tokens, 64)),
           "--max-queued-requests", "256"]
    proc = subprocess.Popen(cmd, cwd=REPO, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                            env={**os.environ, "OTEL_EXPORTER_OTLP_ENDPOINT": ""})
    url = f"http://127.0.0.1:{port}"
    import httpx

    deadline = time.monotonic() + 600
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"tokentrace serve --engine {engine} exited with {proc.returncode}")
        try:
            if httpx.get(url + "/health", timeout=2).status_code == 200:
                return proc, url
        except httpx.HTTPError:
            pass
        time.sleep(0.5)
    proc.kill()
    raise RuntimeError(f"tokentrace serve --engine {engine} did not become ready")


def model_id_of(url: str) -> str:
    import httpx

    return httpx.get(url + "/v1/models", timeout=10).json()["data"][0]["id"]


def load_level(url: str, model_id: str, concurrency: int, requests: int, max_tokens: int) -> dict[str, Any]:
    """One closed-loop level through a server; the client-perspective figures from the same SQL
    as ``tokentrace bench --format json``."""
    from opentelemetry.sdk.trace import SpanLimits, TracerProvider
    from opentelemetry.sdk.trace.export import SimpleSpanProcessor
    from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

    from analyzer.cli._bench_json import bench_summary
    from analyzer.db.store import connect, insert_rows
    from analyzer.formats.sdk_spans import rows_from_sdk_spans
    from instrument.client import chat_body, run_load_sync

    memory = InMemorySpanExporter()
    provider = TracerProvider(span_limits=SpanLimits(max_events=4096))
    provider.add_span_processor(SimpleSpanProcessor(memory))
    results = run_load_sync(url, lambda i: chat_body(model_id, PROMPTS[i % len(PROMPTS)], max_tokens=max_tokens,
                                                     ignore_eos=True),
                            requests=requests, concurrency=concurrency, tracer_provider=provider, timeout_s=600)
    status: dict[str, int] = {}
    for r in results:
        status[str(r.status_code)] = status.get(str(r.status_code), 0) + 1
    con = connect(None)
    try:
        insert_rows(con, *rows_from_sdk_spans(memory.get_finished_spans()))
        return bench_summary(con, status)
    finally:
        con.close()


def section_curve(args: argparse.Namespace) -> dict[str, Any]:
    tmp = Path(tempfile.mkdtemp(prefix="tt-engines-"))
    servers = {e: start_server(args.model, e, tmp / f"{e}.jsonl", args.max_tokens) for e in ("sequential", "continuous")}
    try:
        model_id = model_id_of(servers["continuous"][1])
        for _, url in servers.values():  # one warm-up request each, not measured
            load_level(url, model_id, 1, 1, 4)
        levels: dict[str, dict[str, Any]] = {"sequential": {}, "continuous": {}}
        for n, concurrency in enumerate(args.concurrency):
            order = ("sequential", "continuous") if n % 2 == 0 else ("continuous", "sequential")
            for engine in order:
                requests = max(args.requests_per_level, 2 * concurrency)
                started = time.monotonic()
                stats = load_level(servers[engine][1], model_id, concurrency, requests, args.max_tokens)
                levels[engine][str(concurrency)] = {
                    "requests": requests, "wall_s": round(time.monotonic() - started, 2),
                    "completed": stats["requests_completed"], "failed": stats["requests_failed"],
                    "output_tokens_per_s": stats["output_tokens_per_second"],
                    "request_throughput_rps": stats["request_throughput_rps"],
                    "ttft_ms_p50": stats["ttft_ms"]["p50"], "ttft_ms_p99": stats["ttft_ms"]["p99"],
                    "tpot_ms_p50": stats["tpot_ms"]["p50"], "tpot_ms_p99": stats["tpot_ms"]["p99"],
                }
                print(json.dumps({"engine": engine, "concurrency": concurrency, **levels[engine][str(concurrency)]}),
                      file=sys.stderr, flush=True)
    finally:
        for proc, _ in servers.values():
            proc.terminate()
            proc.wait(timeout=60)
    out: dict[str, Any] = {"levels": levels, "max_tokens": args.max_tokens}
    if "8" in levels["continuous"]:
        seq, cont = levels["sequential"]["8"], levels["continuous"]["8"]
        out["throughput_ratio_c8"] = cont["output_tokens_per_s"] / seq["output_tokens_per_s"]
        out["ttft_p99_ratio_c8"] = seq["ttft_ms_p99"] / cont["ttft_ms_p99"]
        out["goal_throughput_2_5x"] = out["throughput_ratio_c8"] >= 2.5
        out["goal_ttft_p99_3x"] = out["ttft_p99_ratio_c8"] >= 3.0
    return out


# --- tracing cost ----------------------------------------------------------------------------
def section_tracing(args: argparse.Namespace, handle: Any) -> dict[str, Any]:
    from opentelemetry import trace
    from opentelemetry.trace import SpanKind

    from instrument.engines.base import EngineRequest
    from instrument.engines.continuous import ContinuousEngine
    from instrument.hf.token_sampling import SamplingParams
    from instrument.otel.tracing import get_tracer, setup_tracing

    spans = Path(tempfile.mkdtemp(prefix="tt-trace-cost-")) / "spans.jsonl"
    provider = setup_tracing("engine-throughput", exporter="otlp_json", json_path=str(spans))
    # as `tokentrace serve` does (GatewaySettings.gil_switch_interval_s): with CPython's 5 ms
    # default, the export thread's encoding can hold the GIL for 5 ms between two steps
    sys.setswitchinterval(args.switch_interval_s)
    engine = ContinuousEngine(handle, provider)
    tracer = get_tracer(provider)
    prompts = [handle.tokenize([{"role": "user", "content": p}], None) for p in PROMPTS]

    def one_round() -> tuple[float, int]:
        done = threading.Event()
        left = [args.batch]

        def finished(_result: Any) -> None:
            left[0] -= 1
            if left[0] == 0:
                done.set()

        steps0 = engine._step
        started = time.perf_counter()
        for i in range(args.batch):
            # A valid parent, as the gateway passes it (instrument/gateway/app.py): its recording
            # ``gateway`` span. An invalid parent sends decode spans down the span writer's
            # eager path (~12x the lazy one), which production never takes.
            gateway = tracer.start_span("gateway", kind=SpanKind.SERVER)
            engine.submit(EngineRequest(f"r{time.perf_counter_ns()}-{i}", prompts[i % len(prompts)],
                                        SamplingParams(max_tokens=args.max_tokens, temperature=0.0, ignore_eos=True),
                                        trace.set_span_in_context(gateway), lambda t, lp: None,
                                        lambda result, span=gateway: (span.end(), finished(result))))
        if not done.wait(600):
            raise RuntimeError("a tracing round did not finish")
        provider.force_flush()
        return time.perf_counter() - started, engine._step - steps0

    for mode in (True, False):  # warm both paths
        engine.tracing = mode
        one_round()
    per_step: dict[bool, list[float]] = {True: [], False: []}
    for r in range(args.rounds):
        for mode in ((True, False) if r % 2 == 0 else (False, True)):
            engine.tracing = mode
            wall, steps = one_round()
            per_step[mode].append(wall / steps * 1e3)
    engine.close()
    provider.shutdown()
    traced, untraced = statistics.median(per_step[True]), statistics.median(per_step[False])
    paired = [t / u for t, u in zip(per_step[True], per_step[False])]
    return {"batch": args.batch, "max_tokens": args.max_tokens, "rounds": args.rounds,
            "step_ms_traced_median": traced, "step_ms_untraced_median": untraced,
            "tracing_added_ratio": traced / untraced, "tracing_added_ratio_paired_median": statistics.median(paired),
            "goal_tracing_2pct": statistics.median(paired) <= 1.02}


# --- start-up -------------------------------------------------------------------------------
def _manager_round(manager: Any, prompts: list[list[int]], tokens: int) -> float:
    started = time.perf_counter()
    ids = [manager.add_request(p, max_new_tokens=tokens, eos_token_id=-1) for p in prompts]
    pending = set(ids)
    deadline = time.monotonic() + 900
    while pending and time.monotonic() < deadline:
        out = manager.get_result(timeout=1)
        if out is not None and out.is_finished():
            pending.discard(out.request_id)
    return time.perf_counter() - started


def section_startup(args: argparse.Namespace, handle: Any) -> dict[str, Any]:
    from transformers import GenerationConfig
    from transformers.generation.configuration_utils import ContinuousBatchingConfig

    from instrument.engines.continuous import DEFAULT_KV_BUDGET_BYTES, DEFAULT_KV_CACHE_TOKENS

    prompts = [handle.tokenize([{"role": "user", "content": PROMPTS[i % len(PROMPTS)]}], None)
               for i in range(args.batch)]
    per_token = handle.kv_bytes_per_token
    sized = min(DEFAULT_KV_BUDGET_BYTES // (16 * per_token), DEFAULT_KV_CACHE_TOKENS // 16)
    configs = {
        "transformers_defaults": ContinuousBatchingConfig(use_async_batching=False),
        "tokentrace_sizing": ContinuousBatchingConfig(page_size=16, num_blocks=sized, max_batch_tokens=512,
                                                      max_requests_per_batch=64, max_blocks_per_request=0,
                                                      use_async_batching=False, allow_block_sharing=False,
                                                      auto_switch_to_flash=False, max_memory_percent=0.9),
    }
    unknown = set(args.startup_configs) - set(configs)
    if unknown:
        raise SystemExit(f"--startup-configs: unknown {sorted(unknown)}; known: {sorted(configs)}")
    out: dict[str, Any] = {}
    for name, cb in configs.items():
        if name not in args.startup_configs:
            continue
        config = GenerationConfig(do_sample=False, eos_token_id=-1, max_new_tokens=args.max_tokens,
                                  pad_token_id=handle.model.generation_config.pad_token_id)
        t0 = time.perf_counter()
        manager = handle.model.init_continuous_batching(generation_config=config, continuous_batching_config=cb)
        t1 = time.perf_counter()
        manager.warmup()  # builds the batch processor: cache tensor, static tensors, attention mask
        t2 = time.perf_counter()
        processor = manager.batch_processor
        cache = processor.cache
        masks = processor.inputs_and_outputs.attention_mask or {}
        manager.start()
        first = _manager_round(manager, prompts, args.max_tokens)
        later = _manager_round(manager, prompts, args.max_tokens)
        manager.stop(block=True, timeout=60)
        out[name] = {"init_s": t1 - t0, "batch_processor_s": t2 - t1, "first_round_s": first, "later_round_s": later,
                     "cache_blocks": cache.num_blocks, "block_tokens": cb.page_size,
                     "max_batch_tokens": cache.max_batch_tokens, "cache_bytes": int(cache.cache_tensor.numel()),
                     "attention_mask_bytes": int(sum(m.numel() * m.element_size() for m in masks.values()))}
        print(json.dumps({name: out[name]}), file=sys.stderr, flush=True)
        del manager, processor, cache, masks
        import gc

        gc.collect()
    return out


# --- gateway vs the manager -----------------------------------------------------------------
def direct_manager(handle: Any, max_tokens: int) -> Any:
    from transformers import GenerationConfig
    from transformers.generation.configuration_utils import ContinuousBatchingConfig

    from instrument.engines.continuous import DEFAULT_KV_BUDGET_BYTES, DEFAULT_KV_CACHE_TOKENS

    per_token = handle.kv_bytes_per_token
    blocks = min(DEFAULT_KV_BUDGET_BYTES // (16 * per_token), DEFAULT_KV_CACHE_TOKENS // 16)
    config = GenerationConfig(do_sample=False, eos_token_id=-1, max_new_tokens=max_tokens,
                              pad_token_id=handle.model.generation_config.pad_token_id)
    cb = ContinuousBatchingConfig(page_size=16, num_blocks=blocks, max_batch_tokens=512, max_requests_per_batch=64,
                                  max_blocks_per_request=0, use_async_batching=False, allow_block_sharing=False,
                                  auto_switch_to_flash=False, max_memory_percent=0.9)
    manager = handle.model.init_continuous_batching(generation_config=config, continuous_batching_config=cb)
    manager.warmup()
    manager.start()
    return manager


def direct_once(manager: Any, ids: list[int], max_tokens: int) -> tuple[float, float]:
    start = time.perf_counter_ns()
    rid = manager.add_request(ids, max_new_tokens=max_tokens, streaming=True, eos_token_id=-1)
    first = last = None
    for output in manager.request_id_iter(rid):
        now = time.perf_counter_ns()
        if output.generated_tokens and first is None:
            first = now
        last = now
        if output.is_finished():
            break
    return (first - start) / 1e6, (last - start) / 1e6


def gateway_once(http: Any, url: str, model_id: str, prompt: str, max_tokens: int) -> tuple[float, float]:
    body = {"model": model_id, "messages": [{"role": "user", "content": prompt}], "max_tokens": max_tokens,
            "temperature": 0, "stream": True, "ignore_eos": True}
    visible: list[int] = []
    start = time.perf_counter_ns()
    with http.stream("POST", url + "/v1/chat/completions", json=body) as resp:
        resp.raise_for_status()
        for line in resp.iter_lines():
            if line.startswith("data: {"):
                choices = json.loads(line[6:]).get("choices") or [{}]
                if (choices[0].get("delta") or {}).get("content"):
                    visible.append(time.perf_counter_ns())
    return (visible[0] - start) / 1e6, (visible[-1] - start) / 1e6


def section_gateway(args: argparse.Namespace, handle: Any) -> dict[str, Any]:
    import httpx

    tmp = Path(tempfile.mkdtemp(prefix="tt-gw-cb-"))
    proc, url = start_server(args.model, "continuous", tmp / "spans.jsonl", args.max_tokens)
    manager = direct_manager(handle, args.max_tokens)
    pairs: list[dict[str, float]] = []
    try:
        model_id = model_id_of(url)
        with httpx.Client(timeout=600) as http:
            gateway_once(http, url, model_id, PROMPTS[0], 4)
            direct_once(manager, handle.tokenize([{"role": "user", "content": PROMPTS[0]}], None), 4)
            for r in range(args.rounds):
                prompt = PROMPTS[r % len(PROMPTS)]
                ids = handle.tokenize([{"role": "user", "content": prompt}], None)
                sides = ("direct", "gateway") if r % 2 == 0 else ("gateway", "direct")
                pair: dict[str, float] = {}
                for side in sides:
                    ttft, e2e = (direct_once(manager, ids, args.max_tokens) if side == "direct"
                                 else gateway_once(http, url, model_id, prompt, args.max_tokens))
                    pair[f"{side}_ttft_ms"], pair[f"{side}_e2e_ms"] = ttft, e2e
                pairs.append(pair)
    finally:
        manager.stop(block=True, timeout=30)
        proc.terminate()
        proc.wait(timeout=60)
    added = [p["gateway_ttft_ms"] - p["direct_ttft_ms"] for p in pairs]
    ratio = [p["gateway_e2e_ms"] / p["direct_e2e_ms"] for p in pairs]
    return {"pairs": len(pairs), "max_tokens": args.max_tokens,
            "direct_ttft_ms_median": statistics.median(p["direct_ttft_ms"] for p in pairs),
            "direct_e2e_ms_median": statistics.median(p["direct_e2e_ms"] for p in pairs),
            "ttft_added_ms_median": statistics.median(added), "e2e_ratio_median": statistics.median(ratio),
            "ttft_added_ms_p90": _pct(added, 0.9),
            "goal_ttft_5ms": statistics.median(added) <= 5.0, "goal_e2e_1_05": statistics.median(ratio) <= 1.05}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--model", default="tiny", help="tiny, smollm2 or a local model folder")
    parser.add_argument("--sections", default="curve,tracing,gateway")
    parser.add_argument("--concurrency", default="1,4,8,16", type=lambda s: [int(x) for x in s.split(",")])
    parser.add_argument("--max-tokens", type=int, default=48)
    parser.add_argument("--requests-per-level", type=int, default=16, help="at least 2 x concurrency are sent")
    parser.add_argument("--batch", type=int, default=8, help="tracing: sequences per round")
    parser.add_argument("--rounds", type=int, default=10, help="tracing and gateway: interleaved rounds per side")
    parser.add_argument("--startup-configs", default="transformers_defaults,tokentrace_sizing",
                        type=lambda s: [x for x in s.split(",") if x],
                        help="startup: which sizings to build (transformers' defaults take 60%% of free memory for "
                             "KV plus an attention mask over the whole cache: more than a 24 GiB machine has with "
                             "SmolLM2)")
    parser.add_argument("--threads", type=int, default=None, help="torch threads in this process (default: torch's)")
    parser.add_argument("--switch-interval-s", type=float, default=0.0005,
                        help="tracing: sys.setswitchinterval, as tokentrace serve sets it (0.5 ms)")
    args = parser.parse_args()
    sections = [s.strip() for s in args.sections.split(",") if s.strip()]
    out: dict[str, Any] = {"model": args.model, "load_average_start": _load()}
    handle = None
    if any(s in sections for s in ("tracing", "gateway", "startup", "stepcost")):
        import torch

        from instrument.hf.model_handle import load_model_handle

        if args.threads:
            torch.set_num_threads(args.threads)
        handle = load_model_handle(args.model)
    for section in sections:
        started = time.monotonic()
        if section == "curve":
            out["curve"] = section_curve(args)
        elif section == "tracing":
            out["tracing"] = section_tracing(args, handle)
        elif section == "gateway":
            out["gateway"] = section_gateway(args, handle)
        elif section == "startup":
            out["startup"] = section_startup(args, handle)
        elif section == "stepcost":  # the engine step against a bare forward + sampling (engine_step_cost.py)
            from engine_step_cost import section_stepcost

            out["stepcost"] = section_stepcost(args, handle)
        else:
            raise SystemExit(f"--sections: unknown section {section!r}")
        out[section]["seconds"] = round(time.monotonic() - started, 1)
    out["load_average_end"] = _load()
    print(json.dumps(out, indent=2))


if __name__ == "__main__":
    main()
