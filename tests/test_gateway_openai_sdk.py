"""The gateway as the official ``openai`` SDK sees it, on both engines (docs/gateway.md).

A real ``tokentrace serve``-equivalent app (uvicorn on 127.0.0.1) with the tiny model; the
client is ``openai.OpenAI`` (its own HTTP stack, typed errors). Every request parameter the
gateway implements is checked by its effect on the output, not by its echo.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator
from typing import Any

import pytest

pytest.importorskip("fastapi")
pytest.importorskip("torch")
openai = pytest.importorskip("openai")

import httpx
from opentelemetry.sdk.trace import SpanLimits, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from instrument.gateway.app import GatewaySettings, create_app
from instrument.gateway.server import ServerThread
from instrument.hf.model_handle import load_model_handle

MODEL = "tiny"
PROMPT = [{"role": "user", "content": "Tell me about hotels in Kyoto with onsen access."}]
FIXED = {"ignore_eos": True}  # run to max_tokens: the tiny random model stops early otherwise


@pytest.fixture(scope="module")
def handle() -> Any:
    return load_model_handle("tiny")


@pytest.fixture(scope="module", params=["sequential", "continuous"])
def server(request: pytest.FixtureRequest, handle: Any) -> Iterator[Any]:
    exporter = InMemorySpanExporter()
    provider = TracerProvider(span_limits=SpanLimits(max_events=4096))
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    app = create_app(handle, provider, dataclasses.replace(GatewaySettings(max_tokens_limit=256), engine=request.param))
    with ServerThread(app) as srv:
        srv.exporter = exporter  # type: ignore[attr-defined]  # kept on the server object for the test
        yield srv


@pytest.fixture()
def client(server: Any) -> Any:
    return openai.OpenAI(base_url=server.url + "/v1", api_key="unused", max_retries=0, timeout=60.0)


def _chat(client: Any, **kwargs: Any) -> Any:
    extra = {**FIXED, **kwargs.pop("extra_body", {})}
    kwargs.setdefault("temperature", 0)
    return client.chat.completions.create(model=MODEL, messages=PROMPT, extra_body=extra, **kwargs)


def _stream_text(client: Any, **kwargs: Any) -> tuple[list[str], str | None]:
    extra = {**FIXED, **kwargs.pop("extra_body", {})}
    deltas, finish = [], None
    for chunk in client.chat.completions.create(model=MODEL, messages=PROMPT, temperature=0, stream=True,
                                                extra_body=extra, **kwargs):
        if chunk.choices:
            if chunk.choices[0].delta.content:
                deltas.append(chunk.choices[0].delta.content)
            finish = chunk.choices[0].finish_reason or finish
    return deltas, finish


def _gateway_span(server: Any, response_id: str) -> Any:
    return next(s for s in server.exporter.get_finished_spans()
                if s.name == "gateway" and s.attributes.get("gen_ai.response.id") == response_id)


def test_stop_ends_at_the_first_match_without_the_stop_text(client: Any, server: Any) -> None:
    full = _chat(client, max_tokens=40).choices[0].message.content
    assert len(full) > 12
    stop = full[6:9]
    expected = full[:full.find(stop)]
    answer = _chat(client, max_tokens=40, stop=[stop, "never-in-the-output-\u2603"])
    assert answer.choices[0].message.content == expected
    assert answer.choices[0].finish_reason == "stop"
    span = _gateway_span(server, answer.id)
    assert span.attributes["gen_ai.request.stop_sequences"] == (stop, "never-in-the-output-\u2603")
    assert span.attributes["gen_ai.response.finish_reasons"] == ("stop",)
    # streaming: the deltas add up to the same prefix, so no partial stop text was ever shown
    deltas, finish = _stream_text(client, max_tokens=40, stop=stop)
    assert "".join(deltas) == expected and finish == "stop"
    # legacy completions, a single string
    text = client.completions.create(model=MODEL, prompt="Kyoto hotels", max_tokens=30, temperature=0,
                                     extra_body=FIXED).choices[0].text
    cut = text[4:6]
    stopped = client.completions.create(model=MODEL, prompt="Kyoto hotels", max_tokens=30, temperature=0, stop=cut,
                                        extra_body=FIXED)
    assert stopped.choices[0].text == text[:text.find(cut)] and stopped.choices[0].finish_reason == "stop"


def test_seed_makes_sampling_repeatable(client: Any, server: Any) -> None:
    def sample(seed: int) -> str:
        return _chat(client, max_tokens=24, temperature=1.2, seed=seed).choices[0].message.content

    first = sample(7)
    assert sample(7) == first
    assert any(sample(s) != first for s in (8, 9, 10)), "other seeds draw other tokens"
    answer = _chat(client, max_tokens=4, temperature=1.2, seed=7)
    assert _gateway_span(server, answer.id).attributes["gen_ai.request.seed"] == 7


def test_penalties_change_the_output_as_defined(client: Any, server: Any) -> None:
    plain = _chat(client, max_tokens=32, logprobs=True).choices[0].logprobs.content
    plain_tokens = [t.token for t in plain]
    assert len(set(plain_tokens)) < len(plain_tokens), "the greedy answer repeats tokens"
    penalized = _chat(client, max_tokens=32, logprobs=True, frequency_penalty=2.0, presence_penalty=2.0)
    tokens = [t.token for t in penalized.choices[0].logprobs.content]
    assert tokens != plain_tokens
    assert len(set(tokens)) > len(set(plain_tokens)), "penalties push the answer away from repeats"
    span = _gateway_span(server, penalized.id)
    assert span.attributes["gen_ai.request.frequency_penalty"] == 2.0
    assert span.attributes["gen_ai.request.presence_penalty"] == 2.0
    repeated = _chat(client, max_tokens=32, extra_body={"repetition_penalty": 3.0}).choices[0].message.content
    assert repeated != _chat(client, max_tokens=32).choices[0].message.content


def test_logprobs_and_top_logprobs(client: Any) -> None:
    answer = _chat(client, max_tokens=12, logprobs=True, top_logprobs=3)
    content = answer.choices[0].logprobs.content
    assert len(content) == answer.usage.completion_tokens == 12
    assert "".join(t.token for t in content) == answer.choices[0].message.content
    for entry in content:
        assert entry.logprob <= 0.0 and len(entry.top_logprobs) == 3
        # greedy: the chosen token is the most likely one
        assert entry.top_logprobs[0].token == entry.token
        assert entry.top_logprobs[0].logprob == pytest.approx(entry.logprob)
        assert entry.bytes == list(entry.token.encode("utf-8"))
    legacy = client.completions.create(model=MODEL, prompt="Kyoto", max_tokens=6, temperature=0, logprobs=2,
                                       extra_body=FIXED).choices[0]
    assert len(legacy.logprobs.tokens) == 6 and all(len(top) <= 2 for top in legacy.logprobs.top_logprobs)
    assert "".join(legacy.logprobs.tokens) == legacy.text
    assert legacy.logprobs.text_offset[0] == 0


def test_ignore_eos_min_tokens_and_max_completion_tokens_give_the_asked_length(client: Any) -> None:
    exact = _chat(client, max_completion_tokens=17)
    assert exact.usage.completion_tokens == 17 and exact.choices[0].finish_reason == "length"
    # min_tokens alone: EOS cannot end the answer before 20 tokens
    at_least = client.chat.completions.create(model=MODEL, messages=PROMPT, temperature=0, max_tokens=20,
                                              extra_body={"min_tokens": 20})
    assert at_least.usage.completion_tokens == 20
    # top_k=1 samples the most likely token even at a high temperature: the greedy answer
    greedy = _chat(client, max_tokens=16).choices[0].message.content
    assert _chat(client, max_tokens=16, temperature=1.5, extra_body={"top_k": 1}).choices[0].message.content == greedy


def test_streaming_with_usage_and_logprobs(client: Any) -> None:
    chunks = list(client.chat.completions.create(
        model=MODEL, messages=PROMPT, temperature=0, stream=True, max_tokens=10, logprobs=True,
        stream_options={"include_usage": True}, extra_body=FIXED))
    entries = [e for c in chunks if c.choices and c.choices[0].logprobs for e in c.choices[0].logprobs.content]
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert chunks[-1].usage.completion_tokens == 10 == len(entries)
    assert "".join(e.token for e in entries) == text


def test_unknown_fields_refused_accepted_ignored_documented(client: Any) -> None:
    with pytest.raises(openai.BadRequestError) as bad:
        _chat(client, max_tokens=4, extra_body={"frobnicate": 1})
    assert "unrecognized request argument: frobnicate" in str(bad.value)
    assert bad.value.body["param"] == "frobnicate"
    with pytest.raises(openai.BadRequestError, match="n: only n=1"):
        _chat(client, max_tokens=4, n=2)
    with pytest.raises(openai.BadRequestError, match="logit_bias"):
        _chat(client, max_tokens=4, logit_bias={"5": 10})
    # accepted and ignored (docs/gateway.md lists them)
    assert _chat(client, max_tokens=4, user="someone", metadata={"k": "v"}, store=False).choices[0].message.content


def test_models_and_errors_in_openai_shape(client: Any, server: Any) -> None:
    listed = [m.id for m in client.models.list()]
    assert listed == ["tokentrace/tiny-llama-gqa-v1"]
    assert client.models.retrieve(listed[0]).id == listed[0]
    assert client.models.retrieve("tiny").id == listed[0]  # the alias answers too
    with pytest.raises(openai.NotFoundError) as missing:
        client.models.retrieve("gpt-9")
    assert missing.value.body["code"] == "model_not_found"
    with pytest.raises(openai.NotFoundError) as unknown_model:
        client.chat.completions.create(model="gpt-9", messages=PROMPT, max_tokens=2)
    assert "gpt-9" in unknown_model.value.body["message"]
    route = httpx.get(server.url + "/v1/nowhere", timeout=30)
    assert route.status_code == 404 and route.json()["error"]["code"] == "not_found"
    method = httpx.get(server.url + "/v1/chat/completions", timeout=30)
    assert method.status_code == 405 and method.json()["error"]["code"] == "method_not_allowed"
