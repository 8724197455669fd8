"""What an engine step costs besides the model: the ``stepcost`` section
of benchmarks/engine_throughput.py, also runnable alone.

One process, one model, rounds interleaved: each round runs --batch sequences (greedy,
``ignore_eos``, --max-tokens each, the same prompt) through the continuous engine, then the
same batch as a bare forward + argmax loop (HF ``DynamicCache``, batch x 1 decode input,
``logits_to_keep=1``) on a thread of its own (the engine runs on one too), for as many
decode steps. Per decode step (batch size = --batch, no prefill): the engine step's wall
time split into scheduling (``prepare_next_batch``), the forward + logits processing +
sampling (transformers' ``_forward_process_and_sample``, which includes tokentrace's
RowSampler) and the update (``update_batch`` with tokentrace's hooks), against the bare
forward + sampling; medians over rounds and the paired ratio. Goal: engine step
<= 1.2 x bare.

Usage::

    .venv/bin/python benchmarks/engine_step_cost.py --model smollm2 --rounds 4
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import threading
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

PROMPT = "Show me wheelchair-accessible hotels in Kyoto under $200/night with onsen access."


def _timed(obj: Any, name: str, sink: list[float], only_true: bool = False) -> None:
    """Wrap ``obj.name`` (instance attribute) to append its wall time, ms, to ``sink``
    (``only_true``: only calls that returned a true value: a scheduling that found a batch)."""
    orig = getattr(obj, name)

    def wrapped(*args: Any, **kwargs: Any) -> Any:
        started = time.perf_counter()
        result = orig(*args, **kwargs)
        if result or not only_true:
            sink.append((time.perf_counter() - started) * 1e3)
        return result

    setattr(obj, name, wrapped)


def section_stepcost(args: argparse.Namespace, handle: Any) -> dict[str, Any]:
    import torch
    from opentelemetry import trace
    from opentelemetry.sdk.trace import TracerProvider
    from transformers import DynamicCache

    from instrument.engines.base import EngineRequest
    from instrument.engines.continuous import ContinuousEngine
    from instrument.hf.token_sampling import SamplingParams

    engine = ContinuousEngine(handle, TracerProvider())
    processor = engine.manager.batch_processor
    parts: dict[str, list[float]] = {"schedule": [], "forward_sample": [], "update": []}
    _timed(processor, "prepare_next_batch", parts["schedule"], only_true=True)
    _timed(processor.model_runner, "_forward_process_and_sample", parts["forward_sample"])
    _timed(processor, "update_batch", parts["update"])
    prompt = handle.tokenize([{"role": "user", "content": PROMPT}], None)
    model = handle.model

    def engine_round(tag: str) -> dict[str, float]:
        for sink in parts.values():
            sink.clear()
        done = threading.Event()
        left = [args.batch]

        def finished(_result: Any) -> None:
            left[0] -= 1
            if left[0] == 0:
                done.set()

        for i in range(args.batch):
            engine.submit(EngineRequest(f"{tag}-{i}", prompt,
                                        SamplingParams(max_tokens=args.max_tokens, temperature=0.0, ignore_eos=True),
                                        trace.set_span_in_context(trace.INVALID_SPAN), lambda t, lp: None, finished))
        if not done.wait(900):
            raise RuntimeError("a stepcost round did not finish")
        # steps 0-1: prefill (and the first decode); the rest are full-batch decode steps
        decode = {k: v[2:] for k, v in parts.items()}
        assert len({len(v) for v in decode.values()}) == 1, {k: len(v) for k, v in decode.items()}
        steps = [s + f + u for s, f, u in zip(decode["schedule"], decode["forward_sample"], decode["update"])]
        return {"step_ms": statistics.median(steps), **{f"{k}_ms": statistics.median(v) for k, v in decode.items()}}

    def bare_round() -> float:
        out: list[float] = []

        def run() -> None:
            ids = torch.tensor([prompt] * args.batch)
            with torch.no_grad():
                cache = DynamicCache()
                logits = model(input_ids=ids, past_key_values=cache, use_cache=True, logits_to_keep=1).logits
                nxt = logits[:, -1].float().argmax(-1, keepdim=True)
                times = []
                for _ in range(args.max_tokens - 1):
                    started = time.perf_counter()
                    logits = model(input_ids=nxt, past_key_values=cache, use_cache=True, logits_to_keep=1).logits
                    nxt = logits[:, -1].float().argmax(-1, keepdim=True)
                    times.append((time.perf_counter() - started) * 1e3)
            out.append(statistics.median(times[1:]))

        thread = threading.Thread(target=run, name="bare-forward")
        thread.start()
        thread.join()
        return out[0]

    engine_round("warm")
    bare_round()
    rounds = []
    for r in range(args.rounds):
        if r % 2 == 0:
            e, b = engine_round(f"r{r}"), bare_round()
        else:
            b, e = bare_round(), engine_round(f"r{r}")
        rounds.append({**e, "bare_forward_sample_ms": b, "ratio": e["step_ms"] / b,
                       "forward_sample_ratio": e["forward_sample_ms"] / b,
                       "output_tokens_per_s": args.batch / (e["step_ms"] / 1e3)})
    engine.close()
    med = {k: statistics.median(r[k] for r in rounds) for k in rounds[0]}
    return {"batch": args.batch, "max_tokens": args.max_tokens, "rounds": rounds, "median": med,
            "goal_step_le_1_2x_bare": med["ratio"] <= 1.2}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--model", default="tiny")
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--max-tokens", type=int, default=16)
    parser.add_argument("--rounds", type=int, default=4)
    args = parser.parse_args()
    from instrument.hf.model_handle import load_model_handle

    out = {"model": args.model, "load_average_start": os.getloadavg()[0]}
    out["stepcost"] = section_stepcost(args, load_model_handle(args.model))
    out["load_average_end"] = os.getloadavg()[0]
    print(json.dumps(out, indent=2))


if __name__ == "__main__":
    main()
