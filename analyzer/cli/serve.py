"""``tokentrace serve``: the traced OpenAI-compatible gateway around HF generate."""

from __future__ import annotations

import click

from analyzer.cli._group import cli
from analyzer.cli._model_loading import quiet_model_loading
from analyzer.errors import UserError

__all__ = ["serve_command"]


def _bind_error(host: str, port: int) -> str | None:
    """Why ``host:port`` cannot be bound now (one line naming the port), or None. Checked before
    the model loads, so a busy port is one Error line at once, not uvicorn's log after it."""
    import errno
    import socket

    if port == 0:
        return None
    try:
        family, kind, proto, _name, address = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)[0]
    except socket.gaierror as exc:
        return f"--host {host}: cannot be resolved ({exc.strerror})"
    with socket.socket(family, kind, proto) as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as uvicorn: TIME_WAIT is no conflict
        try:
            sock.bind(address)
        except OSError as exc:
            if exc.errno == errno.EADDRINUSE:
                return (f"--port {port}: {host}:{port} is already in use (another process listens there); "
                        "stop it or give another --port (0 = any free port)")
            if exc.errno == errno.EACCES:
                return f"--port {port}: permission denied binding {host}:{port} (ports below 1024 need privileges)"
            return f"--host {host} --port {port}: cannot bind ({exc.strerror})"
    return None


@cli.command("serve")
@click.option("--model", "model_spec", required=True, metavar="PATH|smollm2|tiny",
              help="A local HuggingFace model folder, smollm2 (SmolLM2-135M-Instruct) or tiny (random, for tests).")
@click.option("--host", default="127.0.0.1", show_default=True, help="Address to bind.")
@click.option("--port", type=click.IntRange(min=0, max=65535), default=8000, show_default=True,
              help="Port (0 = any free port).")
@click.option("--api-key", "api_keys", multiple=True, envvar="TOKENTRACE_API_KEYS",
              help="Accepted Bearer key (repeatable; $TOKENTRACE_API_KEYS, space-separated). Required off loopback.")
@click.option("--max-body-bytes", type=click.IntRange(min=1), default=1_048_576, show_default=True,
              help="Largest request body in bytes (413 above).")
@click.option("--max-tokens-limit", type=click.IntRange(min=1), default=1024, show_default=True,
              help="Largest max_tokens a request may ask for (400 above).")
@click.option("--rate-limit-rps", type=click.FloatRange(min=0, min_open=True), default=None,
              help="Requests per second per API key (429 + Retry-After above); default unlimited.")
@click.option("--rate-limit-burst", type=click.IntRange(min=1), default=None, help="Burst size of the rate limit.")
@click.option("--max-queued-requests", type=click.IntRange(min=1), default=64, show_default=True,
              help="Admission queue bound: requests waiting or running (429 + Retry-After above).")
@click.option("--max-queued-tokens", type=click.IntRange(min=1), default=None,
              help="Token budget: sum of input + max_tokens over requests in flight (429 above).")
@click.option("--kv-budget-bytes", type=click.IntRange(min=1), default=None,
              help="KV budget, bytes. continuous: the paged cache's size (default: min(512 MiB, 32768 tokens)); "
                   "blocks are allocated as sequences grow, a request that does not fit waits in the queue, "
                   "running ones are preempted (recomputed) when the cache runs out, and only a request whose "
                   "input + max_tokens exceeds the whole cache gets 400; sequential: worst-case logical KV bytes "
                   "(kv_bytes_per_token x (input + max_tokens)) in flight, 429 above (default: none).")
@click.option("--engine", "engine_name", type=click.Choice(["continuous", "sequential"]), default="continuous",
              show_default=True,
              help="continuous: transformers' continuous batching (paged KV cache, batched steps); "
                   "sequential: one request at a time through generate.")
@click.option("--kv-block-tokens", type=click.IntRange(min=1), default=16, show_default=True,
              help="continuous: tokens per paged KV block.")
@click.option("--max-batch-tokens", type=click.IntRange(min=1), default=512, show_default=True,
              help="continuous: tokens one engine step may compute (longer prompts are prefilled in chunks).")
@click.option("--max-batch-size", type=click.IntRange(min=1), default=64, show_default=True,
              help="continuous: sequences one engine step may hold.")
@click.option("--prefix-caching/--no-prefix-caching", default=True, show_default=True,
              help="continuous: share the KV blocks of identical prompt prefixes (a hit skips their prefill; "
                   "usage.prompt_tokens_details.cached_tokens says how many tokens).")
@click.option("--max-queue-wait-s", type=click.FloatRange(min=0, min_open=True), default=None,
              help="continuous: a request not scheduled within this many seconds gets 503 + Retry-After "
                   "(a streamed one's status line waits for its scheduling); default: wait up to the "
                   "request timeout.")
@click.option("--shutdown-grace-s", type=click.FloatRange(min=0), default=5.0, show_default=True,
              help="On SIGTERM/SIGINT: seconds in-flight requests may take to finish before they are cancelled.")
@click.option("--decode-spans", default="all", show_default=True, metavar="all|every:N|none",
              help="Which decode steps get a span (chunk events are always kept).")
@click.option("--span-export", type=click.Choice(["inline", "process"]), default=None,
              help="process (default with --engine continuous): the engine packs one compact record per "
                   "step and the gateway forwards its own finished spans to a span exporter process, which "
                   "builds and exports every span (nothing is encoded or exported in the serving process); "
                   "inline (default, and the only choice, with --engine sequential): every span is built "
                   "and exported in the serving process. Same spans either way (docs/gateway.md, "
                   "\"Step records and the span exporter process\").")
@click.option("--keep-ttft-ms", type=click.FloatRange(min=0), default=None, metavar="MS",
              help="Keep policy (env TOKENTRACE_KEEP_TTFT_MS): a request whose TTFT is over MS keeps its whole "
                   "per-token detail; every other request outside the random sample leaves only its gateway span "
                   "with its figures (docs/gateway.md, \"Keeping the slow requests\").")
@click.option("--keep-gap-ms", type=click.FloatRange(min=0), default=None, metavar="MS",
              help="Keep policy (TOKENTRACE_KEEP_GAP_MS): largest inter-token gap on the engine side over MS.")
@click.option("--keep-tpot-ms", type=click.FloatRange(min=0), default=None, metavar="MS",
              help="Keep policy (TOKENTRACE_KEEP_TPOT_MS): TPOT over MS.")
@click.option("--keep-e2e-ms", type=click.FloatRange(min=0), default=None, metavar="MS",
              help="Keep policy (TOKENTRACE_KEEP_E2E_MS): E2E over MS.")
@click.option("--keep-slowest", type=click.FloatRange(min=0, max=1, min_open=True), default=None, metavar="F",
              help="Keep policy (TOKENTRACE_KEEP_SLOWEST): TTFT or largest gap above the (1 - F) quantile of the "
                   "last 10 minutes' requests (from 100 requests on; up to 2F kept). With any keep rule, errors, "
                   "aborts and preempted requests are kept too.")
@click.option("--otlp-json", "otlp_json", default=None, metavar="PATH",
              help="Append the server's spans to this OTLP-JSON lines file.")
@click.option("--service-name", default="tokentrace-gateway", show_default=True, help="service.name of the spans.")
def serve_command(model_spec, host, port, api_keys, max_body_bytes, max_tokens_limit, rate_limit_rps,
                  rate_limit_burst, max_queued_requests, max_queued_tokens, kv_budget_bytes, engine_name,
                  kv_block_tokens, max_batch_tokens, max_batch_size, prefix_caching, max_queue_wait_s,
                  shutdown_grace_s, decode_spans, span_export, keep_ttft_ms, keep_gap_ms, keep_tpot_ms,
                  keep_e2e_ms, keep_slowest, otlp_json, service_name) -> None:
    """Serve /v1/chat/completions and /v1/completions (streaming or not), /v1/models and /health,
    with a traced `gateway` SERVER span per request.

    Spans go to --otlp-json and, when OTEL_EXPORTER_OTLP_ENDPOINT is set, over OTLP; with
    neither, one line at start says they go nowhere. One JSON
    log line per request on stderr (id, tokens, queue wait, status). GET /metrics serves
    Prometheus text (GenAI semconv TTFT / TPOT / duration histograms, queue, KV, prefix
    cache, preemptions); OTEL_METRICS_EXPORTER=otlp (or OTEL_EXPORTER_OTLP_ENDPOINT) also
    sends them over OTLP. Errors: 400 with the bad field, 401, 413, 429 with Retry-After
    (rate limit or the admission queue full), 503 with Retry-After (--max-queue-wait-s). SIGTERM and
    SIGINT stop it gracefully: no new requests, in-flight ones finish within
    --shutdown-grace-s (then are cancelled), spans are flushed and their counts printed.

    \b
    Example:
      tokentrace serve --model smollm2 --otlp-json server-spans.jsonl
      tokentrace serve --model smollm2 --kv-budget-bytes 35389440 \\
          --max-queue-wait-s 30
      tokentrace serve --model tiny --engine sequential --port 0
      tokentrace serve --model smollm2 --span-export inline \\
          --otlp-json spans.jsonl
      tokentrace serve --model ./my-model --host 0.0.0.0 --api-key "$KEY" \\
          --kv-budget-bytes 2000000000
      OTEL_TRACES_SAMPLER=parentbased_traceidratio \\
      OTEL_TRACES_SAMPLER_ARG=0.01 \\
          tokentrace serve --model smollm2 --keep-gap-ms 200 \\
          --keep-slowest 0.01
    """
    from instrument.gateway.admission import AdmissionBudgets

    span_export = _check_engine_flags(engine_name, max_queue_wait_s, prefix_caching, span_export)
    keys = _accepted_keys(api_keys, host)
    problem = _bind_error(host, port)
    if problem is not None:
        raise UserError(problem)
    keep, keep_env = _keep_policy(span_export, {"ttft": keep_ttft_ms, "gap": keep_gap_ms, "tpot": keep_tpot_ms,
                                                "e2e": keep_e2e_ms, "slowest": keep_slowest})
    provider = _tracer_provider(decode_spans, service_name, otlp_json, span_export, keep is not None)
    provider.exporter_env.update(keep_env)  # the span exporter process reads the policy there
    handle = _load_model(model_spec)
    from instrument.gateway.app import GatewaySettings

    engine_options = ({"kv_block_tokens": kv_block_tokens, "max_batch_tokens": max_batch_tokens,
                       "max_batch_size": max_batch_size, "prefix_caching": prefix_caching,
                       "max_queue_wait_s": max_queue_wait_s}
                      if engine_name == "continuous" else {})
    settings = GatewaySettings(
        api_keys=keys, max_body_bytes=max_body_bytes, max_tokens_limit=max_tokens_limit,
        rate_limit_rps=rate_limit_rps, rate_limit_burst=rate_limit_burst, decode_spans=decode_spans,
        budgets=AdmissionBudgets(max_queued_requests, max_queued_tokens, kv_budget_bytes),
        gc_freeze=True, engine=engine_name, engine_options=engine_options, shutdown_grace_s=shutdown_grace_s,
    )
    _log_requests_on_stderr()
    app = _create_app(handle, provider, settings)
    listening = _listening_line(handle, app.state.gateway.engine, engine_name, keys,
                                span_export + (f"; keep {keep.describe()}" if keep is not None else ""))
    _serve_until_stopped(app, provider, host, port, shutdown_grace_s, listening)


def _check_engine_flags(engine_name: str, max_queue_wait_s: float | None, prefix_caching: bool,
                        span_export: str | None) -> str:
    """Refuse the flags that apply to --engine continuous only when another engine is asked
    for; the span-export mode (decided by ``instrument.engines.span_export_for``: it travels
    on the tracer provider from here on)."""
    from instrument.engines import span_export_for

    if engine_name != "continuous" and (max_queue_wait_s is not None or not prefix_caching):
        flag = "--max-queue-wait-s" if max_queue_wait_s is not None else "--no-prefix-caching"
        raise UserError(f"{flag} applies to --engine continuous only "
                        "(the sequential engine has one job queue and no prefix cache)")
    try:
        return span_export_for(engine_name, span_export)
    except ValueError as exc:
        raise UserError(str(exc)) from None


def _accepted_keys(api_keys: tuple[str, ...], host: str) -> frozenset[str]:
    """The accepted Bearer keys (each --api-key split on spaces); none is refused off loopback."""
    from instrument.gateway.server import is_loopback

    keys = frozenset(k for raw in api_keys for k in raw.split() if k)
    if not keys and not is_loopback(host):
        raise UserError(f"--host {host} is not a loopback address: give --api-key (or $TOKENTRACE_API_KEYS)")
    return keys


def _keep_policy(span_export: str, flags: dict[str, float | None]):
    """The keep policy of the --keep-* flags over the TOKENTRACE_KEEP_* environment (a flag wins),
    or None, and the variables that carry its checked values to the span exporter process
    (a malformed one is said here, once, and left out). This process's environment is not
    changed."""
    import os

    from instrument.records.keep import ENV, KeepPolicy

    merged = {var: os.environ.get(var, "") for var in ENV.values()}
    merged.update({ENV[name]: repr(value) for name, value in flags.items() if value is not None})
    policy = KeepPolicy.from_env(merged, warn=lambda line: click.echo(line, err=True))
    if policy is None:
        return None, {}
    if span_export != "process":
        raise UserError("a keep policy (--keep-* or TOKENTRACE_KEEP_*) is decided in the span exporter process: "
                        "it needs --engine continuous with --span-export process")
    values = {**policy.thresholds_ms, "slowest": policy.slowest}
    return policy, {var: repr(values[name]) if values[name] is not None else "" for name, var in ENV.items()}


def _tracer_provider(decode_spans: str, service_name: str, otlp_json: str | None, span_export: str,
                     keep: bool = False):
    """The server's tracer provider, --decode-spans checked first. With --span-export process
    the exporters are only named here: the span exporter process makes them. With a keep
    policy every request is recorded, its root span saying whether the standard sampler took
    it (instrument/records/keep.py ``HeadMarkingSampler``)."""
    from instrument.client import local_tracer_provider
    from instrument.hf.generate_spans import DecodeSpanPolicy

    sampler = None
    if keep:
        from opentelemetry.sdk.trace import TracerProvider

        from instrument.records.keep import HeadMarkingSampler

        sampler = HeadMarkingSampler(TracerProvider().sampler)  # the sampler OTEL_TRACES_SAMPLER names
    try:
        DecodeSpanPolicy.parse(decode_spans)
        return local_tracer_provider(service_name, json_path=otlp_json, make_exporters=span_export == "inline",
                                     sampler=sampler)
    except ValueError as exc:
        raise UserError(str(exc)) from None


def _load_model(model_spec: str):
    """The model handle of --model, once the server extras are known to be installed."""
    try:  # the server extras, imported here to check they are installed
        import uvicorn  # noqa: F401 - imported to check the server extra is installed

        from instrument.gateway.app import GatewaySettings, create_app  # noqa: F401 - the server extra, checked with uvicorn
        from instrument.hf.model_handle import load_model_handle
    except ImportError as exc:
        raise UserError(f"serve needs the server extras: pip install 'tokentrace[hf,server]' ({exc})") from None
    try:
        quiet_model_loading()  # transformers' "Loading weights" bar: noise in a server's log
        return load_model_handle(model_spec)
    except ValueError as exc:
        raise UserError(str(exc)) from None


def _log_requests_on_stderr() -> None:
    """The gateway's one JSON line per request goes to stderr, unless a handler is set already."""
    import logging

    log = logging.getLogger("tokentrace.gateway")
    if not log.handlers:
        handler = logging.StreamHandler()
        handler.setFormatter(logging.Formatter("%(message)s"))
        log.addHandler(handler)
        log.setLevel(logging.INFO)


def _create_app(handle, provider, settings):
    """The gateway app; with --span-export process (the provider's mode), its spans forwarded
    to the span exporter process, which the engine's step records share."""
    from instrument.gateway.app import create_app
    from instrument.otel.tracing import span_export_of

    try:
        if span_export_of(provider) == "process":
            from instrument.records.span_forward import forward_spans

            forward_spans(provider)  # one span exporter process: the gateway's spans and the engine's records
        return create_app(handle, provider, settings)
    except ValueError as exc:
        provider.shutdown()
        raise UserError(str(exc)) from None


def _listening_line(handle, engine, engine_name: str, keys: frozenset[str], span_export: str):
    """The line said on stderr once the server listens (a function of its URL): model, engine
    (KV blocks and seconds to ready, continuous), auth, KV bytes/token and span export."""
    health = engine.health()
    detail = (f"{health['kv_blocks_total']} KV blocks of {health['kv_block_tokens']} tokens, "
              f"ready in {health['build_s'] + health['warmup_s']:.1f} s" if engine_name == "continuous" else "")
    return lambda url: (
        f"tokentrace serve: {handle.model_id} on {url} (engine {engine_name}{': ' + detail if detail else ''}; "
        f"auth {'on' if keys else 'off'}; KV {handle.kv_bytes_per_token} bytes/token; span export {span_export})")


def _serve_until_stopped(app, provider, host: str, port: int, shutdown_grace_s: float, listening) -> None:
    """Run uvicorn until SIGTERM/SIGINT (or it exits), then flush the spans and say their counts."""
    import uvicorn

    from instrument.gateway.server import GracefulServer
    from instrument.otel.shutdown import export_summary, shutdown_tracing

    server = GracefulServer(uvicorn.Config(app, host=host, port=port, log_level="warning",
                                           timeout_graceful_shutdown=max(1, round(shutdown_grace_s))))
    server.on_listening = lambda url: click.echo(listening(url), err=True)
    try:
        server.run()
    finally:
        counts = shutdown_tracing(provider, timeout_s=10.0)
        why = f"on {server.stop_signal}" if server.stop_signal else "server exited"
        click.echo(f"tokentrace serve: stopped {why}; {export_summary(counts)}", err=True)
