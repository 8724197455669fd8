"""OTLP/gRPC: opentelemetry-proto's ``TraceServiceServicer`` served by a grpcio server.

The service is registered with a raw-bytes request deserializer instead of the generated
``add_TraceServiceServicer_to_server``: grpcio answers a body that fails to deserialize
with INTERNAL, while OTLP asks for INVALID_ARGUMENT (not retryable) for malformed data.
"""

from __future__ import annotations

from concurrent import futures

import grpc
from google.protobuf.message import DecodeError
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
    ExportTraceServiceRequest,
    ExportTraceServiceResponse,
)
from opentelemetry.proto.collector.trace.v1.trace_service_pb2_grpc import TraceServiceServicer

from analyzer.collect.sink import TraceSink

__all__ = ["SERVICE_NAME", "TraceService", "start_grpc_server"]

SERVICE_NAME = "opentelemetry.proto.collector.trace.v1.TraceService"
GRPC_WORKERS = 8


class TraceService(TraceServiceServicer):
    """``Export``: parse, validate, write, then answer (with partial_success when spans were rejected)."""

    def __init__(self, sink: TraceSink) -> None:
        self.sink = sink

    def Export(self, request: bytes, context: grpc.ServicerContext) -> ExportTraceServiceResponse:
        try:
            message = ExportTraceServiceRequest.FromString(request)
        except DecodeError as exc:
            self.sink.count_malformed()
            context.abort(grpc.StatusCode.INVALID_ARGUMENT, f"malformed ExportTraceServiceRequest: {exc}")
        try:
            return self.sink.export(message)
        except (OSError, RuntimeError) as exc:
            context.abort(grpc.StatusCode.UNAVAILABLE, f"could not write the spans: {exc}")
        raise AssertionError("unreachable")  # pragma: no cover - abort raises


def start_grpc_server(sink: TraceSink, host: str, port: int, max_message_bytes: int) -> tuple[grpc.Server, int]:
    """Bind ``host:port`` (0 = an ephemeral port) and start; returns the server and its port.

    Raises OSError when the address cannot be bound (SO_REUSEPORT is off, so a port already
    in use fails instead of being shared).
    """
    server = grpc.server(
        futures.ThreadPoolExecutor(max_workers=GRPC_WORKERS, thread_name_prefix="otlp-grpc"),
        options=[
            ("grpc.so_reuseport", 0),
            ("grpc.max_receive_message_length", max_message_bytes),
        ],
    )
    service = TraceService(sink)
    handler = grpc.unary_unary_rpc_method_handler(
        service.Export,
        request_deserializer=None,
        response_serializer=ExportTraceServiceResponse.SerializeToString,
    )
    server.add_generic_rpc_handlers((grpc.method_handlers_generic_handler(SERVICE_NAME, {"Export": handler}),))
    target = f"[{host}]:{port}" if ":" in host else f"{host}:{port}"
    try:
        bound = server.add_insecure_port(target)
    except RuntimeError as exc:
        raise OSError(f"cannot bind OTLP/gRPC to {target}: {exc}") from None
    if not bound:
        raise OSError(f"cannot bind OTLP/gRPC to {target} (in use or not a local address)")
    server.start()
    return server, bound
