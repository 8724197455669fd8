"""OpenTelemetry SDK spans (``ReadableSpan``) -> canonical rows.

Useful wherever spans are at hand in-process: tests with an ``InMemorySpanExporter``, an
exporter that writes straight into DuckDB, fixtures. Ids become lowercase hex (trace 32
digits, span 16), times stay OTLP nanoseconds, attributes are split into the typed maps by
:func:`analyzer.db.store.split_attributes` (via the row classes), dropped counts are kept.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from analyzer.db.store import EventRow, LinkRow, SpanRow

__all__ = ["rows_from_sdk_spans", "span_row", "event_rows", "link_rows"]


def _trace_hex(value: int) -> str:
    return f"{value:032x}"


def _span_hex(value: int) -> str:
    return f"{value:016x}"


def _kind(span: Any) -> str:
    kind = getattr(span, "kind", None)
    return "UNSPECIFIED" if kind is None else kind.name


def _status(span: Any) -> tuple[str, str | None]:
    status = getattr(span, "status", None)
    if status is None:
        return "UNSET", None
    return status.status_code.name, status.description


def span_row(span: Any) -> SpanRow:
    """One finished SDK span (``opentelemetry.sdk.trace.ReadableSpan``) as a :class:`SpanRow`.

    Raises ValueError for a span that never ended (no ``end_time``).
    """
    ctx = span.context
    if span.end_time is None or span.start_time is None:
        raise ValueError(f"span {_span_hex(ctx.span_id)} ({span.name!r}) has not ended")
    status_code, status_message = _status(span)
    scope = getattr(span, "instrumentation_scope", None)
    resource = dict(span.resource.attributes) if span.resource is not None else {}
    trace_state = ctx.trace_state.to_header() if ctx.trace_state else None
    return SpanRow(
        trace_id=_trace_hex(ctx.trace_id),
        span_id=_span_hex(ctx.span_id),
        parent_span_id=_span_hex(span.parent.span_id) if span.parent is not None else None,
        name=span.name,
        kind=_kind(span),
        start_ns=int(span.start_time),
        end_ns=int(span.end_time),
        status_code=status_code,
        status_message=status_message or None,
        attributes=dict(span.attributes or {}),
        resource=resource,
        scope_name=scope.name if scope is not None else None,
        scope_version=scope.version if scope is not None else None,
        trace_state=trace_state or None,
        flags=int(ctx.trace_flags),
        dropped_attributes_count=int(getattr(span, "dropped_attributes", 0) or 0),
        dropped_events_count=int(getattr(span, "dropped_events", 0) or 0),
        dropped_links_count=int(getattr(span, "dropped_links", 0) or 0),
    )


def event_rows(span: Any) -> list[EventRow]:
    """The span's events, numbered in the order the SDK kept them (``event_index`` 0-based)."""
    trace_id, span_id = _trace_hex(span.context.trace_id), _span_hex(span.context.span_id)
    rows = []
    for i, event in enumerate(span.events or ()):
        attrs = getattr(event, "attributes", None) or {}
        rows.append(
            EventRow(
                trace_id, span_id, i, int(event.timestamp), event.name, dict(attrs),
                dropped_attributes_count=int(getattr(attrs, "dropped", 0) or 0),
            )
        )
    return rows


def link_rows(span: Any) -> list[LinkRow]:
    """The span's links (``link_index`` 0-based)."""
    trace_id, span_id = _trace_hex(span.context.trace_id), _span_hex(span.context.span_id)
    rows = []
    for i, link in enumerate(span.links or ()):
        ctx = link.context
        attrs = link.attributes or {}
        rows.append(
            LinkRow(
                trace_id, span_id, i, _trace_hex(ctx.trace_id), _span_hex(ctx.span_id),
                trace_state=ctx.trace_state.to_header() if ctx.trace_state else None,
                flags=int(ctx.trace_flags), attributes=dict(attrs),
                dropped_attributes_count=int(getattr(attrs, "dropped", 0) or 0),
            )
        )
    return rows


def rows_from_sdk_spans(spans: Iterable[Any]) -> tuple[list[SpanRow], list[EventRow], list[LinkRow]]:
    """Spans, events and links of finished SDK spans, ready for :func:`analyzer.db.store.insert_rows`."""
    span_out: list[SpanRow] = []
    events: list[EventRow] = []
    links: list[LinkRow] = []
    for span in spans:
        span_out.append(span_row(span))
        events.extend(event_rows(span))
        links.extend(link_rows(span))
    return span_out, events, links
