"""tokentrace instrumentation: KV math, traced generate, tracing setup.

Public names are imported lazily, so ``import instrument.kv`` stays light (no torch, no
OpenTelemetry SDK) and ``instrument`` never needs duckdb.
"""

from __future__ import annotations

import importlib
from typing import Any

__all__ = [
    "setup_tracing",
    "get_tracer",
    "traced_generate",
    "instrument_model",
    "uninstrument_model",
    "TracedGeneration",
    "SequenceTrace",
    "DecodeSpanPolicy",
    "GenerationRecorder",
    "OTLPJsonLinesSpanExporter",
    "load_tiny_model",
    "load_smollm2",
]

_HOMES = {
    "setup_tracing": "instrument.tracing",
    "get_tracer": "instrument.tracing",
    "traced_generate": "instrument.generate",
    "instrument_model": "instrument.generate",
    "uninstrument_model": "instrument.generate",
    "TracedGeneration": "instrument.generate",
    "SequenceTrace": "instrument.generate_spans",
    "DecodeSpanPolicy": "instrument.generate_spans",
    "GenerationRecorder": "instrument.recorder",
    "OTLPJsonLinesSpanExporter": "instrument.otlp_json",
    "load_tiny_model": "instrument.tiny_model",
    "load_smollm2": "instrument.smollm2",
}


def __getattr__(name: str) -> Any:
    home = _HOMES.get(name)
    if home is None:
        raise AttributeError(f"module 'instrument' has no attribute {name!r}")
    value = getattr(importlib.import_module(home), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))
