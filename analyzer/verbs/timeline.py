"""The worked example's request-timeline CSV as an input format, and its calculator artifact.

``request-timeline.csv`` (``event,time_ms,detail``) records endpoint events of one request
on one synthetic reference clock. It becomes a synthetic trace in the canonical tables (a
CLIENT span with a chunk event at the first and at the last visible token; a gateway span
and a prefill span when the CSV gives their start), and every timing figure comes from
``queries/requests.sql``; the window figures come from ``queries/window.sql`` over a
synthetic closed cohort built from the counts. KV figures come from :mod:`instrument.kv.formula`.
"""

from __future__ import annotations

import csv
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import duckdb

from analyzer.db.store import EventRow, SpanRow, connect, insert_rows
from analyzer.errors import TimelineError
from analyzer.query.runner import run_query
from instrument.kv.formula import KVLayout, bytes_to_mib

__all__ = [
    "EVENTS",
    "REQUIRED_EVENTS",
    "WindowCounts",
    "compute_artifact",
    "read_timeline_csv",
    "timeline_spans",
    "validate_request",
    "window_cohort_spans",
]

EVENTS = ("client_send", "server_arrival", "scheduler_admit", "first_visible_token", "last_visible_token")
REQUIRED_EVENTS = ("client_send", "first_visible_token", "last_visible_token")
ANCHOR_NS = 1_767_225_600_000_000_000  # 2026-01-01T00:00:00Z: time_ms 0 of a timeline CSV
SCOPE = ("tokentrace", "1")
TRACE_ID = "7031" + "0" * 28  # synthetic ids, fixed so outputs are reproducible
CLIENT_SPAN_ID = "00000000000000c1"
GATEWAY_SPAN_ID = "00000000000000a1"
PREFILL_SPAN_ID = "00000000000000b1"
CLIENT_RESOURCE = {"service.name": "timeline-client", "service.instance.id": "csv", "host.name": "synthetic"}
SERVER_RESOURCE = {"service.name": "timeline-server", "service.instance.id": "csv", "host.name": "synthetic"}


def read_timeline_csv(path: str | Path) -> dict[str, float]:
    """Event name -> time in ms, from a ``event,time_ms[,detail]`` CSV.

    Raises TimelineError naming the file and line for a missing header, an unknown or
    duplicate event, a non-numeric time, or a missing required event.
    """
    path = Path(path)
    try:
        text = path.read_text()
    except FileNotFoundError:
        raise TimelineError(f"{path}: no such file") from None
    except UnicodeDecodeError as exc:
        raise TimelineError(f"{path}: not UTF-8 text ({exc.reason})") from None
    reader = csv.DictReader(text.splitlines())
    fields = reader.fieldnames or []
    if "event" not in fields or "time_ms" not in fields:
        raise TimelineError(f"{path}:1: header must name the columns event,time_ms (got {','.join(fields) or 'nothing'})")
    times: dict[str, float] = {}
    for row in reader:
        line = reader.line_num
        event = (row.get("event") or "").strip()
        if not event:
            raise TimelineError(f"{path}:{line}: empty event name")
        if event not in EVENTS:
            raise TimelineError(f"{path}:{line}: unknown event {event!r}; known events: {', '.join(EVENTS)}")
        if event in times:
            raise TimelineError(f"{path}:{line}: duplicate event {event!r}")
        raw = (row.get("time_ms") or "").strip()
        try:
            value = float(raw)
        except ValueError:
            raise TimelineError(f"{path}:{line}: time_ms {raw!r} is not a number") from None
        if value != value or value in (float("inf"), float("-inf")):
            raise TimelineError(f"{path}:{line}: time_ms {raw!r} is not a finite number")
        times[event] = value
    missing = [e for e in REQUIRED_EVENTS if e not in times]
    if missing:
        raise TimelineError(f"{path}: missing required event(s): {', '.join(missing)}")
    return times


def validate_request(times: dict[str, float], output_tokens: int) -> None:
    """The timeline's rules (docs/metrics.md): s <= f <= e, O >= 1, and e > f when O > 1 (a positive decode time)."""
    s, f, e = times["client_send"], times["first_visible_token"], times["last_visible_token"]
    if not (s <= f <= e):
        raise TimelineError(
            f"invalid visible-output timeline: need client_send <= first_visible_token <= "
            f"last_visible_token, got {s:g} / {f:g} / {e:g} ms"
        )
    if output_tokens < 1:
        raise TimelineError(f"--output-tokens must be >= 1, got {output_tokens}")
    if output_tokens > 1 and e <= f:
        raise TimelineError(
            f"positive decode duration required: {output_tokens} output tokens but "
            f"last_visible_token - first_visible_token = {e - f:g} ms"
        )
    for name in ("server_arrival", "scheduler_admit"):
        if name in times and not (s <= times[name] <= f):
            raise TimelineError(
                f"{name} at {times[name]:g} ms is outside client_send..first_visible_token ({s:g}..{f:g} ms)"
            )


def _ns(ms: float) -> int:
    return ANCHOR_NS + round(ms * 1_000_000)


def timeline_spans(
    times: dict[str, float], input_tokens: int | None, output_tokens: int, kv: KVLayout | None
) -> tuple[list[SpanRow], list[EventRow]]:
    """The synthetic trace of one timeline (span contract shape, ``tokentrace.synthetic``).

    The CSV records only the first and last visible token, so the trace carries two chunk
    events: token 1 at f, and the remaining O - 1 tokens at e. Per-gap ITL is not known.
    """
    s, f, e = (_ns(times[k]) for k in REQUIRED_EVENTS)
    usage: dict[str, Any] = {"gen_ai.usage.output_tokens": output_tokens, "gen_ai.operation.name": "chat"}
    if input_tokens is not None:
        usage["gen_ai.usage.input_tokens"] = input_tokens
    synthetic = {"tokentrace.synthetic": True, "tokentrace.timeline.endpoint_only": True}
    spans = [
        SpanRow(
            TRACE_ID, CLIENT_SPAN_ID, "chat timeline", s, e, kind="CLIENT",
            attributes={**usage, **synthetic}, resource=CLIENT_RESOURCE,
            scope_name=SCOPE[0], scope_version=SCOPE[1],
        )
    ]
    chunks = [(f, 1)] if output_tokens == 1 else [(f, 1), (e, output_tokens - 1)]
    events = [
        EventRow(TRACE_ID, CLIENT_SPAN_ID, i, t, "tokentrace.chunk",
                 {"tokentrace.chunk.index": i, "tokentrace.chunk.tokens": n, "tokentrace.chunk.visible": True})
        for i, (t, n) in enumerate(chunks)
    ]
    if "server_arrival" in times:
        # The CSV has no server-side send times: the gateway span ends at the last visible
        # token on the one synthetic reference clock, and carries no chunk events.
        spans.append(
            SpanRow(
                TRACE_ID, GATEWAY_SPAN_ID, "gateway", _ns(times["server_arrival"]), e, kind="SERVER",
                parent_span_id=CLIENT_SPAN_ID, attributes={**usage, **synthetic},
                resource=SERVER_RESOURCE, scope_name=SCOPE[0], scope_version=SCOPE[1],
            )
        )
        if "scheduler_admit" in times:
            prefill_attrs: dict[str, Any] = dict(synthetic)
            if kv is not None and input_tokens is not None:
                prefill_attrs.update(
                    {
                        "tokentrace.input_tokens": input_tokens,
                        "tokentrace.kv.bytes_per_token": kv.kv_bytes_per_token,
                        "tokentrace.kv.bytes": kv.kv_bytes(input_tokens),
                        "tokentrace.kv.layout": kv.layout,
                    }
                )
            spans.append(
                SpanRow(
                    TRACE_ID, PREFILL_SPAN_ID, "prefill", _ns(times["scheduler_admit"]), f,
                    parent_span_id=GATEWAY_SPAN_ID, attributes=prefill_attrs,
                    resource=SERVER_RESOURCE, scope_name=SCOPE[0], scope_version=SCOPE[1],
                )
            )
    return spans, events


@dataclass(frozen=True)
class WindowCounts:
    """The worked example's system window: a closed cohort described by its counts."""

    window_s: float
    attempted: int
    succeeded: int
    slo_passing: int

    def validate(self) -> None:
        if not self.window_s > 0:
            raise TimelineError(f"invalid system-window denominator: --window-s must be > 0, got {self.window_s:g}")
        if self.attempted <= 0:
            raise TimelineError(f"invalid system-window denominator: --attempted must be > 0, got {self.attempted}")
        if not (0 <= self.slo_passing <= self.succeeded <= self.attempted):
            raise TimelineError(
                "inconsistent request counts: need 0 <= slo_passing <= succeeded <= attempted, got "
                f"{self.slo_passing} <= {self.succeeded} <= {self.attempted}"
            )


def window_cohort_spans(counts: WindowCounts) -> tuple[list[SpanRow], list[EventRow], float]:
    """A synthetic closed cohort with exactly the given counts, and the E2E SLO (ms) it uses.

    Request i starts at i x window / attempted. Requests that meet the SLO last one unit
    (window / (4 x attempted)); succeeded requests that miss it last two units; failed ones
    end with status ERROR. Every request finishes inside the window (no boundary crossing).
    """
    counts.validate()
    window_ns = round(counts.window_s * 1e9)
    step_ns = window_ns // counts.attempted
    unit_ns = max(window_ns // (4 * counts.attempted), 2)
    spans: list[SpanRow] = []
    events: list[EventRow] = []
    for i in range(counts.attempted):
        start = ANCHOR_NS + i * step_ns
        failed = i >= counts.succeeded
        meets = i < counts.slo_passing
        end = start + (unit_ns if (meets or failed) else 2 * unit_ns)
        span_id = f"{i + 1:016x}"
        trace_id = f"{0x7032:04x}{i + 1:028x}"
        spans.append(
            SpanRow(
                trace_id, span_id, "chat cohort", start, end, kind="CLIENT",
                status_code="ERROR" if failed else "OK",
                attributes={
                    "gen_ai.usage.output_tokens": 0 if failed else 1,
                    "gen_ai.response.finish_reasons": ["error" if failed else "stop"],
                    "tokentrace.synthetic": True,
                },
                resource=CLIENT_RESOURCE, scope_name=SCOPE[0], scope_version=SCOPE[1],
            )
        )
        if not failed:
            events.append(
                EventRow(trace_id, span_id, 0, end, "tokentrace.chunk",
                         {"tokentrace.chunk.index": 0, "tokentrace.chunk.tokens": 1, "tokentrace.chunk.visible": True})
            )
    return spans, events, unit_ns / 1e6


def _window_figures(counts: WindowCounts) -> dict[str, Any]:
    spans, events, slo_e2e_ms = window_cohort_spans(counts)
    con = connect(None)
    try:
        insert_rows(con, spans, events)
        row = run_query(
            con,
            "window",
            {
                "window_start_ns": ANCHOR_NS,
                "window_end_ns": ANCHOR_NS + round(counts.window_s * 1e9),
                "mode": "closed_cohort",
                "slo_e2e_ms": slo_e2e_ms,
            },
        ).dicts()[0]
    finally:
        con.close()
    return row


def compute_artifact(
    times: dict[str, float],
    *,
    input_tokens: int | None,
    output_tokens: int,
    kv: KVLayout | None,
    window: WindowCounts | None = None,
    con: duckdb.DuckDBPyConnection | None = None,
) -> dict[str, Any]:
    """The timeline calculator's artifact, every timing figure from queries/requests.sql.

    ``con`` receives the synthetic trace (an in-memory database when None) so callers can
    keep it. Keys are the metric names of docs/metrics.md: ttft_ms, e2e_ms, tpot_ms, ...
    """
    validate_request(times, output_tokens)
    if window is not None:
        window.validate()
    req = _timeline_request_row(con, times, input_tokens, output_tokens, kv)
    limitations = [
        "endpoint-only timeline: it records the first and last visible token only, so the "
        "per-gap ITL distribution (variance, p99) cannot be derived; tpot_ms is the mean gap",
        "synthetic figures on one synthetic reference clock, not provider measurements",
    ]
    artifact: dict[str, Any] = {
        "scope": "full causal attention; no hidden output; logical unsharded KV; synthetic timeline",
        "input_tokens": input_tokens,
        "output_tokens": output_tokens,
        "itl_gaps": output_tokens - 1,
    }
    artifact.update(_kv_figures(kv, input_tokens, output_tokens))
    if kv is not None:
        limitations.extend(kv.limitations)
    for key in ("ttft_ms", "e2e_ms", "tpot_ms", "decode_output_tokens_per_second", "whole_request_output_tokens_per_second"):
        artifact[key] = req[key]
    artifact["itl_ms"] = None
    artifact["itl_note"] = "not derivable from an endpoint-only timeline"
    artifact.update(_window_artifact(window))
    artifact["limitations"] = limitations
    return artifact


def _timeline_request_row(con: duckdb.DuckDBPyConnection | None, times: dict[str, float], input_tokens: int | None,
                          output_tokens: int, kv: KVLayout | None) -> dict[str, Any]:
    """The timeline as a synthetic trace in ``con`` (an in-memory database, closed after, when
    None) and its one client row of queries/requests.sql."""
    own = con is None
    con = con if con is not None else connect(None)
    try:
        spans, events = timeline_spans(times, input_tokens, output_tokens, kv)
        insert_rows(con, spans, events)
        rows = run_query(con, "requests", {"perspective": "client", "trace_id": TRACE_ID}).dicts()
    finally:
        if own:
            con.close()
    if len(rows) != 1:
        raise RuntimeError(f"expected one client request row for the timeline, got {len(rows)}")
    return rows[0]


def _kv_figures(kv: KVLayout | None, input_tokens: int | None, output_tokens: int) -> dict[str, Any]:
    """The artifact's KV keys: the layout and bytes per token, and (with input_tokens) the KV
    held at the prompt and at the stop (bytes, MiB, GiB); None figures without a layout."""
    if kv is None:
        return {"kv_bytes_per_token": None, "prompt_kv_mib": None, "stop_kv_mib": None}
    figures: dict[str, Any] = {
        "kv_layout": kv.to_dict(),
        "kv_bytes_per_token": kv.kv_bytes_per_token,
        "kv_mib_per_token": bytes_to_mib(kv.kv_bytes_per_token),
    }
    if input_tokens is not None:
        prompt = kv.kv_bytes(input_tokens)
        stop = kv.kv_bytes(input_tokens + output_tokens - 1)
        figures.update(
            {
                "prompt_kv_bytes": prompt,
                "prompt_kv_mib": bytes_to_mib(prompt),
                "prompt_kv_gib": prompt / 2**30,
                "stop_kv_bytes": stop,
                "stop_kv_mib": bytes_to_mib(stop),
            }
        )
    return figures


def _window_artifact(window: WindowCounts | None) -> dict[str, Any]:
    """The artifact's system-window keys (s, requests, req/s, a share), None without a window."""
    if window is None:
        return {"window_s": None, "request_throughput_rps": None, "observed_goodput_rps": None, "error_rate": None}
    w = _window_figures(window)
    return {
        "window_s": w["window_s"],
        "attempted": w["attempted"],
        "succeeded": w["succeeded"],
        "slo_passing": w["slo_passing"],
        "request_throughput_rps": w["request_throughput_rps"],
        "observed_goodput_rps": w["observed_goodput_rps"],
        "error_rate": w["error_rate"],
        "window_mode": w["mode"],
    }
