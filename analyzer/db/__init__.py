"""The DuckDB database: opening and checking files, the canonical tables, the views installed on a connection and their state, the derived tables."""

from __future__ import annotations

__all__: list[str] = []
