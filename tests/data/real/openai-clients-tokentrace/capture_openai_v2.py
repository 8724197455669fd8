"""Capture script for openai-v2-stock.jsonl / openai-v2-httpx2.jsonl (run in a throwaway venv,
not by the tests; README.md beside this file).

Client: official `openai` 3.57 instrumented by opentelemetry-instrumentation-openai-v2 2.4b0
(with opentelemetry-util-genai 1.1b0). MODE `stock`: that instrumentation alone (openai 3.x
speaks httpx2, so no traceparent reaches the server: client and server spans land in separate
traces). MODE `httpx2`: also opentelemetry-instrumentation-httpx 0.66b2's
HTTPX2ClientInstrumentor (a `POST` CLIENT span carries the traceparent to the gateway).
Client spans are written as OTLP/JSON lines to CLIENT_OUT.
Usage: python capture_openai_v2.py BASE_URL CLIENT_OUT stock|httpx2
"""

import json
import sys

import openai
from google.protobuf.json_format import MessageToDict
from opentelemetry import trace
from opentelemetry.exporter.otlp.proto.common.trace_encoder import encode_spans
from opentelemetry.instrumentation.openai_v2 import OpenAIInstrumentor
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor, SpanExporter, SpanExportResult

BASE, OUT, MODE = sys.argv[1], sys.argv[2], sys.argv[3]


class JsonLinesExporter(SpanExporter):
    def export(self, spans):
        with open(OUT, "a") as f:
            f.write(json.dumps(MessageToDict(encode_spans(spans))) + "\n")
        return SpanExportResult.SUCCESS


provider = TracerProvider(resource=Resource.create({"service.name": f"openai-v2-{MODE}"}))
provider.add_span_processor(SimpleSpanProcessor(JsonLinesExporter()))
trace.set_tracer_provider(provider)
OpenAIInstrumentor().instrument()
if MODE == "httpx2":
    from opentelemetry.instrumentation.httpx import HTTPX2ClientInstrumentor

    HTTPX2ClientInstrumentor().instrument()

client = openai.OpenAI(base_url=BASE + "/v1", api_key="none", max_retries=0)
model = client.models.list().data[0].id
messages = [{"role": "user", "content": "Say something."}]
for i in range(3):  # streamed, with the usage chunk
    stream = client.chat.completions.create(model=model, messages=messages, max_tokens=16, temperature=0,
                                            stream=True, stream_options={"include_usage": True},
                                            extra_headers={"X-Request-ID": f"{MODE}-stream-{i}"})
    for _ in stream:
        pass
for i in range(2):  # not streamed
    client.chat.completions.create(model=model, messages=messages, max_tokens=8, temperature=0,
                                   extra_headers={"X-Request-ID": f"{MODE}-whole-{i}"})
if MODE == "stock":  # the client stops reading after 3 chunks and closes the stream
    stream = client.chat.completions.create(model=model, messages=messages, max_tokens=24, temperature=0,
                                            stream=True, extra_headers={"X-Request-ID": f"{MODE}-abandoned"})
    for n, _ in enumerate(stream):
        if n == 2:
            stream.close()
            break
provider.shutdown()
