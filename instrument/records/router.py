"""The exporter process's reading of the record stream: each entry to its channel's decoder.

:class:`Router` reads every message the serving process sends (instrument/records/format.py)
in order: a DECODER entry opens the decoder a writer named for its channel
(instrument/records/channels.py), a BLOB entry goes to its channel's decoder, every other
entry to channel 0's. It names no writer: what it routes to, the writers told it.
"""

from __future__ import annotations

from typing import Any

from instrument.records import format as fmt
from instrument.records.channels import RECORD_ENTRIES, open_decoder

__all__ = ["Router"]


class Router:
    """Routes the messages of the record stream to the decoders the writers named."""

    def __init__(self, tracer_provider: Any) -> None:
        self.tracer_provider = tracer_provider
        self.decoders: dict[int, Any] = {}  # channel -> decoder
        self.targets: dict[int, str] = {}  # channel -> ``module:qualname`` it was opened from

    def register(self, channel: int, target: str) -> None:
        """Open ``target`` for ``channel`` (a second DECODER entry naming the same target, e.g.
        from a writer that joined again, keeps the decoder open). ValueError when it does not
        import, or when the channel already has another decoder."""
        known = self.targets.get(channel)
        if known == target:
            return
        if known is not None:
            raise ValueError(f"record channel {channel}: read by {known}, a writer asked for {target}")
        self.decoders[channel] = open_decoder(target, self.tracer_provider)
        self.targets[channel] = target

    def feed(self, message: bytes | memoryview) -> None:
        """Route every entry of one message (ValueError on a malformed message, a channel with
        no decoder, or a decoder's own ValueError; the entries before it were routed)."""
        decoders = self.decoders
        engine = decoders.get(RECORD_ENTRIES)
        for entry in fmt.iter_entries(message):
            kind = entry[0]
            if kind == fmt.BLOB:
                decoder = decoders.get(entry[1])
                if decoder is None:
                    raise ValueError(f"step records: no decoder for BLOB channel {entry[1]}")
                decoder.feed(entry[2])
            elif kind == fmt.DECODER:
                self.register(entry[1], entry[2])
                engine = decoders.get(RECORD_ENTRIES)
            elif engine is not None:
                engine.entry(entry)
            else:
                raise ValueError(f"step records: entry kind {kind} before any writer named their decoder")

    @property
    def at_rest(self) -> bool:
        """Whether every writer's last message said it held nothing more."""
        return all(getattr(d, "at_rest", True) for d in self.decoders.values())

    @property
    def unknown_slots(self) -> int:
        """Entries the decoders could not place (a sequence whose OPEN entry was lost)."""
        return sum(int(getattr(d, "unknown_slots", 0)) for d in self.decoders.values())

    @property
    def lost_units(self) -> int:
        """Spans the writers counted that the decoders could not build (e.g. the steps of a
        sequence opened in an earlier exporter process, before a restart)."""
        return sum(int(getattr(d, "lost_units", 0)) for d in self.decoders.values())

    def tick(self) -> None:
        """Time passes (called at least every 0.5 s): decoders that wait for something (the
        keep policy's requests) decide what waited too long."""
        for decoder in self.decoders.values():
            tick = getattr(decoder, "tick", None)
            if tick is not None:
                tick()

    def close(self) -> None:
        """Shutdown: every decoder ends what it holds open."""
        for decoder in self.decoders.values():
            decoder.close()
