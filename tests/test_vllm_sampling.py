"""The vLLM plugin's sampling (instrument/vllm/sampling.py): the standard sampler values as the
OpenTelemetry SDK reads them, decided once per request from its traceparent; engine_step spans
by step number, the same on the engine thread and in the exporter process."""

from __future__ import annotations

import logging
import random

import pytest
from opentelemetry.sdk.trace import sampling as sdk_sampling
from opentelemetry.trace import NonRecordingSpan, SpanContext, TraceFlags, set_span_in_context

from instrument.vllm.sampling import (
    ENV_SAMPLE_RATIO,
    ENV_STEP_RATIO,
    MASK64,
    STEP_SPREAD,
    Sampling,
    sampling_from_env,
    step_sampled,
)

TRACE = "4bf92f3577b34da6a3ce929d0e0e4736"
SPAN = "00f067aa0ba902b7"


def _parent(flags: str, trace: str = TRACE) -> dict[str, str]:
    return {"traceparent": f"00-{trace}-{SPAN}-{flags}"}


def _sdk_decides(name: str, arg: str, headers: dict[str, str] | None, monkeypatch: pytest.MonkeyPatch) -> bool:
    """What the OpenTelemetry SDK's sampler from the same variables decides for a child of
    ``headers``' traceparent (None: a root; its trace id then is the one given to the SDK)."""
    monkeypatch.setenv("OTEL_TRACES_SAMPLER", name)
    monkeypatch.setenv("OTEL_TRACES_SAMPLER_ARG", arg)
    sampler = sdk_sampling._get_from_env_or_default()
    context = None
    trace_id = int(TRACE, 16)
    if headers is not None:
        _, trace, span, flags = headers["traceparent"].split("-")
        trace_id = int(trace, 16)
        parent = SpanContext(trace_id, int(span, 16), is_remote=True, trace_flags=TraceFlags(int(flags, 16)))
        context = set_span_in_context(NonRecordingSpan(parent))
    return sampler.should_sample(context, trace_id, "engine_request").decision.is_sampled()


@pytest.mark.parametrize("name, arg", [
    ("always_on", ""), ("always_off", ""), ("parentbased_always_on", ""), ("parentbased_always_off", ""),
    ("traceidratio", "0.5"), ("parentbased_traceidratio", "0.5"), ("traceidratio", "0.0001"),
])
@pytest.mark.parametrize("headers", [
    _parent("01"), _parent("00"), _parent("01", "f" * 16 + "0" * 16), _parent("00", "0" * 16 + "f" * 16),
])
def test_a_request_with_a_parent_is_decided_as_the_sdk_decides(name: str, arg: str, headers: dict[str, str],
                                                                monkeypatch: pytest.MonkeyPatch) -> None:
    sampling = sampling_from_env({"OTEL_TRACES_SAMPLER": name, "OTEL_TRACES_SAMPLER_ARG": arg})
    assert sampling.request_sampled(headers) is _sdk_decides(name, arg, headers, monkeypatch)


@pytest.mark.parametrize("name, want", [("always_on", True), ("parentbased_always_on", True), ("always_off", False),
                                        ("parentbased_always_off", False)])
def test_a_root_request(name: str, want: bool) -> None:
    sampling = sampling_from_env({"OTEL_TRACES_SAMPLER": name})
    assert sampling.request_sampled(None) is want
    assert sampling.request_sampled({}) is want


def test_a_root_under_a_ratio_is_drawn_at_that_ratio() -> None:
    random.seed(7)
    sampling = sampling_from_env({"OTEL_TRACES_SAMPLER": "parentbased_traceidratio", "OTEL_TRACES_SAMPLER_ARG": "0.1"})
    drawn = sum(sampling.request_sampled(None) for _ in range(20_000))
    assert 1_800 < drawn < 2_200  # 2,000 expected; 4.7 standard deviations either side
    assert sampling.request_sampled(_parent("01")) and not sampling.request_sampled(_parent("00"))


@pytest.mark.parametrize("value", [
    "not-a-traceparent", "00-" + "0" * 32 + f"-{SPAN}-01", f"00-{TRACE}-" + "0" * 16 + "-01",
    f"ff-{TRACE}-{SPAN}-01", f"00-{TRACE.upper()}-{SPAN}-01", f"00-{TRACE}-{SPAN}-01-extra", 17,
])
def test_a_malformed_traceparent_is_a_new_root_with_one_warning(value: object,
                                                                 caplog: pytest.LogCaptureFixture) -> None:
    off = sampling_from_env({"OTEL_TRACES_SAMPLER": "parentbased_always_off"})
    on = sampling_from_env({})
    with caplog.at_level(logging.WARNING, logger="tokentrace.vllm"):
        assert off.request_sampled({"traceparent": value}) is False  # a root: never, under *_always_off
        assert off.request_sampled({"traceparent": value}) is False
        assert on.request_sampled({"traceparent": value}) is True  # a root: always
    lines = [r.getMessage() for r in caplog.records]
    assert len(lines) == 2 and all("traceparent is malformed" in line and "new root" in line for line in lines)
    assert off.bad_traceparents == 2


def test_a_future_version_with_more_fields_is_read() -> None:
    """W3C: a version above 00 may carry more fields after the flags."""
    sampling = sampling_from_env({"OTEL_TRACES_SAMPLER": "parentbased_always_off"})
    assert sampling.request_sampled({"traceparent": f"01-{TRACE}-{SPAN}-01-more"}) is True


@pytest.mark.parametrize("env, sampler, ratio, step_ratio, warned", [
    ({}, "parentbased_always_on", 1.0, 1.0, 0),
    ({"OTEL_TRACES_SAMPLER": "traceidratio", "OTEL_TRACES_SAMPLER_ARG": "0.01"}, "traceidratio", 0.01, 0.01, 0),
    ({"OTEL_TRACES_SAMPLER": "parentbased_traceidratio", "OTEL_TRACES_SAMPLER_ARG": "half"},
     "parentbased_traceidratio", 1.0, 1.0, 1),
    ({"OTEL_TRACES_SAMPLER": "traceidratio", "OTEL_TRACES_SAMPLER_ARG": "1.5"}, "traceidratio", 1.0, 1.0, 1),
    ({"OTEL_TRACES_SAMPLER": "sometimes"}, "parentbased_always_on", 1.0, 1.0, 1),
    ({"OTEL_TRACES_SAMPLER": "ALWAYS_OFF"}, "always_off", 1.0, 0.0, 0),
    ({"OTEL_TRACES_SAMPLER": "always_off", ENV_STEP_RATIO: "0.25"}, "always_off", 1.0, 0.25, 0),
    ({"OTEL_TRACES_SAMPLER": "traceidratio", "OTEL_TRACES_SAMPLER_ARG": "0.01", ENV_STEP_RATIO: "1"},
     "traceidratio", 0.01, 1.0, 0),
    ({ENV_STEP_RATIO: "off"}, "parentbased_always_on", 1.0, 0.0, 0),
    ({ENV_STEP_RATIO: "-1"}, "parentbased_always_on", 1.0, 1.0, 1),
    ({"OTEL_TRACES_SAMPLER": "traceidratio", "OTEL_TRACES_SAMPLER_ARG": "0"}, "traceidratio", 0.0, 0.0, 0),
    ({"OTEL_TRACES_SAMPLER": "parentbased_traceidratio", "OTEL_TRACES_SAMPLER_ARG": "0"},
     "parentbased_traceidratio", 0.0, 0.0, 0),
    # the plugin's own ratio, apart from vLLM's sampler (which keeps reading OTEL_TRACES_SAMPLER)
    ({"OTEL_TRACES_SAMPLER": "parentbased_always_on", ENV_SAMPLE_RATIO: "0.01"}, "parentbased_traceidratio",
     0.01, 0.01, 0),
    ({ENV_SAMPLE_RATIO: "0.25"}, "parentbased_traceidratio", 0.25, 0.25, 0),
    ({"OTEL_TRACES_SAMPLER": "always_on", ENV_SAMPLE_RATIO: "0.5", ENV_STEP_RATIO: "off"}, "traceidratio",
     0.5, 0.0, 0),
    ({"OTEL_TRACES_SAMPLER": "traceidratio", "OTEL_TRACES_SAMPLER_ARG": "1", ENV_SAMPLE_RATIO: "0"},
     "traceidratio", 0.0, 0.0, 0),
    ({"OTEL_TRACES_SAMPLER": "parentbased_traceidratio", "OTEL_TRACES_SAMPLER_ARG": "0.5", ENV_SAMPLE_RATIO: "2"},
     "parentbased_traceidratio", 1.0, 1.0, 1),
])
def test_sampling_from_the_environment(env: dict[str, str], sampler: str, ratio: float, step_ratio: float,
                                       warned: int) -> None:
    got = sampling_from_env(env)
    assert (got.sampler, got.ratio, got.step_ratio, len(got.warnings)) == (sampler, ratio, step_ratio, warned)
    # nothing can be sampled: no request (a caller's flag not followed) and no step
    never = sampler == "always_off" or (sampler == "traceidratio" and ratio == 0.0)
    assert got.traces_nothing is (never and step_ratio == 0.0)


def test_the_plugins_own_ratio_still_follows_a_callers_sampled_flag() -> None:
    got = sampling_from_env({"OTEL_TRACES_SAMPLER": "parentbased_always_on", ENV_SAMPLE_RATIO: "0"})
    assert got.request_sampled(_parent("01")) and not got.request_sampled(_parent("00"))
    assert not got.request_sampled(None), "a root, at ratio 0"


def test_bad_values_say_what_was_used() -> None:
    got = sampling_from_env({"OTEL_TRACES_SAMPLER": "traceidratio", "OTEL_TRACES_SAMPLER_ARG": "half"})
    assert got.warnings == ["tokentrace: OTEL_TRACES_SAMPLER_ARG='half' is not a ratio in [0, 1]: 1.0 used (the "
                            "OpenTelemetry SDK's default)"]


@pytest.mark.parametrize("ratio", [0.0, 0.01, 0.1, 0.5, 1.0])
def test_steps_are_sampled_at_the_ratio_evenly(ratio: float) -> None:
    bound = Sampling(step_ratio=ratio).step_bound
    picked = [step for step in range(1, 100_001) if step_sampled(step, bound)]
    assert abs(len(picked) - ratio * 100_000) <= 2
    if 0 < ratio < 1:  # spread: every window of 10/ratio steps holds some, not bunched
        window = int(10 / ratio)
        counts = [sum(1 for s in picked if lo <= s < lo + window) for lo in range(1, 100_001 - window, window)]
        assert min(counts) >= 5 and max(counts) <= 15, (min(counts), max(counts))


def test_the_schedule_wrappers_inlined_step_test_is_step_sampled() -> None:
    """The schedule wrapper (hooks._traced_schedule, made by hooks.install) inlines
    ``(step * STEP_SPREAD) & MASK64 < bound``: the same function."""
    import inspect

    from instrument.vllm import hooks

    assert "(self.current_step * _spread) & _mask < _step_bound" in inspect.getsource(hooks._traced_schedule)
    for bound in (0, Sampling(step_ratio=0.3).step_bound, MASK64 + 1):
        for step in range(1, 2_000):
            assert ((step * STEP_SPREAD) & MASK64 < bound) is step_sampled(step, bound)
