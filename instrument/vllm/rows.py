"""vLLM step records: vLLM's own per-step figures in the engine core, spans in the exporter process.

The plugin's scheduler wrappers (instrument/vllm/hooks/) append one *row* per scheduled step
and one per updated step, on vLLM's engine thread: a tuple of the builtin lists, dicts and
sets vLLM built for the step (referenced, not copied or read element by element) and a few
ints (and the tokens sampled per request, counted in one C pass; None, None for an update
where each request was scheduled one token and sampled one), plus a row per arrival,
preemption and end. When a send is due (the engine went idle; 512 rows held; 2 s since the
last send with about 64 steps held; 10 s since it) :class:`~instrument.vllm.sink.RecordSink` packs
the rows with :func:`pack` (``marshal`` format 4, in C: each string object once per message) into
channel-1 BLOB messages of up to about 256 KiB (instrument/vllm/sink.py ``CHANNEL``). Measured
inside vLLM's engine core, where a model step between two sends leaves vLLM's objects and
this code cold in the CPU's caches, that costs the engine thread about a third less than
reading each step into per-request columns there (docs/spans.md "vLLM", cost). No span,
dict or string is made per token on that side.

In the exporter process :class:`~instrument.vllm.consumer.RecordConsumer` unpacks each message, reads the rows in order
into :class:`~instrument.vllm.facts.StepFacts` with
:class:`~instrument.vllm.steps.StepReader` (which pairs each step's two rows and follows each
request across steps and messages: blocks held, prompt chunk / recompute / decode, first
schedules) and hands them to :meth:`instrument.vllm.spans.SpanBuilder.consume`, the one
function that writes the span contract (docs/spans.md "vLLM").

A message is ``marshal.dumps(rows, 4)``: a list of tuples, oldest first. Step times are the
engine core's ``perf_counter`` ns (GEOMETRY gives the shift to ns since the epoch,
instrument/clock.py); event times are ns since the epoch; counts are requests, tokens, KV
blocks; ``key`` is the ``id()`` of the step's ``SchedulerOutput`` (unique among the steps in
flight: vLLM keeps it alive until the step's update), ``step`` vLLM's ``Scheduler.current_step``.

=========  ====================================================================================
row        fields after the kind (vLLM 0.32 names in ``code``)
=========  ====================================================================================
SCHEDULED  key, step, start, schedule end, requests ``waiting``, KV blocks free,
           ``num_scheduled_tokens`` (id -> tokens; None for a plain decode step: no new
           request and one token for each scheduled one), new: ``[(req_id, num_computed_tokens,
           blocks given (first KV group), tokens so far when the V2 model runner gives them,
           else -1)]`` or None, then ``scheduled_cached_reqs``' ``req_ids``,
           ``resumed_req_ids`` (0 on a release without it: 0.34 re-sends a resumed request
           as new), ``new_block_ids``, ``num_computed_tokens``, ``num_output_tokens``. Held
           only for a step with a sampled request in flight or a sampled ``engine_step``
PARTIAL    key, step, start, schedule end, requests scheduled, tokens scheduled, then
           ``[(req_id, num_computed_tokens, blocks given (first KV group), output tokens so
           far (< 0 for ``scheduled_new_reqs``: -2 - its tokens so far when the V2 model
           runner gives them, else -1), resumed, tokens scheduled)]`` for the requests in
           the step that a sampled request's spans need: the sampled ones, and every one that
           may be in a prefill (new, no output token yet, or preempted earlier), whose tokens
           make ``tokentrace.batch.prefill_tokens``. Held instead of SCHEDULED for a step
           whose ``engine_step`` is not sampled, with at most ``FEW_SAMPLED`` sampled
           requests in flight: the others cost nothing per step (instrument/vllm/sampling.py)
UPDATED    key, end, ``ModelRunnerOutput.req_ids``, tokens sampled per request (in that order:
           the lengths of ``sampled_token_ids``, counted in the update wrapper); None, None
           when each request was scheduled one token and sampled one; after a PARTIAL row,
           the requests it carries (those in the runner's output) and theirs only. Held
           when its step's SCHEDULED or PARTIAL row was
ARRIVED    request id, arrival (s, vLLM's float), trace headers (dict, or None: none, or not
           sampled), prompt tokens, sampled (True: its spans are built; instrument/vllm/sampling.py;
           under a keep policy ``KEPT_IF_SLOW``, 2: recorded, not in the random sample, its
           detail decided once it has ended)
PREEMPTED  request id, KV blocks freed, time
FINISHED   request id, status (facts.FINISHED_*), time
GEOMETRY   tokens per KV block, bytes per block (every layer), blocks in the pool, the send's
           time, ns to add to a perf_counter ns, the message's number (1, 2, ... per engine
           core: a gap is a message dropped at a full socket); the first row of every message
IDLE       (nothing): last row of a send when the scheduler held no request then
=========  ====================================================================================

``marshal`` is Python's own format and trusts its input: it is read only from the socket
pair between the engine core and its own exporter process, both running the same Python.
"""

from __future__ import annotations

import marshal
from typing import Any

__all__ = ["ARRIVED", "FEW_SAMPLED", "FINISHED", "GEOMETRY", "IDLE", "KEPT_IF_SLOW", "PARTIAL", "PREEMPTED", "SCHEDULED", "UPDATED",
           "message", "message_end", "pack", "scheduled_ids", "units", "unpack"]

SCHEDULED, UPDATED, ARRIVED, PREEMPTED, FINISHED, GEOMETRY, IDLE, PARTIAL = range(8)
#: sampled requests in flight up to which a step whose engine_step is not sampled holds a
#: PARTIAL row (each sampled request costs a few C lookups there; beyond this many, vLLM's
#: whole lists by reference cost less)
FEW_SAMPLED = 4
#: an ARRIVED row's ``sampled`` under a keep policy for a request the random sample did not
#: take: recorded all the same, its detail kept only if the policy names it once it has ended
KEPT_IF_SLOW = 2
MARSHAL_VERSION = 4  # shares repeated objects (each request id string object written once per message)


def pack(rows: list[tuple[Any, ...]]) -> bytes:
    """One message's payload (ValueError when a row holds something marshal cannot write)."""
    return marshal.dumps(rows, MARSHAL_VERSION)


def message(header: tuple[int, int, int, int, int], number: int, rows: list[tuple[Any, ...]]) -> list[tuple[Any, ...]]:
    """The rows of message ``number``: its GEOMETRY row (``header``: tokens per KV block,
    bytes per block, blocks in the pool, the send's time, the perf_counter shift), then ``rows``."""
    return [(GEOMETRY, *header, number), *rows]


def message_end(rows: list[tuple[Any, ...]], start: int, count: int) -> int:
    """Where a message that starts at ``rows[start]`` with about ``count`` rows ends (exclusive):
    right after an UPDATED (a step's end) or IDLE row, or where the rows end. The exporter
    process reads the events at the end of a message as an events-only record, so events cut
    from the step they came with would end a request at their own time instead of its step's
    end, and a preemption would leave its step."""
    end, stop = len(rows), min(start + count, len(rows))
    while stop < end and rows[stop - 1][0] not in (UPDATED, IDLE):
        stop += 1
    return stop


def scheduled_ids(row: tuple[Any, ...]) -> Any:
    """The request ids a SCHEDULED row names (every request of its step), or a PARTIAL row
    (those it carries)."""
    if row[0] == PARTIAL:
        return [few[0] for few in row[7]]
    return row[9] if row[7] is None else row[7]


def units(rows: list[tuple[Any, ...]]) -> int:
    """The spans ``rows`` stand for (loss counting): a step's engine_step and one per request
    scheduled, two per request ended; a PARTIAL row: one per request it carries. Under
    sampling an upper bound: unsampled requests in a row are counted, though they get no span."""
    return sum([len(row[9] if row[7] is None else row[7]) + 1 if row[0] == SCHEDULED else len(row[7])
                if row[0] == PARTIAL else 2 if row[0] == FINISHED else 0 for row in rows])


def unpack(payload: bytes | memoryview) -> list[tuple[Any, ...]]:
    """The rows of one payload; ValueError naming what is wrong when it is not a list of rows."""
    try:
        rows = marshal.loads(payload)
    except (EOFError, ValueError, TypeError) as exc:
        raise ValueError(f"vLLM step records: payload unreadable ({exc})") from None
    if not isinstance(rows, list):
        raise ValueError(f"vLLM step records: payload is a {type(rows).__name__}, not a list of rows")
    for i, row in enumerate(rows):
        if not isinstance(row, tuple) or not row or type(row[0]) is not int or len(row) != _WIDTH.get(row[0]):
            raise ValueError(f"vLLM step records: row {i} is not a row ({str(row)[:60]})")
    return rows


_WIDTH = {SCHEDULED: 14, UPDATED: 5, ARRIVED: 6, PREEMPTED: 4, FINISHED: 4, GEOMETRY: 7, IDLE: 1, PARTIAL: 8}
