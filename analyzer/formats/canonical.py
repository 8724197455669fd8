"""The row layout every reader produces, and the sink that counts and batches it.

Readers turn one input shape into tuples in the column order below (the canonical tables of
``analyzer.db.schema`` plus two staging columns) and hand them to a :class:`RowSink`. The sink
counts records and spans read, keeps or raises rejects (strict vs lenient), and flushes
batches to the staging tables (``analyzer.formats.stage``), where deduplication happens.

Staging columns: ``_ord`` numbers spans in file order (0-based; the first of duplicates wins)
and ``_line`` is the 1-based line where the span's record starts (NULL when not line-based).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from analyzer.errors import LoadError

__all__ = [
    "EVENT_COLUMNS",
    "LINK_COLUMNS",
    "Reject",
    "RowSink",
    "SPAN_COLUMNS",
    "STAGE_EVENT_COLUMNS",
    "STAGE_LINK_COLUMNS",
    "STAGE_SPAN_COLUMNS",
]

_ATTRS = ["attr_str", "attr_int", "attr_double", "attr_bool", "attr_json"]
_RESOURCE = ["resource_str", "resource_int", "resource_double", "resource_bool", "resource_json"]

SPAN_COLUMNS: list[str] = [
    "trace_id", "span_id", "parent_span_id", "trace_state", "flags", "name", "kind",
    "start_ns", "end_ns", "status_code", "status_message", "service_name",
    "service_instance_id", "host_name", "clock_domain", "scope_name", "scope_version",
    *_ATTRS, *_RESOURCE, "scope_attributes_json",
    "dropped_attributes_count", "dropped_events_count", "dropped_links_count",
]  # fmt: skip
EVENT_COLUMNS: list[str] = [
    "trace_id", "span_id", "event_index", "time_ns", "name", *_ATTRS, "dropped_attributes_count",
]
LINK_COLUMNS: list[str] = [
    "trace_id", "span_id", "link_index", "linked_trace_id", "linked_span_id", "trace_state",
    "flags", *_ATTRS, "dropped_attributes_count",
]
STAGE_SPAN_COLUMNS: list[str] = [*SPAN_COLUMNS, "_ord", "_line"]
STAGE_EVENT_COLUMNS: list[str] = ["_ord", *EVENT_COLUMNS]
STAGE_LINK_COLUMNS: list[str] = ["_ord", *LINK_COLUMNS]


LENIENT_HINT = "use --lenient to load the other records and keep rejected ones in the rejects table"


@dataclass
class Reject:
    """One rejected record (a line, document or span), kept raw with its reason."""

    line: int | None
    record_index: int | None
    reason: str
    raw: str | None
    trace_id: str | None = None
    span_id: str | None = None
    detail: str = ""


@dataclass
class RowSink:
    """Collects canonical rows from one input file, counting everything it is given.

    ``flush(spans, events, links)`` receives batches of at most ``batch_spans`` spans.
    In strict mode :meth:`reject` raises :class:`LoadError`; an incomplete last line never does.
    """

    file: str
    strict: bool
    flush: Callable[[list, list, list], None]
    batch_spans: int = 20_000
    records_read: int = 0
    spans_read: int = 0
    incomplete_last_line: bool = False
    rejects: list[Reject] = field(default_factory=list)
    reasons: Counter = field(default_factory=Counter)
    spans: list = field(default_factory=list)
    events: list = field(default_factory=list)
    links: list = field(default_factory=list)
    on_progress: Callable[[int], None] | None = None

    def maybe_flush(self) -> None:
        """Flush when a full batch is waiting (readers call this between records)."""
        if len(self.spans) >= self.batch_spans:
            self.flush_now()

    def flush_now(self) -> None:
        if self.spans or self.events or self.links:
            self.flush(self.spans, self.events, self.links)
            self.spans, self.events, self.links = [], [], []

    def reject(self, reject: Reject) -> None:
        """Count one rejected record; strict mode stops the load here."""
        if self.strict and reject.reason != "incomplete_last_line":
            detail = reject.detail
            if reject.span_id or reject.trace_id:
                detail = f"span {reject.span_id or '?'} of trace {reject.trace_id or '?'}" + (f": {detail}" if detail else "")
            raise LoadError(self.file, reject.line, reject.reason, detail, hint=LENIENT_HINT)
        self.reasons[reject.reason] += 1
        if reject.reason == "incomplete_last_line":
            self.incomplete_last_line = True
        self.rejects.append(reject)

    def progress(self, nbytes: int) -> None:
        if self.on_progress is not None:
            self.on_progress(nbytes)


def raw_json(value: Any) -> str:
    """A rejected record's raw text when only the parsed value is at hand."""
    try:
        import orjson

        return orjson.dumps(value, option=orjson.OPT_NON_STR_KEYS).decode()
    except Exception:  # noqa: BLE001 - orjson missing or a value it cannot write
        import json

        return json.dumps(value, default=repr)
