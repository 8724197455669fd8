"""tokentrace's vLLM general plugin: entry point ``vllm.general_plugins:tokentrace``.

vLLM calls :func:`register` in every process it starts (API server, engine core, workers).
It does nothing unless ``TOKENTRACE_VLLM_TRACING=1``; then, on the vLLM version the hooks
were checked on (:data:`instrument.vllm.hooks.TESTED_VLLM`), it wraps the V1 scheduler's
methods (only the engine-core process ever builds a scheduler, so only there does anything
run) and starts the span pipeline on the first scheduler step. On any other version it logs
one line and vLLM runs untraced. Calling it twice is harmless.

``TOKENTRACE_VLLM_STATS=FILE``: whenever the engine goes idle, the plugin rewrites FILE with
its own cost so far (JSON: ``steps``, ``tokens``, ``hook_cpu_ns`` on the engine thread,
``span_cpu_ns`` on its span thread; benchmarks/vllm_tracing_cost.py reads it).

Spans leave through the standard ``OTEL_*`` variables (instrument/tracing.py) and, when
``TOKENTRACE_OTLP_JSON`` names a file, the OTLP/JSON lines exporter (alone, unless
``OTEL_TRACES_EXPORTER`` names others too). docs/spans.md "vLLM" has the span contract.
"""

from __future__ import annotations

import atexit
import logging
import os
import threading
from typing import Any

__all__ = ["ENV_ENABLE", "ENV_JSON", "ENV_STATS", "register"]

ENV_ENABLE = "TOKENTRACE_VLLM_TRACING"
ENV_JSON = "TOKENTRACE_OTLP_JSON"
ENV_STATS = "TOKENTRACE_VLLM_STATS"
log = logging.getLogger("tokentrace.vllm")
_lock = threading.Lock()
_state: dict[str, Any] = {}


def register() -> None:
    """vLLM's plugin hook: install the scheduler hooks when enabled (idempotent)."""
    if os.environ.get(ENV_ENABLE) != "1":
        return
    with _lock:
        if "tap" in _state or "refused" in _state:
            return
        from instrument.vllm import hooks

        try:
            hooks.check_version()
        except ValueError as exc:
            _state["refused"] = True
            log.warning("%s", exc)
            return
        tap = hooks.StepTap(_start_pipeline)
        _state["tap"] = tap
        hooks.install(tap)


def _exporters() -> list[str]:
    names = [n.strip() for n in os.environ.get("OTEL_TRACES_EXPORTER", "").split(",") if n.strip()]
    if os.environ.get(ENV_JSON):
        if "otlp_json" not in names:
            names.append("otlp_json")
    elif not names:
        names = ["otlp"]
    return names


def _start_pipeline(facts: Any) -> None:
    """First record: build the tracer provider and pipeline (lazily, in the engine-core process)."""
    from instrument.tracing import get_tracer, setup_tracing
    from instrument.vllm.hooks import external_request_id
    from instrument.vllm.spans import BackgroundSpanPipeline, SpanBuilder

    tap = _state["tap"]
    provider = setup_tracing(exporter=_exporters(), json_path=os.environ.get(ENV_JSON))
    stats_path = os.environ.get(ENV_STATS)

    def on_idle() -> None:
        provider.force_flush()
        if stats_path:
            _write_stats(stats_path, tap, builder, pipeline)

    builder = SpanBuilder(get_tracer(provider), request_id_of=external_request_id, on_idle=on_idle)
    pipeline = BackgroundSpanPipeline(builder, tap.recycle)
    tap._consume = pipeline.put
    _state["pipeline"], _state["provider"] = pipeline, provider

    def close() -> None:
        pipeline.close()
        if tap.dropped_steps:
            log.warning("tokentrace: %d engine steps not traced (record pool empty)", tap.dropped_steps)
        provider.shutdown()

    atexit.register(close)
    log.info("tokentrace: tracing vLLM scheduler steps (exporters: %s)", ", ".join(_exporters()))
    pipeline.put(facts)


def _write_stats(path: str, tap: Any, builder: Any, pipeline: Any) -> None:
    """The plugin's own cost so far, as JSON (replaced atomically)."""
    import json

    stats = {"steps": builder.steps, "tokens": builder.tokens, "hook_cpu_ns": tap.hook_cpu_ns,
             "span_cpu_ns": pipeline.cpu_ns, "dropped_steps": tap.dropped_steps}
    tmp = f"{path}.tmp"
    with open(tmp, "w") as out:
        json.dump(stats, out)
    os.replace(tmp, path)
