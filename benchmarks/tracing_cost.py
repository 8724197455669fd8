"""Tracing cost per generated token, continuous engine traced vs untraced.

Two sections, one run:

engine   The real continuous engine (instrument/engines/continuous/engine.py) on ``--model`` in this
         process, driven as the gateway drives it: each sequence is submitted with a valid
         parent context (a recording ``gateway`` SERVER span, as instrument/gateway/app.py
         passes ``trace.set_span_in_context(span)``), its tokens go through a queue to a
         stand-in of the gateway's event-loop thread, which keeps one ``tokentrace.chunk``
         event per token and ends the ``queue`` and ``gateway`` spans when the sequence ends.
         Traced rounds use the provider ``tokentrace serve --otlp-json F`` builds (SDK
         BatchSpanProcessor -> OTLP-JSON lines exporter, instrument/otel/tracing.py; with
         ``--span-export process`` the exporter is only named there and the stand-in's
         spans are forwarded, its chunk events as raw tuples, to the span exporter process
         that also gets the engine's step records, as ``serve`` does it); untraced
         rounds turn the engine's tracing off and pass a non-recording parent (valid ids, no
         spans written anywhere). ``gc.freeze()`` after start-up and a 0.5 ms GIL switch
         interval, as ``serve`` does. At each batch size, rounds are interleaved ABBA; each
         round submits --batch sequences of --max-tokens tokens at once, waits for all, and
         (traced) flushes the span processor, so the export of the round's spans is inside
         its CPU figures. Per generated token:

         (a) engine-thread CPU (the manager's generation thread): the tracing work timed
             in place on that thread (``seq``: each sequence's prefill/decode spans, per
             token; ``step``: the step hook's excess over an untraced step plus the
             ``engine_step`` span and the engine trace's close, per step; with
             ``--span-export process``: the step record's packing and its send), and the
             difference of the thread's whole CPU clock traced - untraced (``diff``; noisy:
             the forward's own CPU varies by more than tracing adds on a loaded box);
         (b) serving-process CPU, all threads (this process: engine, export thread, gateway
             stand-in, probe), traced vs untraced; also without the probe thread's own CPU
             (it runs for the round's wall time, which a traced round stretches while it
             waits for the export);
         (c) exporter-process CPU: CPU of this process's child processes (live ones from
             /proc, reaped ones from getrusage). With ``--span-export inline`` the exporter
             runs inside the serving process (its CPU is in (b)), so (c) is 0 and printed as
             n/a with that reason; with ``--span-export process`` the span exporter process
             (instrument/records/exporter_process.py) is that child, and a traced round
             waits for it to build and export the round's spans;
         (d) p99 wake-up delay of a probe thread in the serving process (sleeps
             --probe-interval-ms, records how late it runs again: GIL pressure).

         Goals: (b) <= 1.05x; (a) added <= 1 µs per token + 10 µs per step;
         (d) within 1 ms of untraced.
encode   The export path on spans the engine really wrote (one extra traced round captured in
         memory), in batches of the SDK's 512: the OTLP-JSON exporter's encode per span, the
         per-span ``Resource.__hash__`` the SDK's grouping pays, the largest single
         ``json.dumps`` call (the whole batch as one line vs the exporter's slices), the
         exporter writing the batch to /dev/null sliced vs as one line while a probe thread
         sleeps 0.5 ms at a time (how late it wakes: the GIL held by one call), and the
         OTLP protobuf encoder's build and ``SerializeToString`` of the same batch.

Usage::

    .venv/bin/python benchmarks/tracing_cost.py --quick   # 16 tokens, 2 rounds: ~40 s here
    .venv/bin/python benchmarks/tracing_cost.py           # 64 tokens, 6 rounds: ~2 min here
    .venv/bin/python benchmarks/tracing_cost.py --json out.json --sections engine
    .venv/bin/python benchmarks/tracing_cost.py --quick --span-export process

Prints an 80-column table per section and the load average at start and end;
``--json FILE`` keeps every figure at full precision.
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import statistics
import sys
import tempfile
import textwrap
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run from a checkout without installing
sys.path.insert(0, str(Path(__file__).resolve().parent))

from tracing_cost_harness import Harness, load_average

EXPORT_BATCH = 512  # the SDK BatchSpanProcessor's default max_export_batch_size


def _per_token_us(rounds: list[dict[str, float]], key: str) -> float:
    return statistics.median(r[key] / r["tokens"] * 1e6 for r in rounds)


def summarize(batch: int, max_tokens: int, traced: list[dict], untraced: list[dict],
              span_export: str = "inline") -> dict[str, Any]:
    """Per generated token medians of one batch size, paired ABBA ratios and the goals."""
    pairs = list(zip(traced, untraced))
    proc_ratio = statistics.median(t["process_cpu_s"] / u["process_cpu_s"] for t, u in pairs)
    # the probe thread is the benchmark's instrument and runs for the round's wall time, which
    # a traced round stretches (it waits for the export): its CPU left out, the serving work alone
    proc_ratio_np = statistics.median((t["process_cpu_s"] - t["probe_cpu_s"]) / (u["process_cpu_s"] - u["probe_cpu_s"])
                                      for t, u in pairs)
    added_engine = [t["engine_cpu_s"] - u["engine_cpu_s"] for t, u in pairs]
    steps = statistics.median(t["steps"] for t in traced)
    tokens = batch * max_tokens
    engine_added_us_token = statistics.median(added_engine) / tokens * 1e6
    engine_added_us_step = statistics.median(added_engine) / steps * 1e6
    allowed = 1e-6 * tokens + 10e-6 * steps  # goal (a): 1 µs per token + 10 µs per step
    # attributed: CPU inside the tracing work on the engine thread (Harness._attribute_hooks);
    # the step hook counts only its excess over the untraced rounds' (per step)
    sched_untraced = statistics.median(u["hook_on_scheduled_s"] / u["steps"] for u in untraced)
    per_step_s = [(t["hook_engine_step_span_s"] + t["hook_engine_trace_close_s"]
                   + t["hook_on_scheduled_s"] - sched_untraced * t["steps"]) / t["steps"] for t in traced]
    per_token_s = [t["hook_sequence_spans_s"] / t["tokens"] for t in traced]
    attributed_step_us = statistics.median(per_step_s) * 1e6
    attributed_token_us = statistics.median(per_token_s) * 1e6
    p99_t = statistics.median(r["probe_p99_ms"] for r in traced)
    p99_u = statistics.median(r["probe_p99_ms"] for r in untraced)
    child = _per_token_us(traced, "children_cpu_s")
    return {
        "batch": batch, "max_tokens": max_tokens, "rounds_per_side": len(traced), "steps_per_round": steps,
        "a_engine_cpu_us_per_token": {"traced": _per_token_us(traced, "engine_cpu_s"),
                                      "untraced": _per_token_us(untraced, "engine_cpu_s"),
                                      "added": engine_added_us_token, "added_per_step_us": engine_added_us_step,
                                      "attributed_sequence_spans_per_token": attributed_token_us,
                                      "attributed_per_step_us": attributed_step_us,
                                      "attributed_amortized": attributed_token_us + attributed_step_us * steps / tokens},
        "b_process_cpu_us_per_token": {"traced": _per_token_us(traced, "process_cpu_s"),
                                       "untraced": _per_token_us(untraced, "process_cpu_s"),
                                       "ratio_paired_median": proc_ratio,
                                       "probe_thread_us_per_token": {"traced": _per_token_us(traced, "probe_cpu_s"),
                                                                     "untraced": _per_token_us(untraced, "probe_cpu_s")},
                                       "ratio_paired_median_without_probe": proc_ratio_np},
        "c_exporter_process_cpu_us_per_token": child if child > 0 else None,
        "c_note": None if child > 0 else (
            "n/a: the exporter runs inside the serving process (--span-export inline: its CPU is in b); "
            "no child process used CPU" if span_export == "inline" else
            "0: below the child-CPU clock's 10 ms tick over these rounds (--span-export process)"),
        "d_probe_p99_ms": {"traced": p99_t, "untraced": p99_u, "added": p99_t - p99_u},
        "wall_s_per_round": {"traced": statistics.median(r["wall_s"] for r in traced),
                             "untraced": statistics.median(r["wall_s"] for r in untraced)},
        "goal_b_1_05x": proc_ratio <= 1.05,
        # the goal's budget, 1 µs per token + 10 µs per step, against the work timed in place
        # (per-sequence work inside the step hook, e.g. packing a step record's SEQ entries,
        # spends the per-token part of the budget)
        "goal_a_1us_token_10us_step": (attributed_token_us * tokens + attributed_step_us * steps) * 1e-6 <= allowed,
        "goal_a_differential": statistics.median(added_engine) <= allowed,
        "goal_d_1ms": p99_t - p99_u <= 1.0,
        "rounds": {"traced": traced, "untraced": untraced},
    }


def section_engine(handle: Any, batches: list[int], max_tokens: int, rounds: int, *, max_batch_tokens: int = 512,
                   probe_interval_s: float = 0.001, switch_interval_s: float = 0.0005,
                   capture: bool = True, prompts: list[list[int]] | None = None, unfreeze: bool = True,
                   log: Callable[[str], None] = print, span_export: str = "inline",
                   keep_gap_ms: float | None = None) -> dict[str, Any]:
    """The engine section (module docstring) at each batch size; ``capture``: afterwards one
    more traced round at the largest batch with its spans kept in memory (for ``encode``);
    ``prompts``: token ids to cycle through (default: tracing_cost_harness.PROMPTS through the handle's
    chat template); ``unfreeze``: undo the ``gc.freeze()`` at the end (main keeps it for the
    encode section, as a serving process would); ``keep_gap_ms``: traced rounds under a keep
    policy (``serve --keep-gap-ms``: every request recorded, the arrival sampler's 1 % marked as
    the random sample, decided in the span exporter process; needs ``span_export`` process)."""
    from opentelemetry.sdk.trace.export import BatchSpanProcessor
    from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

    from instrument.otel.tracing import setup_tracing

    spans_file = Path(tempfile.mkdtemp(prefix="tt-tracing-cost-")) / "spans.jsonl"
    # as `tokentrace serve` builds it: under process the exporters are only named here, and one
    # span exporter process gets the stand-in gateway's spans and the engine's records
    sampler = None
    if keep_gap_ms is not None:  # as serve builds it under --keep-gap-ms with a 1 % arrival sample
        from opentelemetry.sdk.trace.sampling import ParentBased, TraceIdRatioBased

        from instrument.records.keep import HeadMarkingSampler

        sampler = HeadMarkingSampler(ParentBased(TraceIdRatioBased(0.01)))
    provider = setup_tracing("tracing-cost", exporter="otlp_json", json_path=str(spans_file),
                             make_exporters=span_export == "inline", sampler=sampler)
    if keep_gap_ms is not None:
        provider.exporter_env["TOKENTRACE_KEEP_GAP_MS"] = str(keep_gap_ms)
    if span_export == "process":
        from instrument.records.span_forward import forward_spans

        forward_spans(provider)
    sys.setswitchinterval(switch_interval_s)  # GatewaySettings.gil_switch_interval_s
    harness = Harness(handle, provider, max_batch_size=max(batches), max_batch_tokens=max_batch_tokens,
                      probe_interval_s=probe_interval_s, prompts=prompts, span_export=span_export)
    gc.collect()
    gc.freeze()  # GatewaySettings.gc_freeze, as `tokentrace serve` does
    out: dict[str, Any] = {"batches": {}, "spans_file_bytes": 0}
    try:
        for traced in (True, False):  # warm both paths and learn the engine thread
            harness.round(min(batches), 4, traced)
        for batch in batches:
            harness.round(batch, max(4, max_tokens // 4), True)  # this batch size's first steps, unmeasured
            sides: dict[bool, list[dict]] = {True: [], False: []}
            for r in range(rounds):
                for traced in ((True, False) if r % 2 == 0 else (False, True)):  # ABBA
                    sides[traced].append(harness.round(batch, max_tokens, traced))
            out["batches"][str(batch)] = summary = summarize(batch, max_tokens, sides[True], sides[False], span_export)
            log(json.dumps({k: v for k, v in summary.items() if k != "rounds"}))
        if capture and span_export == "inline":  # process: the spans are in another process
            memory = InMemorySpanExporter()
            provider.add_span_processor(BatchSpanProcessor(memory, max_queue_size=1 << 20))
            harness.round(max(batches), max_tokens, True)
            provider.force_flush()
            out["captured_spans"] = list(memory.get_finished_spans())
    finally:
        harness.close()
        provider.shutdown()
        if unfreeze:
            gc.unfreeze()
    out["spans_file_bytes"] = spans_file.stat().st_size if spans_file.exists() else 0
    return out


# --- the encode section -----------------------------------------------------------------------
def _best_of(fn: Callable[[], Any], repeat: int) -> float:
    best = float("inf")
    for _ in range(repeat):
        start = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - start)
    return best


def _export_gil(batch: list[Any], repeat: int) -> dict[str, float]:
    """The OTLP-JSON exporter writing ``batch`` to /dev/null, sliced (its defaults) and as one
    line (bounds above the batch: the exporter before records were sliced), ABBA, ``repeat`` x 2 batches a
    turn, each turn after a ``gc.collect()`` (the same collector state for both), while a probe
    thread sleeps 0.5 ms at a time: wall per batch and how late the probe woke (p99, max)."""
    from instrument.otel.otlp_json import OTLPJsonLinesSpanExporter
    from tracing_cost_harness import Probe, percentile

    variants = {"sliced": {}, "one_line": {"max_spans": 1 << 30, "max_events": 1 << 30}}
    walls: dict[str, list[float]] = {name: [] for name in variants}
    delays: dict[str, list[float]] = {name: [] for name in variants}
    probe = Probe(0.0005)
    with open(os.devnull, "w", encoding="utf-8") as sink:
        for turn in range(2):
            for name in (("sliced", "one_line") if turn == 0 else ("one_line", "sliced")):
                exporter = OTLPJsonLinesSpanExporter(stream=sink, **variants[name])
                gc.collect()
                probe.take()
                probe.active = True
                for _ in range(repeat * 2):
                    start = time.perf_counter()
                    exporter.export(batch)
                    walls[name].append(time.perf_counter() - start)
                probe.active = False
                delays[name] += probe.take()
    probe.stop()
    out: dict[str, float] = {}
    for name in variants:
        out[f"export_{name}_ms_per_batch"] = statistics.median(walls[name]) * 1e3
        out[f"export_{name}_probe_p99_ms"] = percentile(delays[name], 0.99) * 1e3
        out[f"export_{name}_probe_max_ms"] = max(delays[name], default=float("nan")) * 1e3
    return out


def section_encode(spans: list[Any], repeat: int = 5) -> dict[str, Any]:
    """Export-path costs on one SDK-sized batch of real spans (module docstring)."""
    from opentelemetry.exporter.otlp.proto.common.trace_encoder import encode_spans
    from opentelemetry.sdk.resources import Resource

    from instrument.otel import otlp_json

    batch = list(spans[:EXPORT_BATCH])
    n = len(batch)
    for span in batch:  # materialize lazily built spans outside the timings
        span.attributes, span.events, span.get_span_context()
    plain = Resource(dict(batch[0].resource.attributes), batch[0].resource.schema_url)
    hash_plain = _best_of(lambda: [hash(plain) for _ in range(n)], repeat)
    hash_provider = _best_of(lambda: [hash(s.resource) for s in batch], repeat)
    build = _best_of(lambda: otlp_json.spans_to_otlp_json(batch), repeat)
    whole = otlp_json.spans_to_otlp_json(batch)
    dumps_whole = _best_of(lambda: json.dumps(whole, separators=(",", ":"), ensure_ascii=False), repeat)
    out: dict[str, Any] = {
        "spans": n, "span_names": sorted({s.name for s in batch}),
        "resource_hash_us_per_span_plain_resource": hash_plain / n * 1e6,
        "resource_hash_us_per_span_provider_resource": hash_provider / n * 1e6,
        "json_build_us_per_span": build / n * 1e6,
        "json_dumps_whole_batch_ms": dumps_whole * 1e3,
    }
    encode_lines = getattr(otlp_json, "encode_lines", None)
    if encode_lines is not None:  # the sliced exporter: the largest single dumps call
        slices = otlp_json.slice_spans(batch)
        out["slices"] = len(slices)
        built = [otlp_json.spans_to_otlp_json(part) for part in slices]
        out["json_dumps_largest_slice_ms"] = max(
            _best_of(lambda obj=obj: json.dumps(obj, separators=(",", ":"), ensure_ascii=False), repeat)
            for obj in built) * 1e3
        out["json_export_us_per_span"] = _best_of(lambda: encode_lines(batch), repeat) / n * 1e6
    else:
        out["json_export_us_per_span"] = (build + dumps_whole) / n * 1e6
    out.update(_export_gil(batch, repeat))
    message = encode_spans(batch)
    out["protobuf_build_us_per_span"] = _best_of(lambda: encode_spans(batch), repeat) / n * 1e6
    out["protobuf_serialize_whole_batch_ms"] = _best_of(message.SerializeToString, repeat) * 1e3
    return out


# --- output -----------------------------------------------------------------------------------
def engine_table(result: dict[str, Any]) -> str:
    """80-column tables of the engine section (per generated token unless named)."""
    lines = ["(a) engine thread CPU: seq = prefill/decode spans per token, step = step hook +",
             "    engine_step span per step (both timed in place), diff = traced - untraced",
             "    thread CPU per token; (b) process CPU per token; (d) probe wake-up p99",
             f"{'batch':>5} {'steps':>5} {'a seq':>6} {'a step':>6} {'a diff':>7} {'b trc':>7} {'b untr':>7} "
             f"{'b x':>6} {'d trc':>6} {'d untr':>6}",
             f"{'':>5} {'/rnd':>5} {'µs':>6} {'µs':>6} {'µs':>7} {'µs':>7} {'µs':>7} {'':>6} {'ms':>6} {'ms':>6}"]
    for batch, s in result["batches"].items():
        a, b, d = s["a_engine_cpu_us_per_token"], s["b_process_cpu_us_per_token"], s["d_probe_p99_ms"]
        lines.append(f"{batch:>5} {s['steps_per_round']:>5.0f} {a['attributed_sequence_spans_per_token']:>6.2f} "
                     f"{a['attributed_per_step_us']:>6.1f} {a['added']:>7.1f} {b['traced']:>7.1f} "
                     f"{b['untraced']:>7.1f} {b['ratio_paired_median']:>6.3f} {d['traced']:>6.2f} {d['untraced']:>6.2f}")
    lines.append("(b) without the probe thread's CPU (it runs for the round's wall time, longer when "
                 "traced): " + ", ".join(f"batch {batch} {s['b_process_cpu_us_per_token']['ratio_paired_median_without_probe']:.3f}"
                                        for batch, s in result["batches"].items()))
    notes = {s["c_note"] for s in result["batches"].values() if s["c_note"]}
    lines += [f"(c) exporter process: {note}" for note in sorted(notes)]
    for batch, s in result["batches"].items():
        if s["c_exporter_process_cpu_us_per_token"] is not None:
            lines.append(f"(c) batch {batch}: {s['c_exporter_process_cpu_us_per_token']:.1f} µs/token in child processes")
    goals = ", ".join(f"{batch}: a {'ok' if s['goal_a_1us_token_10us_step'] else 'no'} "
                      f"b {'ok' if s['goal_b_1_05x'] else 'no'} d {'ok' if s['goal_d_1ms'] else 'no'}"
                      for batch, s in result["batches"].items())
    lines.append(f"goals (a <= 1 µs/token + 10 µs/step, b <= 1.05x, d <= +1 ms) by batch {goals}")
    return "\n".join(out for line in lines for out in textwrap.wrap(line, 80, subsequent_indent="    ",
                                                                  drop_whitespace=False) or [""])


def encode_table(result: dict[str, Any]) -> str:
    """The encode section as name / value lines (units named)."""
    rows = [("spans in the batch", f"{result['spans']}"),
            ("Resource hash, plain SDK Resource", f"{result['resource_hash_us_per_span_plain_resource']:.2f} µs/span"),
            ("Resource hash, provider's resource", f"{result['resource_hash_us_per_span_provider_resource']:.2f} µs/span"),
            ("OTLP-JSON dict build", f"{result['json_build_us_per_span']:.1f} µs/span"),
            ("OTLP-JSON export (build+dumps)", f"{result['json_export_us_per_span']:.1f} µs/span"),
            ("json.dumps, whole batch, one call", f"{result['json_dumps_whole_batch_ms']:.2f} ms")]
    if "json_dumps_largest_slice_ms" in result:
        rows.append((f"json.dumps, largest of {result['slices']} slices", f"{result['json_dumps_largest_slice_ms']:.2f} ms"))
    for name, label in (("one_line", "one line"), ("sliced", "sliced")):
        rows.append((f"export, {label} (ms/batch; probe p99/max)",
                     f"{result[f'export_{name}_ms_per_batch']:.1f}, {result[f'export_{name}_probe_p99_ms']:.2f}/"
                     f"{result[f'export_{name}_probe_max_ms']:.2f} ms"))
    rows += [("protobuf encode_spans", f"{result['protobuf_build_us_per_span']:.1f} µs/span"),
             ("protobuf SerializeToString, batch", f"{result['protobuf_serialize_whole_batch_ms']:.2f} ms")]
    return "\n".join(f"{name:<43} {value:>22}" for name, value in rows)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter,
                                     epilog="example: python benchmarks/tracing_cost.py --quick --json cost.json")
    parser.add_argument("--model", default="tiny", help="tiny, smollm2 or a local model folder (default tiny)")
    parser.add_argument("--sections", default="engine,encode", help="engine,encode (default both; engine always runs: encode reads its spans)")
    parser.add_argument("--batches", default="8,32,64,128", type=lambda s: [int(x) for x in s.split(",") if x],
                        help="sequences per round (default 8,32,64,128)")
    parser.add_argument("--max-tokens", type=int, default=64, help="tokens per sequence (default 64)")
    parser.add_argument("--rounds", type=int, default=6, help="rounds per side and batch, ABBA (default 6)")
    parser.add_argument("--quick", action="store_true", help="2 rounds per side, 16 tokens (~40 s here)")
    parser.add_argument("--probe-interval-ms", type=float, default=1.0, help="probe sleep, ms (default 1)")
    parser.add_argument("--span-export", choices=("inline", "process"), default="inline",
                        help="the engine's span path (serve --span-export; default inline); "
                             "process: encode is skipped")
    parser.add_argument("--keep-gap-ms", type=float, default=None, metavar="MS",
                        help="traced rounds under a keep policy (serve --keep-gap-ms MS, 1 %% arrival sample); "
                             "needs --span-export process")
    parser.add_argument("--threads", type=int, default=None, help="torch threads (default: torch's)")
    parser.add_argument("--json", dest="json_path", default=None, help="write every figure to this file")
    args = parser.parse_args(argv)
    if args.quick:
        args.rounds, args.max_tokens = 2, 16
    sections = [s.strip() for s in args.sections.split(",") if s.strip()]
    unknown = set(sections) - {"engine", "encode"}
    if unknown or not sections:
        parser.error(f"--sections: unknown {sorted(unknown)}; known: engine, encode")
    if args.keep_gap_ms is not None and args.span_export != "process":
        parser.error("--keep-gap-ms needs --span-export process (the policy decides in the span exporter process)")
    if min(args.batches, default=0) < 1 or args.rounds < 1 or args.max_tokens < 2:
        parser.error("--batches, --rounds must be >= 1 and --max-tokens >= 2")
    import torch

    from instrument.hf.model_handle import load_model_handle

    if args.threads:
        torch.set_num_threads(args.threads)
    started = time.monotonic()
    out: dict[str, Any] = {"model": args.model, "load_average_start": load_average(),
                           "cpus": os.cpu_count(), "torch_threads": torch.get_num_threads()}
    handle = load_model_handle(args.model)
    engine = section_engine(handle, args.batches, args.max_tokens, args.rounds,
                            probe_interval_s=args.probe_interval_ms / 1e3, capture="encode" in sections,
                            unfreeze=False, log=lambda line: print(line, file=sys.stderr, flush=True),
                            span_export=args.span_export, keep_gap_ms=args.keep_gap_ms)
    spans = engine.pop("captured_spans", [])
    out["engine"] = engine
    out["span_export"] = args.span_export
    out["keep_gap_ms"] = args.keep_gap_ms
    if "encode" in sections and spans:
        out["encode"] = section_encode(spans)
    gc.unfreeze()
    out["load_average_end"] = load_average()
    out["seconds"] = round(time.monotonic() - started, 1)
    print(f"tracing cost, model {args.model}, {args.max_tokens} tokens/sequence, {args.rounds} rounds/side (ABBA), "
          f"--span-export {args.span_export}"
          + (f", keep policy: gap > {args.keep_gap_ms:g} ms" if args.keep_gap_ms is not None else ""))
    print(engine_table(engine))
    if "encode" in out:
        print(encode_table(out["encode"]))
    print(f"load avg 1/5/15 min: start {' '.join(map(str, out['load_average_start']))}, end "
          f"{' '.join(map(str, out['load_average_end']))}; {out['cpus']} CPUs; {out['seconds']:.0f} s")
    if args.json_path:
        Path(args.json_path).write_text(json.dumps(out, indent=2, default=str))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
