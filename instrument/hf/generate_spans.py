"""Turn one recorded generate call into spans, after the fact, with explicit start/end times.

Span shape (docs/spans.md): per sequence, a root ``generate`` (INTERNAL) carrying one
``tokentrace.chunk`` event per emitted chunk and the usage attributes, unless the caller
passes a parent context (the gateway), in which case ``prefill`` and ``decode`` become its
children and the caller owns chunk events and usage. ``prefill`` spans forward-start 0 ->
token 1 emitted; ``decode`` step k spans forward-start k -> token k+1 emitted.
"""

from __future__ import annotations

import functools
import json
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from opentelemetry import trace
from opentelemetry.context import Context
from opentelemetry.sdk.trace import Event
from opentelemetry.trace import SpanKind, Status, StatusCode

from instrument.hf.recorder import RecordedTimeline
from instrument.kv.runtime import RuntimeKV
from instrument.otel.span_writer import ApiSpanWriter, DirectSpanWriter, LazyEvents, resolve_context

__all__ = ["DecodeSpanPolicy", "SequenceTrace", "emit_sequence_spans", "emit_failed_generate_span"]

CHUNK_EVENT = "tokentrace.chunk"


@dataclass(frozen=True)
class DecodeSpanPolicy:
    """Which decode steps get a span: ``all``, ``every:N`` (steps 1, 1+N, 1+2N, ...) or ``none``."""

    every_n_steps: int | None

    @classmethod
    def parse(cls, value: str | DecodeSpanPolicy) -> DecodeSpanPolicy:
        if isinstance(value, DecodeSpanPolicy):
            return value
        text = str(value).strip().lower()
        if text == "all":
            return cls(1)
        if text == "none":
            return cls(None)
        if text.startswith("every:"):
            raw = text.removeprefix("every:")
            if raw.isdigit() and int(raw) >= 1:
                return cls(int(raw))
        raise ValueError(f"decode_spans: expected 'all', 'none' or 'every:N' with N >= 1, got {value!r}")

    def keeps(self, step: int) -> bool:
        """Whether decode step ``step`` (1-based) gets a span (``step in self.steps(step + 1)``)."""
        return self.every_n_steps is not None and (step - 1) % self.every_n_steps == 0

    def steps(self, generated_tokens: int) -> range:
        """The decode steps of a sequence of ``generated_tokens`` tokens that get a span (the
        same rule as :meth:`keeps`; steps 1 .. generated_tokens - 1, step 0 being prefill)."""
        if self.every_n_steps is None:
            return range(0)
        return range(1, generated_tokens, self.every_n_steps)


@dataclass
class SequenceTrace:
    """One sequence of a generate call: counts (tokens) and chunk emission times (ns since epoch).

    ``input_tokens`` I counts the prompt without padding (cached prefix included);
    ``generated_tokens`` G includes a final stop token; ``output_tokens`` O counts visible ones.
    """

    index: int
    input_tokens: int
    cached_tokens: int
    generated_tokens: int
    output_tokens: int
    finish_reason: str
    chunk_emit_ns: list[int]
    chunk_tokens: list[int]
    chunk_visible: list[bool]
    prompt_text: str | None = None
    completion_text: str | None = None
    span_context: trace.SpanContext | None = field(default=None, repr=False)

    def usage_attributes(self) -> dict[str, Any]:
        """``gen_ai.usage.*``, ``tokentrace.generated_tokens`` and finish reason, for a root/gateway span."""
        return {
            "gen_ai.usage.input_tokens": self.input_tokens,
            "gen_ai.usage.output_tokens": self.output_tokens,
            "tokentrace.generated_tokens": self.generated_tokens,
            "gen_ai.response.finish_reasons": (self.finish_reason,),
        }


def _content_attributes(seq: SequenceTrace) -> dict[str, str]:
    out: dict[str, str] = {}
    if seq.prompt_text is not None:
        out["gen_ai.input.messages"] = json.dumps(
            [{"role": "user", "parts": [{"type": "text", "content": seq.prompt_text}]}], ensure_ascii=False
        )
    if seq.completion_text is not None:
        out["gen_ai.output.messages"] = json.dumps(
            [{"role": "assistant", "parts": [{"type": "text", "content": seq.completion_text}],
              "finish_reason": seq.finish_reason}],
            ensure_ascii=False,
        )
    return out


def emit_sequence_spans(
    writer: ApiSpanWriter | DirectSpanWriter,
    seq: SequenceTrace,
    timeline: RecordedTimeline,
    kv: RuntimeKV,
    policy: DecodeSpanPolicy,
    *,
    parent_context: Context | None,
    root_attributes: dict[str, Any],
    call_start_ns: int,
    call_end_ns: int,
) -> trace.SpanContext:
    """Write the spans of one sequence; returns the span context of its root (or of the parent).

    The root is written first (it is already finished: its times are known), then its children.
    """
    if parent_context is None:
        attributes = dict(root_attributes)
        attributes.update(seq.usage_attributes())
        attributes.update(_content_attributes(seq))
        # Lazy spans read these when the exporter does, after the call returned the timeline
        # and sequences to its caller: they read copies (tuples), not the caller's lists.
        events = LazyEvents(functools.partial(chunk_events, tuple(seq.chunk_emit_ns), tuple(seq.chunk_tokens),
                                              tuple(seq.chunk_visible)),
                            len(seq.chunk_emit_ns))
        child_context = resolve_context(writer.write(
            "generate", Context(), attributes, call_start_ns, call_end_ns,
            events,  # type: ignore[arg-type]  # both writers take LazyEvents as they are (otel/span_writer.py)
        ))
    else:
        child_context = parent_context
    result_context = trace.get_current_span(child_context).get_span_context()

    starts = tuple(timeline.forward_start_ns)  # copies, as above: decode steps read them lazily
    emits = tuple(timeline.emit_ns)
    device = tuple(timeline.forward_device_ns) if timeline.forward_device_ns is not None else None
    first_decode_forward = timeline.prefill_forwards  # forward index of decode step 1
    input_tokens = seq.input_tokens

    prefill_attrs: dict[str, Any] = {
        "tokentrace.input_tokens": input_tokens - seq.cached_tokens,
        "tokentrace.cached_tokens": seq.cached_tokens,
    }
    prefill_attrs.update(kv.prefill_attributes())
    prefill_bytes = kv.bytes_held(input_tokens)
    if prefill_bytes is not None:
        prefill_attrs["tokentrace.kv.bytes"] = prefill_bytes
    if device is not None:
        prefill_attrs["tokentrace.device_ns"] = sum(device[:first_decode_forward])
    writer.write("prefill", child_context, prefill_attrs, starts[0], emits[0])

    per_token = kv.layout.kv_bytes_per_token if kv.layout is not None else None
    writer.write_steps(
        "decode", child_context, policy.steps(seq.generated_tokens),
        functools.partial(_step_attributes, input_tokens, per_token, kv.bytes_held, device, first_decode_forward - 1),
        starts, first_decode_forward - 1, emits,  # forward index of step k is first_decode_forward - 1 + k
    )
    return result_context


def chunk_events(emit_ns: Sequence[int], tokens: Sequence[int], visible: Sequence[bool]) -> list[Event]:
    """The ``tokentrace.chunk`` events of a root span: chunk j at ``emit_ns[j]`` (ns since epoch)."""
    return [
        Event(CHUNK_EVENT, {"tokentrace.chunk.index": index, "tokentrace.chunk.tokens": count,
                            "tokentrace.chunk.visible": shown}, at)
        for index, (at, count, shown) in enumerate(zip(emit_ns, tokens, visible))
    ]


def _step_attributes(
    input_tokens: int, per_token: int | None, bytes_held: Any, device: Sequence[int] | None, first_forward: int, step: int
) -> dict[str, Any]:
    """Attributes of decode step ``step`` (built when the exporter reads the span)."""
    attributes: dict[str, Any] = {"tokentrace.step": step, "tokentrace.context_tokens": input_tokens + step}
    if per_token is not None:
        attributes["tokentrace.kv.bytes_per_token"] = per_token
        attributes["tokentrace.kv.bytes"] = bytes_held(input_tokens + step)
    if device is not None:
        attributes["tokentrace.device_ns"] = device[first_forward + step]
    return attributes


def emit_failed_generate_span(
    tracer: trace.Tracer,
    error: BaseException,
    *,
    root_attributes: dict[str, Any],
    call_start_ns: int,
    call_end_ns: int,
) -> None:
    """A ``generate`` root with status ERROR and ``error.type`` when generate raised."""
    span = tracer.start_span(
        "generate", context=Context(), kind=SpanKind.INTERNAL, attributes=root_attributes, start_time=call_start_ns
    )
    span.set_attribute("error.type", type(error).__qualname__)
    span.set_attribute("gen_ai.response.finish_reasons", ("error",))
    span.record_exception(error, timestamp=call_end_ns)
    span.set_status(Status(StatusCode.ERROR, str(error)[:500]))
    span.end(end_time=call_end_ns)
