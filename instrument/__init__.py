"""tokentrace instrumentation: KV math, traced generate, tracing setup.

Public names are imported lazily, so ``import instrument.kv.formula`` stays light (no torch, no
OpenTelemetry SDK) and ``instrument`` never needs duckdb.
"""

from __future__ import annotations

import importlib
from typing import Any

__all__ = [
    "setup_tracing",
    "get_tracer",
    "TracingSetup",
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
    "setup_tracing": "instrument.otel.tracing",
    "get_tracer": "instrument.otel.tracing",
    "TracingSetup": "instrument.otel.tracing",
    "traced_generate": "instrument.hf.generate",
    "instrument_model": "instrument.hf.generate",
    "uninstrument_model": "instrument.hf.generate",
    "TracedGeneration": "instrument.hf.generate",
    "SequenceTrace": "instrument.hf.generate_spans",
    "DecodeSpanPolicy": "instrument.hf.generate_spans",
    "GenerationRecorder": "instrument.hf.recorder",
    "OTLPJsonLinesSpanExporter": "instrument.otel.otlp_json",
    "load_tiny_model": "instrument.hf.tiny_model",
    "load_smollm2": "instrument.hf.smollm2",
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
