"""Cheap timestamp recording during one ``generate`` call (no spans on the hot path).

Measured on transformers 5.24: ``generate`` calls ``streamer.put()`` with the prompt first,
then once per generated token, after the token was sampled and copied to the host; every
generated token except the last goes through a forward. So with G tokens there are G token
puts and G forwards (1 prefill + G-1 decode; more prefill forwards under chunked prefill).
Decode step k spans forward-start k -> put of token k+1; the prefill spans forward-start 0
-> put of token 1.

Per step the hot path appends one ``perf_counter_ns()`` reading when the model's forward
starts and one in the streamer's ``put`` (plus the chunk's token count). Forward starts come
from a *forward tap*: while any recorder on a model is active, the model's ``forward`` is
replaced (on the instance, as accelerate's hooks do) by a function that looks up the
calling thread's recorder and records for it, then calls the real forward. That costs
~0.3 µs per forward where a torch forward pre-hook costs ~1.1 µs (measured on a small
module: a hook sends every call through ``Module._call_impl``'s slow path), and it keeps
concurrent calls apart: each thread's recorder sees only its own thread's forwards (a
module hook would see every thread's). On CUDA the tap also records a ``torch.cuda.Event``
pair per forward (pre-allocated), read once after generate with a single synchronize: no
synchronize per step.
"""

from __future__ import annotations

import functools
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

from instrument.clock import wall_ns_from_perf_ns_list

__all__ = ["GenerationRecorder", "RecordedTimeline", "RecordingStreamer"]

_perf_counter_ns = time.perf_counter_ns
_get_ident = threading.get_ident


class RecordingStreamer:
    """A streamer for ``generate(streamer=...)``: records token emission times, forwards to ``inner``.

    The first ``put`` (the prompt) is not an emission. Per emission it keeps the time
    (``perf_counter_ns``) and the chunk's token count (1 for a ``[batch]`` tensor, ``n`` for
    ``[batch, n]``), not the tensor. Duck-types transformers' BaseStreamer.
    """

    __slots__ = ("emit_perf_ns", "chunk_tokens", "inner", "prompt_seen")

    def __init__(self, inner: Any = None) -> None:
        self.emit_perf_ns: list[int] = []
        self.chunk_tokens: list[int] = []
        self.inner = inner
        self.prompt_seen = False

    def put(self, value: Any) -> None:
        if self.prompt_seen:
            self.emit_perf_ns.append(_perf_counter_ns())
            try:
                self.chunk_tokens.append(1 if value.dim() < 2 else int(value.shape[-1]))
            except AttributeError:  # not a tensor: a list of ids is one token per sequence
                self.chunk_tokens.append(1)
        else:
            self.prompt_seen = True
        if self.inner is not None:
            self.inner.put(value)

    def end(self) -> None:
        if self.inner is not None:
            self.inner.end()


_TAPS_LOCK = threading.Lock()


class _ForwardTap:
    """The function installed as ``model.forward`` while recorders on ``model`` are active.

    ``taps[thread id] = (before, after)``: ``before(perf_counter_ns())`` runs before the real
    forward and ``after()`` (or None) after it, for forwards called on that thread only.
    """

    def __init__(self, model: Any) -> None:
        self.model = model
        self.own_forward = model.__dict__.get("forward")  # an instance attribute we replace (accelerate's)
        self.taps: dict[int, tuple[Callable[[int], Any], Callable[[], Any] | None]] = {}
        real = model.forward
        taps = self.taps

        @functools.wraps(real)
        def forward(*args: Any, **kwargs: Any) -> Any:
            tap = taps.get(_get_ident())
            if tap is None:
                return real(*args, **kwargs)
            before, after = tap
            before(_perf_counter_ns())
            if after is None:
                return real(*args, **kwargs)
            output = real(*args, **kwargs)
            after()
            return output

        forward._tokentrace_tap = self  # type: ignore[attr-defined]  # a mark on the function object, read with getattr
        self.function = forward

    @classmethod
    @contextmanager
    def active(cls, model: Any, before: Callable[[int], Any], after: Callable[[], Any] | None) -> Iterator[None]:
        """Record this thread's forwards of ``model`` with ``before``/``after`` inside the block."""
        ident = _get_ident()
        with _TAPS_LOCK:
            current = model.__dict__.get("forward")
            tap = getattr(current, "_tokentrace_tap", None)
            if tap is None:
                tap = cls(model)
                model.forward = tap.function
            if ident in tap.taps:
                raise RuntimeError(
                    "traced_generate: this thread is already recording this model (a nested traced generate "
                    "on the same model, e.g. from a streamer, is not supported)"
                )
            tap.taps[ident] = (before, after)
        try:
            yield
        finally:
            with _TAPS_LOCK:
                tap.taps.pop(ident, None)
                if not tap.taps and model.__dict__.get("forward") is tap.function:
                    if tap.own_forward is None:
                        del model.forward
                    else:
                        model.forward = tap.own_forward


@dataclass(frozen=True)
class RecordedTimeline:
    """What one generate call recorded, converted to wall-clock nanoseconds.

    ``chunk_tokens[j]``: tokens per sequence in put j (1, except under speculative decoding).
    ``forward_device_ns[f]``: accelerator time of forward f (CUDA events) or None.
    """

    forward_start_ns: list[int]
    emit_ns: list[int]
    chunk_tokens: list[int]
    forward_device_ns: list[int] | None

    @property
    def prefill_forwards(self) -> int:
        """Forwards before the first token: 1, or more under chunked prefill."""
        return len(self.forward_start_ns) - (len(self.emit_ns) - 1)


class GenerationRecorder:
    """Records forward starts (and CUDA device time) of ``model`` and token emissions of one call.

    Usage::

        recorder = GenerationRecorder(model)
        with recorder.hooks():
            model.generate(**inputs, streamer=recorder.streamer(user_streamer))
        timeline = recorder.timeline()
    """

    def __init__(
        self, model: Any, *, device_time: bool | None = None, expected_forwards: int = 0, device: Any = None
    ) -> None:
        """``device``: the model's device when the caller already looked it up (else read here)."""
        self.model = model
        self.forward_start_perf_ns: list[int] = []
        self._streamer: RecordingStreamer | None = None
        if device is None:
            device = model_device(model)
        self.device_time = (device is not None and device.type == "cuda") if device_time is None else device_time
        if self.device_time and (device is None or device.type != "cuda"):
            raise ValueError(f"device_time=True needs a CUDA model; this model is on {device}")
        self._event_pool: list[tuple[Any, Any]] = []
        self._events_used: list[tuple[Any, Any]] = []
        if self.device_time:
            import torch

            self._event_pool = [
                (torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True))
                for _ in range(expected_forwards)
            ]
            self._event_pool.reverse()

    def streamer(self, inner: Any = None) -> RecordingStreamer:
        """The streamer to pass to ``generate``; ``inner`` (the caller's streamer) still gets every put."""
        self._streamer = RecordingStreamer(inner)
        return self._streamer

    @contextmanager
    def hooks(self) -> Iterator[None]:
        """Record this thread's forwards of the model (start times; CUDA events) inside the block."""
        starts = self.forward_start_perf_ns
        before: Callable[[int], Any]
        after: Callable[[], Any] | None
        if not self.device_time:
            before, after = starts.append, None
        else:
            import torch

            pool, used = self._event_pool, self._events_used

            def before(perf_ns: int) -> None:
                starts.append(perf_ns)
                pair = pool.pop() if pool else (torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True))
                used.append(pair)
                pair[0].record()

            def after() -> None:
                used[-1][1].record()

        with _ForwardTap.active(self.model, before, after):
            yield

    def timeline(self) -> RecordedTimeline:
        """The recording in wall-clock ns; synchronizes on the last CUDA event once."""
        if self._streamer is None:
            raise RuntimeError("GenerationRecorder.streamer() was never passed to generate")
        device_ns: list[int] | None = None
        if self.device_time and self._events_used:
            self._events_used[-1][1].synchronize()
            device_ns = [round(start.elapsed_time(end) * 1e6) for start, end in self._events_used]
        return RecordedTimeline(
            forward_start_ns=wall_ns_from_perf_ns_list(self.forward_start_perf_ns),
            emit_ns=wall_ns_from_perf_ns_list(self._streamer.emit_perf_ns),
            chunk_tokens=list(self._streamer.chunk_tokens),
            forward_device_ns=device_ns,
        )


def model_device(model: Any) -> Any:
    """The model's device (``model.device``, else its first parameter's), or None."""
    device = getattr(model, "device", None)
    if device is not None:
        return device
    try:
        return next(model.parameters()).device
    except (StopIteration, AttributeError):
        return None
