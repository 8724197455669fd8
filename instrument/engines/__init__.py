"""Engines behind the gateway (docs/gateway.md, "Engines"): ``sequential`` runs one sequence
at a time through ``traced_generate``; ``continuous`` wraps transformers' own
continuous-batching manager (paged KV cache, one scheduler, batched steps).

Import the submodule you need; this package's ``__init__`` imports nothing heavy.
"""

from __future__ import annotations

from typing import Any

__all__ = ["ENGINE_CHOICES", "create_engine"]

ENGINE_CHOICES = ("continuous", "sequential")


def create_engine(name: str, handle: Any, tracer_provider: Any, **options: Any) -> Any:
    """The engine called ``name`` for a loaded :class:`~instrument.hf.model_handle.ModelHandle`.

    ``options``: ``decode_spans`` and ``kv_budget_bytes`` for both; the continuous engine's
    own (``kv_block_tokens``, ``max_batch_tokens``, ...) are listed on
    :class:`~instrument.engines.continuous.ContinuousEngine`.
    """
    if name == "sequential":
        from instrument.engines.sequential import SequentialEngine

        return SequentialEngine(handle, tracer_provider, **options)
    if name == "continuous":
        from instrument.engines.continuous import ContinuousEngine

        return ContinuousEngine(handle, tracer_provider, **options)
    raise ValueError(f"engine: expected one of {', '.join(ENGINE_CHOICES)}, got {name!r}")
