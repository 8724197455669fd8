"""Reader for OTLP/protobuf as the Collector's file exporter writes it (``format: proto``).

Each message is a 4-byte big-endian length followed by a TracesData (= ExportTraceServiceRequest)
message; with ``compression: zstd`` each message body is a zstd frame of its own (and the body
may then be OTLP/JSON, which the Collector writes length-prefixed when compressing too).
Messages are converted to the OTLP/JSON dict shape and mapped by :mod:`otlp_json`, so both
encodings share one mapping. Here "line" means the 1-based message number.
"""

from __future__ import annotations

import struct
from typing import BinaryIO

from analyzer.formats.canonical import Reject, RowSink
from analyzer.formats.inputs import ZSTD_MAGIC
from analyzer.formats.otlp_json import add_traces_data, loads_json

__all__ = ["read_proto_stream", "write_length_prefixed"]


def _decoder():
    from google.protobuf.json_format import MessageToDict
    from opentelemetry.proto.trace.v1.trace_pb2 import TracesData

    def decode(body: bytes) -> dict:
        return MessageToDict(TracesData.FromString(body))

    return decode


def read_proto_stream(stream: BinaryIO, sink: RowSink) -> str:
    """Read length-prefixed messages until EOF; returns ``otlp_proto`` or ``otlp_proto_zstd``.

    A truncated final message counts as ``incomplete_last_line``; an undecodable one is
    rejected as ``invalid_protobuf``.
    """
    decode = _decoder()
    zstd = None
    fmt = "otlp_proto"
    n = 0
    while True:
        prefix = stream.read(4)
        if not prefix:
            break
        n += 1
        if len(prefix) < 4:
            sink.records_read += 1
            sink.reject(Reject(n, n - 1, "incomplete_last_line", prefix.hex(), detail="truncated length prefix"))
            break
        (size,) = struct.unpack(">I", prefix)
        body = stream.read(size)
        sink.progress(4 + len(body))
        if len(body) < size:
            sink.records_read += 1
            sink.reject(Reject(n, n - 1, "incomplete_last_line", body.hex(), detail=f"message {n}: {len(body)} of {size} bytes"))
            break
        if body[:4] == ZSTD_MAGIC:
            fmt = "otlp_proto_zstd"
            if zstd is None:
                import zstandard

                zstd = zstandard.ZstdDecompressor()
            try:
                body = zstd.decompressobj().decompress(body)
            except Exception as e:  # noqa: BLE001 - zstandard.ZstdError and friends
                sink.records_read += 1
                sink.reject(Reject(n, n - 1, "invalid_protobuf", None, detail=f"zstd: {e}"))
                continue
        try:
            doc = loads_json(body) if body[:1] == b"{" else decode(body)
        except Exception as e:  # noqa: BLE001 - DecodeError / JSON errors: a bad record
            sink.records_read += 1
            sink.reject(Reject(n, n - 1, "invalid_protobuf", body.hex()[:100_000], detail=str(e)[:200]))
            continue
        add_traces_data(doc, sink, n)
        sink.maybe_flush()
    return fmt


def write_length_prefixed(messages: list[bytes], *, zstd_level: int | None = None) -> bytes:
    """Frame serialized messages the way the Collector's file exporter does (tests, benchmarks)."""
    out = bytearray()
    comp = None
    if zstd_level is not None:
        import zstandard

        comp = zstandard.ZstdCompressor(level=zstd_level)
    for m in messages:
        body = comp.compress(m) if comp is not None else m
        out += struct.pack(">I", len(body)) + body
    return bytes(out)
