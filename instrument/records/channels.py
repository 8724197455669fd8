"""The exporter process's decoders, by channel: every engine is a channel of the record stream.

Channel 0 is the decoder of the messages themselves (instrument/records/format.py): the
continuous engine's STEP / SEQ / OPEN / END / IDLE / META entries, and each BLOB entry handed
to its own channel's decoder. A BLOB channel carries facts that are not the continuous
engine's steps: another engine's step records, or spans finished in the serving process and
forwarded whole. The exporter process opens each decoder when it is first needed (imported
then, by name, so that this package never imports the engines that write them) and feeds it
every payload in order; ``close()`` at shutdown ends what is still open. A decoder raises
ValueError on a payload it cannot read (the exporter process counts the message as
malformed and goes on).

====  ================================================  ======================================
no.   decoder                                           writer
====  ================================================  ======================================
0     ``instrument.engines.continuous.span_builder:SpanBuilder``  the continuous engine (every message)
1     ``instrument.vllm.consumer:RecordConsumer``         the vLLM plugin (scheduler step facts)
2     ``instrument.records.span_forward:Decoder``         the gateway (its own finished spans)
====  ================================================  ======================================
"""

from __future__ import annotations

import importlib
from typing import Any, Protocol

__all__ = ["CHANNELS", "ChannelDecoder", "MESSAGES", "VLLM_STEPS", "FORWARDED_SPANS", "open_channel"]

MESSAGES, VLLM_STEPS, FORWARDED_SPANS = 0, 1, 2
CHANNELS: dict[int, str] = {
    MESSAGES: "instrument.engines.continuous.span_builder:SpanBuilder",
    VLLM_STEPS: "instrument.vllm.consumer:RecordConsumer",
    FORWARDED_SPANS: "instrument.records.span_forward:Decoder",
}


class ChannelDecoder(Protocol):
    """What the exporter process calls for one channel (one thread)."""

    def feed(self, payload: bytes | memoryview) -> None:
        """Build (and hand to the exporters) the spans this payload completes; the view is
        valid only during the call."""

    def close(self) -> None:
        """Shutdown: end what is still open.

        A decoder may also say ``at_rest`` (bool): its writer's last message said it held
        nothing more; one without it counts as at rest."""


def open_channel(channel: int, tracer_provider: Any) -> ChannelDecoder:
    """A new decoder for ``channel`` writing to ``tracer_provider``'s processors.

    Raises ValueError for a channel no decoder is registered for."""
    target = CHANNELS.get(channel)
    if target is None:
        raise ValueError(f"step records: no decoder for BLOB channel {channel}")
    module, _, name = target.partition(":")
    return getattr(importlib.import_module(module), name)(tracer_provider)
