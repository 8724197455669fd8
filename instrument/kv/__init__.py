"""KV cache math: the logical formula from a model config (formula, no torch) and the
runtime view of a live cache (runtime)."""

from __future__ import annotations

__all__: list[str] = []
