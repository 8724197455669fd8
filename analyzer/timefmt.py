"""Epoch nanoseconds as text a person reads: UTC ISO 8601 (the CLI's human view, the report).

Integer arithmetic throughout: a timestamp is truncated to the digits shown, never rounded
up into the next second."""

from __future__ import annotations

import datetime as dt

__all__ = ["utc_ms_text"]


def utc_ms_text(ns: int) -> str:
    """Epoch nanoseconds as UTC ISO 8601 to the millisecond, e.g. ``2026-12-03T07:44:52.123Z``."""
    seconds, fraction = divmod(int(ns), 1_000_000_000)
    day = dt.datetime.fromtimestamp(seconds, tz=dt.timezone.utc)
    return f"{day:%Y-%m-%dT%H:%M:%S}.{fraction // 1_000_000:03d}Z"
