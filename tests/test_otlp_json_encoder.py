"""The direct OTLP/JSON encoder gives exactly the object the SDK's protobuf encoder + MessageToDict give."""

from __future__ import annotations

import math

import pytest
from opentelemetry import trace
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import SpanLimits, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import Link, SpanContext, SpanKind, Status, StatusCode, TraceFlags, TraceState

from instrument.otlp_json import spans_to_otlp_json, spans_to_otlp_json_via_protobuf


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
    from instrument.generate import traced_generate
    from instrument.tiny_model import load_tiny_model

    exporter = InMemorySpanExporter()
    provider = TracerProvider(span_limits=SpanLimits(max_events=4096))
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    model, tok = load_tiny_model()
    traced_generate(model, tok, "Hello", tracer_provider=provider, max_new_tokens=6)
    spans = list(exporter.get_finished_spans())
    assert {s.name for s in spans} == {"generate", "prefill", "decode"}
    assert type(next(s for s in spans if s.name == "decode")).__name__ == "_StepSpan"
    assert spans_to_otlp_json(spans) == spans_to_otlp_json_via_protobuf(spans)
