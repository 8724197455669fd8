"""The record stream's channels: which decoder reads what, told by the writers themselves.

Every writer of the record stream (an engine, the gateway's span forwarding) *joins* the span
exporter process with the decoder that reads its entries there
(:meth:`~instrument.records.exporter_process.ExporterProcess.join`): the join sends one
DECODER entry (instrument/records/format.py) naming the decoder's class, ahead of anything
the writer sends, and the exporter process's :class:`~instrument.records.router.Router`
imports that class then. This package never imports a writer's module and names none: the
writers name their decoders.

Channel 0 carries the entries of format.py (META, OPEN, STEP, SEQ, END, IDLE); channels 1-255
carry BLOB payloads, one decoder each. A channel's number is its writer's constant (the table
is in docs/architecture.md); two writers asking one channel for different decoders is an
error at the second join.

A decoder is a class called with the exporter process's tracer provider. It reads in order,
on one thread; it raises ValueError on a payload it cannot read (the exporter process counts
the message as malformed and goes on).
"""

from __future__ import annotations

import importlib
from typing import Any, Protocol

__all__ = ["BlobDecoder", "EntryDecoder", "RECORD_ENTRIES", "decoder_target", "open_decoder"]

RECORD_ENTRIES = 0  # the channel of format.py's own entries


class BlobDecoder(Protocol):
    """A BLOB channel's decoder (one thread)."""

    def feed(self, payload: bytes | memoryview) -> None:
        """Build (and hand to the exporters) the spans this payload completes; the view is
        valid only during the call."""

    def close(self) -> None:
        """Shutdown: end what is still open.

        A decoder may also say ``at_rest`` (bool): its writer's last message said it held
        nothing more; one without it counts as at rest. ``unknown_slots`` (int), when it has
        it, is reported with the exporter process's counts, and ``lost_units`` (int: spans
        its writer counted that it could not build) is counted as dropped there."""


class EntryDecoder(Protocol):
    """Channel 0's decoder: format.py's entries, one at a time (one thread)."""

    def entry(self, entry: tuple[Any, ...]) -> None:
        """One entry as :func:`~instrument.records.format.iter_entries` yields it."""

    def close(self) -> None:
        """Shutdown: end what is still open (``at_rest`` and ``unknown_slots`` as above)."""


def decoder_target(decoder: type | str) -> str:
    """``module:qualname`` of a decoder class (a string is taken as that already).

    Raises ValueError for a class that another process could not import by that name."""
    if isinstance(decoder, str):
        module, _, name = decoder.partition(":")
        if not module or not name:
            raise ValueError(f"record decoder: expected 'module:qualname', got {decoder!r}")
        return decoder
    qualname = getattr(decoder, "__qualname__", "")
    if not qualname or "<locals>" in qualname or decoder.__module__ == "__main__":
        raise ValueError(f"record decoder: {decoder!r} cannot be imported by name in another process")
    return f"{decoder.__module__}:{qualname}"


def open_decoder(target: str, tracer_provider: Any) -> Any:
    """A new decoder made from ``target`` (``module:qualname``) for ``tracer_provider``.

    Raises ValueError when the target does not import (the message naming it is then counted
    as malformed)."""
    module, _, name = target.partition(":")
    try:
        found: Any = importlib.import_module(module)
        for part in name.split("."):
            found = getattr(found, part)
    except (ImportError, AttributeError, ValueError) as exc:
        raise ValueError(f"record decoder {target!r} does not import ({type(exc).__name__}: {exc})") from None
    return found(tracer_provider)
