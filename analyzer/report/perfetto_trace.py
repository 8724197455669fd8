"""The engine timeline as a Perfetto protobuf trace (``tokentrace export --perfetto FILE``).

Built with the ``perfetto`` package's protos and ``StreamingTraceProtoBuilder`` (the
``perfetto`` extra). Layout, one process per clock domain (an engine or a service: its
``service.name``, instance and host), each holding:

- counter tracks ``KV blocks used``, ``running (sequences)`` and ``waiting (sequences)``: one
  value per engine step at its start (the step's ``tokentrace.kv.blocks_used``,
  ``tokentrace.batch.size``, ``tokentrace.batch.waiting``);
- the track ``engine steps``: one slice per engine step, named by what it carried (``decode
  only`` or ``prefill <bucket> tokens``), with its figures as arguments;
- a track per request: a ``request`` slice over the whole lane, inside it the ``queue``,
  ``prefill`` (``prefill (recompute)`` after a preemption) and ``decode`` slices, an instant
  ``token n`` at each generated token's emission (``chunk n`` for a lane without engine
  spans), and an instant ``preemption``; were a request's spans to overlap, the overlapping
  ones go to a track of their own beside it (``request <id> (overlapping spans n)``), so every
  track nests.

Timestamps are the spans' own nanoseconds since the Unix epoch, each on its process's clock
(the engine's for the engine's process); the clock-skew verdicts between clock domains are
in the trace's metadata (``tokentrace.skew ...`` entries) and on the ``tokentrace`` track.
All rows come from queries/ (analyzer/report/timeline_data.py).
"""

from __future__ import annotations

import heapq
import itertools
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any

import duckdb

from analyzer.errors import ExportError
from analyzer.report.timeline_data import (
    Engine,
    Lane,
    labelled,
    read_engine,
    stream_lanes,
)

__all__ = [
    "COUNTERS",
    "ENGINE_TRACK",
    "PERFETTO_HINT",
    "SEQUENCE_ID",
    "PerfettoReport",
    "export_perfetto",
    "require_perfetto",
    "step_slice_name",
    "write_trace",
]

PERFETTO_HINT = "install the extra: pip install 'tokentrace[perfetto]'"

#: counter track name -> (the steps.sql column it plots, one value per engine step; its unit)
COUNTERS = {"KV blocks used": ("kv_blocks_used", "blocks"), "running (sequences)": ("batch_size", "sequences"),
            "waiting (sequences)": ("waiting", "sequences")}
#: the name of each process's engine-step track
ENGINE_TRACK = "engine steps"
#: trusted_packet_sequence_id of every packet this writer emits (one writer, one sequence)
SEQUENCE_ID = 7001

#: an engine step's arguments: steps.sql columns
_STEP_ARGS = ("step", "batch_size", "scheduled_tokens", "prefill_tokens", "decode_tokens", "waiting", "kv_blocks_used",
              "kv_blocks_total", "step_ms", "schedule_ms", "device_ms", "spec_draft_tokens", "spec_accepted_tokens")
#: a request slice's arguments: timeline.sql columns of its 'request' row
_REQUEST_ARGS = ("trace_id", "request_span_id", "lane_span_id", "perspective", "clock_domain", "response_id",
                 "generated_tokens", "finish_reason", "e2e_ms", "ttft_ms")


@dataclass
class PerfettoReport:
    """What the file holds: requests (one track each), engine steps (one slice each), token
    instants, processes (clock domains), and why there is no engine track (or None)."""

    path: str
    requests: int
    steps: int
    tokens: int
    processes: int
    no_engine_track: str | None


def step_slice_name(step: dict[str, Any]) -> str:
    """An engine step's slice name: what it carried."""
    if not step.get("prefill_tokens"):
        return "decode only"
    return f"prefill {step['prefill_tokens_bucket']} tokens"


def require_perfetto() -> Any:
    """The perfetto package's trace protos module; ExportError naming the extra when missing."""
    try:
        from perfetto.protos.perfetto.trace import perfetto_trace_pb2
        from perfetto.trace_builder.proto_builder import StreamingTraceProtoBuilder  # noqa: F401 - checks the perfetto package has the builder
    except ImportError as exc:
        raise ExportError(f"--perfetto needs the perfetto package ({exc.name} not found); {PERFETTO_HINT}") from None
    return perfetto_trace_pb2


class _Writer:
    """Packets on one sequence; each track's descriptor before its events."""

    def __init__(self, out: IO[bytes]) -> None:
        from perfetto.trace_builder.proto_builder import StreamingTraceProtoBuilder

        self.pb = require_perfetto()
        self.builder = StreamingTraceProtoBuilder(out)
        self.next_uuid = 1
        self.first = True

    def packet(self) -> Any:
        p = self.builder.create_packet()
        p.trusted_packet_sequence_id = SEQUENCE_ID
        if self.first:
            p.sequence_flags = self.pb.TracePacket.SEQ_INCREMENTAL_STATE_CLEARED
            self.first = False
        return p

    def track(self, name: str, parent: int | None = None, *, pid: int | None = None, counter: str | None = None,
              rank: int = 0) -> int:
        uuid, self.next_uuid = self.next_uuid, self.next_uuid + 1
        p = self.packet()
        d = p.track_descriptor
        d.uuid = uuid
        if pid is not None:
            d.process.pid = pid
            d.process.process_name = name
            d.child_ordering = self.pb.TrackDescriptor.EXPLICIT
        else:
            d.name = name
        if parent is not None:
            d.parent_uuid = parent
            d.sibling_order_rank = rank
        if counter is not None:
            d.counter.unit_name = counter
        self.builder.write_packet(p)
        return uuid

    def event(self, track: int, ts: int, kind: str, name: str | None = None, args: dict[str, Any] | None = None,
              value: float | None = None) -> None:
        p = self.packet()
        p.timestamp = ts
        e = p.track_event
        e.track_uuid = track
        e.type = {"B": e.TYPE_SLICE_BEGIN, "E": e.TYPE_SLICE_END, "I": e.TYPE_INSTANT, "C": e.TYPE_COUNTER}[kind]
        if name is not None:
            e.name = name
        if value is not None:
            if isinstance(value, float):
                e.double_counter_value = value
            else:
                e.counter_value = value
        for key, v in (args or {}).items():
            if v is None:
                continue
            a = e.debug_annotations.add()
            a.name = key
            if isinstance(v, bool):
                a.bool_value = v
            elif isinstance(v, int):
                a.int_value = v
            elif isinstance(v, float):
                a.double_value = v
            else:
                a.string_value = str(v)
        self.builder.write_packet(p)

    def metadata(self, entries: dict[str, str]) -> None:
        p = self.packet()
        for key, value in entries.items():
            m = p.chrome_events.metadata.add()
            m.name = key
            m.string_value = value
        self.builder.write_packet(p)


def _process_name(clock_domain: str) -> str:
    service, _, rest = clock_domain.partition("|")
    instance, _, host = rest.partition("|")
    return f"{service or 'unknown service'} ({instance[:8] or 'no instance id'} on {host or 'unknown host'})"


Event = tuple[int, str, "str | None", "dict[str, Any] | None"]


def _sub_tracks(items: list[dict[str, Any]]) -> list[list[dict[str, Any]]]:
    """The phase spans in start order, split so that none overlaps another on its track: each
    goes to the first track whose last span has ended (the spans of one request follow each
    other, so one track, unless a capture has them overlap)."""
    tracks: list[list[dict[str, Any]]] = []
    for item in sorted(items, key=lambda i: (i["start_ns"], i["end_ns"])):
        for track in tracks:
            if max(track[-1]["end_ns"], track[-1]["start_ns"]) <= item["start_ns"]:
                track.append(item)
                break
        else:
            tracks.append([item])
    return tracks or [[]]


def _span_events(items: list[dict[str, Any]]) -> list[Event]:
    out: list[Event] = []
    for item in items:
        name = "prefill (recompute)" if item["kind"] == "prefill" and item["recompute"] else item["kind"]
        args = {"engine_step": item["step"], "tokens": item["tokens"], "decode_step_k": item["token_index"]}
        out.append((item["start_ns"], "B", name, args))
        out.append((max(item["end_ns"], item["start_ns"]), "E", None, None))
    return out


def _lane_events(lane: Lane, spans: list[dict[str, Any]]) -> Iterable[Event]:
    """The request track's events in time order: the request slice opens first and closes
    last; ``spans`` (non-overlapping) each open and close; instants merge in by time after the
    slice events of the same nanosecond."""
    instants: list[Event] = []
    for item in lane.kind("token", "chunk", "preemption"):
        if item["kind"] == "preemption":
            instants.append((item["start_ns"], "I", "preemption", {"reason": item["reason"],
                                                                   "kv_blocks_freed": item["blocks_freed"]}))
        else:
            instants.append((item["start_ns"], "I", f"{item['kind']} {item['token_index']}",
                             {"engine_step": item["step"], "tokens": item["tokens"]}))
    instants.sort(key=lambda e: e[0])
    request = lane.request
    yield lane.start_ns, "B", "request", {k: request.get(k) for k in _REQUEST_ARGS}
    yield from heapq.merge(_span_events(spans), instants, key=lambda e: e[0])
    yield lane.end_ns, "E", None, None


def _skew_entries(engine: Engine) -> dict[str, str]:
    entries = {}
    for row in engine.skew:
        entries[f"tokentrace.skew {row['client_domain']} -> {row['server_domain']}"] = (
            f"{row['verdict']}: server - client offset in [{row['offset_min_ms']}, {row['offset_max_ms']}] ms "
            f"over {row['requests']} requests (tolerance {row['tolerance_ms']} ms)")
    if not entries:
        entries["tokentrace.skew"] = "no client/server clock pair in the traces: no skew check"
    return entries


@dataclass
class _Process:
    uuid: int
    rank: int = 0

    def next_rank(self) -> int:
        self.rank += 1
        return self.rank - 1


def write_trace(engine: Engine, lanes: Iterable[Lane], out: IO[bytes]) -> tuple[int, int, int]:
    """Write the engine's steps and ``lanes`` (at least one, in start order) to ``out``;
    returns (request tracks, token instants, processes)."""
    w = _Writer(out)
    lanes = iter(lanes)
    first = next(lanes)
    no_engine = engine.no_steps_reason()
    meta = {"tokentrace.clock": "timestamps: ns since the Unix epoch, each process on its own clock domain's clock "
                                "(engine-side request lanes on the engine's)", **_skew_entries(engine)}
    if no_engine:
        meta["tokentrace.engine_track"] = no_engine
    w.metadata(meta)
    info = w.track("tokentrace")
    first_ns = min([first.start_ns] + [s["start_ns"] for s in engine.steps])
    for key, value in meta.items():
        w.event(info, first_ns, "I", key.removeprefix("tokentrace."), {"value": value})
    processes: dict[str, _Process] = {}

    def process(domain: str) -> _Process:
        if domain not in processes:
            processes[domain] = _Process(w.track(_process_name(domain), pid=len(processes) + 1))
        return processes[domain]

    for domain in sorted({s["clock_domain"] for s in engine.steps}):
        proc = process(domain)
        steps = engine.steps_of(domain)
        for counter_name, (column, unit) in COUNTERS.items():
            counter = w.track(counter_name, proc.uuid, counter=unit, rank=proc.next_rank())
            for s in steps:
                if s[column] is not None:
                    w.event(counter, s["start_ns"], "C", value=s[column])
        track = w.track(ENGINE_TRACK, proc.uuid, rank=proc.next_rank())
        for s in steps:
            w.event(track, s["start_ns"], "B", step_slice_name(s), {k: s.get(k) for k in _STEP_ARGS})
            w.event(track, max(s["end_ns"], s["start_ns"]), "E")
    requests = tokens = 0
    for lane, label in labelled(itertools.chain([first], lanes)):
        proc = process(lane.clock_domain)
        main, *overlapping = _sub_tracks(lane.kind("queue", "prefill", "decode"))
        track = w.track(f"request {label}", proc.uuid, rank=proc.next_rank())
        for ts, kind, name, args in _lane_events(lane, main):
            w.event(track, ts, kind, name, args)
        for n, spans in enumerate(overlapping, start=1):
            extra = w.track(f"request {label} (overlapping spans {n})", proc.uuid, rank=proc.next_rank())
            for ts, kind, name, args in _span_events(spans):
                w.event(extra, ts, kind, name, args)
        requests += 1
        tokens += len(lane.kind("token"))
    return requests, tokens, len(processes)


def export_perfetto(con: duckdb.DuckDBPyConnection, path: str | Path, *, overwrite: bool = False) -> PerfettoReport:
    """Write the timeline of the traces on ``con`` to ``path`` (lanes streamed from the
    query, never all in memory). Raises ExportError for a database with no request, a
    missing ``perfetto`` package, or a file in the way; nothing is written then."""
    require_perfetto()
    target = Path(path)
    if target.is_dir():
        raise ExportError(f"--perfetto {target}: a folder, not a file name")
    if not target.parent.is_dir():
        raise ExportError(f"--perfetto {target}: folder {target.parent} does not exist")
    if target.exists() and not overwrite:
        raise ExportError(f"--perfetto {target}: exists; --overwrite replaces it")
    engine = read_engine(con)
    lanes = stream_lanes(con)
    first = next(lanes, None)
    if first is None:
        raise ExportError("the database holds no request, so there is no timeline to write "
                          "(load traces first: tokentrace load FILE --db DB)")
    tmp = target.with_name(target.name + ".partial")
    try:
        with open(tmp, "wb") as out:
            requests, tokens, processes = write_trace(engine, itertools.chain([first], lanes), out)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    tmp.replace(target)
    return PerfettoReport(path=str(target), requests=requests, steps=len(engine.steps), tokens=tokens,
                          processes=processes, no_engine_track=engine.no_steps_reason())
