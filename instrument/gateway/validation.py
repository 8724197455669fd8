"""Request-body validation for the OpenAI-compatible endpoints, with field-level messages.

Pure Python (no FastAPI, no torch): the app turns a :class:`ValidationError` into a 400 whose
``error.param`` names the first bad field and whose message lists every bad field.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, Mapping

from instrument.sampling import SamplingParams

__all__ = ["CHAT_ROLES", "GenerationRequest", "ValidationError", "validate_request"]

CHAT_ROLES = ("system", "user", "assistant", "developer", "tool")
TEMPERATURE_MAX = 2.0


class ValidationError(ValueError):
    """One or more bad fields: ``errors`` is a list of ``(param, message)``."""

    def __init__(self, errors: list[tuple[str, str]]) -> None:
        self.errors = errors
        super().__init__("; ".join(f"{param}: {message}" for param, message in errors))

    @property
    def param(self) -> str:
        """The first bad field (OpenAI's ``error.param``)."""
        return self.errors[0][0]


@dataclass(frozen=True)
class GenerationRequest:
    """A validated request. ``messages`` for chat, ``prompt`` for text completions."""

    operation: str  # "chat" or "text_completion"
    model: str
    max_tokens: int
    temperature: float
    top_p: float
    stream: bool
    include_usage: bool
    messages: list[dict[str, str]] | None = None
    prompt: str | None = None
    user: str | None = None
    extra: dict[str, Any] = field(default_factory=dict)

    @property
    def do_sample(self) -> bool:
        """Temperature 0 means greedy decoding."""
        return self.temperature > 0.0

    @property
    def sampling(self) -> SamplingParams:
        """What the engine is asked to do for this request's sequence."""
        return SamplingParams(max_tokens=self.max_tokens, temperature=self.temperature, top_p=self.top_p)


def _number(body: Mapping[str, Any], name: str, default: float, errors: list[tuple[str, str]]) -> float:
    value = body.get(name, default)
    if value is None:
        return default
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        errors.append((name, f"must be a finite number, got {value!r}"))
        return default
    return float(value)


def _messages(raw: Any, errors: list[tuple[str, str]]) -> list[dict[str, str]] | None:
    if not isinstance(raw, list) or not raw:
        errors.append(("messages", "must be a non-empty array of {role, content} objects"))
        return None
    out: list[dict[str, str]] = []
    for index, item in enumerate(raw):
        where = f"messages[{index}]"
        if not isinstance(item, Mapping):
            errors.append((where, "must be an object with 'role' and 'content'"))
            continue
        role, content = item.get("role"), item.get("content")
        if role not in CHAT_ROLES:
            errors.append((f"{where}.role", f"must be one of {', '.join(CHAT_ROLES)}, got {role!r}"))
        if isinstance(content, list):  # content parts: only text parts are supported
            texts = [p.get("text") for p in content if isinstance(p, Mapping) and p.get("type") == "text"]
            if len(texts) != len(content) or not all(isinstance(t, str) for t in texts):
                errors.append((f"{where}.content", "only text content parts are supported"))
                continue
            content = "".join(texts)  # type: ignore[arg-type]
        if not isinstance(content, str):
            errors.append((f"{where}.content", f"must be a string, got {type(content).__name__}"))
            continue
        out.append({"role": str(role), "content": content})
    return out


def validate_request(
    body: Any,
    *,
    operation: str,
    served_models: tuple[str, ...],
    max_tokens_limit: int,
    default_max_tokens: int = 16,
) -> GenerationRequest:
    """Check a decoded JSON body; raise :class:`ValidationError` listing every bad field.

    - ``operation``: ``chat`` (``/v1/chat/completions``) or ``text_completion`` (``/v1/completions``).
    - ``served_models``: model ids this server answers to (the first is the canonical one).
    - ``max_tokens_limit``: the largest ``max_tokens`` (output tokens) the server accepts.
    """
    if not isinstance(body, Mapping):
        raise ValidationError([("body", "must be a JSON object")])
    errors: list[tuple[str, str]] = []
    model = body.get("model")
    if not isinstance(model, str) or not model:
        errors.append(("model", "is required (a string)"))
    elif model not in served_models:
        errors.append(("model", f"unknown model {model!r}; this server serves {served_models[0]!r}"))
    raw_max = body.get("max_completion_tokens", body.get("max_tokens"))
    name_max = "max_completion_tokens" if "max_completion_tokens" in body else "max_tokens"
    max_tokens = default_max_tokens
    if raw_max is not None:
        if isinstance(raw_max, bool) or not isinstance(raw_max, int):
            errors.append((name_max, f"must be an integer, got {raw_max!r}"))
        elif not 1 <= raw_max <= max_tokens_limit:
            errors.append((name_max, f"must be between 1 and {max_tokens_limit}, got {raw_max}"))
        else:
            max_tokens = raw_max
    temperature = _number(body, "temperature", 1.0, errors)
    if not 0.0 <= temperature <= TEMPERATURE_MAX:
        errors.append(("temperature", f"must be between 0 and {TEMPERATURE_MAX:g}, got {temperature:g}"))
    top_p = _number(body, "top_p", 1.0, errors)
    if not 0.0 < top_p <= 1.0:
        errors.append(("top_p", f"must be greater than 0 and at most 1, got {top_p:g}"))
    n = body.get("n", 1)
    if n != 1:
        errors.append(("n", f"only n=1 is supported, got {n!r}"))
    stream = body.get("stream", False)
    if not isinstance(stream, bool):
        errors.append(("stream", f"must be a boolean, got {stream!r}"))
        stream = False
    options = body.get("stream_options") or {}
    include_usage = False
    if not isinstance(options, Mapping):
        errors.append(("stream_options", "must be an object"))
    else:
        include_usage = options.get("include_usage", False)
        if not isinstance(include_usage, bool):
            errors.append(("stream_options.include_usage", f"must be a boolean, got {include_usage!r}"))
            include_usage = False
        elif options and not stream:
            errors.append(("stream_options", "is only allowed when stream is true"))
    messages = prompt = None
    if operation == "chat":
        messages = _messages(body.get("messages"), errors)
    else:
        raw_prompt = body.get("prompt")
        if isinstance(raw_prompt, list) and len(raw_prompt) == 1:
            raw_prompt = raw_prompt[0]
        if not isinstance(raw_prompt, str) or not raw_prompt:
            errors.append(("prompt", "must be a non-empty string (or an array of exactly one string)"))
        else:
            prompt = raw_prompt
    user = body.get("user")
    if errors:
        raise ValidationError(errors)
    return GenerationRequest(
        operation=operation, model=str(model), max_tokens=max_tokens, temperature=temperature, top_p=top_p,
        stream=bool(stream), include_usage=bool(include_usage), messages=messages, prompt=prompt,
        user=user if isinstance(user, str) else None,
    )
