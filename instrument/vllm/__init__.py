"""tokentrace's vLLM general plugin: entry point ``vllm.general_plugins:tokentrace``.

vLLM calls :func:`register` in every process it starts (API server, engine core, workers).
It does nothing unless ``TOKENTRACE_VLLM_TRACING=1``; then, when the installed vLLM's
scheduler has every method and field the hooks read (:func:`instrument.vllm.hooks.check_scheduler`:
vLLM 0.32.0, 0.33.0 and 0.34.0 are checked on their own code), it wraps the V1 scheduler's
methods (only the engine-core process ever builds a scheduler, so only there does anything
run). A vLLM that differs: one log line naming what differs, and vLLM runs untraced. Calling
it twice is harmless.

No span is built in vLLM's processes. At its first send of something sampled the plugin starts
tokentrace's span exporter process (instrument/records/exporter_process.py, started by the engine-core
process and detached from its process tree). vLLM's engine thread holds one row per request event and
per step with a sampled request in flight or a sampled engine_step (instrument/vllm/sampling.py;
vLLM's own per-step lists by reference, instrument/vllm/rows.py) and, batched (whenever
the engine goes idle, else at 512 rows, or 2 s after the last send once about 64 steps are
held, or 10 s after it: instrument/vllm/sink.py says why), packs them with ``marshal`` and sends them as
channel-1 BLOB messages of up to about 256 KiB on a socket that never blocks; the exporter process
reads them into step facts (instrument/vllm/steps.py) and builds the spans
(instrument/vllm/spans.py). At vLLM's scheduler shutdown (or
process exit) the plugin sends the rest and stops the child within ~4 s, logging one line
with the spans lost if any. When vLLM kills the engine core instead (its default
``--shutdown-timeout 0`` on SIGTERM), the exporter, outside the killed tree, exports what
was sent and ends the requests still running as failed (docs/spans.md "Stopping vLLM"). A
dead exporter process: vLLM goes on, one error line, later spans counted as dropped.

A keep policy (``TOKENTRACE_KEEP_*``, read once here with the sampling:
instrument/vllm/sampling.py; a malformed value is one warning line, that rule off): the engine
thread records every request and every step whole, the random sample marked, and the exporter
process decides each request's detail once it has ended (instrument/vllm/keep.py; docs/vllm.md
"Keeping the slow requests").

``TOKENTRACE_VLLM_STATS=FILE``: whenever the engine goes idle, the plugin rewrites FILE with
its own figures so far (JSON: ``steps`` updated with requests in them and ``tokens`` sampled
(both counted only when this is set, outside the timed hooks), ``hook_cpu_ns``: CPU time of
its hooks on vLLM's engine thread, packing and sending included, timed only when this is
set, with ``schedule_cpu_ns`` and ``send_cpu_ns`` its parts in the schedule hook and in
packing and sending, and of the latter ``pack_cpu_ns`` (marshal), ``socket_cpu_ns`` (spans
counted, the socket) and ``free_cpu_ns`` (freeing what the rows held), ``sends``
(messages); ``hook_wall_ns``: the wall time of the same windows (the clock reads that time
them included); ``stats_cpu_ns`` / ``stats_wall_ns``: writing this file, not in the hooks' figures;
``dropped_steps``: steps not sent because a hook or a send failed; ``exporter_pid`` (null
until the detached exporter process's first report, ~1 s after the first send, which is the
first that holds something sampled); ``sent_spans`` (the span units the rows sent stand for:
an engine_step and one per scheduled request per recorded step, two per request ended, every
request counted, so under sampling an upper bound of the spans built), ``dropped_spans``
(likewise), ``dropped_messages``; benchmarks/vllm_tracing_cost.py reads it). The arrival,
preemption and end hooks (once per request, not per step) are not in ``hook_cpu_ns``. Steps scheduled and never updated are said by the
exporter process, which pairs the rows, at its exit.

Spans leave the exporter process through the standard ``OTEL_*`` variables (instrument/otel/tracing.py;
the child inherits the environment) and, when ``TOKENTRACE_OTLP_JSON`` names a file, the
OTLP/JSON lines exporter (alone, unless ``OTEL_TRACES_EXPORTER`` names others too).
docs/spans.md "vLLM" has the span contract.
"""

from __future__ import annotations

import atexit
import logging
import os
import threading
import time
from typing import Any

from instrument.vllm.sampling import ENV_STEP_RATIO, sampling_from_env

__all__ = ["ENV_ENABLE", "ENV_JSON", "ENV_STATS", "ENV_STEP_RATIO", "register"]

ENV_ENABLE = "TOKENTRACE_VLLM_TRACING"
ENV_JSON = "TOKENTRACE_OTLP_JSON"
ENV_STATS = "TOKENTRACE_VLLM_STATS"
log = logging.getLogger("tokentrace.vllm")
_lock = threading.Lock()
_state: dict[str, Any] = {}


def register() -> None:
    """vLLM's plugin hook: install the scheduler hooks when enabled (idempotent)."""
    if os.environ.get(ENV_ENABLE) != "1":
        return
    with _lock:
        if "tap" in _state or "refused" in _state:
            return
        sampling = sampling_from_env()
        for line in sampling.warnings:
            log.warning("%s", line)
        off = ("OTEL_TRACES_EXPORTER=none" if _exporters() == ["none"] else
               f"OTEL_TRACES_SAMPLER={sampling.sampler} and {ENV_STEP_RATIO} 0" if sampling.traces_nothing else None)
        if off is not None:  # nothing could ever be exported: no hook, no exporter process
            _state["refused"] = True
            log.warning("tokentrace: %s=1 but %s: nothing to trace, vLLM's scheduler left as it is", ENV_ENABLE, off)
            return
        from instrument.vllm import hooks

        try:
            shape = hooks.check_scheduler()
        except ValueError as exc:
            _state["refused"] = True
            log.warning("%s", exc)
            return
        if not shape.checked:
            log.warning("tokentrace: vLLM %s is not among the releases checked (%s); its scheduler has every method "
                        "and field the plugin reads: tracing on", shape.version, ", ".join(hooks.CHECKED_RELEASES))
        tap = hooks.StepTap(_start_pipeline, sampling)
        tap.measure = bool(os.environ.get(ENV_STATS))
        _state["tap"] = tap
        hooks.install(tap, shape)


def _exporters() -> list[str]:
    names = [n.strip() for n in os.environ.get("OTEL_TRACES_EXPORTER", "").split(",") if n.strip()]
    if os.environ.get(ENV_JSON):
        if "otlp_json" not in names:
            names.append("otlp_json")
    elif not names:
        names = ["otlp"]
    return names


def _destinations() -> str:
    """Where the exporter process sends, for the start line (OTLP: protocol and endpoint)."""
    from instrument.otel.tracing import otlp_destination

    said = []
    for name in _exporters():
        if name == "otlp":
            said.append(otlp_destination(_protocol(), None))
        else:
            said.append(f"the file {os.environ.get(ENV_JSON)}" if name == "otlp_json" else name)
    return ", ".join(said)


def _sampling_said(sampling: Any) -> str:
    ratio = f" {sampling.ratio:g}" if sampling.sampler.endswith("traceidratio") else ""
    said = f"requests: {sampling.sampler}{ratio}, engine steps: {sampling.step_ratio:g}"
    if sampling.keep_policy is not None:
        said += f"; every request recorded, kept whole when sampled or slow: {sampling.keep_policy.describe()}"
    return said


def _protocol() -> str | None:
    """The OTLP protocol the plugin's spans go with: the standard variables (signal-specific
    first); none set while ``OTEL_EXPORTER_OTLP_TRACES_ENDPOINT`` is (vLLM writes its
    ``--otlp-traces-endpoint`` there, and its processes inherit it): gRPC, vLLM's own default
    for that endpoint, so the plugin's spans go where vLLM's go, the same way."""
    env = os.environ
    return (env.get("OTEL_EXPORTER_OTLP_TRACES_PROTOCOL") or env.get("OTEL_EXPORTER_OTLP_PROTOCOL")
            or ("grpc" if env.get("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT") else None))


def _start_pipeline(idle: bool) -> None:
    """The first send: start the span exporter process (lazily, in the engine-core process),
    then send what the hooks hold."""
    import multiprocessing.util

    from instrument.vllm.rows import UPDATED
    from instrument.vllm.sink import FLUSH_LATE_NS, FLUSH_NS, RecordSink

    tap = _state["tap"]
    stats_path = os.environ.get(ENV_STATS)
    if not tap.worth_sending(idle):  # nothing sampled held yet: no exporter process either
        if idle and stats_path:
            _write_stats(stats_path, tap, None)
        return
    try:
        sink = RecordSink(_exporters(), os.environ.get(ENV_JSON), take=tap.take, protocol=_protocol())
    except Exception:  # no exporter process: vLLM goes on untraced (one line), its own methods back
        tap.failed = True
        if tap.uninstall is not None:
            tap.uninstall()
        tap.dropped_steps += sum(1 for row in tap.held if row[0] == UPDATED)
        tap.held.clear()
        log.exception("tokentrace: the span exporter process did not start (%d steps held not sent); vLLM runs "
                      "on untraced", tap.dropped_steps)
        return
    sink.measure = bool(stats_path)

    def deliver(idle: bool) -> None:
        try:
            sink.flush(idle)
        except Exception:  # the hook's caller stops tracing (tap.fail, one line with these counted)
            tap.dropped_steps += sink.lost_steps
            sink.lost_steps = 0
            raise
        sent = time.perf_counter_ns()
        tap.due_ns, tap.late_ns = sent + FLUSH_NS, sent + FLUSH_LATE_NS

    def send(idle: bool) -> None:  # on the engine thread, when the hooks find a send due
        if tap.worth_sending(idle):
            deliver(idle)
        if idle and stats_path:  # its own CPU apart: not the plugin's cost when the file is not asked for
            _write_stats(stats_path, tap, sink)

    tap.send = send
    _state["sink"] = sink

    def close() -> None:
        sink.close()  # (steps never updated: said by the exporter process, which pairs the rows)
        lost = tap.dropped_steps + sink.lost_steps
        if lost:
            log.warning("tokentrace: %d engine steps not traced (held when tracing stopped, or at the last send)", lost)

    tap.on_shutdown = close  # vLLM's scheduler shutdown; atexit and multiprocessing's exit as fallbacks
    atexit.register(sink.close)
    multiprocessing.util.Finalize(sink, sink.close, exitpriority=10)
    log.info("tokentrace: tracing vLLM scheduler steps (%s); spans built in a detached exporter process, sent to %s",
             _sampling_said(tap.sampling), _destinations())
    deliver(idle)
    if idle and stats_path:
        _write_stats(stats_path, tap, sink)


def _write_stats(path: str, tap: Any, sink: Any) -> None:
    """The plugin's own cost so far, as JSON (replaced atomically; ``sink`` None: no exporter
    process started yet, nothing sent). Its own CPU goes to ``stats_cpu_ns``, not the hooks'."""
    import json

    cpu, wall = time.thread_time_ns(), time.perf_counter_ns()
    sender = sink.sender if sink is not None else None
    stats = {"steps": tap.steps, "tokens": tap.tokens, "hook_cpu_ns": tap.hook_cpu_ns - tap.stats_cpu_ns,
             "stats_cpu_ns": tap.stats_cpu_ns, "schedule_cpu_ns": tap.schedule_cpu_ns,
             "hook_wall_ns": tap.hook_wall_ns - tap.stats_wall_ns, "stats_wall_ns": tap.stats_wall_ns,
             "send_cpu_ns": getattr(sink, "send_cpu_ns", 0), "pack_cpu_ns": getattr(sink, "pack_cpu_ns", 0),
             "socket_cpu_ns": getattr(sink, "socket_cpu_ns", 0), "free_cpu_ns": getattr(sink, "free_cpu_ns", 0),
             "sends": getattr(sink, "sends", 0), "dropped_steps": tap.dropped_steps + getattr(sink, "lost_steps", 0),
             "exporter_pid": sink.exporter.pid if sink is not None else None,
             "sent_spans": getattr(sender, "sent_units", 0), "dropped_spans": getattr(sender, "dropped_units", 0),
             "dropped_messages": getattr(sender, "dropped_messages", 0)}
    tmp = f"{path}.tmp"
    with open(tmp, "w") as out:
        json.dump(stats, out)
    os.replace(tmp, path)
    tap.stats_cpu_ns += time.thread_time_ns() - cpu
    tap.stats_wall_ns += time.perf_counter_ns() - wall
