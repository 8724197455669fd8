"""Epoch nanoseconds as text a person reads: UTC ISO 8601 (the CLI's human view, the report,
the window's bounds beside their ns columns).

Integer arithmetic throughout: a timestamp is truncated to the digits shown, never rounded
up into the next second."""

from __future__ import annotations

import datetime as dt
from typing import Any

__all__ = ["utc_ms_text", "utc_text", "with_utc_bounds"]


def utc_ms_text(ns: int) -> str:
    """Epoch nanoseconds as UTC ISO 8601 to the millisecond, e.g. ``2026-12-03T07:44:52.123Z``."""
    seconds, fraction = divmod(int(ns), 1_000_000_000)
    day = dt.datetime.fromtimestamp(seconds, tz=dt.timezone.utc)
    return f"{day:%Y-%m-%dT%H:%M:%S}.{fraction // 1_000_000:03d}Z"


def utc_text(ns: int | None) -> str | None:
    """A nanosecond epoch timestamp as ISO 8601 UTC with all nine digits of the second,
    e.g. ``2026-01-01T00:00:00.000000000Z`` (integer arithmetic: no float rounding)."""
    if ns is None:
        return None
    seconds, fraction = divmod(int(ns), 1_000_000_000)
    day = dt.datetime.fromtimestamp(seconds, tz=dt.timezone.utc)
    return f"{day:%Y-%m-%dT%H:%M:%S}.{fraction:09d}Z"


def with_utc_bounds(result: Any) -> Any:
    """window.sql's result with ``window_start_utc`` / ``window_end_utc`` beside the ns bounds."""
    from analyzer.query.runner import QueryResult  # lazily: the CLI imports this module at start-up

    columns = list(result.columns)
    rows = [list(r) for r in result.rows]
    for name in ("window_start_ns", "window_end_ns"):
        if name not in columns:
            continue
        at = columns.index(name)
        columns.insert(at + 1, name.replace("_ns", "_utc"))
        for r in rows:
            r.insert(at + 1, utc_text(r[at]))
    return QueryResult(result.name, columns, [tuple(r) for r in rows])
