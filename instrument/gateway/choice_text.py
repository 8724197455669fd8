"""The text of one choice as it streams: detokenization, stop sequences, logprobs, token counts.

``push(token_id, logprobs)`` returns what may be sent now: ``(text, tokens, logprob entries)``.
Stop sequences (OpenAI's ``stop``): generation ends at the first match, the stop text is not
returned, and streamed text never shows part of a stop sequence that is later cut — text
that could be the start of a stop sequence is held back until it is clearly not one (then
sent) or completes one (then dropped). Stop sequences are looked for once ``min_tokens``
tokens were generated (vLLM's rule: nothing stops a sequence before ``min_tokens``).

Token counts: a sent text covers the tokens that produced it, held-back ones included; a
token after the match is never counted (it is generated, G, but not visible, O). Logprob
entries follow their tokens the same way. Stop (EOS) tokens have no text and no entry.
``completion_tokens`` is what the response's ``usage`` reports, vLLM's count: every token up
to and including the one that ended the text — a final stop (EOS) token included, tokens
generated after a stop-sequence match (before the engine stopped) not.
"""

from __future__ import annotations

from typing import Any

from instrument.gateway.request_state import Detokenizer
from instrument.hf.token_sampling import TokenLogprobs

__all__ = ["ChoiceText", "StopText", "completion_logprobs"]


class StopText:
    """Applies stop sequences to a text stream (module docstring)."""

    def __init__(self, stops: tuple[str, ...]) -> None:
        self.stops = stops
        self.held = ""
        self.matched = False

    def push(self, delta: str, *, may_match: bool = True) -> str:
        """The part of ``held + delta`` that can be sent now ("" once matched)."""
        if self.matched:
            return ""
        if not self.stops:
            return delta
        buf = self.held + delta
        if not may_match:
            self.held = ""
            return buf
        hits = [i for i in (buf.find(stop) for stop in self.stops) if i >= 0]
        if hits:
            self.matched = True
            self.held = ""
            return buf[:min(hits)]
        keep = 0
        for stop in self.stops:
            for k in range(min(len(stop) - 1, len(buf)), keep, -1):
                if buf.endswith(stop[:k]):
                    keep = k
                    break
        self.held = buf[len(buf) - keep:] if keep else ""
        return buf[:len(buf) - keep]

    def flush(self) -> str:
        """What is still held when generation ended without a match."""
        out, self.held = ("" if self.matched else self.held), ""
        return out


class ChoiceText:
    """One choice's streamed text (module docstring). ``text``: everything handed out so far."""

    def __init__(self, tokenizer: Any, eos_ids: set[int], *, stops: tuple[str, ...] = (), min_tokens: int = 0,
                 logprobs: bool = False, top_logprobs: int = 0, chat: bool = True) -> None:
        self.detok = Detokenizer(tokenizer, eos_ids)
        self.tokenizer = tokenizer
        self.stop = StopText(stops)
        self.min_tokens = min_tokens
        self.logprobs = logprobs
        self.top_logprobs = top_logprobs
        self.chat = chat
        self.text = ""
        self.output_tokens = 0
        self.completion_tokens = 0  # usage.completion_tokens (module docstring)
        self._pending_tokens = 0
        self._pending_entries: list[tuple[int, TokenLogprobs]] = []
        self._token_text: dict[int, str] = {}

    @property
    def matched(self) -> bool:
        """A stop sequence ended the text."""
        return self.stop.matched

    @property
    def generated_tokens(self) -> int:
        return self.detok.generated_tokens

    def push(self, token_id: int, logprobs: TokenLogprobs | None = None) -> tuple[str, int, list[Any] | None]:
        """Add one generated token; the text to send now, the tokens it covers, its logprob entries."""
        if self.stop.matched:
            self.detok.generated_tokens += 1
            return "", 0, None
        self.completion_tokens += 1
        delta, tokens = self.detok.push(token_id)
        if token_id not in self.detok.eos_ids:
            self._pending_tokens += 1
            if self.logprobs and logprobs is not None:
                self._pending_entries.append((token_id, logprobs))
        if not delta:
            return "", 0, None
        out = self.stop.push(delta, may_match=self.detok.generated_tokens >= self.min_tokens)
        if not out and not self.stop.matched:
            return "", 0, None
        return self._emit(out)

    def finish(self) -> tuple[str, int, list[Any] | None]:
        """What is left to send once generation ended (held-back text)."""
        out = self.stop.flush()
        if not out:
            return "", 0, None
        return self._emit(out)

    def _emit(self, out: str) -> tuple[str, int, list[Any] | None]:
        tokens, self._pending_tokens = self._pending_tokens, 0
        entries, self._pending_entries = self._pending_entries, []
        self.text += out
        self.output_tokens += tokens
        return out, tokens, (self._entries(entries) if self.logprobs else None)

    # --- OpenAI's logprobs shapes -----------------------------------------------------------
    def token_text(self, token_id: int) -> str:
        text = self._token_text.get(token_id)
        if text is None:
            text = self._token_text[token_id] = self.tokenizer.decode([token_id])
        return text

    def _entries(self, entries: list[tuple[int, TokenLogprobs]]) -> list[Any]:
        if self.chat:
            return [{"token": self.token_text(t), "logprob": lp.logprob,
                     "bytes": list(self.token_text(t).encode("utf-8")),
                     "top_logprobs": [{"token": self.token_text(i), "logprob": v,
                                       "bytes": list(self.token_text(i).encode("utf-8"))}
                                      for i, v in lp.top[:self.top_logprobs]]}
                    for t, lp in entries]
        return [(self.token_text(t), lp.logprob, {self.token_text(i): v for i, v in lp.top[:self.top_logprobs]})
                for t, lp in entries]


def completion_logprobs(entries: list[tuple[str, float, dict[str, float]]], text_start: int) -> dict[str, Any]:
    """Legacy completions' ``logprobs`` object for ``entries`` whose text starts at ``text_start``."""
    offsets, at = [], text_start
    for token, _lp, _top in entries:
        offsets.append(at)
        at += len(token)
    return {"tokens": [e[0] for e in entries], "token_logprobs": [e[1] for e in entries],
            "top_logprobs": [e[2] for e in entries], "text_offset": offsets}
