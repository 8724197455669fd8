"""What the keep policy costs the span exporter process, per generated token: a request it
summarizes against one it keeps whole, and against today's full detail (no policy).

The records of a serve run are made here, as the continuous engine and the gateway send
them (instrument/records/format.py: per step a STEP entry and one SEQ entry per sequence;
per request an OPEN and an END entry, its forwarded ``tokenize``, ``queue`` and ``gateway``
spans with one raw chunk event per token), ``--requests`` requests of ``--tokens`` tokens,
``--batch`` at a time. Each round feeds all of them through the exporter process's router
(instrument/records/router.py) into a provider whose exporter writes OTLP-JSON lines to
a temporary file, in this process, timed with the process's CPU clock (``force_flush`` inside
the timed part: the batch processor's encoding counts too). Three
sides, interleaved round by round: ``full`` (no policy: every span built), ``summary`` (a
policy no request crosses: the gateway span alone) and ``kept`` (a policy every request
crosses: all of it, plus the decision). Prints µs of process CPU per generated token,
median of the rounds, the ratios, and the OTLP-JSON bytes written per generated token.

Run: .venv/bin/python benchmarks/keep_policy_cost.py --requests 64 --tokens 256 --rounds 5
"""

from __future__ import annotations

import argparse
import os

from keep_sides import run_sides, set_side, timed_feed

T0 = 1_700_000_000_000_000_000
STEP_NS = 20_000_000  # a step every 20 ms


def _messages(requests: int, tokens: int, batch: int) -> list[bytes]:
    """The record stream of the run: channel-0 entries (the continuous engine's) and channel-2
    forwarded spans (the gateway's), in the order they would be sent."""
    from opentelemetry.sdk.resources import Resource
    from opentelemetry.sdk.trace import ReadableSpan
    from opentelemetry.trace import SpanContext, SpanKind, TraceFlags

    from instrument.engines.continuous.span_builder import SpanBuilder, layout_meta
    from instrument.kv.formula import KVLayout
    from instrument.records.channels import RECORD_ENTRIES, decoder_target
    from instrument.records.format import RecordWriter
    from instrument.records.span_forward import CHANNEL, Decoder, encode_span

    layout = KVLayout(layers=30, q_heads=9, kv_heads=3, head_dim=64, dtype="bfloat16", bytes_per_element=2,
                      layout="gqa")  # SmolLM2-135M's
    w = RecordWriter()
    w.decoder(RECORD_ENTRIES, decoder_target(SpanBuilder))
    w.meta(layout_meta(layout, "gqa", 16 * layout.kv_bytes_per_token, "all", 1000))
    w.decoder(CHANNEL, decoder_target(Decoder))
    out = [bytes(w.take())]
    step, slot = 0, 0
    sampled = TraceFlags(TraceFlags.SAMPLED)
    for first in range(0, requests, batch):
        group = list(range(first, min(requests, first + batch)))
        slots = {}
        start = T0 + step * STEP_NS
        for r in group:
            slot += 1
            slots[r] = slot
            w.open_sequence(slot, (r + 1) << 64, r + 1, int(sampled), 0)
        for k in range(tokens):  # step k: prefill (k = 0) or decode step k
            step += 1
            at = T0 + step * STEP_NS
            w.begin_step(step, at, at, len(group), len(group) * (20 if k == 0 else 1), 20 * len(group) if k == 0 else 0,
                         len(group) if k == 0 else 0, 0, len(group) * 2, 1000, 0, 16)
            for r in group:
                w.sequence(slots[r], 20 if k == 0 else 1, 2, 20 + k, 1 if k == 0 else 0)
            w.finish_step(at + STEP_NS - 1000, None)
            if w.pending() > 32 * 1024:
                out.append(bytes(w.take()))
        for r in group:
            w.end_sequence(slots[r])
        w.idle()
        out.append(bytes(w.take()))
        for r in group:  # the gateway's spans, forwarded (chunk events raw)
            trace_id = (r + 1) << 64
            gateway = SpanContext(trace_id, r + 1, is_remote=False, trace_flags=sampled)
            for name, span_id in (("tokenize", 10_000 + r), ("queue", 20_000 + r)):
                child = ReadableSpan(name, SpanContext(trace_id, span_id, False, sampled), gateway, Resource.create({}),
                                     {}, (), (), SpanKind.INTERNAL, start_time=start, end_time=start + 1000)
                w.blob(CHANNEL, encode_span(child))
            rows = [(k, 1, True, T0 + (step - tokens + k + 1) * STEP_NS) for k in range(tokens)]
            span = ReadableSpan("gateway", gateway, None, Resource.create({}), {
                "tokentrace.sampling.head": False, "gen_ai.usage.output_tokens": tokens,
                "gen_ai.response.finish_reasons": ("length",)}, (), (), SpanKind.SERVER,
                start_time=start, end_time=rows[-1][3] + 1000)
            w.blob(CHANNEL, encode_span(span, [(0, "tokentrace.chunk",
                                                 ("tokentrace.chunk.index", "tokentrace.chunk.tokens",
                                                  "tokentrace.chunk.visible"), rows)]))
        out.append(bytes(w.take()))
    return out


def _round(messages: list[bytes], side: str, path: str) -> tuple[float, int, int]:
    """Feed the messages through a fresh router writing OTLP-JSON lines to ``path``; (process
    CPU s, spans exported, bytes written)."""
    from instrument.otel.tracing import setup_tracing
    from instrument.records.router import Router

    set_side(side)
    if os.path.exists(path):
        os.remove(path)
    provider = setup_tracing("keep-cost", exporter=["otlp_json"], json_path=path)
    router = Router(provider)

    def feed() -> None:
        for message in messages:
            router.feed(message)
        router.close()

    return timed_feed(provider, feed, path)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     epilog="example: .venv/bin/python benchmarks/keep_policy_cost.py --rounds 5")
    parser.add_argument("--requests", type=int, default=64, help="requests per round (default 64)")
    parser.add_argument("--tokens", type=int, default=256, help="tokens per request (default 256)")
    parser.add_argument("--batch", type=int, default=32, help="requests decoding together (default 32)")
    parser.add_argument("--rounds", type=int, default=5, help="interleaved rounds per side (default 5)")
    args = parser.parse_args()
    messages = _messages(args.requests, args.tokens, args.batch)
    run_sides(lambda side, path: _round(messages, side, path), args.requests * args.tokens, args.rounds,
              f"{args.requests} requests x {args.tokens} tokens, batch {args.batch}")


if __name__ == "__main__":
    main()
