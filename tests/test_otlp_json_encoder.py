"""The direct OTLP/JSON encoder gives exactly the object the SDK's protobuf encoder + MessageToDict give."""

from __future__ import annotations

import json
import math

import pytest
from opentelemetry import trace
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import SpanLimits, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import Link, SpanContext, SpanKind, Status, StatusCode, TraceFlags, TraceState

from instrument.otel.otlp_json import spans_to_otlp_json, spans_to_otlp_json_via_protobuf


def _sdk_spans() -> list:
    exporter = InMemorySpanExporter()
    provider = TracerProvider(resource=Resource.create({"service.name": "svc", "host.name": "h", "n": 3}),
                              span_limits=SpanLimits(max_attributes=6, max_events=3))
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    tracer = provider.get_tracer("tokentrace", "1", schema_url="https://example.test/schema")
    other = provider.get_tracer("other-scope")
    remote = SpanContext(0x0123456789ABCDEF0123456789ABCDEF, 0x1122334455667788, is_remote=True,
                         trace_flags=TraceFlags(1), trace_state=TraceState([("vendor", "v1"), ("k", "x")]))
    with tracer.start_as_current_span("root", context=trace.set_span_in_context(trace.NonRecordingSpan(remote)),
                                      kind=SpanKind.SERVER,
                                      attributes={"s": "text", "b": True, "i": 2**40, "f": 0.25, "nan": math.nan,
                                                  "inf": -math.inf, "arr": ["a", "b"], "empty": []}) as root:
        root.add_event("e1", {"k": 1}, timestamp=1_700_000_000_000_000_001)
        root.add_event("e2")
        root.set_status(Status(StatusCode.ERROR, "went wrong"))
        with tracer.start_as_current_span("child", links=[Link(remote, {"why": "follows"}), Link(root.get_span_context())]):
            pass
    with other.start_as_current_span("bare", kind=SpanKind.CLIENT, attributes={f"a{i}": i for i in range(9)}) as bare:
        for k in range(5):
            bare.add_event(f"x{k}", {"ints": [1, 2, 3], "floats": [1.5, 2.0], "bools": [True]})
        bare.set_status(Status(StatusCode.OK))
    return list(exporter.get_finished_spans())


def test_every_shape_matches_the_protobuf_path() -> None:
    spans = _sdk_spans()
    assert spans_to_otlp_json(spans) == spans_to_otlp_json_via_protobuf(spans)
    for span in spans:  # one by one too (one resource, one scope each)
        assert spans_to_otlp_json([span]) == spans_to_otlp_json_via_protobuf([span])
    assert spans_to_otlp_json([]) == spans_to_otlp_json_via_protobuf([]) == {}


def test_the_instruments_own_spans_match_lazy_steps_included() -> None:
    pytest.importorskip("torch")
    from instrument.hf.generate import traced_generate
    from instrument.hf.tiny_model import load_tiny_model

    exporter = InMemorySpanExporter()
    provider = TracerProvider(span_limits=SpanLimits(max_events=4096))
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    model, tok = load_tiny_model()
    traced_generate(model, tok, "Hello", tracer_provider=provider, max_new_tokens=6)
    spans = list(exporter.get_finished_spans())
    assert {s.name for s in spans} == {"generate", "prefill", "decode"}
    assert type(next(s for s in spans if s.name == "decode")).__name__ == "_StepSpan"
    assert spans_to_otlp_json(spans) == spans_to_otlp_json_via_protobuf(spans)


# --- one batch, several resources; bounded encode calls -----------------------
def _two_resource_batch() -> list:
    """Spans of two providers (two resources) interleaved, plus a third provider whose resource
    is a distinct object equal to the first's: the encoder must group by value, as the SDK does."""
    def provider_of(attributes: dict) -> tuple:
        exporter = InMemorySpanExporter()
        provider = TracerProvider(resource=Resource.create(attributes), span_limits=SpanLimits(max_events=1000))
        provider.add_span_processor(SimpleSpanProcessor(exporter))
        return provider, exporter

    (pa, ea), (pb, eb), (pc, ec) = (provider_of({"service.name": "a", "host.name": "h1"}),
                                    provider_of({"service.name": "b", "host.name": "h2", "k": 7}),
                                    provider_of({"service.name": "a", "host.name": "h1"}))
    for provider, tag in ((pa, "a0"), (pb, "b0"), (pc, "c0"), (pa, "a1"), (pb, "b1"), (pc, "c1")):
        tracer = provider.get_tracer("tokentrace", "1") if tag.endswith("0") else provider.get_tracer("other")
        with tracer.start_as_current_span(tag, attributes={"tag": tag}) as span:
            span.add_event("chunk", {"i": 1})
    by_name = {s.name: s for e in (ea, eb, ec) for s in e.get_finished_spans()}
    return [by_name[n] for n in ("a0", "b0", "c0", "a1", "b1", "c1")]


def test_spans_of_two_resources_in_one_batch_match_the_protobuf_path() -> None:
    spans = _two_resource_batch()
    assert spans[0].resource is not spans[2].resource and spans[0].resource == spans[2].resource
    ours = spans_to_otlp_json(spans)
    assert ours == spans_to_otlp_json_via_protobuf(spans)
    services = [{a["key"]: a["value"] for a in rs["resource"]["attributes"]}["service.name"]["stringValue"]
                for rs in ours["resourceSpans"]]
    assert services == ["a", "b"]
    assert [s["name"] for ss in ours["resourceSpans"][0]["scopeSpans"] for s in ss["spans"]] == ["a0", "c0", "a1", "c1"]
    reverse = spans[::-1]
    assert spans_to_otlp_json(reverse) == spans_to_otlp_json_via_protobuf(reverse)


def _many_spans(count: int, events_each: int = 0) -> list:
    exporter = InMemorySpanExporter()
    provider = TracerProvider(resource=Resource.create({"service.name": "svc"}),
                              span_limits=SpanLimits(max_events=10_000))
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    tracer = provider.get_tracer("tokentrace", "1")
    for i in range(count):
        with tracer.start_as_current_span(f"s{i}", attributes={"i": i, "text": "é ✓"}) as span:
            for k in range(events_each):
                span.add_event("tokentrace.chunk", {"tokentrace.chunk.index": k}, timestamp=1_700_000_000_000_000_000 + k)
    return list(exporter.get_finished_spans())


def test_a_batch_larger_than_the_slice_bound_gives_several_lines_holding_every_span_once() -> None:
    from instrument.otel.otlp_json import encode_lines, slice_spans

    spans = _many_spans(23) + _two_resource_batch()
    slices = slice_spans(spans, max_spans=5, max_events=100)
    assert [len(s) for s in slices] == [5, 5, 5, 5, 5, 4]
    lines = encode_lines(spans, max_spans=5, max_events=100)
    assert len(lines) == 6
    names = []
    for line, part in zip(lines, slices):
        assert "\n" not in line
        obj = json.loads(line)
        assert obj == spans_to_otlp_json_via_protobuf(part)
        names += [s["name"] for rs in obj["resourceSpans"] for ss in rs["scopeSpans"] for s in ss["spans"]]
    assert sorted(names) == sorted(s.name for s in spans) and len(set(names)) == len(spans)
    # the event bound closes a slice too: 4 events a span, at most 10 events a slice
    assert [len(s) for s in slice_spans(_many_spans(5, events_each=4), max_spans=64, max_events=10)] == [2, 2, 1]
    with pytest.raises(ValueError, match="slice bounds"):
        slice_spans(spans, max_spans=0)


def test_a_span_with_more_events_than_the_bound_is_dumped_in_pieces_to_the_same_text() -> None:
    from instrument.otel.otlp_json import encode_lines

    spans = _many_spans(3, events_each=25)
    lines = encode_lines(spans, max_spans=64, max_events=10)
    assert len(lines) == 3  # each span alone: 25 events > 10
    for line, span in zip(lines, spans):
        assert line == json.dumps(spans_to_otlp_json([span]), separators=(",", ":"), ensure_ascii=False)
        assert json.loads(line) == spans_to_otlp_json_via_protobuf([span])
        assert len(json.loads(line)["resourceSpans"][0]["scopeSpans"][0]["spans"][0]["events"]) == 25


def test_the_exporter_writes_sliced_lines_that_tokentrace_load_reads(tmp_path) -> None:
    pytest.importorskip("duckdb")
    from analyzer.db.store import connect
    from analyzer.formats.load import load_paths
    from instrument.otel.otlp_json import OTLPJsonLinesSpanExporter

    spans = _many_spans(12) + _many_spans(1, events_each=30)
    path = tmp_path / "spans.jsonl"
    exporter = OTLPJsonLinesSpanExporter(path, max_spans=4, max_events=8)
    assert exporter.export(spans).name == "SUCCESS"
    exporter.shutdown()
    lines = path.read_text(encoding="utf-8").splitlines()
    assert len(lines) == 4  # 4 + 4 + 4 spans, then the 30-event span alone
    con = connect()
    try:
        load_paths(con, [str(path)], lenient=False)
        assert con.execute("select count(*), count(distinct span_id) from spans").fetchone() == (13, 13)
    finally:
        con.close()
    with pytest.raises(ValueError, match="max_spans and max_events"):
        OTLPJsonLinesSpanExporter(path, max_events=0)
