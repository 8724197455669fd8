"""HuggingFace transformers: traced generate, its recorder and spans, token sampling, model loading (tiny, SmolLM2)."""

from __future__ import annotations

__all__: list[str] = []
