"""Traces from the network: the embedded OTLP receiver (``tokentrace collect``: OTLP/gRPC and
OTLP/HTTP in, OTLP/JSON lines out (the format ``tokentrace load`` and the Collector's file exporter share) or, with
``out_format="parquet"``, the Parquet dump ``tokentrace export`` writes), and traces pulled
from a Jaeger query service (:mod:`pull`, ``tokentrace pull``)."""

from __future__ import annotations

from analyzer.collect.convert import filter_invalid_spans, otlp_json_to_request, request_to_otlp_json
from analyzer.collect.receiver import (
    DEFAULT_GRPC_ADDR,
    DEFAULT_HTTP_ADDR,
    OUT_FORMATS,
    Receiver,
    parse_bind_address,
)
from analyzer.collect.sink import ReceiverStats
from analyzer.collect.writer import DEFAULT_ROTATE_BYTES, JsonlWriter

__all__ = [
    "DEFAULT_GRPC_ADDR",
    "DEFAULT_HTTP_ADDR",
    "DEFAULT_ROTATE_BYTES",
    "JsonlWriter",
    "OUT_FORMATS",
    "Receiver",
    "ReceiverStats",
    "filter_invalid_spans",
    "otlp_json_to_request",
    "parse_bind_address",
    "request_to_otlp_json",
]
