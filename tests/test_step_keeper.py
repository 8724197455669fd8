"""Under a keep policy the continuous engine's engine_step spans follow the requests: the step
ratio's sample (by step number) and the steps of each kept request's largest gaps, from the
records held for the last HOLD_S seconds; what is no longer held is counted, never guessed.
The planted-stall test behind the real gateway is tests/test_keep_serve.py."""

from __future__ import annotations

import logging

import pytest
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from instrument.engines.continuous.spans import StepRecord
from instrument.engines.continuous.step_keeper import (
    DEFAULT_STEP_RATIO,
    ENV_STEP_RATIO,
    StepKeeper,
    step_ratio_from_env,
    step_sampled,
)
from instrument.otel.span_writer import span_writer_for

STEP_NS = 50_000_000  # one step every 50 ms


def step(n: int) -> StepRecord:
    start = n * STEP_NS
    return StepRecord(n, start, start + 1_000, 4, 4, 0, 10, 100, 16, 0, end_ns=start + STEP_NS - 1_000)


def keeper(ratio: float, hold_s: float = 120.0) -> tuple[StepKeeper, InMemorySpanExporter]:
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    tracer = provider.get_tracer("test")
    return StepKeeper(tracer, span_writer_for(tracer), 1000, ratio, hold_s=hold_s), exporter


def test_a_malformed_ratio_is_one_warning_and_the_default(caplog) -> None:
    with caplog.at_level(logging.WARNING, logger="tokentrace.export"):
        assert step_ratio_from_env({ENV_STEP_RATIO: "lots"}) == DEFAULT_STEP_RATIO
        assert step_ratio_from_env({ENV_STEP_RATIO: "1.5"}) == DEFAULT_STEP_RATIO
    assert [r.getMessage().split("=")[0] for r in caplog.records] == [f"tokentrace: {ENV_STEP_RATIO}"] * 2
    assert step_ratio_from_env({ENV_STEP_RATIO: "0.25"}) == 0.25 and step_ratio_from_env({}) == DEFAULT_STEP_RATIO


@pytest.mark.parametrize("ratio", [0.01, 0.1, 0.5])
def test_the_sample_takes_its_share_of_steps(ratio: float) -> None:
    taken = sum(step_sampled(n, ratio) for n in range(1, 100_001))
    assert abs(taken / 100_000 - ratio) < 0.1 * ratio
    assert all(step_sampled(n, 1.0) for n in range(100)) and not any(step_sampled(n, 0.0) for n in range(100))


def test_a_kept_request_gets_the_steps_of_its_largest_gaps_once() -> None:
    k, exporter = keeper(0.0)
    for n in range(1, 201):
        k.step(step(n))
    # tokens at the end of steps 10, 12, 30, 31, 40, 41: gaps of 2, 18, 1, 9, 1 steps
    emitted = [(step(n).end_ns, n) for n in (10, 12, 30, 31, 40, 41)]
    k.keep_gaps(emitted)
    spans = exporter.get_finished_spans()
    steps = sorted(s.attributes["tokentrace.engine.step"] for s in spans if s.name == "engine_step")
    # the three largest gaps, each from the step after the token before it to the token's step
    assert steps == [*range(11, 13), *range(13, 31), *range(32, 41)]
    roots = [s for s in spans if s.name == "engine"]
    assert len(roots) == 1 and roots[0].attributes["tokentrace.sampling.reason"] == "gap"
    assert k.counts() == {"sampled": 0, "kept_for_gaps": len(steps), "lost": 0}
    k.keep_gaps(emitted)  # a second request sharing the stall: nothing written twice
    assert len([s for s in exporter.get_finished_spans() if s.name == "engine_step"]) == len(steps)


def test_gap_steps_older_than_the_hold_are_counted_lost() -> None:
    k, exporter = keeper(0.0, hold_s=1.0)  # 20 steps of 50 ms
    for n in range(1, 101):
        k.step(step(n))
    k.keep_gaps([(step(5).end_ns, 5), (step(9).end_ns, 9), (step(95).end_ns, 95), (step(96).end_ns, 96)])
    written = sorted(s.attributes["tokentrace.engine.step"] for s in exporter.get_finished_spans()
                     if s.name == "engine_step")
    # 6..9 are gone; of 10..95 (the 64 steps up to 95: 32..95) the held ones are written
    held = {n for n in range(1, 101) if step(100).end_ns - step(n).end_ns <= 1e9}
    wanted = {*range(6, 10), *range(32, 96), 96}
    assert written == sorted(wanted & held)
    assert k.counts()["lost"] == len(wanted - held) and k.counts()["kept_for_gaps"] == len(written)


def test_the_sample_is_written_at_once_under_the_usual_engine_traces() -> None:
    k, exporter = keeper(0.1)
    for n in range(1, 1001):
        k.step(step(n))
    k.idle()
    written = [s.attributes["tokentrace.engine.step"] for s in exporter.get_finished_spans() if s.name == "engine_step"]
    assert written == [n for n in range(1, 1001) if step_sampled(n, 0.1)] and k.counts()["sampled"] == len(written)
