"""Per-sequence sampling shared by both engines: one definition of every sampling parameter.

Each sequence gets a :class:`SequenceSampler` that turns the model's logits for its next
position into a token (and, when asked, its log probability and the top alternatives). The
sequential engine runs it as a transformers ``LogitsProcessor`` inside ``generate``
(:class:`SamplerLogitsProcessor`); the continuous engine runs it once per row of each
batched step (instrument/engines/continuous/hooks.py). Either way the processor leaves one finite
score per row (0 for the chosen token, -inf elsewhere) and the engine's own greedy pick
returns exactly that token, so sampling is per sequence, with its own random generator,
whatever else shares the batch.

Order of operations on the raw logits of one row (definitions as OpenAI and vLLM give them):

1. ``repetition_penalty`` r (extension, HF/vLLM definition): every token id seen in the
   prompt or the output so far has its logit divided by r when positive, multiplied by r
   when negative.
2. ``frequency_penalty`` f and ``presence_penalty`` p (OpenAI's additive definition):
   ``logit[j] -= f * count[j] + p * (count[j] > 0)``, counts over the output tokens so far.
3. Stop tokens (EOS) are masked (-inf) while fewer than ``min_tokens`` tokens were generated,
   and always under ``ignore_eos`` (extensions): the sequence then runs to ``max_tokens``.
4. Log probabilities, when asked, are ``log_softmax`` of the result of 1–3 (before
   temperature and truncation): the model's distribution under the penalties.
5. ``temperature`` 0: greedy (argmax). Otherwise divide by the temperature, keep the
   ``top_k`` best (0: all), keep the smallest set whose probability reaches ``top_p``,
   and draw from the softmax with the sequence's generator (seeded by ``seed`` when given,
   else by a fresh random seed).
"""

from __future__ import annotations

import random
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

__all__ = ["SamplingParams", "SequenceSampler", "SamplerLogitsProcessor", "TokenLogprobs", "draw_tokens",
           "one_hot_scores"]

_SEEDS = random.SystemRandom()


@dataclass(frozen=True)
class SamplingParams:
    """What one sequence asks for. Tokens are counts of tokens; 0 / 1.0 defaults mean "off"."""

    max_tokens: int
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = 0
    seed: int | None = None
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    repetition_penalty: float = 1.0
    min_tokens: int = 0
    ignore_eos: bool = False
    logprobs: bool = False
    top_logprobs: int = 0

    @property
    def greedy(self) -> bool:
        """Temperature 0 means greedy decoding."""
        return self.temperature == 0.0

    @property
    def plain(self) -> bool:
        """Nothing but the pick itself: greedy or sampling without penalties, masks or logprobs."""
        return (self.presence_penalty == 0.0 and self.frequency_penalty == 0.0 and self.repetition_penalty == 1.0
                and self.min_tokens == 0 and not self.ignore_eos and not self.logprobs)


@dataclass(frozen=True)
class TokenLogprobs:
    """Log probability (natural log) of the chosen token and the ``top`` alternatives, best first."""

    logprob: float
    top: tuple[tuple[int, float], ...] = ()


class SequenceSampler:
    """Chooses the tokens of one sequence (module docstring: the order of operations)."""

    def __init__(self, params: SamplingParams, eos_ids: Iterable[int], prompt_ids: list[int], vocab_size: int,
                 device: Any = None) -> None:
        import torch

        self.params = params
        self.generated = 0
        self._torch = torch
        self._eos = torch.tensor(sorted(set(eos_ids)), dtype=torch.long, device=device) if eos_ids else None
        self._generator: Any = None
        if not params.greedy:
            self._generator = torch.Generator(device=device or "cpu")
            self._generator.manual_seed(params.seed if params.seed is not None else _SEEDS.getrandbits(63))
        self._seen = None
        if params.repetition_penalty != 1.0:
            self._seen = torch.zeros(vocab_size, dtype=torch.bool, device=device)
            if prompt_ids:
                self._seen[torch.tensor(prompt_ids, dtype=torch.long, device=device)] = True
        self._counts = None
        if params.presence_penalty != 0.0 or params.frequency_penalty != 0.0:
            self._counts = torch.zeros(vocab_size, dtype=torch.float32, device=device)

    def penalized(self, logits: Any) -> Any:
        """Steps 1-3 of the module docstring on a 1-D logits row (a new tensor; the row is kept)."""
        torch = self._torch
        p = self.params
        x = logits.float().clone()
        if self._seen is not None:
            seen = x[self._seen]
            x[self._seen] = torch.where(seen > 0, seen / p.repetition_penalty, seen * p.repetition_penalty)
        if self._counts is not None:
            x -= p.frequency_penalty * self._counts + p.presence_penalty * (self._counts > 0).float()
        if self._eos is not None and (p.ignore_eos or self.generated < p.min_tokens):
            x[self._eos] = float("-inf")
        return x

    def uniform(self) -> float:
        """The next draw in [0, 1) of this sequence's own generator (one per sampled token)."""
        return float(self._torch.rand((), generator=self._generator))

    def choose(self, logits: Any) -> tuple[int, TokenLogprobs | None]:
        """The next token for a 1-D float logits row (not modified), and its logprobs when asked."""
        torch = self._torch
        p = self.params
        x = logits if p.plain else self.penalized(logits)
        if p.greedy:
            token = int(torch.argmax(x))
        else:
            token = draw_tokens(x.unsqueeze(0), [p], [self.uniform()])[0]
        logprobs = None
        if p.logprobs:
            lp = torch.log_softmax(x.float(), dim=-1)
            top: tuple[tuple[int, float], ...] = ()
            if p.top_logprobs > 0:
                values, ids = torch.topk(lp, p.top_logprobs)
                top = tuple(zip(ids.tolist(), values.tolist()))
            logprobs = TokenLogprobs(float(lp[token]), top)
        self.record(token)
        return token, logprobs

    def record(self, token: int) -> None:
        """Count ``token`` as generated (penalties and min_tokens read the counts)."""
        self.generated += 1
        if self._seen is not None:
            self._seen[token] = True
        if self._counts is not None:
            self._counts[token] += 1.0


def draw_tokens(scores: Any, params: list[SamplingParams], uniforms: list[float]) -> list[int]:
    """Step 5 for several rows at once: ``scores`` [rows, vocab] (processed logits), each row
    with its own temperature, top_k, top_p and uniform draw ``uniforms[row]`` from its own
    generator; the token is the first whose cumulative probability exceeds the draw (inverse
    CDF over the tokens sorted by score). Vectorized over rows; the same function serves one
    row, so a seed gives the same token on either engine for the same logits."""
    torch = __import__("torch")
    rows = scores.shape[0]
    device = scores.device
    temperature = torch.tensor([p.temperature for p in params], dtype=torch.float32, device=device).unsqueeze(-1)
    sorted_scores, order = torch.sort(scores.float() / temperature, dim=-1, descending=True)
    vocab = sorted_scores.shape[-1]
    top_k = torch.tensor([p.top_k if 0 < p.top_k < vocab else vocab for p in params], device=device)
    positions = torch.arange(vocab, device=device).unsqueeze(0)
    sorted_scores = sorted_scores.masked_fill(positions >= top_k.unsqueeze(-1), float("-inf"))
    probs = torch.softmax(sorted_scores, dim=-1)
    top_p = torch.tensor([p.top_p for p in params], dtype=torch.float32, device=device).unsqueeze(-1)
    before = probs.cumsum(dim=-1) - probs  # probability of the better tokens
    probs = probs.masked_fill(before >= top_p, 0.0)  # keeps the token that crosses top_p, and the best
    cdf = probs.cumsum(dim=-1)
    u = torch.tensor(uniforms, dtype=torch.float32, device=device).unsqueeze(-1) * cdf[:, -1:]
    picked = torch.searchsorted(cdf, u, right=True).clamp(max=vocab - 1)
    return order.gather(-1, picked).squeeze(-1).tolist()[:rows]


def one_hot_scores(scores: Any, tokens: list[int]) -> Any:
    """``scores`` ([rows, vocab]) overwritten in place: 0 at ``tokens[row]``, -inf elsewhere."""
    torch = __import__("torch")
    scores.fill_(float("-inf"))
    index = torch.tensor(tokens, dtype=torch.long, device=scores.device).unsqueeze(-1)
    scores.scatter_(1, index, 0.0)
    return scores


class SamplerLogitsProcessor:
    """A transformers ``LogitsProcessor`` for one sequence in ``generate`` (batch of one, greedy
    search): its scores become one-hot on the sampler's choice. The choices' logprobs wait in
    ``logprobs`` (oldest first) for the streamer to pick up."""

    def __init__(self, sampler: SequenceSampler) -> None:
        from collections import deque

        self.sampler = sampler
        self.logprobs: Any = deque()

    def __call__(self, input_ids: Any, scores: Any) -> Any:
        token, logprobs = self.sampler.choose(scores[0])
        if self.sampler.params.logprobs:
            self.logprobs.append(logprobs)
        return one_hot_scores(scores, [token])
