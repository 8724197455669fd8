"""Server metrics: ``GET /metrics`` in Prometheus text, and the same instruments over OTLP.

One set of OpenTelemetry instruments (an SDK ``MeterProvider`` of the app's own, never the
global one) with two readers:

- ``opentelemetry-exporter-prometheus``'s ``PrometheusMetricReader`` on a
  ``prometheus_client.CollectorRegistry`` of this app's own; ``GET /metrics`` renders that
  registry (``prometheus_client.generate_latest``). Chosen over a bare ``prometheus_client``
  because the instruments are then OTel instruments, named and bucketed as the GenAI
  semantic conventions say, and the OTLP export below reads the very same ones: one place
  records, two formats leave.
- An OTLP ``PeriodicExportingMetricReader`` when the environment asks for it
  (:func:`otlp_metrics_requested`): ``OTEL_METRICS_EXPORTER`` naming ``otlp``, or, with that
  variable unset, ``OTEL_EXPORTER_OTLP_ENDPOINT`` / ``OTEL_EXPORTER_OTLP_METRICS_ENDPOINT``
  set. Protocol: ``OTEL_EXPORTER_OTLP_METRICS_PROTOCOL``, then ``OTEL_EXPORTER_OTLP_PROTOCOL``,
  then ``http/protobuf``; interval ``OTEL_METRIC_EXPORT_INTERVAL`` (ms, the SDK's 60,000).

Instruments (docs/gateway.md, "Metrics", has the table with the Prometheus names):

- GenAI semconv server histograms, seconds, the semconv bucket boundaries, attributes
  ``gen_ai.operation.name``, ``gen_ai.request.model``, ``gen_ai.system`` and, on a failed
  request's duration, ``error.type``:
  ``gen_ai.server.time_to_first_token``, ``gen_ai.server.time_per_output_token``,
  ``gen_ai.server.request.duration``. Recorded once per request when it ends, on the
  event loop (never on the engine's thread). TTFT: arrival at the gateway .. the first
  token (streaming: its chunk handed to the server; otherwise: its arrival on the event
  loop); TPOT: (last token - first token) / (output tokens - 1), for 2+ output tokens.
- The engine's own: requests running / waiting, KV blocks used / total (observable gauges
  read at collection from the engine's own counters and cache), prefix-cache query / hit tokens and
  preemptions (counters), step duration and batch size (histograms, one record each per
  engine step on the engine's thread: benchmarks/engine_throughput.py ``--metrics`` measures it).
"""

from __future__ import annotations

import os
from typing import Any

__all__ = ["DURATION_BUCKETS_S", "TPOT_BUCKETS_S", "TTFT_BUCKETS_S", "ServerMetrics", "otlp_metrics_requested"]

# OpenTelemetry GenAI semantic conventions (gen-ai-metrics.md), explicit bucket boundaries, s.
TTFT_BUCKETS_S = (0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0)
TPOT_BUCKETS_S = (0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5)
DURATION_BUCKETS_S = (0.01, 0.02, 0.04, 0.08, 0.16, 0.32, 0.64, 1.28, 2.56, 5.12, 10.24, 20.48, 40.96, 81.92)
STEP_BUCKETS_S = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0)
BATCH_BUCKETS = (1, 2, 4, 8, 16, 32, 64, 128, 256, 512)

ENV_METRICS_EXPORTER = "OTEL_METRICS_EXPORTER"
ENV_METRICS_ENDPOINT = "OTEL_EXPORTER_OTLP_METRICS_ENDPOINT"
ENV_ENDPOINT = "OTEL_EXPORTER_OTLP_ENDPOINT"
ENV_METRICS_PROTOCOL = "OTEL_EXPORTER_OTLP_METRICS_PROTOCOL"
ENV_PROTOCOL = "OTEL_EXPORTER_OTLP_PROTOCOL"
SCOPE = "tokentrace"
PROMETHEUS_CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"


def otlp_metrics_requested(environ: Any = None) -> bool:
    """Whether the environment asks for OTLP metrics (module docstring); ValueError on an
    exporter name this server does not know."""
    env = os.environ if environ is None else environ
    names = [n.strip().lower() for n in (env.get(ENV_METRICS_EXPORTER) or "").split(",") if n.strip()]
    unknown = [n for n in names if n not in ("otlp", "prometheus", "none", "console")]
    if unknown:
        raise ValueError(f"{ENV_METRICS_EXPORTER}: unsupported exporter {unknown[0]!r} (expected otlp, prometheus "
                         "or none; /metrics always serves Prometheus text)")
    if names:
        return "otlp" in names
    return bool(env.get(ENV_ENDPOINT) or env.get(ENV_METRICS_ENDPOINT))


def _otlp_metric_exporter(environ: Any) -> Any:
    """The OTLP metric exporter ``environ`` asks for (endpoint: the metrics one as is, else
    the base one with ``/v1/metrics`` for HTTP; headers and timeout: the SDK's variables)."""
    protocol = (environ.get(ENV_METRICS_PROTOCOL) or environ.get(ENV_PROTOCOL) or "http/protobuf").lower()
    endpoint = environ.get(ENV_METRICS_ENDPOINT)
    base = environ.get(ENV_ENDPOINT)
    if protocol == "grpc":
        from opentelemetry.exporter.otlp.proto.grpc.metric_exporter import OTLPMetricExporter

        return OTLPMetricExporter(endpoint=endpoint or base or None)
    if protocol != "http/protobuf":
        raise ValueError(f"{ENV_METRICS_PROTOCOL}: unsupported OTLP protocol {protocol!r} (expected grpc or http/protobuf)")
    from opentelemetry.exporter.otlp.proto.http.metric_exporter import OTLPMetricExporter as HTTPExporter

    if endpoint is None and base:
        endpoint = base.rstrip("/") + "/v1/metrics"
    return HTTPExporter(endpoint=endpoint)


class ServerMetrics:
    """The app's instruments and readers (module docstring). ``engine``: read by the gauges
    (``requests_running``, ``requests_waiting``; ``geometry`` and the last step's blocks).

    Engine hooks (the engine's thread, O(1), no allocation beyond the SDK's record):
    :meth:`step_scheduled`, :meth:`step_done`, :meth:`preempted`, :meth:`prefix_cache_queried`.
    """

    def __init__(self, engine: Any, *, resource: Any = None, environ: Any = None) -> None:
        from opentelemetry.exporter.prometheus import PrometheusMetricReader
        from opentelemetry.metrics import Observation
        from opentelemetry.sdk.metrics import MeterProvider
        from opentelemetry.sdk.metrics.view import ExplicitBucketHistogramAggregation, View
        from prometheus_client import CollectorRegistry

        env = os.environ if environ is None else environ
        self.engine = engine
        self.registry = CollectorRegistry(auto_describe=False)
        readers: list[Any] = [PrometheusMetricReader(registry=self.registry)]
        self.otlp = otlp_metrics_requested(env)
        if self.otlp:
            from opentelemetry.sdk.metrics.export import PeriodicExportingMetricReader

            readers.append(PeriodicExportingMetricReader(_otlp_metric_exporter(env)))

        def buckets(name: str, bounds: tuple[float, ...]) -> View:
            return View(instrument_name=name, aggregation=ExplicitBucketHistogramAggregation(boundaries=bounds))

        views = [buckets("gen_ai.server.time_to_first_token", TTFT_BUCKETS_S),
                 buckets("gen_ai.server.time_per_output_token", TPOT_BUCKETS_S),
                 buckets("gen_ai.server.request.duration", DURATION_BUCKETS_S),
                 buckets("tokentrace.engine.step.duration", STEP_BUCKETS_S),
                 buckets("tokentrace.engine.batch.size", BATCH_BUCKETS)]
        kwargs: dict[str, Any] = {"metric_readers": readers, "views": views}
        if resource is not None:
            kwargs["resource"] = resource
        self.provider = MeterProvider(**kwargs)
        from instrument.otel.tracing import CONTRACT_VERSION

        meter = self.provider.get_meter(SCOPE, CONTRACT_VERSION)
        self.ttft = meter.create_histogram("gen_ai.server.time_to_first_token", unit="s",
                                           description="Time to generate the first token of a request")
        self.tpot = meter.create_histogram("gen_ai.server.time_per_output_token", unit="s",
                                           description="Time per output token after the first")
        self.duration = meter.create_histogram("gen_ai.server.request.duration", unit="s",
                                               description="Generative AI server request duration")
        self.step_duration = meter.create_histogram("tokentrace.engine.step.duration", unit="s",
                                                    description="Engine step: scheduling to tokens handed over")
        self.batch_size = meter.create_histogram("tokentrace.engine.batch.size", unit="{sequence}",
                                                 description="Sequences in an engine step")
        self.preemptions = meter.create_counter("tokentrace.engine.preemptions", unit="{preemption}",
                                                description="Running sequences preempted (KV cache full)")
        self.prefix_queries = meter.create_counter("tokentrace.engine.prefix_cache.queries", unit="{token}",
                                                   description="Prompt tokens looked up in the prefix cache")
        self.prefix_hits = meter.create_counter("tokentrace.engine.prefix_cache.hits", unit="{token}",
                                                description="Prompt tokens served from the prefix cache")
        # Counters are listed from 0 (a Prometheus reader tells "none yet" from "not exported").
        for counter in (self.prefix_queries, self.prefix_hits):
            counter.add(0)
        self.preemptions.add(0, {"tokentrace.preemption.mode": "recompute"})

        def gauge(value: Any) -> Any:
            def callback(_options: Any) -> list[Any]:
                return [Observation(value())]
            return [callback]

        meter.create_observable_gauge("tokentrace.engine.requests.running", gauge(lambda: engine.requests_running),
                                      unit="{request}", description="Requests the engine runs")
        meter.create_observable_gauge("tokentrace.engine.requests.waiting", gauge(lambda: engine.requests_waiting),
                                      unit="{request}", description="Requests waiting to be scheduled")
        geometry = getattr(engine, "geometry", None)
        if geometry is not None:
            meter.create_observable_gauge("tokentrace.engine.kv.blocks_used", gauge(lambda: engine.kv_blocks_used),
                                          unit="{block}", description="KV blocks held by sequences (shared once)")
            meter.create_observable_gauge("tokentrace.engine.kv.blocks_total", gauge(lambda: geometry.blocks_total),
                                          unit="{block}", description="KV blocks in the paged cache")

    # --- per request (the event loop) ---------------------------------------------------------
    def record_request(self, attributes: dict[str, Any], *, start_ns: int, first_token_ns: int | None,
                       last_token_ns: int | None, output_tokens: int, end_ns: int, error_type: str | None) -> None:
        """One ended request: duration always; TTFT when a token was written; TPOT over the
        tokens after the first, when there were two or more. Times in ns (one clock)."""
        self.duration.record((end_ns - start_ns) / 1e9,
                             {**attributes, "error.type": error_type} if error_type else attributes)
        if first_token_ns is not None:
            self.ttft.record((first_token_ns - start_ns) / 1e9, attributes)
            if last_token_ns is not None and output_tokens > 1:
                self.tpot.record((last_token_ns - first_token_ns) / 1e9 / (output_tokens - 1), attributes)

    # --- engine hooks (the engine's thread) -----------------------------------------------------
    def step_scheduled(self, batch_size: int) -> None:
        self.batch_size.record(batch_size)

    def step_done(self, duration_s: float) -> None:
        self.step_duration.record(duration_s)

    def preempted(self, mode: str) -> None:
        self.preemptions.add(1, {"tokentrace.preemption.mode": mode})

    def prefix_cache_queried(self, prompt_tokens: int, hit_tokens: int) -> None:
        self.prefix_queries.add(prompt_tokens)
        self.prefix_hits.add(hit_tokens)

    # --- output -----------------------------------------------------------------------------------
    def prometheus_text(self) -> bytes:
        """Every instrument in the Prometheus text exposition format (version 0.0.4)."""
        from prometheus_client import generate_latest

        return generate_latest(self.registry)

    def force_flush(self, timeout_ms: int = 10_000) -> bool:
        """Export what the OTLP reader holds now (True without an OTLP reader)."""
        return self.provider.force_flush(timeout_ms)

    def shutdown(self) -> None:
        self.provider.shutdown()
