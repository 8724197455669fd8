"""Cheap timestamp recording during one ``generate`` call (no spans on the hot path).

Measured on transformers 5.24: ``generate`` calls ``streamer.put()`` with the prompt first,
then once per generated token, after the token was sampled and copied to the host; every
generated token except the last goes through a forward. So with G tokens there are G token
puts and G forwards (1 prefill + G-1 decode; more prefill forwards under chunked prefill).
Decode step k spans forward-start k -> put of token k+1; the prefill spans forward-start 0
-> put of token 1.

Per step the hot path appends one ``perf_counter_ns()`` reading in a forward pre-hook and
one in the streamer's ``put`` (plus a reference to the token tensor). On CUDA it also records
a ``torch.cuda.Event`` pair per forward (pre-allocated), read once after generate with a
single synchronize: no synchronize per step.
"""

from __future__ import annotations

import time
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any, Iterator

from instrument.clock import wall_ns_from_perf_ns_list

__all__ = ["GenerationRecorder", "RecordedTimeline", "RecordingStreamer"]

_perf_counter_ns = time.perf_counter_ns


class RecordingStreamer:
    """A streamer for ``generate(streamer=...)``: records token emission times, forwards to ``inner``.

    The first ``put`` (the prompt) is not an emission. Duck-types transformers' BaseStreamer.
    """

    __slots__ = ("emit_perf_ns", "emitted", "inner", "prompt_seen")

    def __init__(self, inner: Any = None) -> None:
        self.emit_perf_ns: list[int] = []
        self.emitted: list[Any] = []
        self.inner = inner
        self.prompt_seen = False

    def put(self, value: Any) -> None:
        if self.prompt_seen:
            self.emit_perf_ns.append(_perf_counter_ns())
            self.emitted.append(value)
        else:
            self.prompt_seen = True
        if self.inner is not None:
            self.inner.put(value)

    def end(self) -> None:
        if self.inner is not None:
            self.inner.end()


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

    def __init__(self, model: Any, *, device_time: bool | None = None, expected_forwards: int = 0) -> None:
        self.model = model
        self.forward_start_perf_ns: list[int] = []
        self._streamer: RecordingStreamer | None = None
        device = _model_device(model)
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
        """Forward pre-hook (and post-hook for CUDA events) on the model, removed on exit."""
        starts = self.forward_start_perf_ns
        if not self.device_time:

            def pre_hook(module: Any, args: Any) -> None:
                starts.append(_perf_counter_ns())

            handles = [self.model.register_forward_pre_hook(pre_hook)]
        else:
            import torch

            pool, used = self._event_pool, self._events_used

            def pre_hook_cuda(module: Any, args: Any) -> None:
                starts.append(_perf_counter_ns())
                pair = pool.pop() if pool else (torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True))
                used.append(pair)
                pair[0].record()

            def post_hook_cuda(module: Any, args: Any, output: Any) -> None:
                used[-1][1].record()

            handles = [
                self.model.register_forward_pre_hook(pre_hook_cuda),
                self.model.register_forward_hook(post_hook_cuda),
            ]
        try:
            yield
        finally:
            for handle in handles:
                handle.remove()

    def timeline(self) -> RecordedTimeline:
        """The recording in wall-clock ns; synchronizes on the last CUDA event once."""
        if self._streamer is None:
            raise RuntimeError("GenerationRecorder.streamer() was never passed to generate")
        emitted = self._streamer.emitted
        try:  # tensors: [batch] (one token each) or [batch, n] (n tokens per sequence)
            chunk_tokens = [1 if v.dim() < 2 else int(v.shape[-1]) for v in emitted]
        except AttributeError:
            chunk_tokens = [int(v.shape[-1]) if getattr(v, "dim", lambda: 0)() >= 2 else 1 for v in emitted]
        device_ns: list[int] | None = None
        if self.device_time and self._events_used:
            self._events_used[-1][1].synchronize()
            device_ns = [round(start.elapsed_time(end) * 1e6) for start, end in self._events_used]
        return RecordedTimeline(
            forward_start_ns=wall_ns_from_perf_ns_list(self.forward_start_perf_ns),
            emit_ns=wall_ns_from_perf_ns_list(self._streamer.emit_perf_ns),
            chunk_tokens=chunk_tokens,
            forward_device_ns=device_ns,
        )

    @property
    def emitted_tokens(self) -> list[Any]:
        """The token tensors of every put after the prompt (shape [batch] or [batch, n])."""
        return self._streamer.emitted if self._streamer is not None else []


def _model_device(model: Any) -> Any:
    device = getattr(model, "device", None)
    if device is not None:
        return device
    try:
        return next(model.parameters()).device
    except (StopIteration, AttributeError):
        return None
