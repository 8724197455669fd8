"""vLLM step records: compact bytes in vLLM's engine-core process, spans in the exporter process.

The plugin's scheduler hooks (instrument/vllm/hooks/) hold each scheduler step's
references to vLLM's own objects; when a send is due (the engine went idle, 2 s since the
last send, or 512 entries held) :class:`~instrument.vllm.sink.RecordSink` reads them, on the
same engine thread, as :class:`~instrument.vllm.facts.StepFacts` one after another
(:meth:`~instrument.vllm.hooks.StepTap.drain`) and packs each with :meth:`Encoder.write`
into one preallocated buffer (``struct.pack_into`` for the header and each event, one
memory copy per per-request column: no span, dict or string is made per token), sending it
as one BLOB entry of channel 1 (instrument/records/channels.py) every ``FLUSH_BYTES``
(32 KiB) and at the end, to the span exporter process
(instrument/records/exporter_process.py). There :class:`RecordConsumer` rebuilds each
StepFacts and hands it to :meth:`instrument.vllm.spans.SpanBuilder.consume`: the span
contract (docs/spans.md, "vLLM") is written by that one function, whichever side of the
socket it runs on.

Payload (little-endian; a record is its event entries followed by one STEP entry; times are
ns since the epoch, counts are requests, tokens, KV blocks):

====  =======  ===============================================================================
kind  name     fields after the kind byte
====  =======  ===============================================================================
1     ARRIVE   ``<IdIHHH`` slot, arrival (s, vLLM's float), prompt tokens, lengths of the
               request id, ``traceparent``, ``tracestate`` + those UTF-8 bytes: once per request
2     NAME     ``<IH`` slot, id length + bytes: a slot for one record only (a request this
               encoder saw no arrival of, or one that already ended)
3     FIRST    ``<II`` slot, cached prompt tokens (first scheduled)
4     PREEMPT  ``<IIq`` slot, KV blocks freed, time
5     FINISH   ``<IBq`` slot, status (facts.FINISHED_*), time
6     STEP     ``<qqqqIIIIIIq`` step (-1: events only), start, schedule end, end, requests
               scheduled n, waiting, KV blocks used, total, prefix-cache hit tokens, tokens
               per block, bytes per block; then n × u32 slots, tokens, computed, KV blocks
               held, sampled, and n × u8 prefill kind
7     IDLE     (nothing): after a record, the scheduler held no request then (a request the
               exporter still holds lost its end in a dropped message: forgotten, counted)
====  =======  ===============================================================================

A slot numbers a request from its ARRIVE to its FINISH (never reused by one encoder).
"""

from __future__ import annotations

import logging
import struct
from array import array
from typing import Any

from instrument.vllm.facts import StepFacts

__all__ = ["ARRIVE", "FINISH", "FIRST", "IDLE", "NAME", "PREEMPT", "STEP", "Encoder", "RecordConsumer", "decode"]

log = logging.getLogger("tokentrace.vllm")
ARRIVE, NAME, FIRST, PREEMPT, FINISH, STEP, IDLE = 1, 2, 3, 4, 5, 6, 7
_ARRIVE = struct.Struct("<BIdIHHH")
_NAME = struct.Struct("<BIH")
_FIRST = struct.Struct("<BII")
_PREEMPT = struct.Struct("<BIIq")
_FINISH = struct.Struct("<BIBq")
_STEP = struct.Struct("<BqqqqIIIIIIq")
_MAX_HEADER = 512  # bytes kept of a traceparent / tracestate value (W3C: 55 / 512 characters)


def _header(headers: Any, name: str) -> bytes:
    value = headers.get(name) if headers else None
    if isinstance(value, (list, tuple)):
        value = ",".join(value)
    # cut on a character boundary: a client-sent header cut inside a UTF-8 character would
    # make the exporter process refuse the whole message
    return value.encode()[:_MAX_HEADER].decode("utf-8", "ignore").encode() if value else b""


_MAX_ID = 0xFFFF  # bytes of a request id kept (a u16 length; vLLM takes ids of any length)


def _id_bytes(req_id: str) -> bytes:
    return req_id.encode()[:_MAX_ID].decode("utf-8", "ignore").encode()


class Encoder:
    """Packs StepFacts into one growing buffer (one writer thread: vLLM's engine thread)."""

    __slots__ = ("buf", "pos", "slot_of", "next_slot", "units", "slots")

    def __init__(self, capacity: int = 1 << 16) -> None:
        self.buf = bytearray(capacity)
        self.pos = 0
        self.slot_of: dict[str, int] = {}  # live request id -> slot
        self.next_slot = 0
        self.units = 0  # spans the packed, unsent records stand for (estimate: loss counting)
        self.slots = array("I")  # the step's slots when a request needs a NAME entry (grown to the largest batch)

    def _room(self, size: int) -> None:
        if self.pos + size > len(self.buf):
            self.buf.extend(bytes(max(size, len(self.buf))))

    def _bytes(self, data: bytes) -> None:
        end = self.pos + len(data)
        self.buf[self.pos:end] = data
        self.pos = end

    def _name(self, req_id: str) -> int:
        """A one-record slot for a request this encoder holds no slot of."""
        self.next_slot += 1
        data = _id_bytes(req_id)
        self._room(_NAME.size + len(data))
        _NAME.pack_into(self.buf, self.pos, NAME, self.next_slot, len(data))
        self.pos += _NAME.size
        self._bytes(data)
        return self.next_slot

    def _slot(self, req_id: str) -> int:
        slot = self.slot_of.get(req_id)
        return self._name(req_id) if slot is None else slot

    def write(self, facts: StepFacts) -> None:
        """Pack one record (``facts`` may be reused once this returns)."""
        for req_id, arrival_s, headers, prompt_tokens in facts.arrivals:
            self.next_slot += 1
            self.slot_of[req_id] = self.next_slot
            rid, parent, state = _id_bytes(req_id), _header(headers, "traceparent"), _header(headers, "tracestate")
            self._room(_ARRIVE.size + len(rid) + len(parent) + len(state))
            _ARRIVE.pack_into(self.buf, self.pos, ARRIVE, self.next_slot, arrival_s, prompt_tokens, len(rid),
                              len(parent), len(state))
            self.pos += _ARRIVE.size
            self._bytes(rid + parent + state)
        for req_id, cached in facts.first:
            slot = self._slot(req_id)
            self._room(_FIRST.size)
            _FIRST.pack_into(self.buf, self.pos, FIRST, slot, cached)
            self.pos += _FIRST.size
        for req_id, blocks, time_ns in facts.preempted:
            slot = self._slot(req_id)
            self._room(_PREEMPT.size)
            _PREEMPT.pack_into(self.buf, self.pos, PREEMPT, slot, blocks, time_ns)
            self.pos += _PREEMPT.size
        for req_id, status, time_ns in facts.finished:
            slot = self._slot(req_id)
            self._room(_FINISH.size)
            _FINISH.pack_into(self.buf, self.pos, FINISH, slot, status, time_ns)
            self.pos += _FINISH.size
        n = facts.n
        slots = self.slots
        if len(slots) < n:
            self.slots = slots = array("I", bytes(4 * n))
        slot_of, req_ids = self.slot_of, facts.req_ids
        try:
            slots = array("I", map(slot_of.__getitem__, req_ids[:n]))
        except KeyError:  # a request this encoder holds no slot of
            for i in range(n):
                slot = slot_of.get(req_ids[i])  # type: ignore[arg-type]
                slots[i] = self._name(req_ids[i]) if slot is None else slot  # type: ignore[arg-type]
            slots = slots[:n]
        self._room(_STEP.size + 21 * n)
        buf, pos = self.buf, self.pos
        _STEP.pack_into(buf, pos, STEP, facts.step, facts.start_ns, facts.sched_end_ns, facts.end_ns, n, facts.waiting,
                        facts.kv_used, facts.kv_total, facts.prefix_hit_tokens, facts.block_tokens,
                        facts.bytes_per_block)
        pos += _STEP.size
        if n:
            size = 4 * n
            end = pos
            for column in (slots, facts.tokens, facts.computed, facts.blocks, facts.sampled):
                pos, end = end, end + size
                buf[pos:end] = column if len(column) == n else column[:n]
            pos, end = end, end + n
            prefill = facts.prefill
            buf[pos:end] = prefill if len(prefill) == n else prefill[:n]
            pos = end
        self.pos = pos
        for req_id, _, _ in facts.finished:
            slot_of.pop(req_id, None)
        self.units += (n + 1 if facts.step >= 0 else 0) + 2 * len(facts.finished)

    def idle(self) -> None:
        """An IDLE entry: the scheduler holds no request after the last record written."""
        self._room(1)
        self.buf[self.pos] = IDLE
        self.pos += 1

    def take(self) -> tuple[memoryview, int]:
        """(the packed records: a view valid until the next write, the spans they stand for)."""
        view, units = memoryview(self.buf)[:self.pos], self.units
        self.pos = self.units = 0
        return view, units


def _read_str(payload: memoryview, pos: int, size: int) -> str:
    return bytes(payload[pos:pos + size]).decode("utf-8", "replace")


def decode(payload: bytes | memoryview, names: dict[int, str], out: list[StepFacts | None]) -> None:
    """Append the StepFacts of every record in ``payload`` to ``out`` (None for an IDLE entry);
    ``names`` (slot -> request id) carries the live requests from one payload to the next. Raises ValueError when the
    payload is truncated or names an unknown kind; a slot never named maps to
    ``"?slot-N"`` (its ARRIVE was in a message the exporter never received)."""
    view = memoryview(payload)
    pos, size = 0, len(view)
    facts = StepFacts(0)
    once: list[int] = []  # NAME slots and finished slots: dropped once their record is out
    try:
        while pos < size:
            kind = view[pos]
            if kind == STEP:
                (_, step, start, sched_end, end, n, waiting, used, total, hits, block_tokens,
                 bytes_per_block) = _STEP.unpack_from(view, pos)
                pos += _STEP.size
                if pos + 21 * n > size:
                    raise ValueError("vLLM step records: STEP entry truncated")
                facts.step, facts.start_ns, facts.sched_end_ns, facts.end_ns = step, start, sched_end, end
                facts.n, facts.waiting, facts.kv_used, facts.kv_total = n, waiting, used, total
                facts.prefix_hit_tokens, facts.block_tokens, facts.bytes_per_block = hits, block_tokens, bytes_per_block
                columns = []
                for _ in range(5):
                    column = array("I")
                    column.frombytes(view[pos:pos + 4 * n])
                    columns.append(column)
                    pos += 4 * n
                slots, facts.tokens, facts.computed, facts.blocks, facts.sampled = columns
                facts.prefill = array("b")
                facts.prefill.frombytes(view[pos:pos + n])
                pos += n
                facts.req_ids = [names.get(slot) or f"?slot-{slot}" for slot in slots]
                out.append(facts)
                for slot in once:
                    names.pop(slot, None)
                once.clear()
                facts = StepFacts(0)
            elif kind == ARRIVE:
                _, slot, arrival_s, prompt_tokens, n_id, n_parent, n_state = _ARRIVE.unpack_from(view, pos)
                pos += _ARRIVE.size
                req_id = _read_str(view, pos, n_id)
                headers = {}
                if n_parent:
                    headers["traceparent"] = _read_str(view, pos + n_id, n_parent)
                if n_state:
                    headers["tracestate"] = _read_str(view, pos + n_id + n_parent, n_state)
                pos += n_id + n_parent + n_state
                names[slot] = req_id
                facts.arrivals.append((req_id, arrival_s, headers or None, prompt_tokens))
            elif kind == IDLE:
                if facts.arrivals or facts.first or facts.preempted or facts.finished:
                    raise ValueError(f"vLLM step records: IDLE inside a record at byte {pos}")
                pos += 1
                out.append(None)
            elif kind == NAME:
                _, slot, n_id = _NAME.unpack_from(view, pos)
                names[slot] = _read_str(view, pos + _NAME.size, n_id)
                pos += _NAME.size + n_id
                once.append(slot)
            elif kind == FIRST:
                _, slot, cached = _FIRST.unpack_from(view, pos)
                pos += _FIRST.size
                facts.first.append((names.get(slot) or f"?slot-{slot}", cached))
            elif kind == PREEMPT:
                _, slot, blocks, time_ns = _PREEMPT.unpack_from(view, pos)
                pos += _PREEMPT.size
                facts.preempted.append((names.get(slot) or f"?slot-{slot}", blocks, time_ns))
            elif kind == FINISH:
                _, slot, status, time_ns = _FINISH.unpack_from(view, pos)
                pos += _FINISH.size
                facts.finished.append((names.get(slot) or f"?slot-{slot}", status, time_ns))
                once.append(slot)
            else:
                raise ValueError(f"vLLM step records: unknown entry kind {kind} at byte {pos}")
    except (struct.error, UnicodeDecodeError) as exc:
        raise ValueError(f"vLLM step records: entry truncated or malformed at byte {pos}: {exc}") from None
    if pos != size or facts.arrivals or facts.first or facts.preempted or facts.finished:
        raise ValueError(f"vLLM step records: payload ends inside a record (byte {pos} of {size})")


class RecordConsumer:
    """Channel 1's decoder in the exporter process: payloads in, spans out (one thread)."""

    def __init__(self, tracer_provider: Any) -> None:
        from instrument.tracing import get_tracer
        from instrument.vllm.hooks import external_request_id
        from instrument.vllm.spans import SpanBuilder

        self.provider = tracer_provider
        self.builder = SpanBuilder(get_tracer(tracer_provider), request_id_of=external_request_id,
                                   on_idle=self._idle)
        self.names: dict[int, str] = {}
        self._records: list[StepFacts | None] = []

    def _idle(self) -> None:
        """No live request: export what was built now (the engine went idle)."""
        self.provider.force_flush()

    def feed(self, payload: memoryview) -> None:
        """Build the spans of every record in ``payload`` (ValueError: malformed, nothing built)."""
        records = self._records
        records.clear()
        decode(payload, self.names, records)
        for facts in records:
            if facts is None:  # the scheduler held no request: no slot is live any more
                self.names.clear()
                self.builder.engine_idle()
                continue
            try:
                self.builder.consume(facts)
            except Exception:  # a bug here must not stop the exporter; logged with its step
                log.exception("tokentrace: spans of vLLM engine step %s not written", facts.step)
        records.clear()

    def close(self) -> None:
        """Shutdown: end the open engine trace (requests still live stay unended: never exported)."""
        self.builder.close_engine_trace()
