"""The UTC day that partition pruning computes must equal the day export partitions by."""

from __future__ import annotations

from analyzer.db.source import utc_day_of_ns

MIDNIGHT_NS = 1_767_225_600_000_000_000  # 2026-01-01T00:00:00Z


def test_day_boundary_is_exact_to_the_nanosecond() -> None:
    # A float division (ns / 1e9) rounds the last nanosecond of 2025 up to 2026.
    assert utc_day_of_ns(MIDNIGHT_NS - 1) == "2025-12-31"
    assert utc_day_of_ns(MIDNIGHT_NS) == "2026-01-01"
    assert utc_day_of_ns(MIDNIGHT_NS + 86_400 * 10**9 - 1) == "2026-01-01"
