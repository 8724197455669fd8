"""setup_tracing: OTEL_* configuration, and the SDK's real OTLP exporters sending to loopback receivers."""

from __future__ import annotations

import gzip
import http.server
import json
import re
import threading
from concurrent import futures

import pytest

torch = pytest.importorskip("torch")
grpc = pytest.importorskip("grpc")

from google.protobuf import json_format
from opentelemetry.proto.collector.trace.v1 import trace_service_pb2, trace_service_pb2_grpc
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from instrument.hf.generate import traced_generate
from instrument.hf.tiny_model import load_tiny_model
from instrument.otel.otlp_json import otlp_json_ids_to_base64
from instrument.otel.tracing import DEFAULT_SPAN_EVENT_LIMIT, get_tracer, setup_tracing, span_event_limit_of

PROMPT = "Hello world, the quick brown fox"
NEW_TOKENS = 7
OTEL_VARS = (
    "OTEL_SERVICE_NAME", "OTEL_RESOURCE_ATTRIBUTES", "OTEL_TRACES_EXPORTER", "OTEL_EXPORTER_OTLP_ENDPOINT",
    "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", "OTEL_EXPORTER_OTLP_PROTOCOL", "OTEL_EXPORTER_OTLP_TRACES_PROTOCOL",
    "OTEL_SPAN_EVENT_COUNT_LIMIT", "TOKENTRACE_OTLP_JSON_PATH",
)


@pytest.fixture(autouse=True)
def clean_env(monkeypatch):
    for name in OTEL_VARS:
        monkeypatch.delenv(name, raising=False)
    for name in ("no_proxy", "NO_PROXY"):  # loopback receivers must never go through a proxy
        monkeypatch.setenv(name, "127.0.0.1,localhost")


@pytest.fixture(scope="module")
def tiny():
    return load_tiny_model()


class _GrpcReceiver(trace_service_pb2_grpc.TraceServiceServicer):
    def __init__(self) -> None:
        self.requests: list[trace_service_pb2.ExportTraceServiceRequest] = []

    def Export(self, request, context):
        self.requests.append(request)
        return trace_service_pb2.ExportTraceServiceResponse()


@pytest.fixture
def grpc_receiver():
    receiver = _GrpcReceiver()
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=2))
    trace_service_pb2_grpc.add_TraceServiceServicer_to_server(receiver, server)
    port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    yield receiver, f"http://127.0.0.1:{port}"
    server.stop(grace=None)


@pytest.fixture
def http_receiver():
    received: list[trace_service_pb2.ExportTraceServiceRequest] = []
    paths: list[str] = []

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_POST(self):
            body = self.rfile.read(int(self.headers["Content-Length"]))
            if self.headers.get("Content-Encoding") == "gzip":
                body = gzip.decompress(body)
            paths.append(self.path)
            received.append(trace_service_pb2.ExportTraceServiceRequest.FromString(body))
            reply = trace_service_pb2.ExportTraceServiceResponse().SerializeToString()
            self.send_response(200)
            self.send_header("Content-Type", "application/x-protobuf")
            self.send_header("Content-Length", str(len(reply)))
            self.end_headers()
            self.wfile.write(reply)

        def log_message(self, *args):
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield received, paths, f"http://127.0.0.1:{server.server_address[1]}"
    server.shutdown()
    server.server_close()


def _assert_request_spans(requests, expected_input_tokens):
    """The received protobuf holds the contract's span tree for one request."""
    spans, scopes, resources = [], set(), []
    for request in requests:
        for resource_spans in request.resource_spans:
            resources.append({kv.key: kv.value.string_value for kv in resource_spans.resource.attributes})
            for scope_spans in resource_spans.scope_spans:
                scopes.add((scope_spans.scope.name, scope_spans.scope.version))
                spans.extend(scope_spans.spans)
    assert scopes == {("tokentrace", "3")}  # CONTRACT_VERSION (docs/spans.md, "Contract version")
    assert all({"service.name", "service.instance.id", "host.name"} <= set(r) for r in resources)
    (root,) = [s for s in spans if s.name == "generate"]
    (prefill,) = [s for s in spans if s.name == "prefill"]
    decodes = sorted((s for s in spans if s.name == "decode"), key=lambda s: s.start_time_unix_nano)
    attrs = lambda span: {kv.key: kv.value for kv in span.attributes}  # noqa: E731 - a one-line accessor for the asserts below
    assert [attrs(d)["tokentrace.step"].int_value for d in decodes] == list(range(1, NEW_TOKENS))
    assert [attrs(d)["tokentrace.context_tokens"].int_value for d in decodes] == [
        expected_input_tokens + k for k in range(1, NEW_TOKENS)
    ]
    assert [attrs(d)["tokentrace.kv.bytes"].int_value for d in decodes] == [
        256 * (expected_input_tokens + k) for k in range(1, NEW_TOKENS)
    ]
    assert attrs(prefill)["tokentrace.kv.bytes"].int_value == 256 * expected_input_tokens
    assert root.parent_span_id == b""
    assert {s.parent_span_id for s in [prefill, *decodes]} == {root.span_id}
    assert len({s.trace_id for s in spans}) == 1
    times = [prefill.start_time_unix_nano, prefill.end_time_unix_nano]
    for d in decodes:
        times += [d.start_time_unix_nano, d.end_time_unix_nano]
    assert times == sorted(times)
    assert root.start_time_unix_nano <= times[0] and times[-1] <= root.end_time_unix_nano
    assert len(root.events) == NEW_TOKENS and root.dropped_events_count == 0
    assert attrs(root)["tokentrace.generated_tokens"].int_value == NEW_TOKENS


def test_otlp_grpc_exporter_sends_the_span_tree(tiny, grpc_receiver):
    model, tok = tiny
    receiver, endpoint = grpc_receiver
    provider = setup_tracing("grpc-test", exporter="otlp", protocol="grpc", endpoint=endpoint)
    traced_generate(model, tok, PROMPT, tracer_provider=provider, max_new_tokens=NEW_TOKENS)
    assert provider.force_flush(10_000)
    provider.shutdown()
    _assert_request_spans(receiver.requests, len(tok(PROMPT)["input_ids"]))


def test_otlp_http_exporter_configured_from_env(tiny, http_receiver, monkeypatch):
    model, tok = tiny
    received, paths, base_url = http_receiver
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_ENDPOINT", base_url)
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_PROTOCOL", "http/protobuf")
    monkeypatch.setenv("OTEL_SERVICE_NAME", "http-env-test")
    provider = setup_tracing()
    traced_generate(model, tok, PROMPT, tracer_provider=provider, max_new_tokens=NEW_TOKENS)
    assert provider.force_flush(10_000)
    provider.shutdown()
    assert set(paths) == {"/v1/traces"}
    _assert_request_spans(received, len(tok(PROMPT)["input_ids"]))
    names = {kv.value.string_value for r in received for rs in r.resource_spans for kv in rs.resource.attributes
             if kv.key == "service.name"}
    assert names == {"http-env-test"}


def test_otlp_json_lines_are_valid_otlp_json(tiny, tmp_path):
    model, tok = tiny
    path = tmp_path / "spans.jsonl"
    memory = InMemorySpanExporter()
    provider = setup_tracing(exporter="otlp_json", json_path=path, span_exporters=[memory], batch=False)
    traced_generate(model, tok, PROMPT, tracer_provider=provider, max_new_tokens=NEW_TOKENS)
    provider.shutdown()
    lines = path.read_text().splitlines()
    assert lines
    requests = []
    for line in lines:
        obj = json.loads(line)
        for rs in obj["resourceSpans"]:
            for ss in rs["scopeSpans"]:
                for span in ss["spans"]:
                    assert re.fullmatch(r"[0-9a-f]{32}", span["traceId"])
                    assert re.fullmatch(r"[0-9a-f]{16}", span["spanId"])
                    assert "parentSpanId" not in span or re.fullmatch(r"[0-9a-f]{16}", span["parentSpanId"])
                    assert span["kind"] == 1  # SPAN_KIND_INTERNAL, as an integer
                    assert isinstance(span["startTimeUnixNano"], str) and span["startTimeUnixNano"].isdigit()
                    for attr in span.get("attributes", []):
                        if "intValue" in attr["value"]:
                            assert isinstance(attr["value"]["intValue"], str)
        message = json_format.ParseDict(otlp_json_ids_to_base64(obj), trace_service_pb2.ExportTraceServiceRequest())
        requests.append(message)
    _assert_request_spans(requests, len(tok(PROMPT)["input_ids"]))
    in_file = {json.loads(line)["resourceSpans"][0]["scopeSpans"][0]["spans"][0]["spanId"] for line in lines}
    assert in_file <= {format(s.context.span_id, "016x") for s in memory.get_finished_spans()}


def test_arguments_override_environment(monkeypatch):
    monkeypatch.setenv("OTEL_SERVICE_NAME", "from-env")
    monkeypatch.setenv("OTEL_RESOURCE_ATTRIBUTES", "service.instance.id=env-instance,host.name=env-host")
    monkeypatch.setenv("OTEL_SPAN_EVENT_COUNT_LIMIT", "500")
    from_env = setup_tracing(exporter="none")
    assert from_env.resource.attributes["service.name"] == "from-env"
    assert from_env.resource.attributes["service.instance.id"] == "env-instance"
    assert from_env.resource.attributes["host.name"] == "env-host"
    assert span_event_limit_of(get_tracer(from_env)) == 500
    explicit = setup_tracing("from-arg", exporter="none", instance_id="arg-instance", span_event_limit=1000)
    assert explicit.resource.attributes["service.name"] == "from-arg"
    assert explicit.resource.attributes["service.instance.id"] == "arg-instance"
    assert span_event_limit_of(get_tracer(explicit)) == 1000


def test_defaults_name_the_clock_domain():
    provider = setup_tracing(exporter="none")
    attrs = provider.resource.attributes
    assert attrs["service.name"] == "tokentrace"
    assert attrs["service.instance.id"] and attrs["host.name"]
    assert span_event_limit_of(get_tracer(provider)) == DEFAULT_SPAN_EVENT_LIMIT
    # One process is one clock domain: every provider of this process names the same instance.
    assert setup_tracing(exporter="none").resource.attributes["service.instance.id"] == attrs["service.instance.id"]


@pytest.mark.parametrize(
    ("env", "kwargs", "message"),
    [
        ({"OTEL_TRACES_EXPORTER": "zipkin"}, {}, "OTEL_TRACES_EXPORTER"),
        ({}, {"exporter": "jaeger"}, "exporter argument"),
        ({"OTEL_EXPORTER_OTLP_PROTOCOL": "http/json"}, {"exporter": "otlp"}, "OTEL_EXPORTER_OTLP_PROTOCOL"),
        ({"OTEL_SPAN_EVENT_COUNT_LIMIT": "many"}, {"exporter": "none"}, "OTEL_SPAN_EVENT_COUNT_LIMIT"),
        ({}, {"exporter": "otlp_json"}, "json_path"),
    ],
)
def test_bad_settings_name_their_source(monkeypatch, env, kwargs, message):
    for key, value in env.items():
        monkeypatch.setenv(key, value)
    with pytest.raises(ValueError, match=message):
        setup_tracing(**kwargs)


def test_global_provider_is_left_alone():
    from opentelemetry import trace

    before = trace.get_tracer_provider()
    setup_tracing(exporter="none")
    assert trace.get_tracer_provider() is before


def test_the_providers_resource_hashes_once_and_groups_like_the_sdks():
    """setup_tracing's resource keeps its hash (the SDK's OTLP encoder hashes the resource of
    every span it groups): same hash and equality as a plain SDK Resource, both ways, so the
    SDK's encoder still groups its spans with an equal plain resource's."""
    from opentelemetry.exporter.otlp.proto.common.trace_encoder import encode_spans
    from opentelemetry.sdk.resources import Resource
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import SimpleSpanProcessor

    from instrument.otel.tracing import HashOnceResource

    provider = setup_tracing(exporter="none", batch=False, resource_attributes={"deployment.environment": "t"})
    resource = provider.resource
    assert isinstance(resource, HashOnceResource)
    plain = Resource(dict(resource.attributes), resource.schema_url)
    assert type(plain) is Resource
    assert hash(resource) == hash(plain) == Resource.__hash__(resource)
    assert resource == plain and plain == resource and resource != Resource({"service.name": "other"})
    assert resource.merge(Resource({"x": 1})).attributes["x"] == 1
    memory = InMemorySpanExporter()
    provider.add_span_processor(SimpleSpanProcessor(memory))
    other_memory = InMemorySpanExporter()
    other = TracerProvider(resource=plain)
    other.add_span_processor(SimpleSpanProcessor(other_memory))
    get_tracer(provider).start_span("a").end()
    get_tracer(other).start_span("b").end()
    message = encode_spans(list(memory.get_finished_spans()) + list(other_memory.get_finished_spans()))
    assert len(message.resource_spans) == 1
    assert sorted(s.name for ss in message.resource_spans[0].scope_spans for s in ss.spans) == ["a", "b"]
