"""Which request fields the gateway knows, and what it does with each (docs/gateway.md,
"Request parameters"): implemented, accepted-and-ignored, or refused with a reason.

A field in none of these lists is refused with ``unrecognized request argument: <name>``
(OpenAI's behaviour), so no parameter is ever silently ignored.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

__all__ = ["ACCEPTED_IGNORED", "CHAT_FIELDS", "COMPLETION_FIELDS", "EXTENSIONS", "MAX_STOP_SEQUENCES",
           "refusal", "unknown_fields"]

MAX_STOP_SEQUENCES = 4

# Implemented on both engines, streaming or not (OpenAI's names and meanings).
COMMON_FIELDS = frozenset({
    "model", "max_tokens", "temperature", "top_p", "stream", "stream_options", "stop", "seed", "presence_penalty",
    "frequency_penalty", "n", "logprobs",
})
# Engine extensions (vLLM's names and meanings; not in OpenAI's API).
EXTENSIONS = frozenset({"ignore_eos", "min_tokens", "top_k", "repetition_penalty"})
# Accepted and ignored: they do not change what is generated or how it is timed.
ACCEPTED_IGNORED = {
    "user": "an end-user id for abuse monitoring; recorded nowhere",
    "metadata": "key/value tags for stored completions; nothing is stored",
    "store": "OpenAI's stored completions; nothing is stored",
}
# Known, but only their neutral value is accepted (anything else changes the output: refused).
NEUTRAL_ONLY: dict[str, tuple[Any, str]] = {
    "logit_bias": ({}, "logit_bias is not supported"),
    "response_format": ({"type": "text"}, "only response_format {\"type\": \"text\"} is supported"),
    "tools": ([], "tool calling is not supported"),
    "tool_choice": ("none", "tool calling is not supported"),
    "functions": ([], "function calling is not supported"),
    "function_call": ("none", "function calling is not supported"),
    "parallel_tool_calls": (False, "tool calling is not supported"),
    "modalities": (["text"], "only text output is supported"),
    "echo": (False, "echo is not supported"),
    "suffix": ("", "suffix (insertion) is not supported"),
    "best_of": (1, "best_of other than 1 is not supported"),
}
_CHAT_NEUTRAL = set(NEUTRAL_ONLY) - {"echo", "suffix", "best_of"}
_COMPLETION_NEUTRAL = {"echo", "suffix", "best_of", "logit_bias"}
CHAT_FIELDS = frozenset(COMMON_FIELDS | EXTENSIONS | {"messages", "max_completion_tokens", "top_logprobs"}
                        | set(ACCEPTED_IGNORED) | _CHAT_NEUTRAL)
COMPLETION_FIELDS = frozenset(COMMON_FIELDS | EXTENSIONS | {"prompt"} | set(ACCEPTED_IGNORED) | _COMPLETION_NEUTRAL)


def unknown_fields(body: Mapping[str, Any], operation: str) -> list[str]:
    """Fields of ``body`` the endpoint does not know at all (in body order)."""
    known = CHAT_FIELDS if operation == "chat" else COMPLETION_FIELDS
    return [name for name in body if name not in known]


def refusal(name: str, value: Any) -> str | None:
    """Why a known-but-unsupported field's value is refused (None: neutral, accepted)."""
    rule = NEUTRAL_ONLY.get(name)
    if rule is None or value is None:
        return None
    neutral, reason = rule
    return None if value == neutral else f"{reason} (got {value!r})"
