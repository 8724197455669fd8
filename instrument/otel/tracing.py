"""``setup_tracing``: a TracerProvider configured from OTEL_* variables, arguments first.

Precedence for every setting: explicit argument, then environment variable, then default.
The provider is *returned*, never installed globally: the caller (or the CLI) may call
``opentelemetry.trace.set_tracer_provider`` itself.

Environment variables read (each with its default):

=========================================  =========================================
``OTEL_SERVICE_NAME``                      ``tokentrace`` (also via OTEL_RESOURCE_ATTRIBUTES)
``OTEL_RESOURCE_ATTRIBUTES``               none; may carry service.instance.id, host.name
``OTEL_TRACES_EXPORTER``                   ``otlp``; comma-separated list of
                                           ``otlp``, ``console``, ``otlp_json``, ``none``
``OTEL_EXPORTER_OTLP_TRACES_PROTOCOL``     then ``OTEL_EXPORTER_OTLP_PROTOCOL``, then
                                           ``http/protobuf`` (the spec default); or ``grpc``
``OTEL_EXPORTER_OTLP_TRACES_ENDPOINT``     used as is
``OTEL_EXPORTER_OTLP_ENDPOINT``            base URL; ``/v1/traces`` appended for HTTP
                                           (default: the exporters' own, localhost:4317/4318)
``TOKENTRACE_OTLP_JSON_PATH``              file for ``otlp_json`` (OTLP/JSON lines)
``OTEL_SPAN_EVENT_COUNT_LIMIT``            ``65536`` here (the SDK's 128 would drop the chunk
                                           events of any request longer than 128 tokens)
``OTEL_BSP_MAX_QUEUE_SIZE``                ``65536`` here (the SDK's 2048 drops the decode
                                           spans of any request longer than ~2,000 tokens)
``OTEL_ATTRIBUTE_VALUE_LENGTH_LIMIT``      ``8192`` characters here (the SDK's default is
                                           unlimited); also ``OTEL_SPAN_ATTRIBUTE_VALUE_LENGTH_LIMIT``
=========================================  =========================================
"""

from __future__ import annotations

import logging
import os
import socket
import sys
import uuid
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import SpanLimits, SpanProcessor, TracerProvider
from opentelemetry.sdk.trace.export import (
    BatchSpanProcessor,
    ConsoleSpanExporter,
    SimpleSpanProcessor,
    SpanExporter,
)
from opentelemetry.sdk.trace.sampling import Sampler
from opentelemetry.trace import Tracer

__all__ = [
    "HashOnceResource",
    "SPAN_EXPORT_CHOICES",
    "default_resource",
    "span_export_of",
    "SCOPE_NAME",
    "CONTRACT_VERSION",
    "DEFAULT_SERVICE_NAME",
    "DEFAULT_SPAN_EVENT_LIMIT",
    "EXPORTER_NAMES",
    "PROTOCOLS",
    "NO_DESTINATION",
    "setup_tracing",
    "TracingSetup",
    "get_tracer",
    "span_event_limit_of",
]

SCOPE_NAME = "tokentrace"
CONTRACT_VERSION = "3"
DEFAULT_SERVICE_NAME = "tokentrace"
DEFAULT_SPAN_EVENT_LIMIT = 65536
DEFAULT_BATCH_QUEUE_SIZE = 65536
EXPORTER_NAMES = ("otlp", "console", "otlp_json", "none")
PROTOCOLS = ("grpc", "http/protobuf")

ENV_SERVICE_NAME = "OTEL_SERVICE_NAME"
ENV_TRACES_EXPORTER = "OTEL_TRACES_EXPORTER"
ENV_TRACES_PROTOCOL = "OTEL_EXPORTER_OTLP_TRACES_PROTOCOL"
ENV_PROTOCOL = "OTEL_EXPORTER_OTLP_PROTOCOL"
ENV_TRACES_ENDPOINT = "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT"
ENV_ENDPOINT = "OTEL_EXPORTER_OTLP_ENDPOINT"
ENV_TRACES_INSECURE = "OTEL_EXPORTER_OTLP_TRACES_INSECURE"
ENV_INSECURE = "OTEL_EXPORTER_OTLP_INSECURE"
ENV_JSON_PATH = "TOKENTRACE_OTLP_JSON_PATH"
ENV_EVENT_LIMIT = "OTEL_SPAN_EVENT_COUNT_LIMIT"
ENV_BSP_QUEUE_SIZE = "OTEL_BSP_MAX_QUEUE_SIZE"


def _env(name: str) -> str | None:
    value = os.environ.get(name)
    return value.strip() if value and value.strip() else None


def _exporter_names(exporter: str | Sequence[str] | None) -> list[str]:
    source = "exporter argument"
    if exporter is None:
        exporter, source = _env(ENV_TRACES_EXPORTER) or "otlp", ENV_TRACES_EXPORTER
    names = [n.strip().lower() for n in (exporter.split(",") if isinstance(exporter, str) else exporter)]
    names = [n for n in names if n]
    for name in names:
        if name not in EXPORTER_NAMES:
            raise ValueError(f"{source}: unknown trace exporter {name!r} (expected one of {', '.join(EXPORTER_NAMES)})")
    return names


def _protocol(protocol: str | None) -> str:
    source = "protocol argument"
    if protocol is None:
        for name in (ENV_TRACES_PROTOCOL, ENV_PROTOCOL):
            if _env(name):
                protocol, source = _env(name), name
                break
    protocol = (protocol or "http/protobuf").lower()
    if protocol not in PROTOCOLS:
        raise ValueError(
            f"{source}: unsupported OTLP protocol {protocol!r} (expected grpc or http/protobuf; "
            "for OTLP/JSON to a file use the otlp_json exporter)"
        )
    return protocol


def otlp_target(protocol: str, endpoint: str | None) -> tuple[str, str | None, bool | None]:
    """(protocol, endpoint, insecure) the OTLP span exporter is made with: ``endpoint`` given,
    else ``OTEL_EXPORTER_OTLP_TRACES_ENDPOINT`` as it is, else ``OTEL_EXPORTER_OTLP_ENDPOINT``
    (``/v1/traces`` appended for HTTP), else the exporter's default (None). A ``grpc://`` URL
    (vLLM's ``--otlp-traces-endpoint`` form) means gRPC whatever the protocol; gRPC is
    plaintext (``insecure``) unless the URL is ``https://`` or an ``*_INSECURE`` variable is
    set (then the SDK decides: None), as vLLM's own exporter does for the same endpoint."""
    given = endpoint if endpoint is not None else _env(ENV_TRACES_ENDPOINT) or _env(ENV_ENDPOINT)
    scheme = given.split("://", 1)[0].lower() if given and "://" in given else ""
    if scheme == "grpc":
        protocol = "grpc"
    if endpoint is None and _env(ENV_TRACES_ENDPOINT):
        endpoint = _env(ENV_TRACES_ENDPOINT)
    elif endpoint is None and _env(ENV_ENDPOINT) and protocol == "http/protobuf":
        endpoint = _env(ENV_ENDPOINT).rstrip("/") + "/v1/traces"  # type: ignore[union-attr]  # _env(ENV_ENDPOINT) is set: tested above
    elif endpoint is None and _env(ENV_ENDPOINT):
        endpoint = _env(ENV_ENDPOINT)
    elif endpoint is not None and protocol == "http/protobuf" and not endpoint.rstrip("/").endswith("/v1/traces"):
        endpoint = endpoint.rstrip("/") + "/v1/traces"
    insecure = None
    if protocol == "grpc" and not (scheme == "https" or _env(ENV_TRACES_INSECURE) or _env(ENV_INSECURE)):
        insecure = True
    return protocol, endpoint, insecure


def otlp_destination(protocol: str | None, endpoint: str | None) -> str:
    """Where the OTLP exporter made from these settings sends, for a log line (e.g. ``grpc
    127.0.0.1:4317 (plaintext)``, ``http/protobuf http://collector:4318/v1/traces``)."""
    protocol, endpoint, insecure = otlp_target(_protocol(protocol), endpoint)
    default = "localhost:4317" if protocol == "grpc" else "http://localhost:4318/v1/traces"
    return f"{protocol} {endpoint or default + ' (default)'}" + (" (plaintext)" if insecure else "")


def _otlp_exporter(protocol: str, endpoint: str | None) -> SpanExporter:
    protocol, endpoint, insecure = otlp_target(protocol, endpoint)
    if protocol == "grpc":
        from opentelemetry.exporter.otlp.proto.grpc.trace_exporter import OTLPSpanExporter as GrpcExporter

        return GrpcExporter(endpoint=endpoint, insecure=insecure)
    from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter as HttpExporter

    return HttpExporter(endpoint=endpoint)


class HashOnceResource(Resource):
    """A ``Resource`` that computes its hash once. The SDK's ``Resource.__hash__`` JSON-dumps
    the attributes on every call (~3 µs), and the SDK's OTLP encoder groups every exported span
    by its resource, hashing it once per span; a resource is immutable (its attributes are
    an immutable ``BoundedAttributes``), so one hash serves its life. Equality, ``merge`` and
    everything else are the SDK's (public API only: no SDK internals read)."""

    def __init__(self, attributes: Mapping[str, object], schema_url: str | None = None) -> None:
        super().__init__(attributes, schema_url)  # type: ignore[arg-type]  # the SDK's attribute types, narrower than object
        self._hash_once = Resource.__hash__(self)

    def __hash__(self) -> int:
        return self._hash_once

    def __eq__(self, other: object) -> bool:
        return Resource.__eq__(self, other)


def _resource(
    service_name: str | None, instance_id: str | None, extra: Mapping[str, object] | None
) -> Resource:
    attributes: dict[str, Any] = dict(extra or {})
    if service_name is not None:
        attributes["service.name"] = service_name
    resource = Resource.create(attributes)  # merges OTEL_RESOURCE_ATTRIBUTES / OTEL_SERVICE_NAME
    found = resource.attributes
    defaults: dict[str, Any] = {}
    if str(found.get("service.name", "")).startswith("unknown_service"):
        defaults["service.name"] = DEFAULT_SERVICE_NAME
    if instance_id is not None:
        defaults["service.instance.id"] = instance_id
    elif "service.instance.id" not in found:
        defaults["service.instance.id"] = str(uuid.uuid4())
    if "host.name" not in found:
        defaults["host.name"] = socket.gethostname()
    merged = resource.merge(Resource(defaults)) if defaults else resource
    return HashOnceResource(merged.attributes, merged.schema_url)


def _event_limit(span_event_limit: int | None) -> int:
    source = "span_event_limit argument"
    if span_event_limit is None and _env(ENV_EVENT_LIMIT):
        raw = _env(ENV_EVENT_LIMIT)
        try:
            span_event_limit, source = int(raw), ENV_EVENT_LIMIT  # type: ignore[arg-type]  # _env(ENV_EVENT_LIMIT) is set: tested above
        except ValueError:
            raise ValueError(f"{ENV_EVENT_LIMIT}: expected an integer, got {raw!r}") from None
    if span_event_limit is None:
        return DEFAULT_SPAN_EVENT_LIMIT
    if span_event_limit < 1:
        raise ValueError(f"{source}: the span event limit must be >= 1, got {span_event_limit}")
    return span_event_limit


# Longest attribute value a span keeps (characters) unless OTEL_ATTRIBUTE_VALUE_LENGTH_LIMIT /
# OTEL_SPAN_ATTRIBUTE_VALUE_LENGTH_LIMIT say otherwise: one opted-in prompt or an error text
# of any size must not bloat a span. Longer strings are truncated by the SDK.
DEFAULT_ATTRIBUTE_VALUE_LENGTH_LIMIT = 8192
ENV_ATTRIBUTE_LENGTH = ("OTEL_ATTRIBUTE_VALUE_LENGTH_LIMIT", "OTEL_SPAN_ATTRIBUTE_VALUE_LENGTH_LIMIT")


def _attribute_length_limits() -> dict[str, int]:
    """Explicit attribute value length limits, unless the standard variables set them (the SDK
    reads those itself when the arguments are absent)."""
    if any(_env(name) for name in ENV_ATTRIBUTE_LENGTH):
        return {}
    return {
        "max_attribute_length": DEFAULT_ATTRIBUTE_VALUE_LENGTH_LIMIT,
        "max_span_attribute_length": DEFAULT_ATTRIBUTE_VALUE_LENGTH_LIMIT,
    }


SPAN_EXPORT_CHOICES = ("inline", "process")


def span_export_of(tracer_provider: object) -> str:
    """Where ``tracer_provider``'s spans are exported: ``process`` (its exporters are made by a
    span exporter process: ``setup_tracing(make_exporters=False)``, or :func:`forward_spans
    <instrument.records.span_forward.forward_spans>` wired it) or ``inline`` (made here; any
    provider not made by :func:`setup_tracing`). The one value engines and the gateway read."""
    mode = getattr(tracer_provider, "span_export", "inline") if isinstance(tracer_provider, TracingSetup) else "inline"
    return str(mode)


def default_resource(service_name: str | None = None) -> Resource:
    """The resource :func:`setup_tracing` gives a provider (``OTEL_RESOURCE_ATTRIBUTES`` /
    ``OTEL_SERVICE_NAME`` merged, a fresh ``service.instance.id``, ``host.name``), without one."""
    return _resource(service_name, None, None)


class TracingSetup(TracerProvider):
    """The TracerProvider :func:`setup_tracing` returns, with what tokentrace needs of it kept
    on it (it *is* the provider: use it wherever a ``TracerProvider`` goes).

    - ``exporter_settings``: how its exporters were asked for (see :func:`exporter_settings`).
    - ``exporters``: the exporters its processors feed (each in a ``CountingSpanExporter``
      when ``count_exports``), in order.
    - ``span_export``: where its spans are exported: ``inline`` (by exporters made in this
      process) or ``process`` (``make_exporters=False``, or :func:`forward_spans
      <instrument.records.span_forward.forward_spans>` wired it: the span exporter process).
    - ``tokentrace_tracer``: its ``tokentrace`` tracer, made by the first :func:`get_tracer`.
    - ``count_sources``: more export counts for ``export_health`` (another process's
      exporters, ``export_health.add_counts_source``).
    - ``exporter_process`` / ``span_forwarder``: the span exporter process and the span
      processor forwarding to it, once ``forward_spans`` started them (else None).
    - ``exporter_env``: variables that span exporter process gets besides this process's
      environment (``serve``'s keep policy: its ``TOKENTRACE_KEEP_*`` values).

    Providers made otherwise keep working everywhere: the functions reading these fall back
    (no settings, no forwarder; the tracer and the count sources kept on the provider object).
    """

    def __init__(self, *, exporter_settings: dict[str, Any], span_export: str, **kwargs: object) -> None:
        super().__init__(**kwargs)  # type: ignore[arg-type]  # the SDK's keyword types, passed through
        self.exporter_settings = exporter_settings
        self.span_export = span_export
        self.exporters: tuple[SpanExporter, ...] = ()
        self.tokentrace_tracer: Tracer | None = None
        self.count_sources: list[Callable[[], list]] = []
        self.exporter_process: Any = None  # instrument.records.exporter_process.ExporterProcess
        self.span_forwarder: Any = None  # instrument.records.span_forward.SpanForwarder
        self.exporter_env: dict[str, str] = {}


NO_DESTINATION = (f"tokentrace: no span destination: spans are made but exported nowhere (give --otlp-json FILE, "
                  f"or set {ENV_ENDPOINT}; from Python: exporter='otlp_json' with json_path=)")


def setup_tracing(
    service_name: str | None = None,
    *,
    exporter: str | Sequence[str] | None = None,
    endpoint: str | None = None,
    protocol: str | None = None,
    json_path: str | Path | None = None,
    instance_id: str | None = None,
    resource_attributes: Mapping[str, object] | None = None,
    span_event_limit: int | None = None,
    span_exporters: Sequence[SpanExporter] = (),
    batch: bool = True,
    count_exports: bool = True,
    make_exporters: bool = True,
    sampler: Sampler | None = None,
    say_no_destination: bool = True,
) -> TracingSetup:
    """A TracerProvider (a :class:`TracingSetup`) with tokentrace's resource, span limits and
    exporters (not installed globally).

    - ``exporter``: ``otlp`` | ``console`` | ``otlp_json`` | ``none`` or a list of them.
    - ``protocol`` (for ``otlp``): ``grpc`` or ``http/protobuf``; ``endpoint`` e.g.
      ``http://127.0.0.1:4317`` (gRPC) or ``http://127.0.0.1:4318`` (HTTP; ``/v1/traces`` is
      appended unless present).
    - ``json_path``: the OTLP/JSON lines file for ``otlp_json``.
    - ``span_event_limit``: max events per span (default 65536; must exceed the largest
      max_new_tokens served, since the ``generate`` span carries one event per chunk).
    - ``span_exporters``: extra exporters added as given (e.g. an InMemorySpanExporter).
    - ``batch``: BatchSpanProcessor (default, exports off the request path) or
      SimpleSpanProcessor (synchronous; for scripts and tests).
    - ``count_exports``: wrap each exporter and its processor to count spans exported, failed
      and dropped (``instrument.otel.export_health``; one log line per exporter at shutdown).
    - ``make_exporters``: False checks and records the exporter settings (``exporter_settings``)
      but builds no exporter in this process: the span exporter process makes them
      (``--span-export process``, instrument/records/span_forward.py ``forward_spans``).
    - ``sampler``: the provider's sampler; None: the SDK's, from ``OTEL_TRACES_SAMPLER`` /
      ``OTEL_TRACES_SAMPLER_ARG`` (the vLLM plugin's exporter process passes ALWAYS_ON: its
      requests were decided at arrival, instrument/vllm/sampling.py).
    - ``say_no_destination``: with no exporter but ``none`` and no ``span_exporters`` (the
      spans go nowhere), one warning line on the ``tokentrace.export`` logger
      (:data:`NO_DESTINATION`); False for a caller whose parent said it already.
    """
    names = _exporter_names(exporter)
    if say_no_destination and not span_exporters and all(n == "none" for n in names):
        logging.getLogger("tokentrace.export").warning(NO_DESTINATION)
    if make_exporters:
        exporters, destinations = _named_exporters(names, protocol, endpoint, json_path)
    else:
        _check_named_exporters(names, protocol, json_path)
        exporters, destinations = [], {}
    exporters.extend(span_exporters)
    settings: dict[str, object] = {
        "exporters": [n for n in names if n != "none"],
        "json_path": str(json_path if json_path is not None else _env(ENV_JSON_PATH) or "") or None,
        "extra_exporters": len(span_exporters), "endpoint": endpoint, "protocol": protocol, "built": bool(exporters),
    }
    provider = TracingSetup(
        exporter_settings=settings,
        span_export="inline" if make_exporters else "process",
        sampler=sampler,
        resource=_resource(service_name, instance_id, resource_attributes),
        span_limits=SpanLimits(max_events=_event_limit(span_event_limit), **_attribute_length_limits()),
    )
    provider.exporters = _add_processors(provider, exporters, destinations, batch=batch, count_exports=count_exports)
    return provider


def _check_named_exporters(names: list[str], protocol: str | None, json_path: str | Path | None) -> None:
    """The errors making the named exporters would raise, without making them
    (``make_exporters=False``: another process makes them)."""
    if "otlp" in names:
        _protocol(protocol)  # the same error here as when the exporter is made
    if "otlp_json" in names and json_path is None and _env(ENV_JSON_PATH) is None:
        raise ValueError(f"the otlp_json exporter needs json_path= or {ENV_JSON_PATH}")


def _named_exporters(names: list[str], protocol: str | None, endpoint: str | None,
                     json_path: str | Path | None) -> tuple[list[SpanExporter], dict[int, str]]:
    """The exporters named (``none`` makes none), and where each OTLP one sends by its index
    (named in the log line when one fails)."""
    exporters: list[SpanExporter] = []
    destinations: dict[int, str] = {}
    for name in names:
        if name == "otlp":
            exporters.append(_otlp_exporter(_protocol(protocol), endpoint))
            destinations[len(exporters) - 1] = otlp_destination(protocol, endpoint)
        elif name == "console":
            exporters.append(ConsoleSpanExporter(out=sys.stderr))
        elif name == "otlp_json":
            from instrument.otel.otlp_json import OTLPJsonLinesSpanExporter

            path = json_path if json_path is not None else _env(ENV_JSON_PATH)
            if path is None:
                raise ValueError(f"the otlp_json exporter needs json_path= or {ENV_JSON_PATH}")
            exporters.append(OTLPJsonLinesSpanExporter(path))
    return exporters, destinations


def _add_processors(provider: TracerProvider, exporters: list[SpanExporter], destinations: dict[int, str], *,
                    batch: bool, count_exports: bool) -> tuple[SpanExporter, ...]:
    """One span processor per exporter on ``provider`` (batch or simple; both wrapped to count
    when ``count_exports``); returns the exporters as the processors hold them."""
    queue_size = None if _env(ENV_BSP_QUEUE_SIZE) else DEFAULT_BATCH_QUEUE_SIZE
    fed: list[SpanExporter] = []
    for index, span_exporter in enumerate(exporters):
        counted = None
        if count_exports:
            from instrument.otel.export_health import CountingSpanExporter

            span_exporter = counted = CountingSpanExporter(span_exporter, where=destinations.get(index))
        processor: SpanProcessor = (
            BatchSpanProcessor(span_exporter, max_queue_size=queue_size) if batch else SimpleSpanProcessor(span_exporter)
        )
        if counted is not None:
            from instrument.otel.export_health import CountingSpanProcessor

            processor = CountingSpanProcessor(processor, counted)
        provider.add_span_processor(processor)
        fed.append(span_exporter)
    return tuple(fed)


def exporter_settings(provider: object) -> dict[str, Any] | None:
    """How ``setup_tracing`` made ``provider``'s exporters (names from ``EXPORTER_NAMES``, the
    OTLP-JSON path, how many extra exporter objects were given, the OTLP endpoint and protocol
    given, None: from the ``OTEL_*`` variables; ``built``: exporters were made in this
    process), so that another process
    can make the same ones (instrument/records/exporter_process.py); None for other providers."""
    return provider.exporter_settings if isinstance(provider, TracingSetup) else None


def get_tracer(provider: TracerProvider | None = None) -> Tracer:
    """The ``tokentrace`` tracer (scope version = contract version) of ``provider``.

    ``None`` means the global provider the application installed (never one installed here).
    """
    if provider is None:
        from opentelemetry import trace

        return trace.get_tracer(SCOPE_NAME, CONTRACT_VERSION)
    # The SDK builds a new Tracer per call (~20-70 µs); one per provider is enough, kept on it
    # (a TracingSetup's attribute; set on any other provider object that takes attributes).
    tracer = getattr(provider, "tokentrace_tracer", None)
    if tracer is None:
        tracer = provider.get_tracer(SCOPE_NAME, CONTRACT_VERSION)
        try:
            provider.tokentrace_tracer = tracer  # type: ignore[attr-defined]  # kept on the provider object, read back with getattr
        except (AttributeError, TypeError):  # a provider that takes no attribute: a tracer per call
            pass
    return tracer


def span_event_limit_of(tracer: object) -> int | None:
    """The max events per span an SDK tracer enforces (None when unknown, e.g. a no-op tracer)."""
    limits = getattr(tracer, "_span_limits", None)
    value = getattr(limits, "max_events", None)
    return value if isinstance(value, int) else None
