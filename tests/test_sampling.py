"""instrument/hf/token_sampling.py and the stop-sequence text filter, against the definitions they cite."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

from instrument.gateway.choice_text import StopText
from instrument.hf.token_sampling import SamplingParams, SequenceSampler, one_hot_scores

VOCAB = 8
EOS = 7


def _sampler(**kwargs: object) -> SequenceSampler:
    params = SamplingParams(max_tokens=100, temperature=kwargs.pop("temperature", 0.0), **kwargs)  # type: ignore[arg-type]  # the test passes the keyword arguments through
    return SequenceSampler(params, [EOS], prompt_ids=[1, 2], vocab_size=VOCAB)


def test_greedy_picks_the_argmax_and_leaves_the_logits_alone() -> None:
    logits = torch.tensor([0.1, 3.0, 2.0, -1.0, 0.0, 0.5, 2.9, 1.0])
    before = logits.clone()
    token, logprobs = _sampler().choose(logits)
    assert token == 1 and logprobs is None and torch.equal(logits, before)


def test_frequency_and_presence_penalties_are_openais_additive_definition() -> None:
    s = _sampler(frequency_penalty=0.5, presence_penalty=1.0, logprobs=True, top_logprobs=2)
    logits = torch.tensor([0.0, 3.0, 2.9, 2.8, 0.0, 0.0, 0.0, 0.0])
    assert s.choose(logits)[0] == 1  # nothing generated yet: no penalty
    # token 1 was generated once: 3.0 - 0.5*1 - 1.0 = 1.5 < 2.9
    token, lp = s.choose(logits)
    assert token == 2
    expected = logits.clone()
    expected[1] -= 0.5 + 1.0
    assert lp.logprob == pytest.approx(float(torch.log_softmax(expected, -1)[2]))
    assert [t for t, _ in lp.top] == [2, 3]
    # tokens 1 and 2 once each: 3 is best now (2.8 > 1.5, 1.4)
    assert s.choose(logits)[0] == 3


def test_repetition_penalty_divides_positive_and_multiplies_negative_seen_logits() -> None:
    s = _sampler(repetition_penalty=2.0)
    # prompt ids 1 and 2 are seen: 4.0 -> 2.0, -1.0 -> -2.0; unseen 3.0 stays
    logits = torch.tensor([0.0, 4.0, -1.0, 3.0, 0.0, 0.0, 0.0, 0.0])
    assert s.choose(logits)[0] == 3
    logits2 = torch.tensor([0.0, 4.0, -1.0, 1.9, 0.0, 0.0, 0.0, 0.0])
    # now 3 is seen too: 1.9 / 2 = 0.95 < 2.0 (token 1)
    assert s.choose(logits2)[0] == 1


def test_min_tokens_and_ignore_eos_mask_the_stop_token() -> None:
    logits = torch.zeros(VOCAB)
    logits[EOS] = 10.0
    s = _sampler(min_tokens=2)
    assert s.choose(logits)[0] != EOS and s.choose(logits)[0] != EOS
    assert s.choose(logits)[0] == EOS  # two generated: EOS allowed again
    forever = _sampler(ignore_eos=True)
    assert all(forever.choose(logits)[0] != EOS for _ in range(5))


def test_truncation_keeps_the_best_token() -> None:
    logits = torch.tensor([1.0, 1.1, 0.9, 1.05, 0.95, 1.0, 0.8, -5.0])
    one = _sampler(temperature=1.0, seed=1, top_k=1)
    assert all(one.choose(logits)[0] == 1 for _ in range(10))
    nucleus = _sampler(temperature=1.0, seed=1, top_p=0.01)
    assert all(nucleus.choose(logits)[0] == 1 for _ in range(10))
    two = _sampler(temperature=1.0, seed=2, top_k=2)
    assert {two.choose(logits)[0] for _ in range(40)} == {1, 3}


def test_same_seed_same_sequence_of_draws() -> None:
    logits = torch.tensor([1.0, 1.1, 0.9, 1.05, 0.95, 1.0, 0.8, 0.7])
    a, b, c = (_sampler(temperature=1.0, seed=s) for s in (11, 11, 12))
    seq_a = [a.choose(logits)[0] for _ in range(30)]
    assert seq_a == [b.choose(logits)[0] for _ in range(30)]
    assert seq_a != [c.choose(logits)[0] for _ in range(30)]


def test_one_hot_scores() -> None:
    scores = torch.randn(3, VOCAB)
    out = one_hot_scores(scores, [4, 0, 7])
    assert torch.equal(out.argmax(-1), torch.tensor([4, 0, 7]))
    assert int(torch.isfinite(out).sum()) == 3


@pytest.mark.parametrize(
    "stops, deltas, sent, matched",
    [
        ((",",), ["Hello", " wor", "ld, and", " more"], ["Hello", " wor", "ld", ""], True),
        (("END",), ["abc E", "N", "D tail"], ["abc ", "", ""], True),  # held across chunks, then cut
        (("END",), ["abc E", "N", "o"], ["abc ", "", "ENo"], False),  # not a stop after all: sent late
        (("xyz", "b"), ["aaxy", "zb"], ["aa", ""], True),  # the earliest match wins
    ],
)
def test_stop_text_never_shows_a_partial_stop(stops: tuple[str, ...], deltas: list[str], sent: list[str],
                                              matched: bool) -> None:
    st = StopText(stops)
    out = [st.push(d) for d in deltas]
    assert out[:len(sent)] == sent
    assert st.matched is matched
    if not matched:
        assert st.flush() == ""


def test_batched_draws_equal_single_row_draws_and_follow_the_distribution() -> None:
    from instrument.hf.token_sampling import draw_tokens

    g = torch.Generator().manual_seed(0)
    scores = torch.randn(5, VOCAB, generator=g)
    params = [SamplingParams(max_tokens=1, temperature=t, top_k=k, top_p=p)
              for t, k, p in [(1.0, 0, 1.0), (0.5, 3, 1.0), (1.5, 0, 0.7), (1.0, 2, 0.5), (0.8, 0, 1.0)]]
    uniforms = [0.03, 0.51, 0.97, 0.42, 0.0]
    together = draw_tokens(scores, params, uniforms)
    alone = [draw_tokens(scores[i:i + 1], [params[i]], [uniforms[i]])[0] for i in range(5)]
    assert together == alone
    # the inverse CDF over the softmax: draw frequencies follow the probabilities
    row = torch.tensor([2.0, 1.0, 0.0, -1.0, 0.5, 0.0, -3.0, 1.5])
    probs = torch.softmax(row, -1)
    n = 4000
    picks = draw_tokens(row.repeat(n, 1), [SamplingParams(max_tokens=1)] * n, torch.rand(n, generator=g).tolist())
    freq = torch.bincount(torch.tensor(picks), minlength=VOCAB).float() / n
    assert torch.allclose(freq, probs, atol=0.03)
    # top_p keeps the smallest set of best tokens whose probability reaches it
    nucleus = draw_tokens(row.repeat(n, 1), [SamplingParams(max_tokens=1, top_p=0.6)] * n,
                          torch.rand(n, generator=g).tolist())
    kept = sorted(range(VOCAB), key=lambda j: -float(probs[j]))
    mass, need = 0.0, set()
    for j in kept:
        need.add(j)
        mass += float(probs[j])
        if mass >= 0.6:
            break
    assert set(nucleus) == need
