"""Two ways to write a finished span with explicit times: the tracer API, or direct hand-off.

``ApiSpanWriter`` uses ``tracer.start_span(...).end(...)`` (any OpenTelemetry tracer); it
costs ~13 µs per span and ~5 µs per event on the SDK. ``DirectSpanWriter`` (SDK tracers
only) does what the SDK's ``start_span`` does for an already-finished span - asks the
tracer's sampler, takes ids from its id generator, enforces the span limits, builds a
``ReadableSpan`` and hands it to the tracer's span processor ``on_end`` - at ~5 µs per span
and ~0.5 µs per event. Processors' ``on_start`` is not called (the span is already over);
the SDK's Batch and Simple processors do nothing there.

For the many decode-step spans of one sequence, ``DirectSpanWriter.write_steps`` creates
:class:`_StepSpan` objects whose id, ``SpanContext`` and attributes are built when first
read (by the exporter, on the batch processor's thread) and queues them on an SDK batch
processor in one call: ~0.2 µs per step on the caller's thread. A root's chunk events can
be passed as :class:`LazyEvents`, built the same way. Both read SDK internals
(``ReadableSpan``'s private fields, the batch processor's queue), pinned by
tests/test_span_writer.py against the installed SDK.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Iterable, Iterator, Sequence
from typing import Any

from opentelemetry import trace
from opentelemetry.attributes import BoundedAttributes
from opentelemetry.context import Context
from opentelemetry.sdk.trace import Event, ReadableSpan
from opentelemetry.sdk.util import BoundedList
from opentelemetry.sdk.util.instrumentation import InstrumentationScope
from opentelemetry.trace import SpanKind, Status, StatusCode

from instrument.otel.export_health import emit_sampled_spans
from instrument.otel.tracing import CONTRACT_VERSION, SCOPE_NAME

__all__ = ["ApiSpanWriter", "DirectSpanWriter", "LazyEvents", "span_writer_for", "resolve_context"]

ChunkEvent = tuple[str, dict[str, Any], int]  # (name, attributes, timestamp ns)
ChildSpan = tuple[dict[str, Any], int, int]  # (attributes, start ns, end ns)


class LazyEvents(Sequence[Event]):
    """A span's events, built by ``build()`` when first read (by the exporter, on its thread).

    A root span's chunk events (one per token) cost ~1 µs each to build; the request thread
    only stores this object. ``len`` is known up front (``count``). Built once and kept;
    two threads reading it first at the same time build equal lists and one is kept.
    """

    __slots__ = ("_build", "_count", "_events")

    def __init__(self, build: Callable[[], list[Event]], count: int) -> None:
        self._build = build
        self._count = count
        self._events: list[Event] | None = None

    def _built(self) -> list[Event]:
        events = self._events
        if events is None:
            events = self._build()
            if len(events) != self._count:
                raise RuntimeError(f"LazyEvents: built {len(events)} events, {self._count} announced")
            self._events = events
        return events

    def __len__(self) -> int:
        return self._count

    def __getitem__(self, index: Any) -> Any:
        return self._built()[index]

    def __iter__(self) -> Iterator[Event]:
        return iter(self._built())

    def __repr__(self) -> str:
        return f"LazyEvents({self._count} events{'' if self._events is not None else ', not built yet'})"


class ApiSpanWriter:
    """Writes spans through the public tracer API."""

    def __init__(self, tracer: trace.Tracer) -> None:
        self.tracer = tracer

    def write(
        self, name: str, parent: Context, attributes: dict[str, Any], start_ns: int, end_ns: int,
        events: Sequence[ChunkEvent] = (),
    ) -> Context:
        """Write one INTERNAL span; returns a context holding it (to parent further spans)."""
        span = self.tracer.start_span(name, context=parent, kind=SpanKind.INTERNAL, attributes=attributes, start_time=start_ns)
        if isinstance(events, LazyEvents):
            for event in events:
                span.add_event(event.name, event.attributes, timestamp=event.timestamp)
        else:
            for event_name, event_attributes, timestamp in events:
                span.add_event(event_name, event_attributes, timestamp=timestamp)
        span.end(end_time=end_ns)
        return trace.set_span_in_context(span)

    def write_children(self, name: str, parent: Context, children: Iterable[ChildSpan]) -> int:
        """Write many event-less INTERNAL spans named ``name`` under ``parent``; returns how many."""
        written = 0
        for attributes, start_ns, end_ns in children:
            self.tracer.start_span(
                name, context=parent, kind=SpanKind.INTERNAL, attributes=attributes, start_time=start_ns
            ).end(end_time=end_ns)
            written += 1
        return written

    def write_steps(
        self, name: str, parent: Context, steps: Sequence[int], attributes_of: Callable[[int], dict[str, Any]],
        starts: Sequence[int], start_offset: int, ends: Sequence[int],
    ) -> int:
        """Span ``k`` for each ``k`` in ``steps``: ``attributes_of(k)``, from
        ``starts[start_offset + k]`` to ``ends[k]`` (ns). Same spans as :meth:`write_children`."""
        return self.write_children(
            name, parent, ((attributes_of(k), starts[start_offset + k], ends[k]) for k in steps)
        )


class DirectSpanWriter:
    """Builds finished ``ReadableSpan``s for an SDK tracer and hands them to its span processor."""

    def __init__(self, tracer: Any) -> None:
        self.sampler = tracer.sampler
        self.id_generator = tracer.id_generator
        self.processor = tracer.span_processor
        self.resource = tracer.resource
        self.limits = tracer._span_limits
        scope = getattr(tracer, "_instrumentation_scope", None)
        self.scope = scope if scope is not None else InstrumentationScope(SCOPE_NAME, CONTRACT_VERSION)
        self._decisions: dict[Any, Any] = {}

    def _bounded(self, attributes: dict[str, Any]) -> Any:
        """``attributes`` as the SDK's spans hold them under the tracer's span limits: the dict
        itself when no limit applies (the usual case), else ``BoundedAttributes`` (oldest keys
        evicted past ``max_span_attributes``, strings cut at ``max_span_attribute_length``)."""
        if self._within_limits(attributes):
            return attributes
        limits = self.limits
        return BoundedAttributes(
            limits.max_span_attributes, attributes, immutable=True, max_value_len=limits.max_span_attribute_length
        )

    def _decide(self, key: Any, parent: Context, trace_id: int, name: str,
                attributes: dict[str, Any]) -> tuple[Any, dict[str, Any]]:
        """(the sampler's decision for a span named ``name`` under ``parent``, the attributes
        the sampler adds of its own). The decision is taken once per ``key`` (parent span,
        name) and reused for that parent's later spans of the name. What the sampler hands back
        holds the attributes it was given (the SDK's static and parent-based samplers return
        them whole): only the keys it added or changed are kept with the decision, so a later
        span never takes the first span's attributes as its own."""
        cached = self._decisions.get(key) if key is not None else None
        if cached is not None:
            return cached
        sampling = self.sampler.should_sample(parent, trace_id, name, SpanKind.INTERNAL, attributes, ())
        missing = object()
        extra = {k: v for k, v in (sampling.attributes or {}).items() if attributes.get(k, missing) != v}
        if key is not None:
            if len(self._decisions) > 64:
                self._decisions.clear()
            self._decisions[key] = (sampling, extra)
        return sampling, extra

    def _within_limits(self, attributes: dict[str, Any], *, strings: bool = True) -> bool:
        """Whether the span limits would leave ``attributes`` as they are: no more keys than
        ``max_span_attributes`` and no string (alone or in a sequence) longer than
        ``max_span_attribute_length``. With ``strings=False``, any string value at all
        answers False (for attributes whose later values are not seen)."""
        limits = self.limits
        most = limits.max_span_attributes
        if most is not None and len(attributes) > most:
            return False
        length = limits.max_span_attribute_length
        if length is None:
            return True
        for value in attributes.values():
            if isinstance(value, str):
                if not strings or len(value) > length:
                    return False
            elif isinstance(value, (list, tuple)):
                if any(isinstance(item, str) and (not strings or len(item) > length) for item in value):
                    return False
        return True

    def write(
        self, name: str, parent: Context, attributes: dict[str, Any], start_ns: int, end_ns: int,
        events: Sequence[ChunkEvent] = (),
    ) -> Context:
        parent_span_context: trace.SpanContext | None = trace.get_current_span(parent).get_span_context()
        if parent_span_context is None or not parent_span_context.is_valid:
            parent_span_context = None
            trace_id = self.id_generator.generate_trace_id()
        else:
            trace_id = parent_span_context.trace_id
        # The standard samplers decide on parent, trace id and name, never on per-step
        # attributes: one decision per (parent, name) serves every decode step of a sequence.
        key = (parent_span_context.span_id, name) if parent_span_context is not None else None
        sampling, extra = self._decide(key, parent, trace_id, name, attributes)
        flags = trace.TraceFlags(trace.TraceFlags.SAMPLED if sampling.decision.is_sampled() else trace.TraceFlags.DEFAULT)
        context = trace.SpanContext(
            trace_id, self.id_generator.generate_span_id(), is_remote=False, trace_flags=flags,
            trace_state=sampling.trace_state,
        )
        if sampling.decision.is_recording():
            if extra:
                attributes = {**extra, **attributes}
            event_list: BoundedList | LazyEvents | tuple[()] = ()
            max_events = self.limits.max_events
            if isinstance(events, LazyEvents) and (max_events is None or len(events) <= max_events):
                event_list = events  # within the limit: nothing to drop, built on first read
            elif events:
                event_list = BoundedList(max_events)
                if isinstance(events, LazyEvents):
                    event_list.extend(events)
                else:
                    event_list.extend([Event(event_name, attrs, timestamp) for event_name, attrs, timestamp in events])
            span = ReadableSpan(
                name, context, parent_span_context, self.resource, self._bounded(attributes), event_list, (),
                SpanKind.INTERNAL,
                start_time=start_ns, end_time=end_ns, instrumentation_scope=self.scope,
            )
            self.processor.on_end(span)
        return _LazyContext(context)  # type: ignore[return-value]  # a lazy stand-in for the Context

    def write_children(self, name: str, parent: Context, children: Iterable[ChildSpan]) -> int:
        """Write many event-less INTERNAL spans named ``name`` under ``parent``; returns how many.

        The per-sequence work (parent lookup, one sampling decision, flags) is done once; per
        span only an id, a ``SpanContext``, a ``ReadableSpan`` and the hand-off remain (the
        decode-step path: ~2.5 µs per span instead of ~4 µs through :meth:`write`).
        """
        parent_span_context = trace.get_current_span(parent).get_span_context()
        if parent_span_context is None or not parent_span_context.is_valid:
            # No parent: each span starts its own trace; keep the general path.
            written = 0
            for attributes, start_ns, end_ns in children:
                self.write(name, parent, attributes, start_ns, end_ns)
                written += 1
            return written
        iterator = iter(children)
        first = next(iterator, None)
        if first is None:
            return 0
        trace_id = parent_span_context.trace_id
        key = (parent_span_context.span_id, name)
        sampling, extra = self._decide(key, parent, trace_id, name, first[0])
        if not sampling.decision.is_recording():
            return 1 + sum(1 for _ in iterator)
        flags = trace.TraceFlags(trace.TraceFlags.SAMPLED if sampling.decision.is_sampled() else trace.TraceFlags.DEFAULT)
        trace_state = sampling.trace_state
        new_span_id, span_context, readable = self.id_generator.generate_span_id, trace.SpanContext, ReadableSpan
        resource, scope, internal, bounded = self.resource, self.scope, SpanKind.INTERNAL, self._bounded
        spans = []
        for attributes, start_ns, end_ns in itertools.chain((first,), iterator):
            if extra:
                attributes = {**extra, **attributes}
            spans.append(readable(
                name, span_context(trace_id, new_span_id(), False, flags, trace_state), parent_span_context, resource,
                bounded(attributes), (), (), internal, start_time=start_ns, end_time=end_ns, instrumentation_scope=scope,
            ))
        _hand_off(self.processor, spans)
        return len(spans)

    def write_steps(
        self, name: str, parent: Context, steps: Sequence[int], attributes_of: Callable[[int], dict[str, Any]],
        starts: Sequence[int], start_offset: int, ends: Sequence[int],
    ) -> int:
        """Span ``k`` for each ``k`` in ``steps``: ``attributes_of(k)``, from
        ``starts[start_offset + k]`` to ``ends[k]`` (ns), INTERNAL, children of ``parent``.

        The decode-step path. Per span the caller's thread only creates a small
        :class:`_StepSpan` (~0.3 µs) and queues it; its span id, ``SpanContext`` and
        attributes are made when the exporter first reads them (on the batch processor's
        thread). ``starts``, ``ends`` and ``attributes_of`` must not change afterwards.
        Without a valid parent, with a sampler that adds attributes of its own, or with step
        attributes the span limits would change (string values under a value length limit,
        more keys than allowed), every span goes through :meth:`write_children` instead.
        """
        parent_span_context = trace.get_current_span(parent).get_span_context()
        if not steps:
            return 0
        if parent_span_context is None or not parent_span_context.is_valid:
            return self.write_children(
                name, parent, ((attributes_of(k), starts[start_offset + k], ends[k]) for k in steps)
            )
        trace_id = parent_span_context.trace_id
        key = (parent_span_context.span_id, name)
        first = attributes_of(steps[0])
        sampling, extra = self._decide(key, parent, trace_id, name, first)
        if not sampling.decision.is_recording():
            return len(steps)
        # The SDK's samplers hand back the attributes they were given; one that adds its own
        # keys gets them merged into every span, by the eager path.
        # The same for span attribute limits that a step's attributes would exceed (the lazy
        # spans hold plain dicts; the eager path bounds them as the SDK's spans do).
        adds_keys = bool(extra)
        # The default setup sets a value length limit; step attributes are numbers, which no
        # limit touches, so only a step with string values (or too many keys) goes eager.
        if adds_keys or not self._within_limits(first, strings=False):
            return self.write_children(
                name, parent, ((attributes_of(k), starts[start_offset + k], ends[k]) for k in steps)
            )
        sampled = sampling.decision.is_sampled()
        shared = _StepShared(
            name, parent_span_context, self.resource, self.scope, trace_id,
            trace.TraceFlags(trace.TraceFlags.SAMPLED if sampled else trace.TraceFlags.DEFAULT),
            sampling.trace_state, self.id_generator, attributes_of, starts, start_offset, ends,
        )
        step_span = _StepSpan
        spans = [step_span(shared, k) for k in steps]
        _hand_off(self.processor, spans, sampled=sampled)
        return len(spans)

    def hand_off(self, spans: list[ReadableSpan]) -> None:
        """Hand already-built finished spans to the tracer's span processors (``on_end``;
        the span exporter process's forwarded spans, instrument/records/span_forward.py)."""
        _hand_off(self.processor, spans)


class _StepShared:
    """What every decode-step span of one sequence shares (see :class:`_StepSpan`)."""

    __slots__ = ("_name", "_parent", "_resource", "_instrumentation_scope", "trace_id", "flags", "trace_state",
                 "id_generator", "attributes_of", "starts", "start_offset", "ends")

    def __init__(self, name: str, parent: trace.SpanContext, resource: Any, scope: Any, trace_id: int, flags: Any,
                 trace_state: Any, id_generator: Any, attributes_of: Callable[[int], dict[str, Any]],
                 starts: Sequence[int], start_offset: int, ends: Sequence[int]) -> None:
        self._name, self._parent, self._resource, self._instrumentation_scope = name, parent, resource, scope
        self.trace_id, self.flags, self.trace_state, self.id_generator = trace_id, flags, trace_state, id_generator
        self.attributes_of, self.starts, self.start_offset, self.ends = attributes_of, starts, start_offset, ends


class _StepSpan(ReadableSpan):
    """A finished decode-step span that builds its context and attributes when first read.

    ``ReadableSpan`` keeps its fields in private attributes (``_context``, ``_attributes``,
    ...) that its properties and ``to_json`` read; here they are class attributes (the same
    for every step span) or properties reading the sequence's :class:`_StepShared`, so a
    step span is created with two fields and nothing else. The span id is drawn when
    ``_context`` is first read; ``dict.setdefault`` keeps the first one when two threads
    race, so a span never shows two ids.
    """

    _kind = SpanKind.INTERNAL
    _instrumentation_info = None
    _events: tuple[()] = ()
    _links: tuple[()] = ()
    _status = Status(StatusCode.UNSET)  # ReadableSpan's default

    def __init__(self, shared: _StepShared, step: int) -> None:
        self._shared = shared
        self._step = step

    @property
    def _context(self) -> trace.SpanContext:  # type: ignore[override]  # built on first read, not stored
        context = self.__dict__.get("_built_context")
        if context is None:
            shared = self._shared
            context = self.__dict__.setdefault("_built_context", trace.SpanContext(
                shared.trace_id, shared.id_generator.generate_span_id(), False, shared.flags, shared.trace_state
            ))
        return context

    @property
    def _attributes(self) -> dict[str, Any]:  # type: ignore[override]  # built on first read, not stored
        attributes = self.__dict__.get("_built_attributes")
        if attributes is None:
            attributes = self.__dict__.setdefault("_built_attributes", self._shared.attributes_of(self._step))
        return attributes

    @property
    def _start_time(self) -> int:  # type: ignore[override]  # built on first read, not stored
        shared = self._shared
        return shared.starts[shared.start_offset + self._step]

    @property
    def _end_time(self) -> int:  # type: ignore[override]  # built on first read, not stored
        return self._shared.ends[self._step]

    @property
    def _name(self) -> str:  # type: ignore[override]  # built on first read, not stored
        return self._shared._name

    @property
    def _parent(self) -> trace.SpanContext:  # type: ignore[override]  # built on first read, not stored
        return self._shared._parent

    @property
    def _resource(self) -> Any:  # type: ignore[override]  # built on first read, not stored
        return self._shared._resource

    @property
    def _instrumentation_scope(self) -> Any:  # type: ignore[override]  # built on first read, not stored
        return self._shared._instrumentation_scope


def _hand_off(processor: Any, spans: Sequence[ReadableSpan], *, sampled: bool = False) -> None:
    """``processor.on_end`` for each span, through ``on_end_many`` where a processor has one
    (the SDK's multi-processor is unrolled so that our counting processor sees the batch).
    ``sampled``: every span is sampled (SDK batch processors then take the list at once)."""
    inner = getattr(processor, "_span_processors", None)
    for target in (inner if isinstance(inner, tuple) else (processor,)):
        many = getattr(target, "on_end_many", None)
        if many is not None:
            if sampled:
                many(spans, sampled=True)
            else:
                many(spans)
        elif sampled:
            emit_sampled_spans(target, spans)
        else:
            on_end = target.on_end
            for span in spans:
                on_end(span)


class _LazyContext:
    """Stands in for the returned Context until someone uses it (most callers never do)."""

    __slots__ = ("span_context",)

    def __init__(self, span_context: trace.SpanContext) -> None:
        self.span_context = span_context

    def resolve(self) -> Context:
        return trace.set_span_in_context(trace.NonRecordingSpan(self.span_context))


def resolve_context(context: Any) -> Context:
    """A real Context from what a writer returned."""
    return context.resolve() if isinstance(context, _LazyContext) else context


def span_writer_for(tracer: trace.Tracer, direct: bool = True) -> ApiSpanWriter | DirectSpanWriter:
    """The direct writer for an enabled SDK tracer when ``direct``, else the API writer.

    A tracer's direct writer is made once and kept on the tracer (``tokentrace_span_writer``;
    it only reads the tracer's sampler, id generator, processor, resource and limits, which
    an SDK tracer never replaces)."""
    enabled = getattr(getattr(tracer, "_tracer_config", None), "is_enabled", True)
    if not (direct and enabled):
        return ApiSpanWriter(tracer)
    writer = getattr(tracer, "tokentrace_span_writer", None)
    if isinstance(writer, DirectSpanWriter):
        return writer
    sdk_parts = ("sampler", "id_generator", "span_processor", "resource", "_span_limits")
    if not all(hasattr(tracer, part) for part in sdk_parts):
        return ApiSpanWriter(tracer)
    writer = DirectSpanWriter(tracer)
    try:
        tracer.tokentrace_span_writer = writer  # type: ignore[attr-defined]  # kept on the tracer object, read back with getattr
    except (AttributeError, TypeError):  # a tracer that takes no attribute: a writer per call
        pass
    return writer
