"""The continuous engine (docs/gateway.md, "Engines"): transformers' continuous-batching
manager, traced per step.

- ``engine``: :class:`ContinuousEngine`, what the gateway drives;
- ``hooks``: the one module that reads transformers' continuous-batching internals;
- ``request_queue``: waiting, started, preempted, cancelled and expired requests;
- ``spans``: the step and sequence records and the spans written from them;
- ``record_sink``: ``--span-export process``: step records sent instead of spans;
- ``span_builder``: those records' decoder in the span exporter process.

Importing this package imports neither torch nor transformers (the exporter process loads
``span_builder`` through it); ``ContinuousEngine`` and the engine's constants load
``engine`` on first use.
"""

from __future__ import annotations

from typing import Any

__all__ = ["ContinuousEngine", "DEFAULT_KV_BUDGET_BYTES", "DEFAULT_KV_CACHE_TOKENS", "SPAN_EXPORT_CHOICES"]


def __getattr__(name: str) -> Any:
    if name in __all__:
        from instrument.engines.continuous import engine

        return getattr(engine, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
