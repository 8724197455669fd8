"""``traced_generate``: HuggingFace ``generate`` with a prefill span and one span per decode step.

The hot path only records timestamps (:mod:`instrument.hf.recorder`); spans are created after
``generate`` returns, with explicit start/end times (:mod:`instrument.hf.generate_spans`), and
exported by the provider's span processor (batched, off the request path).

With a parent context (the gateway) no ``generate`` root is created: ``prefill``
and ``decode`` become children of the caller's span, and the caller puts chunk events and
usage on its own span from the returned :class:`TracedGeneration`::

    ctx = opentelemetry.trace.set_span_in_context(gateway_span)
    result = traced_generate(model, tok, messages, tracer_provider=provider,
                             parent_context=ctx, streamer=my_streamer, max_new_tokens=256)
    gateway_span.set_attributes(result.sequences[0].usage_attributes())
"""

from __future__ import annotations

import functools
import os
import weakref
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from opentelemetry.context import Context

from instrument.clock import now_wall_ns
from instrument.hf.generate_spans import DecodeSpanPolicy, SequenceTrace, emit_failed_generate_span, emit_sequence_spans
from instrument.hf.recorder import GenerationRecorder, RecordedTimeline, model_device
from instrument.kv.runtime import RuntimeKV, inspect_runtime_kv
from instrument.otel.span_writer import span_writer_for
from instrument.otel.tracing import get_tracer, span_event_limit_of

__all__ = ["TracedGeneration", "traced_generate", "instrument_model", "uninstrument_model", "CAPTURE_CONTENT_ENV"]

CAPTURE_CONTENT_ENV = "OTEL_INSTRUMENTATION_GENAI_CAPTURE_MESSAGE_CONTENT"
_UNSUPPORTED_KWARGS = {
    "assistant_model": "assisted generation",
    "prompt_lookup_num_tokens": "prompt-lookup (speculative) decoding",
    "assistant_early_exit": "self-speculative decoding",
}


@dataclass
class TracedGeneration:
    """What ``traced_generate`` returns: ``output`` is exactly what ``generate`` returned."""

    output: Any
    sequences: list[SequenceTrace]
    timeline: RecordedTimeline
    kv: RuntimeKV
    call_start_ns: int
    call_end_ns: int


def _capture_content(value: bool | None) -> bool:
    if value is not None:
        return value
    return os.environ.get(CAPTURE_CONTENT_ENV, "").strip().lower() in ("true", "1", "yes")


def _model_inputs(model: Any, tokenizer: Any, inputs: Any, device: Any) -> tuple[dict[str, Any], str]:
    """Tensors for ``generate`` (on ``device``, the model's) and the operation name (``chat`` for messages)."""
    import torch

    operation = "text_completion"
    if isinstance(inputs, str) or (isinstance(inputs, list) and inputs and all(isinstance(i, str) for i in inputs)):
        if tokenizer is None:
            raise ValueError("inputs: text prompts need a tokenizer (tokenizer=None was given)")
        batch = tokenizer(inputs, return_tensors="pt", padding=not isinstance(inputs, str), padding_side="left")
        tensors = dict(batch)
    elif isinstance(inputs, list) and inputs and all(isinstance(i, Mapping) and "role" in i for i in inputs):
        if tokenizer is None:
            raise ValueError("inputs: chat messages need a tokenizer with a chat template (tokenizer=None was given)")
        batch = tokenizer.apply_chat_template(inputs, add_generation_prompt=True, return_dict=True, return_tensors="pt")
        tensors, operation = dict(batch), "chat"
    elif isinstance(inputs, Mapping):
        tensors = dict(inputs)
        if "input_ids" not in tensors:
            raise ValueError("inputs: a mapping of tensors must contain 'input_ids'")
    elif isinstance(inputs, torch.Tensor):
        tensors = {"input_ids": inputs if inputs.dim() == 2 else inputs.unsqueeze(0)}
    else:
        raise ValueError(
            f"inputs: expected a prompt string, a list of strings, chat messages, a mapping with input_ids "
            f"or a tensor of token ids, got {type(inputs).__name__}"
        )
    return {
        k: (v.to(device) if isinstance(v, torch.Tensor) and device is not None and v.device != device else v)
        for k, v in tensors.items()
    }, operation


def _generation_settings(model: Any, kwargs: dict[str, Any], prompt_tokens: int) -> tuple[Any, int, set[int]]:
    """(generation config, max new tokens, eos ids) as generate will resolve them."""
    for name, what in _UNSUPPORTED_KWARGS.items():
        if kwargs.get(name) is not None:
            raise ValueError(f"{name}: {what} is not supported by traced_generate (chunk/step mapping would be wrong)")
    config = kwargs.get("generation_config") or model.generation_config
    num_beams = kwargs.get("num_beams", getattr(config, "num_beams", 1)) or 1
    if num_beams > 1:
        raise ValueError(f"num_beams: beam search ({num_beams} beams) is not supported by traced_generate")
    max_new = kwargs.get("max_new_tokens", getattr(config, "max_new_tokens", None))
    if max_new is None:
        max_length = kwargs.get("max_length", getattr(config, "max_length", None)) or 20
        max_new = max(max_length - prompt_tokens, 0)
    eos = kwargs.get("eos_token_id", getattr(config, "eos_token_id", None))
    eos_ids = set(eos if isinstance(eos, (list, tuple)) else ([] if eos is None else [eos]))
    return config, int(max_new), {int(i) for i in eos_ids}


_VISIBLE: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()  # tokenizer -> {token id: visible}


def _visible_ids(tokenizer: Any, token_ids: set[int], eos_ids: set[int]) -> set[int]:
    """Token ids whose text delta is non-empty (special tokens and stop tokens are not visible).

    Each tokenizer's answers are remembered (a token's decoded text does not change), so a
    call decodes only ids it has not seen before.
    """
    candidates = token_ids - eos_ids
    if tokenizer is None:
        return candidates
    try:
        known = _VISIBLE.setdefault(tokenizer, {})
    except TypeError:  # a tokenizer that cannot be weakly referenced
        known = {}
    new = sorted(i for i in candidates if i not in known)
    if new:
        texts = tokenizer.batch_decode([[i] for i in new], skip_special_tokens=True)
        if len(known) > 1_000_000:
            known.clear()
        known.update((i, text != "") for i, text in zip(new, texts))
    return {i for i in candidates if known[i]}


def _cached_tokens(generate_kwargs: Mapping[str, Any]) -> int:
    """Tokens already held by a cache the caller passed (``past_key_values`` / ``cache``)."""
    user_cache = generate_kwargs.get("past_key_values", generate_kwargs.get("cache"))
    return int(user_cache.get_seq_length()) if user_cache is not None else 0


def _prompt_lengths(tensors: Mapping[str, Any], padded_prompt_tokens: int, batch_rows: int) -> list[int]:
    """Each prompt row's own length (its attention mask's sum; the padded length without one)."""
    mask = tensors.get("attention_mask")
    return mask.sum(dim=-1).tolist() if mask is not None else [padded_prompt_tokens] * batch_rows


def _check_traceable(tracer: Any, parent_context: Context | None, sequences: int, max_new_tokens: int) -> None:
    """ValueError when the call cannot be traced whole: more than one sequence under one
    parent span, or more new tokens than the tracer's span event limit (a chunk event each)."""
    if parent_context is not None and sequences > 1:
        raise ValueError("parent_context: one parent span is one request; pass a batch of 1 sequence")
    event_limit = span_event_limit_of(tracer)
    if parent_context is None and event_limit is not None and event_limit < max_new_tokens:
        raise ValueError(
            f"max_new_tokens ({max_new_tokens}) exceeds the tracer provider's span event limit ({event_limit}): "
            "chunk events would be dropped; use setup_tracing() or SpanLimits(max_events=...) above it"
        )


def _root_attributes(model: Any, model_name: str | None, operation: str, max_new_tokens: int, config: Any,
                     generate_kwargs: Mapping[str, Any]) -> dict[str, Any]:
    """The ``gen_ai.*`` request attributes of the call (temperature and top_p when sampling)."""
    root_attributes: dict[str, Any] = {
        "gen_ai.operation.name": operation,
        "gen_ai.request.model": model_name or getattr(model.config, "_name_or_path", "") or model.config.model_type,
        "gen_ai.request.max_tokens": max_new_tokens,
    }
    do_sample = generate_kwargs.get("do_sample", getattr(config, "do_sample", False))
    if do_sample:
        for key, attr in (("temperature", "gen_ai.request.temperature"), ("top_p", "gen_ai.request.top_p")):
            value = generate_kwargs.get(key, getattr(config, key, None))
            if value is not None:
                root_attributes[attr] = float(value)
    return root_attributes


def _run_generate(model: Any, tensors: Mapping[str, Any], generate_kwargs: Mapping[str, Any],
                  recorder: GenerationRecorder, user_streamer: Any, tracer: Any, parent_context: Context | None,
                  root_attributes: dict[str, Any]) -> tuple[Any, int, int]:
    """The model's own ``generate`` under the recorder's hooks: (its output, call start ns,
    call end ns). When it raises: a failed ``generate`` span (unless the caller owns the
    parent), then the error."""
    generate = getattr(model, "_tokentrace_original_generate", model.generate)
    call_start_ns = now_wall_ns()
    try:
        with recorder.hooks():
            output = generate(
                **tensors, **generate_kwargs, streamer=recorder.streamer(user_streamer), return_dict_in_generate=True
            )
    except BaseException as error:
        if parent_context is None:
            emit_failed_generate_span(
                tracer, error, root_attributes=root_attributes, call_start_ns=call_start_ns, call_end_ns=now_wall_ns()
            )
        raise
    return output, call_start_ns, now_wall_ns()


def _tokens_recorded(timeline: RecordedTimeline, generated: list[list[int]]) -> int:
    """Tokens the recorder saw emitted; RuntimeError unless that is one per chunk, one per
    generated token, after at least one prefill forward (other generation modes)."""
    steps_recorded = sum(timeline.chunk_tokens)
    multi_token_chunks = len(timeline.chunk_tokens) - timeline.chunk_tokens.count(1)
    if multi_token_chunks or steps_recorded != len(generated[0]) or timeline.prefill_forwards < 1:
        raise RuntimeError(
            f"traced_generate: recorded {len(timeline.forward_start_ns)} forwards and {len(timeline.emit_ns)} token "
            f"chunks for {len(generated[0])} generated tokens; this generation mode is not supported"
        )
    return steps_recorded


def traced_generate(
    model: Any,
    tokenizer: Any,
    inputs: Any,
    *,
    tracer_provider: Any = None,
    parent_context: Context | None = None,
    decode_spans: str = "all",
    capture_content: bool | None = None,
    device_time: bool | None = None,
    model_name: str | None = None,
    direct_spans: bool = True,
    **generate_kwargs: Any,
) -> TracedGeneration:
    """Run ``model.generate`` and emit prefill/decode spans (and a ``generate`` root) for it.

    - ``inputs``: prompt string, list of strings (left-padded batch), chat messages
      (``[{"role": ..., "content": ...}]``), a mapping with ``input_ids``, or a token tensor.
    - ``tracer_provider``: where spans go (None: the global provider the application set).
    - ``parent_context``: make prefill/decode children of the span in this context and create
      no ``generate`` root (the caller owns chunk events and usage). Batch size must be 1.
    - ``decode_spans``: ``all`` | ``every:N`` | ``none``; chunk events are always kept.
    - ``capture_content``: put prompt/completion text on the root (default: off, or
      ``OTEL_INSTRUMENTATION_GENAI_CAPTURE_MESSAGE_CONTENT=true``).
    - ``device_time``: CUDA event timing per forward (``tokentrace.device_ns``); default on CUDA.
    - ``direct_spans``: with an SDK tracer, hand finished spans straight to its span processor
      (~5 µs/step) instead of the tracer API (~18 µs/step); see :mod:`instrument.otel.span_writer`.
    - ``generate_kwargs``: passed to ``generate`` (``streamer=`` still receives every put).
    """
    policy = DecodeSpanPolicy.parse(decode_spans)
    tracer = get_tracer(tracer_provider)
    device = model_device(model)
    tensors, operation = _model_inputs(model, tokenizer, inputs, device)
    input_ids = tensors["input_ids"]
    batch_rows, padded_prompt_tokens = int(input_ids.shape[0]), int(input_ids.shape[1])
    config, max_new_tokens, eos_ids = _generation_settings(model, generate_kwargs, padded_prompt_tokens)
    return_sequences = int(generate_kwargs.get("num_return_sequences", getattr(config, "num_return_sequences", 1)) or 1)
    _check_traceable(tracer, parent_context, batch_rows * return_sequences, max_new_tokens)
    cached_tokens = _cached_tokens(generate_kwargs)
    capture = _capture_content(capture_content)
    recorder = GenerationRecorder(model, device_time=device_time, expected_forwards=max_new_tokens + 1, device=device)
    user_wants_dict = generate_kwargs.pop("return_dict_in_generate", None)
    user_streamer = generate_kwargs.pop("streamer", None)
    root_attributes = _root_attributes(model, model_name, operation, max_new_tokens, config, generate_kwargs)
    output, call_start_ns, call_end_ns = _run_generate(
        model, tensors, generate_kwargs, recorder, user_streamer, tracer, parent_context, root_attributes
    )

    timeline = recorder.timeline()
    rows = int(output.sequences.shape[0])
    generated = output.sequences[:, padded_prompt_tokens:].tolist()
    steps_recorded = _tokens_recorded(timeline, generated)
    kv = inspect_runtime_kv(model, getattr(output, "cache", None), batch_size=rows,
                            tokens_held=padded_prompt_tokens + steps_recorded - 1)
    prompt_lengths = _prompt_lengths(tensors, padded_prompt_tokens, batch_rows)
    visible_ids = _visible_ids(tokenizer, {t for row in generated for t in row}, eos_ids)
    writer = span_writer_for(tracer, direct=direct_spans)
    sequences: list[SequenceTrace] = []
    for row, ids in enumerate(generated):
        stop_at = min((ids.index(e) for e in eos_ids if e in ids), default=None)  # first stop token
        g = stop_at + 1 if stop_at is not None else len(ids)
        visible = [t in visible_ids for t in ids[:g]]
        finish = "length" if stop_at is None and g >= max_new_tokens else "stop"
        prompt_row = row // return_sequences
        seq = SequenceTrace(
            index=row,
            input_tokens=int(prompt_lengths[prompt_row]),
            cached_tokens=cached_tokens,
            generated_tokens=g,
            output_tokens=sum(visible),
            finish_reason=finish,
            chunk_emit_ns=timeline.emit_ns[:g],
            chunk_tokens=timeline.chunk_tokens[:g],
            chunk_visible=visible,
        )
        if capture and tokenizer is not None:
            seq.prompt_text = inputs if isinstance(inputs, str) else tokenizer.decode(
                input_ids[prompt_row][-seq.input_tokens:], skip_special_tokens=False
            )
            seq.completion_text = tokenizer.decode(ids[:g], skip_special_tokens=True)
        attrs = dict(root_attributes)
        if rows > 1:
            attrs["tokentrace.batch.index"] = row
            attrs["tokentrace.batch.size"] = rows
        seq.span_context = emit_sequence_spans(
            writer, seq, timeline, kv, policy, parent_context=parent_context, root_attributes=attrs,
            call_start_ns=call_start_ns, call_end_ns=call_end_ns,
        )
        sequences.append(seq)
    result_output = output if user_wants_dict else output.sequences
    return TracedGeneration(result_output, sequences, timeline, kv, call_start_ns, call_end_ns)


def instrument_model(model: Any, tokenizer: Any = None, **options: Any) -> Any:
    """Hook ``model`` once: every ``model.generate(...)`` call is traced and returns generate's usual output.

    ``options`` are :func:`traced_generate`'s keyword options (``tracer_provider``,
    ``decode_spans``, ...). Undo with :func:`uninstrument_model`. Returns ``model``.
    """
    if hasattr(model, "_tokentrace_original_generate"):
        raise ValueError("instrument_model: this model is already instrumented")
    original = model.generate

    @functools.wraps(original)
    def generate(inputs: Any = None, **kwargs: Any) -> Any:
        if inputs is None:
            inputs = {k: kwargs.pop(k) for k in ("input_ids", "attention_mask") if k in kwargs}
        return traced_generate(model, tokenizer, inputs, **options, **kwargs).output

    model._tokentrace_original_generate = original
    model.generate = generate
    return model


def uninstrument_model(model: Any) -> Any:
    """Restore the model's own ``generate``. Returns ``model``."""
    original = model.__dict__.pop("_tokentrace_original_generate", None)
    if original is not None:
        model.__dict__.pop("generate", None)
    return model
