"""The plugin's engine trace: ``engine_step`` spans under an ``engine`` root (docs/spans.md
"vLLM"), written in the exporter process by :class:`~instrument.vllm.spans.SpanBuilder`: a
step of the step ratio's sample as it is read, and under a keep policy the step that ended a
kept request's largest gap once that request has ended (later steps may have been written
by then)."""

from __future__ import annotations

from typing import Any

from opentelemetry import trace
from opentelemetry.context import Context
from opentelemetry.trace import SpanKind

from instrument.vllm.facts import StepFacts

__all__ = ["EngineTrace", "engine_figures"]


def engine_figures(facts: StepFacts, step_attributes: dict[str, Any]) -> tuple[Any, ...]:
    """What a step's engine_step span is written from (``step_attributes``: the step's own,
    completed once its requests are read); ``facts`` is rewritten for the next step, this is not."""
    return (step_attributes, sum(1 for i in range(facts.n) if facts.prefill[i]), facts.waiting, facts.kv_used,
            facts.kv_total, facts.block_tokens, facts.sched_end_ns - facts.start_ns, facts.prefix_hit_tokens,
            facts.start_ns, facts.end_ns, facts.step)


class EngineTrace:
    """The open ``engine`` root (at most ``steps_per_trace`` steps; ends when the engine goes
    idle) and its ``engine_step`` spans (one thread)."""

    def __init__(self, tracer: trace.Tracer, writer: Any, steps_per_trace: int = 1000) -> None:
        self.tracer = tracer
        self.writer = writer
        self.steps_per_trace = steps_per_trace
        self._root: Any = None
        self._context: Context | None = None
        self._last = self._steps = self._end_ns = 0

    def step(self, engine: tuple[Any, ...]) -> None:
        """Write one engine_step span (``engine``: :func:`engine_figures`)."""
        (step_attributes, prefill_sequences, waiting, kv_used, kv_total, block_tokens, schedule_ns, hits, start_ns,
         end_ns, step) = engine
        if self._root is None:
            self._root = self.tracer.start_span("engine", context=Context(), kind=SpanKind.INTERNAL,
                                                start_time=start_ns, attributes={"tokentrace.engine.first_step": step})
            self._context = trace.set_span_in_context(self._root)
            self._last, self._steps, self._end_ns = step, 0, end_ns
        attributes = dict(step_attributes)
        attributes.update({
            "tokentrace.batch.prefill_sequences": prefill_sequences, "tokentrace.batch.waiting": waiting,
            "tokentrace.kv.blocks_used": kv_used, "tokentrace.kv.blocks_total": kv_total,
            "tokentrace.kv.block_tokens": block_tokens,
            "tokentrace.engine.schedule_ns": schedule_ns,
            "tokentrace.prefix_cache.hit_tokens": hits,
        })
        self.writer.write("engine_step", self._context, attributes, start_ns, end_ns)
        # (a kept request's gap step comes once the request has ended: maybe after later steps)
        self._last, self._end_ns = max(self._last, step), max(self._end_ns, end_ns)
        self._steps += 1
        if self._steps >= self.steps_per_trace:
            self.close()

    def close(self) -> None:
        """End the open ``engine`` root (idle, full, or shutdown)."""
        if self._root is None:
            return
        self._root.set_attributes({"tokentrace.engine.last_step": self._last, "tokentrace.engine.steps": self._steps})
        self._root.end(end_time=self._end_ns)
        self._root = self._context = None
