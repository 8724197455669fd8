"""Read a Perfetto trace back with the perfetto package's protos (not trace_processor, which
downloads a binary): its tracks, each track's events in file order, its metadata."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any


@dataclass
class Track:
    uuid: int
    name: str
    parent: int | None
    pid: int | None
    counter: bool
    events: list[dict[str, Any]] = field(default_factory=list)


@dataclass
class ReadBack:
    tracks: dict[int, Track]
    metadata: dict[str, str]

    def named(self, name: str) -> list[Track]:
        return [t for t in self.tracks.values() if t.name == name]

    def children(self, parent: int) -> list[Track]:
        return [t for t in self.tracks.values() if t.parent == parent]


def _value(a: Any) -> Any:
    return getattr(a, a.WhichOneof("value")) if a.WhichOneof("value") else None


def read_trace(path: Path) -> ReadBack:
    from perfetto.protos.perfetto.trace.perfetto_trace_pb2 import Trace, TrackEvent

    trace = Trace.FromString(path.read_bytes())  # the streamed Trace messages concatenate into one
    tracks: dict[int, Track] = {}
    metadata: dict[str, str] = {}
    kinds = {TrackEvent.TYPE_SLICE_BEGIN: "B", TrackEvent.TYPE_SLICE_END: "E", TrackEvent.TYPE_INSTANT: "I",
             TrackEvent.TYPE_COUNTER: "C"}
    for p in trace.packet:
        if p.HasField("track_descriptor"):
            d = p.track_descriptor
            tracks[d.uuid] = Track(d.uuid, d.process.process_name if d.HasField("process") else d.name,
                                   d.parent_uuid if d.HasField("parent_uuid") else None,
                                   d.process.pid if d.HasField("process") else None, d.HasField("counter"))
        elif p.HasField("track_event"):
            e = p.track_event
            value = e.counter_value if e.HasField("counter_value") else (
                e.double_counter_value if e.HasField("double_counter_value") else None)
            tracks[e.track_uuid].events.append({
                "ts": p.timestamp, "type": kinds[e.type], "name": e.name, "value": value,
                "args": {a.name: _value(a) for a in e.debug_annotations}})
        elif p.HasField("chrome_events"):
            metadata.update({m.name: m.string_value for m in p.chrome_events.metadata})
    return ReadBack(tracks, metadata)
