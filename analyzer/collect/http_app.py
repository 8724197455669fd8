"""OTLP/HTTP: ``POST /v1/traces`` with protobuf or JSON bodies, optionally gzip-compressed,
served by Starlette on uvicorn (the ``server`` extra) in a background thread.

Answers follow the OTLP/HTTP spec: 200 with an ExportTraceServiceResponse in the request's
encoding; 400 with a ``google.rpc.Status`` for a malformed body; 413 for a body over the
size limit (compressed or decompressed); 415 for an unknown Content-Type or
Content-Encoding; 503 when the spans could not be written (the sender retries).
"""

from __future__ import annotations

import socket
import threading
import time
import zlib
from typing import Any

from google.protobuf import json_format
from google.protobuf.message import DecodeError, Message
from google.rpc import code_pb2, status_pb2
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest

from analyzer.collect.convert import InvalidRequest, otlp_json_to_request
from analyzer.collect.sink import TraceSink

__all__ = ["HttpServerHandle", "TRACES_PATH", "build_app", "decode_body", "start_http_server"]

TRACES_PATH = "/v1/traces"
PROTOBUF = "application/x-protobuf"
JSON = "application/json"
START_TIMEOUT_S = 10.0
POLL_S = 0.01


class BodyTooLarge(ValueError):
    """The body (or what it decompresses to) is over the receiver's limit."""


def _gunzip(data: bytes, limit_bytes: int) -> bytes:
    inflater = zlib.decompressobj(wbits=16 + zlib.MAX_WBITS)
    try:
        out = inflater.decompress(data, limit_bytes + 1)
    except zlib.error as exc:
        raise InvalidRequest(f"body is not valid gzip: {exc}") from None
    if len(out) > limit_bytes:
        raise BodyTooLarge(f"decompressed body is over {limit_bytes} bytes")
    if not inflater.eof:
        raise InvalidRequest("gzip body is truncated")
    return out


def decode_body(body: bytes, content_type: str, content_encoding: str, limit_bytes: int) -> ExportTraceServiceRequest:
    """Decompress and parse one request body. Raises InvalidRequest, BodyTooLarge or LookupError
    (unsupported type or encoding)."""
    encoding = content_encoding.strip().lower()
    if encoding == "gzip":
        body = _gunzip(body, limit_bytes)
    elif encoding not in ("", "identity"):
        raise LookupError(f"unsupported Content-Encoding {content_encoding!r} (gzip or none)")
    if content_type == PROTOBUF:
        try:
            return ExportTraceServiceRequest.FromString(body)
        except DecodeError as exc:
            raise InvalidRequest(f"malformed protobuf ExportTraceServiceRequest: {exc}") from None
    if content_type == JSON:
        return otlp_json_to_request(body)
    raise LookupError(f"unsupported Content-Type {content_type!r} ({PROTOBUF} or {JSON})")


def _encode(message: Message, content_type: str) -> bytes:
    if content_type == JSON:
        return json_format.MessageToJson(message, use_integers_for_enums=True, indent=None).encode()
    return message.SerializeToString()


def build_app(sink: TraceSink, max_body_bytes: int) -> Any:
    """The Starlette application (one route)."""
    from starlette.applications import Starlette
    from starlette.concurrency import run_in_threadpool
    from starlette.requests import Request
    from starlette.responses import Response
    from starlette.routing import Route

    def status_response(http_code: int, rpc_code: int, message: str, content_type: str) -> Response:
        body = _encode(status_pb2.Status(code=rpc_code, message=message), content_type)
        return Response(body, status_code=http_code, media_type=content_type)

    async def export(request: Request) -> Response:
        content_type = request.headers.get("content-type", "").split(";")[0].strip().lower()
        reply_type = JSON if content_type == JSON else PROTOBUF
        chunks: list[bytes] = []
        size = 0
        async for chunk in request.stream():
            size += len(chunk)
            if size > max_body_bytes:
                sink.count_malformed()
                return status_response(413, code_pb2.RESOURCE_EXHAUSTED, f"body is over {max_body_bytes} bytes", reply_type)
            chunks.append(chunk)
        try:
            message = decode_body(b"".join(chunks), content_type, request.headers.get("content-encoding", ""), max_body_bytes)
        except BodyTooLarge as exc:
            sink.count_malformed()
            return status_response(413, code_pb2.RESOURCE_EXHAUSTED, str(exc), reply_type)
        except LookupError as exc:
            sink.count_malformed()
            return status_response(415, code_pb2.INVALID_ARGUMENT, str(exc), reply_type)
        except InvalidRequest as exc:
            sink.count_malformed()
            return status_response(400, code_pb2.INVALID_ARGUMENT, str(exc), reply_type)
        try:
            response = await run_in_threadpool(sink.export, message)
        except (OSError, RuntimeError) as exc:
            return status_response(503, code_pb2.UNAVAILABLE, f"could not write the spans: {exc}", reply_type)
        return Response(_encode(response, reply_type), status_code=200, media_type=reply_type)

    return Starlette(routes=[Route(TRACES_PATH, export, methods=["POST"])])


class HttpServerHandle:
    """A uvicorn server running in a daemon thread on a socket bound beforehand."""

    def __init__(self, server: Any, thread: threading.Thread, port: int) -> None:
        self.server = server
        self.thread = thread
        self.port = port

    def stop(self, grace_s: float) -> None:
        """Stop accepting, let in-flight requests finish (up to ``grace_s`` seconds), join."""
        self.server.should_exit = True
        self.thread.join(timeout=grace_s + 2.0)


def start_http_server(sink: TraceSink, host: str, port: int, max_body_bytes: int, grace_s: float) -> HttpServerHandle:
    """Bind ``host:port`` (0 = ephemeral) and serve in a thread. Raises OSError if the bind
    fails, ImportError without uvicorn/starlette, RuntimeError if it does not start in time."""
    import uvicorn

    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.create_server((host, port), family=family, reuse_port=False)
    bound_port = int(sock.getsockname()[1])
    config = uvicorn.Config(
        build_app(sink, max_body_bytes),
        log_level="warning",
        lifespan="off",
        access_log=False,
        timeout_graceful_shutdown=max(1, int(grace_s)),
    )
    server = uvicorn.Server(config)
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, name="otlp-http", daemon=True)
    thread.start()
    deadline = time.monotonic() + START_TIMEOUT_S
    while not server.started:
        if not thread.is_alive() or time.monotonic() > deadline:
            server.should_exit = True
            sock.close()
            raise RuntimeError(f"OTLP/HTTP server on {host}:{bound_port} did not start within {START_TIMEOUT_S} s")
        time.sleep(POLL_S)
    return HttpServerHandle(server, thread, bound_port)
