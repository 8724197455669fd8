"""The measuring parts of benchmarks/tracing_cost.py: CPU clocks (a thread's, the process's
children's), the GIL probe thread, a stand-in for the gateway's event-loop thread, and the
harness that drives the continuous engine one round at a time, traced or untraced, timing the
engine's tracing work in place on its thread. The module docstring of tracing_cost.py says
what each figure means."""

from __future__ import annotations

import os
import queue
import resource
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

__all__ = ["HOOKS", "PROMPTS", "Harness", "Probe", "ThreadClock", "children_cpu_s", "load_average", "percentile",
           "untraced_parent"]

PROMPTS = (
    "Show me wheelchair-accessible hotels in Kyoto under $200/night with onsen access.",
    "Which Kyoto temples have step-free access?",
    "Suggest a two-day Kyoto itinerary for a wheelchair user, with the best times to visit each place.",
    "What is an onsen, and are private onsen baths common in ryokan?",
    "How do I get from Kansai airport to Kyoto station with luggage?",
    "List three accessible restaurants near Gion.",
    "Is the Arashiyama bamboo grove accessible by wheelchair? Describe the paths and the slopes.",
    "Compare staying near Kyoto station with staying in Higashiyama for a first visit.",
)
# The engine's tracing work timed in place (Harness._attribute_hooks); "calibration" is the
# timing wrapper's own cost, subtracted per call.
HOOKS = ("on_scheduled", "engine_step_span", "engine_trace_close", "sequence_spans", "calibration")


def load_average() -> list[float]:
    """1, 5 and 15 minute load averages (empty where /proc/loadavg is missing)."""
    path = Path("/proc/loadavg")
    return [float(x) for x in path.read_text().split()[:3]] if path.exists() else []


def percentile(values: list[float], q: float) -> float:
    """Linear-interpolated percentile, q in [0, 1]."""
    ordered = sorted(values)
    if not ordered:
        return float("nan")
    pos = (len(ordered) - 1) * q
    low = int(pos)
    high = min(low + 1, len(ordered) - 1)
    return ordered[low] + (ordered[high] - ordered[low]) * (pos - low)


# --- CPU clocks -------------------------------------------------------------------------------
def _children_of(pid: int) -> list[int]:
    out: list[int] = []
    for task in Path(f"/proc/{pid}/task").glob("*"):
        try:
            out += [int(x) for x in (task / "children").read_text().split()]
        except OSError:
            continue
    return out


def children_cpu_s() -> float:
    """CPU seconds of this process's descendants: live ones (utime + stime from /proc, clock
    ticks) and reaped ones (getrusage RUSAGE_CHILDREN). Where an exporter process would show."""
    tick = os.sysconf("SC_CLK_TCK")
    total = 0.0
    todo = _children_of(os.getpid())
    seen: set[int] = set()
    while todo:
        pid = todo.pop()
        if pid in seen:
            continue
        seen.add(pid)
        try:
            fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
            total += (int(fields[11]) + int(fields[12])) / tick
        except (OSError, IndexError, ValueError):
            continue
        todo += _children_of(pid)
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return total + usage.ru_utime + usage.ru_stime


class ThreadClock:
    """CPU time of another thread of this process (``pthread_getcpuclockid``), seconds."""

    def __init__(self, ident: int) -> None:
        self.clock = time.pthread_getcpuclockid(ident)

    def __call__(self) -> float:
        return time.clock_gettime(self.clock)


class Probe:
    """A thread that sleeps ``interval_s`` and records how late it wakes (s) while ``active``."""

    def __init__(self, interval_s: float) -> None:
        self.interval_s = interval_s
        self.delays: list[float] = []
        self.active = False
        self.cpu_s = 0.0  # this thread's own CPU so far, s (it runs through every round, for its wall time)
        self._stop = threading.Event()
        self.thread = threading.Thread(target=self._run, name="tracing-cost-probe", daemon=True)
        self.thread.start()

    def _run(self) -> None:
        interval, clock = self.interval_s, time.perf_counter
        while not self._stop.is_set():
            start = clock()
            time.sleep(interval)
            late = clock() - start - interval
            self.cpu_s = time.thread_time()
            if self.active:
                self.delays.append(late)

    def take(self) -> list[float]:
        out, self.delays = self.delays, []
        return out

    def stop(self) -> None:
        self._stop.set()
        self.thread.join(2)


# --- the gateway's side, as instrument/gateway does it ----------------------------------------
class GatewayStandIn:
    """The gateway's event-loop thread, reduced to what it does per request around the engine:
    a ``gateway`` span (parent of the engine's spans), one ``tokentrace.chunk`` event per token
    (instrument/gateway/request_state.py), the ``queue`` span, the span's end. Tokens arrive
    from the engine thread through a queue (the gateway uses ``call_soon_threadsafe``)."""

    def __init__(self, forwarder: Any = None) -> None:
        self.forwarder = forwarder  # span_forward.SpanForwarder: chunk events kept raw, as the gateway does
        self.inbox: queue.SimpleQueue = queue.SimpleQueue()
        self.thread = threading.Thread(target=self._run, name="tracing-cost-gateway", daemon=True)
        self.thread.start()

    def _run(self) -> None:
        from opentelemetry import trace

        from instrument.clock import now_wall_ns
        from instrument.gateway.request_state import CHUNK_EVENT, CHUNK_KEYS

        while True:
            item = self.inbox.get()
            if item is None:
                return
            state, kind, value = item
            if kind == "token":
                state["chunks"].append(now_wall_ns())
                continue
            span = state["span"]  # done
            if span is not None:
                tracer, result = state["tracer"], value
                rows = [(index, 1, True, at_ns) for index, at_ns in enumerate(state["chunks"])]
                if self.forwarder is None or not self.forwarder.defer_events(span, CHUNK_EVENT, CHUNK_KEYS, rows):
                    add_event = span.add_event
                    for index, tokens, visible, at_ns in rows:
                        add_event(CHUNK_EVENT, dict(zip(CHUNK_KEYS, (index, tokens, visible))), timestamp=at_ns)
                queue_span = tracer.start_span("queue", context=trace.set_span_in_context(span),
                                               start_time=state["enqueued_ns"])
                queue_span.end(end_time=max(result.admitted_ns, state["enqueued_ns"]))
                span.set_attribute("gen_ai.usage.output_tokens", result.generated_tokens)
                span.end()
            state["done"]()

    def stop(self) -> None:
        self.inbox.put(None)
        self.thread.join(5)


def untraced_parent() -> Any:
    """A valid, sampled, non-recording parent context (random ids): what an upstream
    ``traceparent`` gives when this process writes no spans."""
    import random

    from opentelemetry import trace
    from opentelemetry.trace import NonRecordingSpan, SpanContext, TraceFlags

    ctx = SpanContext(random.getrandbits(128) | 1, random.getrandbits(64) | 1, is_remote=False,
                      trace_flags=TraceFlags(TraceFlags.SAMPLED))
    return trace.set_span_in_context(NonRecordingSpan(ctx))


# --- the engine section -----------------------------------------------------------------------
class Harness:
    """One continuous engine, one traced provider, the gateway stand-in and the probe."""

    def __init__(self, handle: Any, provider: Any, *, max_batch_size: int, max_batch_tokens: int,
                 probe_interval_s: float, prompts: list[list[int]] | None = None,
                 span_export: str = "inline") -> None:
        from instrument.engines.continuous import ContinuousEngine
        from instrument.otel.tracing import get_tracer

        self.handle = handle
        self.provider = provider
        self.tracer = get_tracer(provider)
        self.engine = ContinuousEngine(handle, provider, max_batch_size=max_batch_size,
                                       max_batch_tokens=max_batch_tokens, span_export=span_export)
        from instrument.records.span_forward import forwarder_of

        self.gateway = GatewayStandIn(forwarder_of(provider))
        self.probe = Probe(probe_interval_s)
        self.prompts = prompts or [handle.tokenize([{"role": "user", "content": p}], None) for p in PROMPTS]
        self.engine_thread: ThreadClock | None = None
        self._serial = 0
        self.hook_cpu = dict.fromkeys(HOOKS, 0.0)
        self.hook_calls = dict.fromkeys(HOOKS, 0)
        self._attribute_hooks()

    def _timed(self, name: str, fn: Callable[..., Any]) -> Callable[..., Any]:
        """``fn`` with its CPU time (of the calling thread: the engine's) added to ``hook_cpu``."""
        clock, cpu, calls = time.thread_time, self.hook_cpu, self.hook_calls

        def timed(*args: Any, **kwargs: Any) -> Any:
            start = clock()
            try:
                return fn(*args, **kwargs)
            finally:
                cpu[name] += clock() - start
                calls[name] += 1

        return timed

    def _attribute_hooks(self) -> None:
        """Time the engine's tracing work where it happens, on the engine thread: the step hook
        (traced rounds keep a step record, untraced rounds only the admission time), the
        ``engine_step`` span, the engine trace's close and each sequence's prefill/decode
        spans. Instance attributes and the module global the engine looks up at call time
        are wrapped here; no engine file changes. Undone by :meth:`close`."""
        from instrument.engines.continuous import engine as continuous

        engine = self.engine
        engine.on_scheduled = self._timed("on_scheduled", engine.on_scheduled)
        engine.engine_traces.step = self._timed("engine_step_span", engine.engine_traces.step)
        if engine.records is not None:  # --span-export process: the records' sends (the step bucket)
            engine.records.flush = self._timed("engine_step_span", engine.records.flush)
        engine.engine_traces.close = self._timed("engine_trace_close", engine.engine_traces.close)
        self._write_sequence_spans = continuous.write_sequence_spans
        continuous.write_sequence_spans = self._timed("sequence_spans", continuous.write_sequence_spans)
        probe = self._timed("calibration", lambda: None)
        start = time.thread_time()
        for _ in range(2000):
            probe()
        self.wrapper_cost_s = (time.thread_time() - start) / 2000  # one wrapped call's own cost
        self.hook_cpu["calibration"], self.hook_calls["calibration"] = 0.0, 0

    def round(self, batch: int, max_tokens: int, traced: bool) -> dict[str, float]:
        """Submit ``batch`` sequences at once, wait for all (and the export flush when traced)."""
        from opentelemetry import trace
        from opentelemetry.trace import SpanKind

        from instrument.engines.base import EngineRequest
        from instrument.hf.token_sampling import SamplingParams

        engine, inbox = self.engine, self.gateway.inbox
        engine.tracing = traced
        done = threading.Event()
        left = [batch]
        idents: list[int] = []

        def finished() -> None:
            left[0] -= 1
            if left[0] == 0:
                done.set()

        def make(i: int) -> EngineRequest:
            self._serial += 1
            request_id = f"chatcmpl-{self._serial:024x}"
            state: dict[str, Any] = {"chunks": [], "done": finished, "tracer": self.tracer, "span": None}
            if traced:
                span = self.tracer.start_span("gateway", kind=SpanKind.SERVER, attributes={
                    "gen_ai.operation.name": "chat", "gen_ai.response.id": request_id,
                    "gen_ai.system": "tokentrace", "http.request.method": "POST", "url.path": "/v1/chat/completions"})
                state["span"], parent = span, trace.set_span_in_context(span)
            else:
                parent = untraced_parent()

            def on_token(token: int, logprobs: Any) -> None:
                if not idents:
                    idents.append(threading.get_ident())
                inbox.put((state, "token", token))

            request = EngineRequest(request_id, self.prompts[i % len(self.prompts)],
                                    SamplingParams(max_tokens=max_tokens, temperature=0.0, ignore_eos=True), parent,
                                    on_token, lambda result: inbox.put((state, "done", result)))
            state["enqueued_ns"] = request.enqueued_ns
            return request

        requests = [make(i) for i in range(batch)]
        self.probe.take()
        self.probe.active = True
        hooks0, calls0 = dict(self.hook_cpu), dict(self.hook_calls)
        engine_cpu0 = self.engine_thread() if self.engine_thread else None
        steps0 = engine.health()["steps"]
        cpu0, child0, wall0, probe0 = time.process_time(), children_cpu_s(), time.perf_counter(), self.probe.cpu_s
        for request in requests:
            engine.submit(request)
        if not done.wait(900):
            raise RuntimeError(f"a round of {batch} sequences did not finish within 900 s")
        steps = engine.health()["steps"] - steps0
        if traced:
            # one flush of each pipeline: a forwarding provider's force_flush is the exporter
            # process's flush (the engine's records included); otherwise the in-process
            # exporters', then the engine's own exporter process's
            flushed = self.provider.force_flush(300_000)
            if self.gateway.forwarder is not None:
                if not flushed:
                    raise RuntimeError("the span exporter process did not flush within 300 s")
            elif engine.exporter is not None and not engine.exporter.flush(300):
                raise RuntimeError("the span exporter process did not flush within 300 s")
        cpu1, child1, wall1, probe1 = time.process_time(), children_cpu_s(), time.perf_counter(), self.probe.cpu_s
        engine_cpu1 = self.engine_thread() if self.engine_thread else None
        self.probe.active = False
        delays = self.probe.take()
        if self.engine_thread is None and idents:
            self.engine_thread = ThreadClock(idents[0])
        hooks = {name: self.hook_cpu[name] - hooks0[name]
                 - (self.hook_calls[name] - calls0[name]) * self.wrapper_cost_s for name in HOOKS[:-1]}
        return {**{f"hook_{name}_s": value for name, value in hooks.items()}, "tokens": batch * max_tokens, "steps": steps,
                "wall_s": wall1 - wall0, "process_cpu_s": cpu1 - cpu0,
                "probe_cpu_s": probe1 - probe0,
                "children_cpu_s": child1 - child0,
                "engine_cpu_s": (engine_cpu1 - engine_cpu0) if engine_cpu0 is not None else float("nan"),
                "probe_p99_ms": percentile(delays, 0.99) * 1e3, "probe_samples": len(delays)}

    def close(self) -> None:
        from instrument.engines.continuous import engine as continuous

        self.engine.close()
        continuous.write_sequence_spans = self._write_sequence_spans
        self.gateway.stop()
        self.probe.stop()
