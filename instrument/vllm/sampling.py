"""Which vLLM requests and engine steps the plugin traces.

A request is decided once, at its arrival on vLLM's engine thread, from the ``traceparent``
vLLM received and the sampler the standard variables name (``OTEL_TRACES_SAMPLER``,
``OTEL_TRACES_SAMPLER_ARG``), with the OpenTelemetry SDK's meaning of each value:

==========================  ================================================================
``OTEL_TRACES_SAMPLER``     a request is traced when
==========================  ================================================================
``always_on``               always
``always_off``              never
``traceidratio``            the trace id's low 64 bits fall under ratio × 2^64 (the
                            ``traceparent``'s trace id; a root: drawn at random, same odds)
``parentbased_always_on``   the ``traceparent`` says sampled; with none, always (default)
``parentbased_always_off``  the ``traceparent`` says sampled; with none, never
``parentbased_traceidratio``  the ``traceparent`` says sampled; with none, as ``traceidratio``
==========================  ================================================================

An unknown sampler name is ``parentbased_always_on``, and a ratio that is not a number in
[0, 1] is 1.0, as the SDK does; each with one warning line. A malformed ``traceparent`` is
none at all (a new root, as the W3C rules say), one warning line for the first.

``TOKENTRACE_VLLM_SAMPLE_RATIO`` (0 to 1) sets the plugin's request ratio apart from vLLM's own
sampler, which reads the same standard variables: the plugin then decides as
``parentbased_traceidratio`` at that ratio when ``OTEL_TRACES_SAMPLER`` is parent-based (or
unset), else as ``traceidratio``. So ``OTEL_TRACES_SAMPLER=parentbased_always_on`` keeps vLLM's
``llm_request`` for every request while the plugin traces 1 % of them in detail
(``TOKENTRACE_VLLM_SAMPLE_RATIO=0.01``); a caller's sampled ``traceparent`` is still followed.
A value that is not a ratio is 1.0, one warning line.

``engine_step`` spans have their own ratio, ``TOKENTRACE_VLLM_STEP_SAMPLE_RATIO`` (0 to 1, or
``off``); unset, the request sampler's ratio for a request without a parent (1 for
``always_on`` and ``parentbased_always_on``, 0 for ``*always_off``). A step is sampled when its
number, spread over 64 bits (:func:`step_sampled`), falls under ratio × 2^64: the engine thread
and the exporter process decide it alike from the number, with no field sent.

The exporter process builds spans only for what was decided here: its own sampler is
``always_on`` (a root decided here must not be decided again on another trace id).

A keep policy (``TOKENTRACE_KEEP_*``, instrument/records/keep.py, read here once) changes what
the engine thread records, not what is decided here: every request is recorded, every step
whole (so every step has its waiting and KV figures), and the decision above only marks the
random sample (:attr:`Sampling.head`); the exporter process decides each request's detail
once it has ended (instrument/vllm/spans.py).
"""

from __future__ import annotations

import logging
import os
import random
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

__all__ = ["ENV_SAMPLE_RATIO", "ENV_STEP_RATIO", "MASK64", "STEP_SPREAD", "Sampling", "sampling_from_env", "step_sampled"]

ENV_STEP_RATIO = "TOKENTRACE_VLLM_STEP_SAMPLE_RATIO"
ENV_SAMPLE_RATIO = "TOKENTRACE_VLLM_SAMPLE_RATIO"
MASK64 = (1 << 64) - 1
#: 2^64 / golden ratio, odd: multiplying spreads consecutive step numbers evenly over 64 bits
STEP_SPREAD = 0x9E3779B97F4A7C15
_SAMPLERS = ("always_on", "always_off", "traceidratio", "parentbased_always_on", "parentbased_always_off",
             "parentbased_traceidratio")
_TRACEPARENT = re.compile(r"^([0-9a-f]{2})-([0-9a-f]{32})-([0-9a-f]{16})-([0-9a-f]{2})(-.*)?$")
log = logging.getLogger("tokentrace.vllm")


def _bound(ratio: float) -> int:
    """The OpenTelemetry SDK's bound for a ratio (``TraceIdRatioBased.get_bound_for_rate``)."""
    return round(ratio * (MASK64 + 1))


def step_sampled(step: int, step_bound: int) -> bool:
    """Whether engine step ``step`` gets its ``engine_step`` span (``step_bound``:
    :attr:`Sampling.step_bound`). The schedule wrapper inlines the same arithmetic."""
    return (step * STEP_SPREAD) & MASK64 < step_bound


@dataclass
class Sampling:
    """The plugin's sampling, read once from the environment (:func:`sampling_from_env`)."""

    sampler: str = "parentbased_always_on"  # one of the standard names
    ratio: float = 1.0  # for the *traceidratio samplers (else 1.0)
    step_ratio: float = 1.0  # engine_step spans
    warnings: list[str] = field(default_factory=list)  # lines to log once (bad values)
    bad_traceparents: int = 0  # malformed traceparent headers seen (the first logged)
    keep_policy: Any = None  # the keep policy (instrument/records/keep.py KeepPolicy), None: none set

    @property
    def keeps(self) -> bool:
        """A keep policy is set: every request recorded, each decided once it has ended."""
        return self.keep_policy is not None

    @property
    def bound(self) -> int:
        return _bound(self.ratio)

    @property
    def step_bound(self) -> int:
        return _bound(self.step_ratio)

    @property
    def traces_nothing(self) -> bool:
        """No request and no step can ever be sampled (the plugin then starts nothing):
        ``always_off``, or ``traceidratio`` at 0 (a caller's flag not followed), steps off."""
        never = self.sampler == "always_off" or (self.sampler == "traceidratio" and self.bound == 0)
        return never and self.step_bound == 0 and not self.keeps

    def _root(self) -> bool:
        """A request without a (valid) parent."""
        name = self.sampler
        if name in ("always_on", "parentbased_always_on"):
            return True
        if name in ("always_off", "parentbased_always_off"):
            return False
        return random.getrandbits(64) < self.bound

    def request_sampled(self, headers: Mapping[str, Any] | None) -> bool:
        """Whether the request with these trace headers (vLLM's ``Request.trace_headers``) is
        traced. Never raises: a malformed ``traceparent`` counts as none (one warning line)."""
        name = self.sampler
        if name == "always_on":
            return True
        if name == "always_off":
            return False
        value = headers.get("traceparent") if headers else None
        if value is None:
            return self._root()
        parsed = _TRACEPARENT.match(value.strip()) if isinstance(value, str) else None
        if (parsed is None or parsed.group(1) == "ff" or parsed.group(2) == "0" * 32 or parsed.group(3) == "0" * 16
                or (parsed.group(1) == "00" and parsed.group(5))):
            self.bad_traceparents += 1
            if self.bad_traceparents == 1:
                log.warning("tokentrace: a request's traceparent is malformed (%.80r): traced as a new root, as "
                            "the W3C rules say (later ones counted, not logged)", value)
            return self._root()
        if name == "traceidratio":
            return int(parsed.group(2)[16:], 16) < self.bound
        return bool(int(parsed.group(4), 16) & 1)


def _ratio(text: str, what: str, warnings: list[str]) -> float:
    try:
        ratio = float(text)
    except ValueError:
        ratio = -1.0
    if not 0.0 <= ratio <= 1.0:
        warnings.append(f"tokentrace: {what}={text!r} is not a ratio in [0, 1]: 1.0 used (the OpenTelemetry SDK's "
                        "default)")
        return 1.0
    return ratio


def sampling_from_env(env: Mapping[str, str] = os.environ) -> Sampling:
    """The plugin's :class:`Sampling` from the standard variables, ``ENV_SAMPLE_RATIO``,
    ``ENV_STEP_RATIO`` and the keep policy's ``TOKENTRACE_KEEP_*`` (a malformed one: a line
    in ``warnings`` naming it, that rule off)."""
    from instrument.records.keep import KeepPolicy

    warnings: list[str] = []
    name = env.get("OTEL_TRACES_SAMPLER", "parentbased_always_on").strip().lower() or "parentbased_always_on"
    if name not in _SAMPLERS:
        warnings.append(f"tokentrace: OTEL_TRACES_SAMPLER={name!r} is not a sampler the plugin knows: "
                        "parentbased_always_on used (the OpenTelemetry SDK's default)")
        name = "parentbased_always_on"
    ratio = 1.0
    own = env.get(ENV_SAMPLE_RATIO, "").strip()
    if own:  # the plugin's ratio, apart from vLLM's own sampler (module docstring)
        name = "parentbased_traceidratio" if name.startswith("parentbased") else "traceidratio"
        ratio = _ratio(own, ENV_SAMPLE_RATIO, warnings)
    elif name.endswith("traceidratio"):
        ratio = _ratio(env.get("OTEL_TRACES_SAMPLER_ARG", ""), "OTEL_TRACES_SAMPLER_ARG", warnings)
    step_text = env.get(ENV_STEP_RATIO, "").strip().lower()
    if step_text == "off":
        step_ratio = 0.0
    elif step_text:
        step_ratio = _ratio(step_text, ENV_STEP_RATIO, warnings)
    else:
        step_ratio = ratio if name.endswith("traceidratio") else 0.0 if name.endswith("always_off") else 1.0
    policy = KeepPolicy.from_env(env, warn=warnings.append)
    return Sampling(name, ratio, step_ratio, warnings, keep_policy=policy)
