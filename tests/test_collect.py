"""``tokentrace collect`` / ``analyzer.collect.Receiver``: the SDK's real OTLP exporters in,
OTLP/JSON lines out. Loopback and ephemeral ports only; every wait is bounded."""

from __future__ import annotations

import gzip
import json
import re
from pathlib import Path

import duckdb
import grpc
import httpx
import pytest
from click.testing import CliRunner
from opentelemetry.exporter.otlp.proto.grpc.trace_exporter import OTLPSpanExporter as GrpcSpanExporter
from opentelemetry.exporter.otlp.proto.http import Compression
from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter as HttpSpanExporter
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
    ExportTraceServiceRequest,
    ExportTraceServiceResponse,
)
from opentelemetry.proto.trace.v1.trace_pb2 import ResourceSpans, ScopeSpans, Span
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor, SimpleSpanProcessor

from analyzer.cli import cli
from analyzer.collect import Receiver, parse_bind_address

EXPORT_METHOD = "/opentelemetry.proto.collector.trace.v1.TraceService/Export"
FILE_NAME = re.compile(r"^otlp-traces-\d{8}T\d{6}Z-\d{6}\.jsonl$")
TIMEOUT_S = 5.0


def _lines(out_dir: Path) -> list[dict]:
    docs = []
    for path in sorted(out_dir.iterdir()):
        assert FILE_NAME.match(path.name), path.name
        for line in path.read_text(encoding="utf-8").splitlines():
            docs.append(json.loads(line))
    return docs


def _spans(docs: list[dict]) -> list[dict]:
    return [sp for d in docs for rs in d["resourceSpans"] for ss in rs["scopeSpans"] for sp in ss["spans"]]


def _emit(exporter, n: int, batch: bool) -> None:
    provider = TracerProvider(resource=Resource.create({"service.name": "collect-test"}))
    processor = BatchSpanProcessor(exporter, max_export_batch_size=7) if batch else SimpleSpanProcessor(exporter)
    provider.add_span_processor(processor)
    tracer = provider.get_tracer("tokentrace", "1")
    with tracer.start_as_current_span("gateway") as root:
        root.set_attribute("gen_ai.usage.output_tokens", 3)
        for k in range(n - 1):
            with tracer.start_as_current_span("decode") as span:
                span.set_attribute("tokentrace.step", k + 1)
                span.add_event("tokentrace.chunk", {"tokentrace.chunk.index": k})
    assert provider.force_flush(int(TIMEOUT_S * 1000))
    provider.shutdown()


def _loaded_span_count(runner: CliRunner, out_dir: Path, db: Path) -> int:
    result = runner.invoke(cli, ["load", str(out_dir), "--db", str(db), "-q"], catch_exceptions=False)
    assert result.exit_code == 0, result.output
    with duckdb.connect(str(db), read_only=True) as con:
        return con.execute("SELECT count(*) FROM spans").fetchone()[0]


def _request(*spans: Span) -> ExportTraceServiceRequest:
    return ExportTraceServiceRequest(resource_spans=[ResourceSpans(scope_spans=[ScopeSpans(spans=list(spans))])])


GOOD = Span(trace_id=bytes(range(1, 17)), span_id=bytes(range(1, 9)), name="good", kind=2,
            start_time_unix_nano=1_700_000_000_000_000_000, end_time_unix_nano=1_700_000_000_500_000_000)
BAD = Span(trace_id=b"\x01\x02\x03", span_id=bytes(range(1, 9)), name="bad",
           start_time_unix_nano=1, end_time_unix_nano=2)


def test_grpc_exporter_spans_all_written_as_valid_otlp_json(tmp_path: Path, runner: CliRunner) -> None:
    out = tmp_path / "traces"
    n = 25
    with Receiver(out, grpc_addr="127.0.0.1:0", http_addr="off") as rx:
        _emit(GrpcSpanExporter(endpoint=f"127.0.0.1:{rx.grpc_port}", insecure=True, timeout=TIMEOUT_S,
                               compression=grpc.Compression.Gzip), n, batch=False)
    assert rx.stats.spans_written == n and rx.stats.requests_accepted == n
    spans = _spans(_lines(out))
    assert len(spans) == n
    for sp in spans:
        assert re.fullmatch(r"[0-9a-f]{32}", sp["traceId"]) and re.fullmatch(r"[0-9a-f]{16}", sp["spanId"])
        assert isinstance(sp["kind"], int)
        assert isinstance(sp["startTimeUnixNano"], str) and sp["startTimeUnixNano"].isdigit()
    assert _loaded_span_count(runner, out, tmp_path / "t.duckdb") == n


def test_http_exporter_gzip_batches_all_written(tmp_path: Path, runner: CliRunner) -> None:
    out = tmp_path / "traces"
    n = 30
    with Receiver(out, grpc_addr="off", http_addr="127.0.0.1:0") as rx:
        exporter = HttpSpanExporter(endpoint=f"http://127.0.0.1:{rx.http_port}/v1/traces",
                                    compression=Compression.Gzip, timeout=TIMEOUT_S)
        _emit(exporter, n, batch=True)
    assert len(_spans(_lines(out))) == n
    assert rx.stats.requests_accepted >= n // 7  # batches of at most 7
    assert _loaded_span_count(runner, out, tmp_path / "t.duckdb") == n


def test_http_json_body_with_uppercase_hex_ids(tmp_path: Path, samples_dir: Path) -> None:
    body = (samples_dir / "otlp_proto_examples_trace.json").read_bytes()
    with Receiver(tmp_path, grpc_addr="off", http_addr="127.0.0.1:0") as rx:
        r = httpx.post(f"http://127.0.0.1:{rx.http_port}/v1/traces", content=body,
                       headers={"Content-Type": "application/json"}, timeout=TIMEOUT_S)
    assert r.status_code == 200 and r.headers["content-type"].startswith("application/json")
    spans = _spans(_lines(tmp_path))
    expected = _spans([json.loads(body)])
    assert [s["traceId"] for s in spans] == [s["traceId"].lower() for s in expected]


def test_partial_success_http_and_grpc(tmp_path: Path) -> None:
    payload = _request(GOOD, BAD).SerializeToString()
    with Receiver(tmp_path, grpc_addr="127.0.0.1:0", http_addr="127.0.0.1:0") as rx:
        r = httpx.post(f"http://127.0.0.1:{rx.http_port}/v1/traces", content=gzip.compress(payload),
                       headers={"Content-Type": "application/x-protobuf", "Content-Encoding": "gzip"}, timeout=TIMEOUT_S)
        assert r.status_code == 200
        answer = ExportTraceServiceResponse.FromString(r.content)
        assert answer.partial_success.rejected_spans == 1
        assert "traceId is 3 bytes" in answer.partial_success.error_message
        with grpc.insecure_channel(f"127.0.0.1:{rx.grpc_port}") as channel:
            export = channel.unary_unary(EXPORT_METHOD, request_serializer=lambda b: b,
                                         response_deserializer=ExportTraceServiceResponse.FromString)
            answer = export(payload, timeout=TIMEOUT_S)
        assert answer.partial_success.rejected_spans == 1
    spans = _spans(_lines(tmp_path))
    assert [s["name"] for s in spans] == ["good", "good"]
    assert rx.stats.spans_rejected == 2


@pytest.mark.parametrize(
    ("body", "headers", "status"),
    [
        (b"\x0a\xff\xff\xff\x0f", {"Content-Type": "application/x-protobuf"}, 400),
        (b"{not json", {"Content-Type": "application/json"}, 400),
        (b'{"resourceSpans": 7}', {"Content-Type": "application/json"}, 400),
        (b"not gzip at all", {"Content-Type": "application/x-protobuf", "Content-Encoding": "gzip"}, 400),
        (b"", {"Content-Type": "text/plain"}, 415),
        (b"", {"Content-Type": "application/x-protobuf", "Content-Encoding": "br"}, 415),
    ],
)
def test_http_garbage_is_rejected_and_the_receiver_keeps_serving(tmp_path: Path, body: bytes, headers: dict, status: int) -> None:
    with Receiver(tmp_path, grpc_addr="off", http_addr="127.0.0.1:0") as rx:
        url = f"http://127.0.0.1:{rx.http_port}/v1/traces"
        bad = httpx.post(url, content=body, headers=headers, timeout=TIMEOUT_S)
        assert bad.status_code == status, bad.text
        ok = httpx.post(url, content=_request(GOOD).SerializeToString(),
                        headers={"Content-Type": "application/x-protobuf"}, timeout=TIMEOUT_S)
        assert ok.status_code == 200
    assert len(_spans(_lines(tmp_path))) == 1 and rx.stats.requests_malformed == 1


def test_http_body_over_limit_gets_413(tmp_path: Path) -> None:
    big = _request(*[GOOD] * 200).SerializeToString()
    with Receiver(tmp_path, grpc_addr="off", http_addr="127.0.0.1:0", max_body_bytes=1000) as rx:
        url = f"http://127.0.0.1:{rx.http_port}/v1/traces"
        assert httpx.post(url, content=big, headers={"Content-Type": "application/x-protobuf"}, timeout=TIMEOUT_S).status_code == 413
        zipped = httpx.post(url, content=gzip.compress(big), timeout=TIMEOUT_S,
                            headers={"Content-Type": "application/x-protobuf", "Content-Encoding": "gzip"})
        assert zipped.status_code == 413


def test_grpc_garbage_is_invalid_argument_and_the_receiver_keeps_serving(tmp_path: Path) -> None:
    with Receiver(tmp_path, grpc_addr="127.0.0.1:0", http_addr="off") as rx:
        with grpc.insecure_channel(f"127.0.0.1:{rx.grpc_port}") as channel:
            export = channel.unary_unary(EXPORT_METHOD, request_serializer=lambda b: b,
                                         response_deserializer=ExportTraceServiceResponse.FromString)
            with pytest.raises(grpc.RpcError) as info:
                export(b"\x0a\xff\xff\xff\x0f", timeout=TIMEOUT_S)
            assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT
            answer = export(_request(GOOD).SerializeToString(), timeout=TIMEOUT_S)
            assert not answer.HasField("partial_success")
    assert len(_spans(_lines(tmp_path))) == 1


def test_rotation_by_size_keeps_lines_whole(tmp_path: Path) -> None:
    with Receiver(tmp_path, grpc_addr="off", http_addr="127.0.0.1:0", rotate_bytes=600) as rx:
        for _ in range(6):
            r = httpx.post(f"http://127.0.0.1:{rx.http_port}/v1/traces", content=_request(GOOD, GOOD).SerializeToString(),
                           headers={"Content-Type": "application/x-protobuf"}, timeout=TIMEOUT_S)
            assert r.status_code == 200
    files = sorted(tmp_path.iterdir())
    assert len(files) >= 2 and all(f.parent == tmp_path for f in files)
    assert all(f.stat().st_size <= 600 or len(f.read_text().splitlines()) == 1 for f in files)
    assert len(_spans(_lines(tmp_path))) == 12


@pytest.mark.parametrize(
    ("text", "expected"),
    [("127.0.0.1:4317", ("127.0.0.1", 4317)), (":0", ("127.0.0.1", 0)), ("[::1]:4318", ("::1", 4318)),
     ("localhost:1", ("127.0.0.1", 1)), ("0.0.0.0:4317", ("0.0.0.0", 4317)), ("off", None), ("OFF", None)],
)
def test_parse_bind_address(text: str, expected: tuple | None) -> None:
    assert parse_bind_address(text) == expected


@pytest.mark.parametrize("text", ["4317", "example.com:4317", "127.0.0.1:70000", "127.0.0.1:x", "::1:4317", "[::1]4317"])
def test_parse_bind_address_rejects(text: str) -> None:
    with pytest.raises(ValueError):
        parse_bind_address(text)


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--grpc", "example.com:4317"], "is not an IP address"),
        (["--grpc", "off", "--http", "off"], "nothing to receive on"),
    ],
)
def test_cli_collect_user_errors_are_one_line(tmp_path: Path, runner: CliRunner, args: list[str], message: str) -> None:
    result = runner.invoke(cli, ["collect", "--out", str(tmp_path / "o"), *args], catch_exceptions=False)
    assert result.exit_code == 1 and message in result.output and "Traceback" not in result.output


def test_cli_collect_out_is_a_file(tmp_path: Path, runner: CliRunner) -> None:
    target = tmp_path / "file.txt"
    target.write_text("x")
    result = runner.invoke(cli, ["collect", "--out", str(target), "--grpc", ":0", "--http", ":0"], catch_exceptions=False)
    assert result.exit_code != 0 and "Traceback" not in result.output


def test_cli_collect_runs_and_stops(tmp_path: Path, runner: CliRunner) -> None:
    result = runner.invoke(cli, ["collect", "--out", str(tmp_path), "--grpc", ":0", "--http", ":0", "--max-seconds", "0.5"],
                           catch_exceptions=False)
    assert result.exit_code == 0, result.output
    assert re.search(r"listening grpc=127\.0\.0\.1:\d+ http=127\.0\.0\.1:\d+", result.output)


@pytest.mark.parametrize("flag", ["--grpc", "--http"])
def test_cli_collect_port_in_use_is_one_line(tmp_path: Path, runner: CliRunner, flag: str) -> None:
    import socket

    with socket.create_server(("127.0.0.1", 0)) as busy:
        port = busy.getsockname()[1]
        other = "--http" if flag == "--grpc" else "--grpc"
        result = runner.invoke(cli, ["collect", "--out", str(tmp_path), flag, f"127.0.0.1:{port}", other, "off"],
                               catch_exceptions=False)
    assert result.exit_code == 1 and "cannot listen" in result.output and "Traceback" not in result.output
