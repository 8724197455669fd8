"""Capture script for openllmetry.jsonl (run in a throwaway venv, not by the tests; README.md).

Client: official `openai` 3.57 instrumented by traceloop's opentelemetry-instrumentation-openai
0.62.4 (OpenLLMetry) and opentelemetry-instrumentation-httpx 0.66b2's HTTPX2ClientInstrumentor
(the `POST` span carries the traceparent to the gateway). Client spans are written as OTLP/JSON
lines to CLIENT_OUT. Usage: python capture_openllmetry.py BASE_URL CLIENT_OUT
"""

import json
import sys

import openai
from google.protobuf.json_format import MessageToDict
from opentelemetry import trace
from opentelemetry.exporter.otlp.proto.common.trace_encoder import encode_spans
from opentelemetry.instrumentation.httpx import HTTPX2ClientInstrumentor
from opentelemetry.instrumentation.openai import OpenAIInstrumentor
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor, SpanExporter, SpanExportResult

BASE, OUT = sys.argv[1], sys.argv[2]


class JsonLinesExporter(SpanExporter):
    def export(self, spans):
        with open(OUT, "a") as f:
            f.write(json.dumps(MessageToDict(encode_spans(spans))) + "\n")
        return SpanExportResult.SUCCESS


provider = TracerProvider(resource=Resource.create({"service.name": "openllmetry"}))
provider.add_span_processor(SimpleSpanProcessor(JsonLinesExporter()))
trace.set_tracer_provider(provider)
OpenAIInstrumentor().instrument()
HTTPX2ClientInstrumentor().instrument()

client = openai.OpenAI(base_url=BASE + "/v1", api_key="none", max_retries=0)
model = client.models.list().data[0].id
messages = [{"role": "user", "content": "Say something."}]
for i in range(3):  # streamed, with the usage chunk
    stream = client.chat.completions.create(model=model, messages=messages, max_tokens=16, temperature=0,
                                            stream=True, stream_options={"include_usage": True},
                                            extra_headers={"X-Request-ID": f"ollm-stream-{i}"})
    for _ in stream:
        pass
client.chat.completions.create(model=model, messages=messages, max_tokens=8, temperature=0,
                               extra_headers={"X-Request-ID": "ollm-whole-0"})
provider.shutdown()
