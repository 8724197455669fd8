"""Request-body validation for the OpenAI-compatible endpoints, with field-level messages.

Pure Python (no FastAPI, no torch): the app turns a :class:`ValidationError` into a 400 whose
``error.param`` names the first bad field and whose message lists every bad field.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from instrument.gateway.request_fields import MAX_STOP_SEQUENCES, refusal, unknown_fields
from instrument.hf.token_sampling import SamplingParams

__all__ = ["CHAT_ROLES", "GenerationRequest", "ValidationError", "validate_request"]

CHAT_ROLES = ("system", "user", "assistant", "developer", "tool")
TEMPERATURE_MAX = 2.0


class ValidationError(ValueError):
    """One or more bad fields: ``errors`` is a list of ``(param, message)``; ``status`` the HTTP
    status (400, or 404 for an unknown model), ``code`` OpenAI's error code; ``bare``: the
    message is the messages alone (not prefixed by the field names)."""

    def __init__(self, errors: list[tuple[str, str]], *, status: int = 400, code: str | None = None,
                 bare: bool = False) -> None:
        self.errors = errors
        self.status = status
        self.code = code
        super().__init__("; ".join(message if bare else f"{param}: {message}" for param, message in errors))

    @property
    def param(self) -> str:
        """The first bad field (OpenAI's ``error.param``)."""
        return self.errors[0][0]


@dataclass(frozen=True)
class GenerationRequest:
    """A validated request. ``messages`` for chat, ``prompt`` for text completions.

    Token counts are tokens; penalties are OpenAI's (additive, -2..2) and vLLM's
    (``repetition_penalty``, multiplicative, 1 = off); ``top_k`` 0 = off.
    """

    operation: str  # "chat" or "text_completion"
    model: str
    max_tokens: int
    temperature: float
    top_p: float
    stream: bool
    include_usage: bool
    continuous_usage: bool = False  # stream_options.continuous_usage_stats with include_usage: usage on every chunk
    messages: list[dict[str, str]] | None = None
    prompt: str | None = None
    user: str | None = None
    stop: tuple[str, ...] = ()
    seed: int | None = None
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    logprobs: bool = False
    top_logprobs: int = 0
    ignore_eos: bool = False
    min_tokens: int = 0
    top_k: int = 0
    repetition_penalty: float = 1.0
    extra: dict[str, Any] = field(default_factory=dict)

    @property
    def do_sample(self) -> bool:
        """Temperature 0 means greedy decoding."""
        return self.temperature > 0.0

    @property
    def sampling(self) -> SamplingParams:
        """What the engine is asked to do for this request's sequence."""
        return SamplingParams(
            max_tokens=self.max_tokens, temperature=self.temperature, top_p=self.top_p, top_k=self.top_k,
            seed=self.seed, presence_penalty=self.presence_penalty, frequency_penalty=self.frequency_penalty,
            repetition_penalty=self.repetition_penalty, min_tokens=self.min_tokens, ignore_eos=self.ignore_eos,
            logprobs=self.logprobs, top_logprobs=self.top_logprobs,
        )

    def span_attributes(self) -> dict[str, Any]:
        """What was asked that shapes the output or its timing, for the gateway span
        (``gen_ai.request.*`` semconv names; tokentrace names for the extensions)."""
        out: dict[str, Any] = {
            "gen_ai.request.model": self.model, "gen_ai.request.max_tokens": self.max_tokens,
            "gen_ai.request.temperature": self.temperature, "gen_ai.request.top_p": self.top_p,
            "gen_ai.request.choice.count": 1, "gen_ai.request.presence_penalty": self.presence_penalty,
            "gen_ai.request.frequency_penalty": self.frequency_penalty,
        }
        if self.stop:
            out["gen_ai.request.stop_sequences"] = self.stop
        if self.seed is not None:
            out["gen_ai.request.seed"] = self.seed
        if self.top_k:
            out["gen_ai.request.top_k"] = float(self.top_k)
        if self.logprobs:
            out["tokentrace.request.logprobs"] = True
            out["tokentrace.request.top_logprobs"] = self.top_logprobs
        if self.ignore_eos:
            out["tokentrace.request.ignore_eos"] = True
        if self.min_tokens:
            out["tokentrace.request.min_tokens"] = self.min_tokens
        if self.repetition_penalty != 1.0:
            out["tokentrace.request.repetition_penalty"] = self.repetition_penalty
        return out


def _number(body: Mapping[str, Any], name: str, default: float, errors: list[tuple[str, str]]) -> float:
    value = body.get(name, default)
    if value is None:
        return default
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        errors.append((name, f"must be a finite number, got {value!r}"))
        return default
    return float(value)


def _integer(body: Mapping[str, Any], name: str, default: int, errors: list[tuple[str, str]]) -> int:
    value = body.get(name, default)
    if value is None:
        return default
    if isinstance(value, bool) or not isinstance(value, int):
        errors.append((name, f"must be an integer, got {value!r}"))
        return default
    return value


def _boolean(body: Mapping[str, Any], name: str, errors: list[tuple[str, str]]) -> bool:
    value = body.get(name, False)
    if value is None:
        return False
    if not isinstance(value, bool):
        errors.append((name, f"must be a boolean, got {value!r}"))
        return False
    return value


def _in_range(name: str, value: float, low: float, high: float, errors: list[tuple[str, str]]) -> None:
    if not low <= value <= high:
        errors.append((name, f"must be between {low:g} and {high:g}, got {value:g}"))


def _stop(raw: Any, errors: list[tuple[str, str]]) -> tuple[str, ...]:
    if raw is None:
        return ()
    if isinstance(raw, str):
        raw = [raw]
    if not isinstance(raw, list) or not all(isinstance(item, str) for item in raw):
        errors.append(("stop", f"must be a string or an array of strings, got {raw!r}"))
        return ()
    if len(raw) > MAX_STOP_SEQUENCES:
        errors.append(("stop", f"at most {MAX_STOP_SEQUENCES} stop sequences, got {len(raw)}"))
        return ()
    if any(item == "" for item in raw):
        errors.append(("stop", "stop sequences must not be empty strings"))
        return ()
    return tuple(dict.fromkeys(raw))


def _logprobs(body: Mapping[str, Any], operation: str, errors: list[tuple[str, str]]) -> tuple[bool, int]:
    """(logprobs wanted, how many top alternatives): chat has ``logprobs`` (bool) and
    ``top_logprobs`` (0..20); completions have ``logprobs`` (int 0..5, the top count)."""
    raw = body.get("logprobs")
    if operation == "chat":
        wanted = _boolean(body, "logprobs", errors)
        top = _integer(body, "top_logprobs", 0, errors)
        if not 0 <= top <= 20:
            errors.append(("top_logprobs", f"must be between 0 and 20, got {top}"))
        elif top and not wanted:
            errors.append(("top_logprobs", "needs logprobs: true"))
        return wanted, top
    if raw is None:
        return False, 0
    if isinstance(raw, bool) or not isinstance(raw, int) or not 0 <= raw <= 5:
        errors.append(("logprobs", f"must be an integer between 0 and 5 (alternatives per token), got {raw!r}"))
        return False, 0
    return True, raw


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
            content = "".join(texts)  # type: ignore[arg-type]  # every part is a str: checked above
        if not isinstance(content, str):
            errors.append((f"{where}.content", f"must be a string, got {type(content).__name__}"))
            continue
        out.append({"role": str(role), "content": content})
    return out


def _model(body: Mapping[str, Any], served_models: tuple[str, ...], errors: list[tuple[str, str]]) -> Any:
    """The ``model`` asked for (an error when missing); ValidationError 404 when this server
    does not serve it."""
    model = body.get("model")
    if not isinstance(model, str) or not model:
        errors.append(("model", "is required (a string)"))
    elif model not in served_models:
        raise ValidationError([("model", f"The model `{model}` does not exist; this server serves "
                                         f"`{served_models[0]}`")], status=404, code="model_not_found", bare=True)
    return model


def _max_tokens(body: Mapping[str, Any], limit: int, default: int, errors: list[tuple[str, str]]) -> int:
    """``max_completion_tokens`` (else ``max_tokens``, else ``default``): 1..``limit``."""
    raw_max = body.get("max_completion_tokens", body.get("max_tokens"))
    name_max = "max_completion_tokens" if "max_completion_tokens" in body else "max_tokens"
    if raw_max is None:
        return default
    if isinstance(raw_max, bool) or not isinstance(raw_max, int):
        errors.append((name_max, f"must be an integer, got {raw_max!r}"))
    elif not 1 <= raw_max <= limit:
        errors.append((name_max, f"must be between 1 and {limit}, got {raw_max}"))
    else:
        return raw_max
    return default


def _sampling_fields(body: Mapping[str, Any], errors: list[tuple[str, str]]) -> dict[str, Any]:
    """The sampling fields as :class:`GenerationRequest` takes them: temperature, top_p, the
    three penalties, top_k (vLLM's -1: off, 0 here) and seed (None when bad)."""
    temperature = _number(body, "temperature", 1.0, errors)
    _in_range("temperature", temperature, 0.0, TEMPERATURE_MAX, errors)
    top_p = _number(body, "top_p", 1.0, errors)
    if not 0.0 < top_p <= 1.0:
        errors.append(("top_p", f"must be greater than 0 and at most 1, got {top_p:g}"))
    presence = _number(body, "presence_penalty", 0.0, errors)
    _in_range("presence_penalty", presence, -2.0, 2.0, errors)
    frequency = _number(body, "frequency_penalty", 0.0, errors)
    _in_range("frequency_penalty", frequency, -2.0, 2.0, errors)
    repetition = _number(body, "repetition_penalty", 1.0, errors)
    if not 0.0 < repetition <= 10.0:
        errors.append(("repetition_penalty", f"must be greater than 0 and at most 10 (1 = off), got {repetition:g}"))
    top_k = _integer(body, "top_k", 0, errors)
    if top_k == -1:  # vLLM's "off"
        top_k = 0
    if top_k < 0:
        errors.append(("top_k", f"must be -1 or 0 (off) or a positive integer, got {top_k}"))
    seed = body.get("seed")
    if seed is not None and (isinstance(seed, bool) or not isinstance(seed, int) or not -2**63 <= seed < 2**64):
        errors.append(("seed", f"must be an integer, got {seed!r}"))
        seed = None
    return {"temperature": temperature, "top_p": top_p, "presence_penalty": presence, "frequency_penalty": frequency,
            "repetition_penalty": repetition, "top_k": top_k, "seed": seed}


def _stream(body: Mapping[str, Any], errors: list[tuple[str, str]]) -> tuple[bool, bool, bool]:
    """(``stream``, ``stream_options.include_usage``, usage on every chunk); stream options
    only with ``stream``. ``stream_options.continuous_usage_stats`` is vLLM's extension (guidellm
    sends it on every streamed request): with ``include_usage`` also true every chunk carries
    the usage so far; without ``include_usage`` it is accepted and changes nothing (vLLM's rule)."""
    stream = body.get("stream", False)
    if stream is None:
        stream = False
    if not isinstance(stream, bool):
        errors.append(("stream", f"must be a boolean, got {stream!r}"))
        stream = False
    options = body.get("stream_options") or {}
    include_usage = continuous = False
    if not isinstance(options, Mapping):
        errors.append(("stream_options", "must be an object"))
    else:
        extra_options = [key for key in options if key not in ("include_usage", "continuous_usage_stats")]
        if extra_options:
            errors.append((f"stream_options.{extra_options[0]}", f"unrecognized request argument: "
                                                                  f"stream_options.{extra_options[0]}"))
        include_usage = options.get("include_usage", False)
        if not isinstance(include_usage, bool):
            errors.append(("stream_options.include_usage", f"must be a boolean, got {include_usage!r}"))
            include_usage = False
        continuous = options.get("continuous_usage_stats", False)
        if continuous is None:
            continuous = False
        if not isinstance(continuous, bool):
            errors.append(("stream_options.continuous_usage_stats", f"must be a boolean, got {continuous!r}"))
            continuous = False
        if options and not stream:
            errors.append(("stream_options", "is only allowed when stream is true"))
    return bool(stream), bool(include_usage), bool(include_usage and continuous)


def _prompt(raw_prompt: Any, errors: list[tuple[str, str]]) -> str | None:
    """A completion's ``prompt``: a non-empty string, or an array of exactly one."""
    if isinstance(raw_prompt, list) and len(raw_prompt) == 1:
        raw_prompt = raw_prompt[0]
    if not isinstance(raw_prompt, str) or not raw_prompt:
        errors.append(("prompt", "must be a non-empty string (or an array of exactly one string)"))
        return None
    return raw_prompt


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

    In this order, each alone: a field the endpoint does not know (400 ``unrecognized request
    argument: <name>``), an unknown model (404 ``model_not_found``); then every other bad
    field at once (400, ``param`` = the first).
    """
    if not isinstance(body, Mapping):
        raise ValidationError([("body", "must be a JSON object")])
    unknown = unknown_fields(body, operation)
    if unknown:
        raise ValidationError([(name, f"unrecognized request argument: {name}") for name in unknown],
                              code="unrecognized_argument", bare=True)
    errors: list[tuple[str, str]] = []
    model = _model(body, served_models, errors)
    for name in body:
        reason = refusal(name, body[name])
        if reason is not None:
            errors.append((name, reason))
    max_tokens = _max_tokens(body, max_tokens_limit, default_max_tokens, errors)
    sampling = _sampling_fields(body, errors)
    min_tokens = _integer(body, "min_tokens", 0, errors)
    if not 0 <= min_tokens <= max_tokens:
        errors.append(("min_tokens", f"must be between 0 and max_tokens ({max_tokens}), got {min_tokens}"))
    ignore_eos = _boolean(body, "ignore_eos", errors)
    stop = _stop(body.get("stop"), errors)
    logprobs, top_logprobs = _logprobs(body, operation, errors)
    n = body.get("n", 1)
    if n is not None and n != 1:
        errors.append(("n", f"only n=1 is supported (the span contract traces one sequence per request: send "
                            f"{n!r} requests instead), got {n!r}"))
    stream, include_usage, continuous_usage = _stream(body, errors)
    messages = prompt = None
    if operation == "chat":
        messages = _messages(body.get("messages"), errors)
    else:
        prompt = _prompt(body.get("prompt"), errors)
    user = body.get("user")
    if errors:
        raise ValidationError(errors)
    return GenerationRequest(
        operation=operation, model=str(model), max_tokens=max_tokens, stream=stream, include_usage=include_usage,
        continuous_usage=continuous_usage,
        messages=messages, prompt=prompt, user=user if isinstance(user, str) else None, stop=stop,
        logprobs=logprobs, top_logprobs=top_logprobs, ignore_eos=ignore_eos, min_tokens=min_tokens, **sampling,
    )
