"""An independent Python computation of the engine-step figures (views engine_steps,
request_step_gaps; queries steps, steps_summary, stalls, stalls_groups, stalls_slowest),
straight from span records, for tests to compare the SQL against. Nothing here reads a view.

A span record is a :class:`Span`: built from OpenTelemetry SDK spans (:func:`from_sdk`) or
from an OTLP/JSON lines file (:func:`from_otlp_json_lines`), without the analyzer's loader.
"""

from __future__ import annotations

import json
import math
from collections import defaultdict
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

PREFILL_BUCKETS = [("0", 0, 0), ("1-128", 1, 128), ("129-1024", 129, 1024), (">1024", 1025, None)]
SCHEDULED_BUCKETS = [("1-16", 1, 16), ("17-128", 17, 128), ("129-1024", 129, 1024), (">1024", 1025, None)]


@dataclass(frozen=True)
class Span:
    trace_id: str
    span_id: str
    parent_span_id: str | None
    name: str
    start_ns: int
    end_ns: int
    attrs: dict[str, Any]
    domain: str
    scope: str | None


def _domain(resource: dict[str, Any]) -> str:
    return "|".join(str(resource.get(k, "")) for k in ("service.name", "service.instance.id", "host.name"))


def from_sdk(spans: Iterable[Any]) -> list[Span]:
    out = []
    for s in spans:
        scope = s.instrumentation_scope.name if s.instrumentation_scope is not None else None
        out.append(Span(f"{s.context.trace_id:032x}", f"{s.context.span_id:016x}",
                        f"{s.parent.span_id:016x}" if s.parent is not None else None, s.name, s.start_time,
                        s.end_time, dict(s.attributes or {}), _domain(dict(s.resource.attributes)), scope))
    return out


def _value(v: dict[str, Any]) -> Any:
    if "intValue" in v:
        return int(v["intValue"])
    for key in ("stringValue", "boolValue", "doubleValue"):
        if key in v:
            return v[key]
    if "arrayValue" in v:
        return [_value(x) for x in v["arrayValue"].get("values", [])]
    return None


def from_otlp_json_lines(*paths: Path) -> list[Span]:
    out = []
    for path in paths:
        for line in path.read_text().splitlines():
            for rs in json.loads(line)["resourceSpans"]:
                resource = {a["key"]: _value(a["value"]) for a in rs["resource"]["attributes"]}
                for ss in rs["scopeSpans"]:
                    for s in ss["spans"]:
                        out.append(Span(s["traceId"], s["spanId"], s.get("parentSpanId") or None, s["name"],
                                        int(s["startTimeUnixNano"]), int(s["endTimeUnixNano"]),
                                        {a["key"]: _value(a["value"]) for a in s.get("attributes", [])},
                                        _domain(resource), ss["scope"].get("name")))
    return out


def quantile(values: Sequence[float], p: float) -> float:
    """Linear interpolation between order statistics (numpy's default)."""
    xs = sorted(values)
    h = (len(xs) - 1) * p
    lo = math.floor(h)
    return xs[lo] if lo + 1 >= len(xs) else xs[lo] + (h - lo) * (xs[lo + 1] - xs[lo])


def _bucket(buckets: list[tuple[str, int, int | None]], n: int) -> str:
    return next(label for label, lo, hi in buckets if n >= lo and (hi is None or n <= hi))


def steps(spans: Sequence[Span]) -> list[dict[str, Any]]:
    """One dict per engine_step span, ordered by (domain, step)."""
    rows = []
    for s in spans:
        if s.name != "engine_step" or s.scope != "tokentrace":
            continue
        a = s.attrs
        rows.append({
            "clock_domain": s.domain, "step": a["tokentrace.engine.step"], "start_ns": s.start_ns, "end_ns": s.end_ns,
            "step_ms": (s.end_ns - s.start_ns) / 1e6, "schedule_ms": a["tokentrace.engine.schedule_ns"] / 1e6,
            "execute_ms": (s.end_ns - s.start_ns - a["tokentrace.engine.schedule_ns"]) / 1e6,
            "device_ms": a["tokentrace.device_ns"] / 1e6 if "tokentrace.device_ns" in a else None,
            "batch_size": a["tokentrace.batch.size"], "scheduled_tokens": a["tokentrace.batch.tokens"],
            "prefill_tokens": a["tokentrace.batch.prefill_tokens"],
            "decode_tokens": a["tokentrace.batch.tokens"] - a["tokentrace.batch.prefill_tokens"],
            "prefill_tokens_bucket": _bucket(PREFILL_BUCKETS, a["tokentrace.batch.prefill_tokens"]),
            "scheduled_tokens_bucket": _bucket(SCHEDULED_BUCKETS, a["tokentrace.batch.tokens"]),
            "waiting": a["tokentrace.batch.waiting"], "kv_blocks_used": a["tokentrace.kv.blocks_used"],
            "kv_blocks_total": a["tokentrace.kv.blocks_total"], "kv_block_tokens": a["tokentrace.kv.block_tokens"],
            "kv_used_fraction": a["tokentrace.kv.blocks_used"] / a["tokentrace.kv.blocks_total"],
            "spec_draft_tokens": a.get("tokentrace.spec.draft_tokens", 0),
            "spec_accepted_tokens": a.get("tokentrace.spec.accepted_tokens", 0),
            "trace_id": s.trace_id, "span_id": s.span_id,
        })
    return sorted(rows, key=lambda r: (r["clock_domain"], r["step"]))


def gaps(spans: Sequence[Span]) -> list[dict[str, Any]]:
    """One dict per generated token after the first (engine emission gaps), with its step."""
    by_step = {(r["clock_domain"], r["step"]): r for r in steps(spans)}
    prefill: dict[tuple[str, str], list[Span]] = defaultdict(list)
    decode: dict[tuple[str, str], list[Span]] = defaultdict(list)
    for s in spans:
        if s.scope == "tokentrace" and s.name in ("prefill", "decode"):
            (prefill if s.name == "prefill" else decode)[(s.trace_id, s.parent_span_id)].append(s)
    rows = []
    for key, decodes in decode.items():
        last = max(prefill[key], key=lambda s: s.end_ns)
        prev_emit, prev_step = last.end_ns, last.attrs.get("tokentrace.engine.step")
        for d in sorted(decodes, key=lambda s: s.attrs["tokentrace.step"]):
            k = d.attrs["tokentrace.step"]
            step_id = d.attrs.get("tokentrace.engine.step")
            st = by_step.get((d.domain, step_id))
            # a speculative decode step emits tokens k + 1 .. k + m at once (tokentrace.decode.tokens)
            for i in range(d.attrs.get("tokentrace.decode.tokens", 1)):
                same = i > 0  # came with the token before it, in the same step
                rows.append({
                    "trace_id": key[0], "request_span_id": key[1], "clock_domain": d.domain, "token_index": k + 1 + i,
                    "decode_step": k, "prev_emit_ns": prev_emit, "emit_ns": d.end_ns,
                    "itl_ms": (d.end_ns - prev_emit) / 1e6,
                    "step": step_id, "steps_in_gap": None if step_id is None else step_id - prev_step,
                    "between_steps_ms": None if st is None or same else (st["start_ns"] - prev_emit) / 1e6,
                    **{c: None if st is None else st[c] for c in ("step_ms", "batch_size", "scheduled_tokens",
                                                                  "prefill_tokens", "prefill_tokens_bucket", "waiting",
                                                                  "kv_blocks_used", "kv_blocks_total")},
                })
                prev_emit, prev_step = d.end_ns, step_id
    return sorted(rows, key=lambda r: (r["trace_id"], r["request_span_id"], r["token_index"]))


def _stats(itl: list[float]) -> dict[str, Any]:
    return {"itl_count": len(itl), "itl_mean_ms": sum(itl) / len(itl), "itl_p50_ms": quantile(itl, 0.5),
            "itl_p90_ms": quantile(itl, 0.9), "itl_p99_ms": quantile(itl, 0.99), "itl_max_ms": max(itl)}


def stall_groups(gap_rows: Sequence[dict[str, Any]]) -> dict[tuple[str, str], dict[str, Any]]:
    """(grouping, label) -> gaps and ITL figures, for the gaps that have step data."""
    known = [g for g in gap_rows if g["batch_size"] is not None]
    members: dict[tuple[str, str], list[dict[str, Any]]] = defaultdict(list)
    for g in known:
        members[("prefill_tokens", g["prefill_tokens_bucket"])].append(g)
        members[("batch_size", str(g["batch_size"]))].append(g)
    out = {}
    for key, rows in members.items():
        out[key] = {"gaps": len(rows), "requests": len({(g["trace_id"], g["request_span_id"]) for g in rows}),
                    **_stats([g["itl_ms"] for g in rows]), "step_ms_mean": sum(g["step_ms"] for g in rows) / len(rows)}
    return out


def slowest(spans: Sequence[Span], gap_rows: Sequence[dict[str, Any]], per_request: int) -> list[dict[str, Any]]:
    """The per_request largest gaps of each request and what shared their step."""
    members: dict[tuple[str, int], list[Span]] = defaultdict(list)
    for s in spans:
        if s.scope == "tokentrace" and s.name in ("prefill", "decode") and "tokentrace.engine.step" in s.attrs:
            members[(s.domain, s.attrs["tokentrace.engine.step"])].append(s)
    by_request: dict[tuple[str, str], list[dict[str, Any]]] = defaultdict(list)
    for g in gap_rows:
        by_request[(g["trace_id"], g["request_span_id"])].append(g)
    out = []
    for key in sorted(by_request):
        ranked = sorted(by_request[key], key=lambda g: (-g["itl_ms"], g["token_index"]))[:per_request]
        for rank, g in enumerate(ranked, 1):
            others = [m for m in members[(g["clock_domain"], g["step"])]
                      if (m.trace_id, m.parent_span_id) != key] if g["batch_size"] is not None else None
            row = {**g, "gap_rank": rank}
            if others is not None:
                pre = [m for m in others if m.name == "prefill"]
                largest = max(pre, key=lambda m: (m.attrs["tokentrace.prefill.tokens"], m.parent_span_id), default=None)
                row.update({
                    "shared_sequences": len(others), "shared_prefill_sequences": len(pre),
                    "shared_decode_sequences": len(others) - len(pre),
                    "shared_prefill_tokens": sum(m.attrs["tokentrace.prefill.tokens"] for m in pre),
                    "largest_shared_prefill_request_span_id": largest.parent_span_id if largest else None,
                    "largest_shared_prefill_tokens": largest.attrs["tokentrace.prefill.tokens"] if largest else None,
                    "shared_prefill_request_span_ids": ",".join(sorted(m.parent_span_id for m in pre)),
                    "untraced_sequences": g["batch_size"] - 1 - len(others),
                })
            out.append(row)
    return out


#: steps_summary.sql's defaults: a line over fewer steps, or explaining less of step_ms, is not given.
MIN_FIT_STEPS = 5
MIN_FIT_R2 = 0.5


def _fit(rows: Sequence[dict[str, Any]]) -> tuple[float | None, float | None, float | None]:
    """(slope, intercept, r2); slope and intercept None when the fit does not hold."""
    xs = [r["scheduled_tokens"] for r in rows]
    ys = [r["step_ms"] for r in rows]
    if len(set(xs)) < 2:
        return None, None, None
    mx, my = sum(xs) / len(xs), sum(ys) / len(ys)
    sxx = sum((x - mx) ** 2 for x in xs)
    syy = sum((y - my) ** 2 for y in ys)
    sxy = sum((x - mx) * (y - my) for x, y in zip(xs, ys))
    slope = sxy / sxx
    r2 = 1.0 if syy == 0 else min(1.0, sxy * sxy / (sxx * syy))
    if len(rows) < MIN_FIT_STEPS or r2 < MIN_FIT_R2:
        return None, None, r2
    return slope, my - slope * mx, r2


def step_summary(step_rows: Sequence[dict[str, Any]]) -> dict[tuple[str, str], dict[str, Any]]:
    """(grouping, label) -> steps and step time figures (groups with at least one step)."""
    members: dict[tuple[str, str], list[dict[str, Any]]] = defaultdict(list)
    for r in step_rows:
        members[("all", "all")].append(r)
        members[("batch_size", str(r["batch_size"]))].append(r)
        members[("scheduled_tokens", r["scheduled_tokens_bucket"])].append(r)
    out = {}
    for key, rows in members.items():
        ms = [r["step_ms"] for r in rows]
        slope, intercept, r2 = _fit(rows)
        out[key] = {"steps": len(rows), "step_ms_mean": sum(ms) / len(ms), "step_ms_p50": quantile(ms, 0.5),
                    "step_ms_p90": quantile(ms, 0.9), "step_ms_p99": quantile(ms, 0.99), "step_ms_max": max(ms),
                    "batch_size_mean": sum(r["batch_size"] for r in rows) / len(rows),
                    "ms_per_scheduled_token": slope, "fixed_ms": intercept, "fit_r2": r2}
    return out
