"""What CLI verbs do beyond one query: the demo run, the skew verbs' offset options."""

from __future__ import annotations

__all__: list[str] = []
