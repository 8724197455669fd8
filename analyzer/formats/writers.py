"""Canonical rows back to OTLP/JSON, OTLP/protobuf and Jaeger JSON (round-trip tests, fixtures).

Input: span dicts with the ``spans`` columns, each with ``events`` and ``links`` lists of
``span_events`` / ``span_links`` column dicts (what ``SELECT`` returns, maps as dicts).
Each span gets its own ResourceSpans/ScopeSpans, which is valid OTLP and keeps every field.
Jaeger JSON cannot carry scope attributes, dropped counts, link fields other than the ids
and ``opentracing.ref_type``, non-scalar attributes, or times finer than microseconds.
"""

from __future__ import annotations

import base64
import json
import math
from collections.abc import Iterable, Mapping
from typing import Any

from analyzer.db.schema import SPAN_KINDS, STATUS_CODES

__all__ = ["to_jaeger_trace", "to_otlp_json", "to_otlp_proto"]


def _any_value(v: Any) -> dict:
    """A plain JSON value (as stored in ``attr_json``) as an OTLP AnyValue."""
    if v is None:
        return {}
    if isinstance(v, bool):
        return {"boolValue": v}
    if isinstance(v, int):
        return {"intValue": str(v)}
    if isinstance(v, float):
        return {"doubleValue": v}
    if isinstance(v, str):
        return {"stringValue": v}
    if isinstance(v, list):
        return {"arrayValue": {"values": [_any_value(x) for x in v]}}
    if isinstance(v, dict) and list(v) == ["bytes_base64"]:
        return {"bytesValue": v["bytes_base64"]}
    return {"kvlistValue": {"values": [{"key": k, "value": _any_value(x)} for k, x in v.items()]}}


def _double(x: float) -> Any:
    return x if math.isfinite(x) else ("NaN" if math.isnan(x) else ("Infinity" if x > 0 else "-Infinity"))


def _attributes(row: Mapping[str, Any], prefix: str) -> list[dict]:
    out: list[dict] = []
    out += [{"key": k, "value": {"stringValue": v}} for k, v in (row.get(f"{prefix}_str") or {}).items()]
    out += [{"key": k, "value": {"intValue": str(v)}} for k, v in (row.get(f"{prefix}_int") or {}).items()]
    out += [{"key": k, "value": {"doubleValue": _double(v)}} for k, v in (row.get(f"{prefix}_double") or {}).items()]
    out += [{"key": k, "value": {"boolValue": v}} for k, v in (row.get(f"{prefix}_bool") or {}).items()]
    out += [{"key": k, "value": _any_value(json.loads(v))} for k, v in (row.get(f"{prefix}_json") or {}).items()]
    return out


def _drop_none(d: dict) -> dict:
    return {k: v for k, v in d.items() if v is not None}


def _otlp_span(s: Mapping[str, Any]) -> dict:
    return _drop_none({
        "traceId": s["trace_id"], "spanId": s["span_id"], "parentSpanId": s.get("parent_span_id"),
        "traceState": s.get("trace_state"), "flags": s.get("flags"), "name": s["name"],
        "kind": SPAN_KINDS.index(s["kind"]), "startTimeUnixNano": str(s["start_ns"]), "endTimeUnixNano": str(s["end_ns"]),
        "attributes": _attributes(s, "attr"), "droppedAttributesCount": s.get("dropped_attributes_count") or None,
        "events": [_drop_none({"timeUnixNano": str(e["time_ns"]), "name": e["name"], "attributes": _attributes(e, "attr"),
                               "droppedAttributesCount": e.get("dropped_attributes_count") or None}) for e in s.get("events", [])],
        "droppedEventsCount": s.get("dropped_events_count") or None,
        "links": [_drop_none({"traceId": ln["linked_trace_id"], "spanId": ln["linked_span_id"], "traceState": ln.get("trace_state"),
                              "flags": ln.get("flags"), "attributes": _attributes(ln, "attr"),
                              "droppedAttributesCount": ln.get("dropped_attributes_count") or None}) for ln in s.get("links", [])],
        "droppedLinksCount": s.get("dropped_links_count") or None,
        "status": _drop_none({"code": STATUS_CODES.index(s["status_code"]), "message": s.get("status_message")}),
    })  # fmt: skip


def to_otlp_json(spans: Iterable[Mapping[str, Any]]) -> dict:
    """A TracesData dict (OTLP/JSON) holding ``spans``, one ResourceSpans per span."""
    out = []
    for s in spans:
        scope = _drop_none({"name": s.get("scope_name"), "version": s.get("scope_version")})
        if s.get("scope_attributes_json"):
            scope["attributes"] = [{"key": k, "value": _any_value(v)} for k, v in json.loads(s["scope_attributes_json"]).items()]
        out.append({"resource": {"attributes": _attributes(s, "resource")}, "scopeSpans": [{"scope": scope, "spans": [_otlp_span(s)]}]})
    return {"resourceSpans": out}


def to_otlp_proto(spans: Iterable[Mapping[str, Any]]) -> bytes:
    """The same TracesData serialized as protobuf (ids as bytes)."""
    from google.protobuf.json_format import ParseDict
    from opentelemetry.proto.trace.v1.trace_pb2 import TracesData

    doc = to_otlp_json(spans)

    def b64(hex_id: str | None) -> str | None:
        return base64.b64encode(bytes.fromhex(hex_id)).decode() if hex_id else None

    for rs in doc["resourceSpans"]:
        for sp in rs["scopeSpans"][0]["spans"]:
            for key in ("traceId", "spanId", "parentSpanId"):
                if key in sp:
                    sp[key] = b64(sp[key])
            for ln in sp.get("links", []):
                ln["traceId"], ln["spanId"] = b64(ln["traceId"]), b64(ln["spanId"])
    return ParseDict(doc, TracesData()).SerializeToString()


_JAEGER_TYPES = (("str", "string"), ("int", "int64"), ("double", "float64"), ("bool", "bool"))


def _jaeger_tags(row: Mapping[str, Any], prefix: str) -> list[dict]:
    return [{"key": k, "type": t, "value": v} for m, t in _JAEGER_TYPES for k, v in (row.get(f"{prefix}_{m}") or {}).items()]


def to_jaeger_trace(spans: list[Mapping[str, Any]]) -> dict:
    """A Jaeger UI trace object (``{traceID, spans, processes}``) of spans sharing one trace id."""
    processes: dict[str, dict] = {}
    out = []
    for s in spans:
        tags = [t for t in _jaeger_tags(s, "resource") if t["key"] != "service.name"]
        proc = {"serviceName": (s.get("resource_str") or {}).get("service.name", ""), "tags": tags}
        pid = next((k for k, v in processes.items() if v == proc), f"p{len(processes) + 1}")
        processes[pid] = proc
        special = [("otel.scope.name", s.get("scope_name")), ("otel.scope.version", s.get("scope_version")),
                   ("otel.status_code", None if s["status_code"] == "UNSET" else s["status_code"]),
                   ("otel.status_description", s.get("status_message")), ("w3c.tracestate", s.get("trace_state")),
                   ("span.kind", None if s["kind"] == "UNSPECIFIED" else s["kind"].lower())]  # fmt: skip
        refs = [{"refType": "CHILD_OF", "traceID": s["trace_id"], "spanID": s["parent_span_id"]}] if s.get("parent_span_id") else []
        refs += [{"refType": "FOLLOWS_FROM" if (ln.get("attr_str") or {}).get("opentracing.ref_type") == "follows_from" else "CHILD_OF",
                  "traceID": ln["linked_trace_id"], "spanID": ln["linked_span_id"]} for ln in s.get("links", [])]  # fmt: skip
        logs = [{"timestamp": e["time_ns"] // 1000,
                 "fields": ([{"key": "event", "type": "string", "value": e["name"]}] if e["name"] else []) + _jaeger_tags(e, "attr")}
                for e in s.get("events", [])]  # fmt: skip
        out.append(_drop_none({
            "traceID": s["trace_id"], "spanID": s["span_id"], "flags": s.get("flags"), "operationName": s["name"],
            "references": refs, "startTime": s["start_ns"] // 1000, "duration": (s["end_ns"] - s["start_ns"]) // 1000,
            "tags": _jaeger_tags(s, "attr") + [{"key": k, "type": "string", "value": v} for k, v in special if v is not None],
            "logs": logs, "processID": pid,
        }))  # fmt: skip
    return {"traceID": spans[0]["trace_id"] if spans else "", "spans": out, "processes": processes}
