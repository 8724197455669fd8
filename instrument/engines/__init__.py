"""Engines behind the gateway (docs/gateway.md, "Engines"): ``sequential`` runs one sequence
at a time through ``traced_generate``; ``continuous`` wraps transformers' own
continuous-batching manager (paged KV cache, one scheduler, batched steps).

Import the submodule you need; this package's ``__init__`` imports nothing heavy.
"""

from __future__ import annotations

from typing import Any

__all__ = ["ENGINE_CHOICES", "create_engine", "span_export_for"]

ENGINE_CHOICES = ("continuous", "sequential")
RECORD_WRITERS = ("continuous",)  # engines that can send step records to a span exporter process


def span_export_for(name: str, asked: str | None = None) -> str:
    """The span-export mode for engine ``name``: ``asked`` (``--span-export``), else
    ``process`` for an engine that writes step records (the continuous engine), ``inline`` for
    the others. The one place the mode is decided; it travels on the tracer provider
    (``setup_tracing(make_exporters=...)``, :func:`~instrument.otel.tracing.span_export_of`).

    Raises ValueError for ``process`` with an engine that writes no step records."""
    from instrument.otel.tracing import SPAN_EXPORT_CHOICES

    if asked is not None and asked not in SPAN_EXPORT_CHOICES:
        raise ValueError(f"--span-export must be one of {', '.join(SPAN_EXPORT_CHOICES)}, got {asked!r}")
    if asked == "process" and name not in RECORD_WRITERS:
        raise ValueError(f"--span-export process applies to --engine {' or '.join(RECORD_WRITERS)} only "
                         "(it writes no step records)")
    return asked or ("process" if name in RECORD_WRITERS else "inline")


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
