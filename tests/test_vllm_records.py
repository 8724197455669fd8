"""vLLM step records (#28, instrument/vllm/records.py): spans built from records in the
exporter process are the spans SpanBuilder.consume writes from the same StepFacts directly,
attribute by attribute, with the same times, events and parents (docs/spans.md "vLLM").

Deterministic and without vLLM: the StepFacts are what hooks.StepTap.drain gives (an arrival with a
traceparent, a chunked prefill with prefix-cache hits, decodes, a preemption and its recomputed
prefill, an abort, a step that names the aborted request, events-only records); both paths
write to real SDK providers with in-memory exporters. The sink's tests send records through a
real exporter process (python -m instrument.records.exporter_process) to an OTLP/JSON file.
"""

from __future__ import annotations

import json
import os
import signal
import time
from pathlib import Path
from typing import Any

import pytest
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from instrument.records import format as fmt
from instrument.records.channels import VLLM_STEPS
from instrument.records.span_builder import SpanBuilder as ExporterSpanBuilder
from instrument.tracing import get_tracer
from instrument.vllm import records
from instrument.vllm import sink as sink_module
from instrument.vllm.hooks import FINISHED_ABORTED, FINISHED_LENGTH, FINISHED_STOPPED, StepFacts, external_request_id
from instrument.vllm.spans import SpanBuilder

T0 = 1_764_000_000_000_000_000
MS = 1_000_000
TRACE_ID = 0x4BF92F3577B34DA6A3CE929D0E0E4736
PARENT = {"traceparent": f"00-{TRACE_ID:032x}-00f067aa0ba902b7-01", "tracestate": "vendor=abc"}
A, B, C, D = "chatcmpl-a-1a2b3c4d", "chatcmpl-b-5e6f7a8b", "cmpl-c-0-9c0d1e2f", "cmpl-d-abcdefgh"
BYTES_PER_BLOCK = 16 * 2 * 2 * 576  # tokens per block × layers × (K, V) × bytes per token per layer


def _facts(step: int, t: int, rows: list[tuple[str, int, int, int, int, int]], **events: Any) -> StepFacts:
    """One record as StepTap.drain gives it: rows (req_id, scheduled, computed, prefill kind, blocks, sampled)."""
    f = StepFacts(max(len(rows), 1))
    f.step, f.start_ns, f.sched_end_ns, f.end_ns = step, T0 + t * MS, T0 + t * MS + 40_000, T0 + (t + 9) * MS
    f.n = len(rows)
    f.waiting, f.kv_used, f.kv_total = events.pop("waiting", 0), 10 + step, 400
    f.prefix_hit_tokens, f.block_tokens, f.bytes_per_block = events.pop("hits", 0), 16, BYTES_PER_BLOCK
    for i, (req_id, tokens, computed, prefill, blocks, sampled) in enumerate(rows):
        f.req_ids[i], f.tokens[i], f.computed[i], f.prefill[i], f.blocks[i], f.sampled[i] = (
            req_id, tokens, computed, prefill, blocks, sampled)
    for name in ("arrivals", "first", "preempted", "finished"):
        getattr(f, name).extend(events.pop(name, []))
    assert not events, events
    return f


def _stream() -> list[StepFacts]:
    s = T0 / 1e9
    return [
        _facts(-1, 0, [], arrivals=[(A, s, PARENT, 300), (B, s + 0.001, None, 40)]),  # events only
        _facts(1, 2, [(A, 100, 128, 1, 15, 0), (B, 40, 0, 1, 3, 1)], first=[(A, 128), (B, 0)], hits=128, waiting=1),
        _facts(2, 12, [(A, 72, 228, 1, 19, 1), (B, 1, 40, 0, 3, 1)],
               arrivals=[(C, s + 0.013, {"traceparent": PARENT["traceparent"]}, 20)]),
        _facts(3, 22, [(A, 1, 300, 0, 19, 1), (B, 1, 41, 0, 3, 1), (C, 20, 0, 1, 2, 1)], first=[(C, 0)]),
        _facts(4, 32, [(A, 1, 301, 0, 19, 1), (C, 1, 20, 0, 2, 1)], preempted=[(B, 3, T0 + 32 * MS + 10_000)]),
        _facts(5, 42, [(A, 1, 302, 0, 19, 1), (B, 42, 0, 2, 3, 1), (C, 1, 21, 0, 2, 1)], hits=0),
        _facts(-1, 52, [], finished=[(C, FINISHED_ABORTED, T0 + 52 * MS)]),  # client disconnect
        _facts(6, 53, [(A, 1, 303, 0, 19, 1), (B, 1, 44, 0, 3, 1), (C, 1, 22, 0, 2, 1)],  # C scheduled before the abort
               finished=[(A, FINISHED_LENGTH, T0 + 61 * MS), (B, FINISHED_STOPPED, T0 + 61 * MS)]),
        _facts(-1, 70, [], arrivals=[(D, s + 0.070, None, 8)], finished=[(D, FINISHED_ABORTED, T0 + 71 * MS)]),
    ]


def _provider() -> tuple[TracerProvider, InMemorySpanExporter]:
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    return provider, exporter


def _direct(stream: list[StepFacts]) -> list[Any]:
    provider, exporter = _provider()
    builder = SpanBuilder(get_tracer(provider), request_id_of=external_request_id)
    for facts in stream:
        builder.consume(facts)
    builder.close_engine_trace()
    return list(exporter.get_finished_spans())


def _through_records(stream: list[StepFacts], per_message: int) -> list[Any]:
    """Encode on the 'engine' side, send as BLOB messages, build in the exporter's SpanBuilder."""
    provider, exporter = _provider()
    builder = ExporterSpanBuilder(provider)
    encoder, writer = records.Encoder(capacity=64), fmt.RecordWriter()  # tiny buffer: it grows
    for i, facts in enumerate(stream):
        encoder.write(facts)
        if (i + 1) % per_message == 0 or i == len(stream) - 1:
            payload, _ = encoder.take()
            writer.blob(VLLM_STEPS, payload)
            builder.feed(bytes(writer.take()))  # a copy, as the socket gives the child
    builder.close()
    return list(exporter.get_finished_spans())


def _canonical(spans: list[Any]) -> list[tuple[Any, ...]]:
    """Spans with their ids replaced by positions (ids are random); a trace or parent id that
    no span here carries (the received traceparent) is kept as it is."""
    index = {s.context.span_id: i for i, s in enumerate(spans)}
    traces: dict[int, int] = {}
    for s in spans:
        if s.parent is None or s.parent.span_id not in index:
            traces.setdefault(s.context.trace_id, len(traces))
    out = []
    for s in spans:
        parent = None if s.parent is None else index.get(s.parent.span_id, f"{s.parent.span_id:016x}")
        trace_id = s.context.trace_id if s.context.trace_id == TRACE_ID else f"local-{traces[s.context.trace_id]}"
        out.append((s.name, s.kind, s.start_time, s.end_time, trace_id, parent, dict(s.attributes),
                    [(e.name, e.timestamp, dict(e.attributes)) for e in s.events],
                    s.parent.trace_state.to_header() if s.parent is not None and s.parent.trace_state else None))
    return out


@pytest.mark.parametrize("per_message", [1, 3, 100])
def test_records_give_the_spans_consume_gives(per_message: int) -> None:
    direct = _canonical(_direct(_stream()))
    through = _canonical(_through_records(_stream(), per_message))
    assert len(through) == len(direct)
    for mine, theirs in zip(through, direct):
        assert mine == theirs
    names = [s[0] for s in direct]
    # the stream covers what it says it does
    assert names.count("engine_request") == 4 and names.count("queue") == 4 and names.count("engine_step") == 6
    by_id = {s[6]["gen_ai.request.id"]: s for s in direct if s[0] == "engine_request"}
    assert set(by_id) == {"chatcmpl-a", "chatcmpl-b", "cmpl-c-0", "cmpl-d"}
    assert by_id["chatcmpl-a"][4] == TRACE_ID and by_id["chatcmpl-a"][5] == "00f067aa0ba902b7"
    assert by_id["chatcmpl-a"][8] == "vendor=abc"
    assert by_id["chatcmpl-a"][6]["tokentrace.cached_tokens"] == 128
    assert by_id["chatcmpl-a"][6]["gen_ai.response.finish_reasons"] == ("length",)
    assert by_id["cmpl-c-0"][6]["gen_ai.response.finish_reasons"] == ("cancelled",)
    assert by_id["cmpl-d"][6]["gen_ai.response.finish_reasons"] == ("cancelled",)
    assert by_id["chatcmpl-b"][6]["tokentrace.preemptions"] == 1
    assert [e[0] for e in by_id["chatcmpl-b"][7]].count("tokentrace.preempted") == 1
    recompute = [s for s in direct if s[0] == "prefill" and s[6]["tokentrace.prefill.recompute"]]
    assert len(recompute) == 1 and recompute[0][6]["tokentrace.prefill.tokens"] == 42
    last_step = [s for s in direct if s[0] == "engine_step"][-1][6]
    assert last_step["tokentrace.batch.discarded_sequences"] == 1  # C, scheduled before its abort


def test_slots_end_with_their_requests() -> None:
    """The encoder and the decoder hold a slot from arrival to finish only; a request named
    after its end gets a one-record slot, and a slot whose ARRIVE never came decodes as
    ``?slot-N`` (a lost message), never as another request."""
    encoder, names, out = records.Encoder(), {}, []
    for facts in _stream():
        encoder.write(facts)
    payload, units = encoder.take()
    records.decode(payload, names, out)
    assert encoder.slot_of == {} and names == {}
    assert units == sum(f.n + 1 for f in _stream() if f.step >= 0) + 2 * 4
    assert [f.req_ids[:f.n] for f in out][-2] == [A, B, C]
    stream, encoder = _stream(), records.Encoder()
    for facts in stream[:5]:
        encoder.write(facts)
    encoder.take()  # a message the exporter never received (a full socket)
    for facts in stream[5:]:
        encoder.write(facts)
    later: list[StepFacts] = []
    records.decode(encoder.take()[0], {}, later)
    assert later[0].req_ids == ["?slot-1", "?slot-2", "?slot-3"]  # A, B, C


def test_a_malformed_payload_is_a_value_error() -> None:
    encoder = records.Encoder()
    encoder.write(_stream()[1])
    payload = bytes(encoder.take()[0])
    for bad in (payload[:-3], payload[:10], b"\x09" + payload[1:], payload + b"\x03\x01"):
        with pytest.raises(ValueError, match="vLLM step records"):
            records.decode(bad, {}, [])


def test_what_a_client_controls_never_breaks_a_message() -> None:
    """A tracestate cut at 512 bytes inside a UTF-8 character, and a request id over the u16
    length (vLLM takes a body's request_id of any length): both are packed on a character
    boundary and the message decodes (it used to raise on vLLM's thread, or be refused whole)."""
    long_id = "cmpl-abc" + "é" * 40_000  # 80,008 bytes: byte 65,535 is the first of an é
    state = "k=" + "a" * 509 + "é"  # 513 bytes: the 512th is the first byte of é
    headers = {"traceparent": "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01", "tracestate": state}
    encoder = records.Encoder()
    encoder.write(_facts(1, 0, [(long_id, 8, 0, 1, 1, 1)], arrivals=[(long_id, T0 / 1e9, headers, 8)]))
    out: list[StepFacts] = []
    records.decode(bytes(encoder.take()[0]), {}, out)
    (arrival,) = out[0].arrivals
    assert arrival[0] == long_id.encode()[:0xFFFF].decode("utf-8", "ignore") and len(arrival[0].encode()) == 0xFFFF - 1
    assert arrival[2]["tracestate"] == "k=" + "a" * 509 and arrival[2]["traceparent"] == headers["traceparent"]
    assert out[0].req_ids[0] == arrival[0]


def _otlp_json_spans(path: Path) -> list[tuple[str, dict[str, Any]]]:
    found = []
    for line in path.read_text().splitlines():
        for rs in json.loads(line)["resourceSpans"]:
            for ss in rs["scopeSpans"]:
                for span in ss["spans"]:
                    attrs = {a["key"]: next(iter(a["value"].values())) for a in span.get("attributes", [])}
                    found.append((span["name"], attrs))
    return found


class _Held:
    """What the hooks hold, as RecordSink reads it: records given, drained at each flush."""

    def __init__(self) -> None:
        self.records: list[StepFacts] = []

    def drain(self) -> Any:
        records, self.records = self.records, []
        yield from records


def test_through_a_real_exporter_process(tmp_path: Path) -> None:
    """RecordSink (the engine-core side) -> socket -> exporter process -> OTLP/JSON file: the
    same spans by name and request id, nothing counted lost; the exporter runs nicer."""
    out = tmp_path / "spans.jsonl"
    held = _Held()
    sink = sink_module.RecordSink(["otlp_json"], str(out), held.drain)
    nice = min(19, os.getpriority(os.PRIO_PROCESS, 0) + sink_module.EXPORTER_NICE)
    assert os.getpriority(os.PRIO_PROCESS, sink.exporter.process.pid) == nice  # below the engine's priority
    try:
        stream = _stream()
        held.records = list(stream)
        sink.flush(idle=True)  # one message: the records are far under FLUSH_BYTES
        assert sink.sends == 1 and sink.sender.sent_units == sum(f.n + 1 for f in stream if f.step >= 0) + 2 * 4
        assert sink.exporter.flush(30)
    finally:
        sink.close()
    counts = sink.exporter.counts()
    assert sum(c.dropped + c.failed for c in counts) == 0
    spans = _otlp_json_spans(out)
    direct = _direct(_stream())
    assert sorted(n for n, _ in spans) == sorted(s.name for s in direct)
    assert sorted(a["gen_ai.request.id"] for n, a in spans if n == "engine_request") == \
        ["chatcmpl-a", "chatcmpl-b", "cmpl-c-0", "cmpl-d"]
    assert sum(1 for n, a in spans if n == "decode") == sum(1 for s in direct if s.name == "decode") == 9  # A 4, B 3, C 2


def test_close_is_bounded_when_the_exporter_process_hangs(caplog: pytest.LogCaptureFixture) -> None:
    """vLLM kills an engine core 5 s after asking it to stop: with the exporter process
    stopped dead (SIGSTOP), close() still returns within ~4 s, the child killed, and says
    the spans it could not account for."""
    held = _Held()
    sink = sink_module.RecordSink(["none"], None, held.drain)
    held.records = _stream()
    pid = sink.exporter.process.pid
    os.kill(pid, signal.SIGSTOP)
    start = time.monotonic()
    with caplog.at_level("WARNING", logger="tokentrace.vllm"):
        sink.close()
    elapsed = time.monotonic() - start
    assert 2.5 < elapsed < 4.6, elapsed  # waited for the child's report (3 s), then killed it
    assert sink.exporter.process.poll() is not None
    assert "vLLM spans not exported" in caplog.text, caplog.text


def test_close_stops_the_exporter_even_when_the_last_send_fails(caplog: pytest.LogCaptureFixture) -> None:
    """A record that cannot be read at shutdown: one log line, and the exporter process is
    still stopped (what it holds exported), within the bound."""
    def broken() -> Any:
        raise RuntimeError("a record vLLM changed under us")
        yield  # (a generator, as StepTap.drain)

    sink = sink_module.RecordSink(["none"], None, broken)
    start = time.monotonic()
    with caplog.at_level("ERROR", logger="tokentrace.vllm"):
        sink.close()
    assert time.monotonic() - start < 4.6
    assert sink.exporter.process.poll() is not None
    assert "the last vLLM step records were not sent" in caplog.text, caplog.text


def test_a_send_is_cut_into_messages_of_flush_bytes(tmp_path: Path) -> None:
    """Many steps held (a busy engine at batch 256): one send packs them into several
    messages, each a little over FLUSH_BYTES at most (whole records), none too large for the
    socket; the exporter process rebuilds every span."""
    out = tmp_path / "spans.jsonl"
    held = _Held()
    sink = sink_module.RecordSink(["otlp_json"], str(out), held.drain)
    rows = 256
    try:
        ids = [f"r{i}" for i in range(rows)]
        t = T0
        held.records = [_facts(-1, 0, [], arrivals=[(r, t / 1e9, None, 8) for r in ids])]
        held.records += [_facts(k, k, [(r, 1, 8 + k - 1, 0, 1, 1) for r in ids]) for k in range(1, 40)]
        held.records.append(_facts(-1, 60, [], finished=[(r, FINISHED_LENGTH, T0 + 60 * MS) for r in ids]))
        sink.flush(idle=True)
        # arrivals (~7 KB), then 39 steps of 5,441 bytes (256 × 21 + 65): a message whenever
        # 32 KiB are packed, i.e. the arrivals + 5 steps, then 7 steps per message (38,087
        # bytes), the last 6 with the ends and the IDLE entry: 6 messages
        assert sink.sends == 6 and sink.sender.dropped_messages == 0, sink.sends
        assert sink.exporter.flush(60)
    finally:
        sink.close()
    spans = _otlp_json_spans(out)
    assert sum(1 for n, _ in spans if n == "engine_request") == rows
    assert sum(1 for n, _ in spans if n == "decode") == rows * 39 and sum(1 for n, _ in spans if n == "engine_step") == 39
    assert sum(c.dropped + c.failed for c in sink.exporter.counts()) == 0


def test_a_lost_message_costs_its_spans_and_one_line_per_request(caplog: pytest.LogCaptureFixture) -> None:
    """The exporter never got the message with the arrivals: later steps still give their
    engine_step spans (the unknown requests' tokens counted as discarded), with one warning per
    unknown request, not one per step."""
    stream, encoder = _stream(), records.Encoder()
    for facts in stream[:2]:
        encoder.write(facts)
    encoder.take()  # lost on the way
    for facts in stream[2:6]:
        encoder.write(facts)
    provider, exporter = _provider()
    consumer = records.RecordConsumer(provider)
    with caplog.at_level("WARNING", logger="tokentrace.vllm"):
        consumer.feed(memoryview(bytes(encoder.take()[0])))
    consumer.close()
    spans = exporter.get_finished_spans()
    steps = [s for s in spans if s.name == "engine_step"]
    assert [s.attributes["tokentrace.engine.step"] for s in steps] == [2, 3, 4, 5]
    assert [s.attributes["tokentrace.batch.discarded_sequences"] for s in steps] == [2, 2, 1, 2]
    warned = [r.getMessage() for r in caplog.records if "never saw arrive" in r.getMessage()]
    assert warned == ["tokentrace: engine step 2 names request ?slot-1 it never saw arrive",
                      "tokentrace: engine step 2 names request ?slot-2 it never saw arrive"]


def test_an_idle_engine_forgets_requests_whose_end_was_lost(caplog: pytest.LogCaptureFixture) -> None:
    """The message with a request's FINISH was dropped: at the next IDLE entry (the scheduler
    held no request) the exporter forgets it, says so once and counts it, and the engine looks
    idle again (its engine trace closes, the provider is flushed), instead of holding it for good."""
    stream, encoder = _stream(), records.Encoder()
    provider, exporter = _provider()
    consumer = records.RecordConsumer(provider)
    # everything but the records that finish requests: cut at the first record with a FINISH
    first_finish = next(i for i, f in enumerate(stream) if f.finished)
    for facts in stream[:first_finish]:
        encoder.write(facts)
    consumer.feed(memoryview(bytes(encoder.take()[0])))
    live = len(consumer.builder.live)
    assert live > 0  # requests the exporter now holds with their end lost
    encoder.idle()
    with caplog.at_level("WARNING", logger="tokentrace.vllm"):
        consumer.feed(memoryview(bytes(encoder.take()[0])))
    assert consumer.builder.live == {} and consumer.builder.lost_requests == live and consumer.names == {}
    assert [r.getMessage() for r in caplog.records if "lost their end" in r.getMessage()] == [
        f"tokentrace: {live} vLLM request(s) lost their end in a dropped message; their spans are not exported "
        f"({live} so far)"]
    assert "engine" in {s.name for s in exporter.get_finished_spans()}  # the engine trace closed at idle
    out: list = []
    records.decode(b"\x07", {}, out)
    assert out == [None]


def test_a_failing_hook_counts_the_steps_it_held(caplog: pytest.LogCaptureFixture) -> None:
    """A hook that raises stops tracing: what the tap held is not sent (it may miss an event),
    and its steps are counted, said in the one log line."""
    from instrument.vllm.hooks import ARRIVED, SCHEDULED, UPDATED, StepTap

    tap = StepTap(send=None)
    out = object()
    tap.held += [(ARRIVED, "a", 1.0, None, 4), (SCHEDULED, out), (UPDATED, out), (SCHEDULED, out), (UPDATED, out),
                 (SCHEDULED, object())]
    with caplog.at_level("ERROR", logger="tokentrace.vllm"):
        try:
            raise KeyError("a field vLLM renamed")
        except KeyError:
            tap.fail()
        tap.fail()  # once
    assert tap.failed and tap.held == [] and tap.dropped_steps == 2
    assert caplog.text.count("the vLLM hooks failed") == 1 and "2 steps held not sent" in caplog.text
