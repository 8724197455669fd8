"""``tokentrace demo``: serve a model through the traced gateway, send the seed's request and a
small concurrent load with the traced client, write every span (client and server) to
OTLP-JSON lines files, load them into DuckDB and answer with the metric queries.

Server and client run in one process: uvicorn in a thread on 127.0.0.1 (ephemeral port).
They get separate tracer providers with separate resources (``tokentrace-gateway`` and
``tokentrace-client``), i.e. two clock domains, so the skew check has a pair to judge.

Nothing is computed in Python: per-request metrics come from queries/requests.sql, the
window from queries/window.sql and the skew check from queries/skew_offsets.sql.
torch/FastAPI are imported inside :func:`run_demo` only.
"""

from __future__ import annotations

import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

__all__ = ["DEMO_PROMPTS", "DemoOptions", "DemoResult", "DemoStopped", "REQUEST_ID_CHARS", "StepLog", "model_step",
           "run_demo", "summary_queries", "with_short_request_id"]

DEMO_PROMPTS = (
    "Which Kyoto temples have step-free access?",
    "Suggest a two-day Kyoto itinerary for a wheelchair user.",
    "What is an onsen, and are private onsen baths common in ryokan?",
    "How do I get from Kansai airport to Kyoto station with luggage?",
    "List three accessible restaurants near Gion.",
    "Is the Arashiyama bamboo grove accessible by wheelchair?",
)

# `request` (bench's "Request ids" table) is a short request id: the last REQUEST_ID_CHARS hex
# digits of request_span_id (the end of an id is what differs when an id generator counts up);
# a request's client and server rows share it, so they pair up by eye.
REQUEST_ID_CHARS = 8


@dataclass
class DemoOptions:
    """What the demo runs. Times in ms, counts in requests/tokens."""

    out_dir: Path = Path("tokentrace-demo")
    model: str = "smollm2"  # "tiny", "smollm2" or a local model folder
    load_requests: int = 6
    concurrency: int = 3
    max_tokens: int = 48
    clock_offset_ms: float = 0.0
    seed: int = 0
    shutdown_grace_s: float = 5.0  # on SIGINT/SIGTERM: s the requests in flight get to finish
    say_steps: bool = True  # one line per step on stderr, with the time since the demo started
    width: int = 80  # columns the step lines fit (the CLI passes analyzer/cli/_human.terminal_width())


@dataclass
class DemoResult:
    """Where the demo wrote its files, what the client saw, and the query results."""

    server_spans_path: Path
    client_spans_path: Path
    db_path: Path
    url: str
    model_id: str
    client_results: list[Any] = field(default_factory=list)
    spans_loaded: int = 0
    report_path: Path | None = None
    queries: dict[str, Any] = field(default_factory=dict)  # name -> analyzer.query.runner.QueryResult


class DemoStopped(Exception):
    """SIGINT or SIGTERM stopped the demo before it loaded the spans. ``signal_name``:
    ``SIGINT`` | ``SIGTERM``; ``sent``/``total``: requests sent (including the seed) and planned;
    ``summary``: :func:`instrument.otel.shutdown.export_summary` of both span files' exporters."""

    def __init__(self, signal_name: str, sent: int, total: int, summary: str, paths: list[Path]) -> None:
        self.signal_name, self.sent, self.total, self.summary, self.paths = signal_name, sent, total, summary, paths
        super().__init__(f"stopped on {signal_name} after sending {sent} of {total} requests; {summary}")


class _StopBeforeSending(Exception):
    """Raised by the signal handler while the model loads (nothing is sent yet)."""


ProgressFn = Callable[[str, int, int], None]  # (stage description, done, total)


class StepLog:
    """``[demo m:ss] what is happening`` lines on stderr, timed from the demo's start, so a
    first run (minutes: imports, converting the model once) is never silent. A message wider
    than ``width`` columns goes on indented lines below (a path is never cut)."""

    def __init__(self, enabled: bool = True, width: int = 80) -> None:
        self.enabled = enabled
        self.width = width
        self.started = time.monotonic()

    def __call__(self, message: str) -> None:
        if not self.enabled:
            return
        import textwrap

        elapsed = int(time.monotonic() - self.started)
        prefix = f"[demo {elapsed // 60}:{elapsed % 60:02d}] "
        lines = textwrap.wrap(message, self.width - len(prefix), break_long_words=False, break_on_hyphens=False) or [""]
        sys.stderr.write(prefix + f"\n{' ' * len(prefix)}".join(lines) + "\n")
        sys.stderr.flush()


def model_step(spec: str) -> str:
    """What loading ``spec`` will do, in words: SmolLM2 is converted from its GGUF file the
    first time (minutes on 2 cores) and loaded from the converted copy afterwards."""
    if spec == "smollm2":
        from instrument.hf.smollm2 import smollm2_cache_dir

        directory = smollm2_cache_dir()
        if (directory / "config.json").is_file() and (directory / "tokenizer.json").is_file():
            return f"loading SmolLM2-135M-Instruct (converted copy in {directory})"
        return (f"converting SmolLM2-135M-Instruct from its GGUF file, once, into {directory} "
                "(about a minute on 2 cores; later runs load the copy in seconds)")
    if spec == "tiny":
        return "loading the tiny random model (built once into the cache)"
    return f"loading the model folder {spec}"


def with_short_request_id(result: Any) -> Any:
    """requests.sql's result with a first column ``request``: the last :data:`REQUEST_ID_CHARS`
    hex digits of request_span_id (the same for a request's client and server rows)."""
    from analyzer.query.runner import QueryResult

    at = result.columns.index("request_span_id")
    rows = [(None if r[at] is None else r[at][-REQUEST_ID_CHARS:], *r) for r in result.rows]
    return QueryResult(result.name, ["request", *result.columns], rows)


def summary_queries(con: Any, *, perspective: str | None = None, skew: bool = True) -> dict[str, Any]:
    """Run requests.sql (with the short ``request`` id in front), window.sql (with UTC bounds
    beside the ns ones) and (when present and asked) skew_offsets.sql on ``con``."""
    from analyzer.query.runner import list_queries, run_query

    from analyzer.query.utc_columns import with_utc_bounds

    results = {
        "requests": with_short_request_id(run_query(con, "requests", {"perspective": perspective})),
        "window": with_utc_bounds(run_query(con, "window", {"perspective": perspective}, views=False)),
    }
    if skew and "skew_offsets" in list_queries():
        results["skew_offsets"] = run_query(con, "skew_offsets", {}, views=False)
    return results


def _fresh(paths: list[Path]) -> None:
    for path in paths:
        for candidate in (path, path.with_name(path.name + ".wal")):
            if candidate.exists():
                candidate.unlink()


def run_demo(options: DemoOptions, progress: ProgressFn | None = None) -> DemoResult:
    """Serve, send, export, load, query. ``progress`` is told each stage (and request counts);
    with ``options.say_steps`` each step is also one timed line on stderr."""
    if options.model not in ("tiny", "smollm2") and not Path(options.model).is_dir():
        raise ValueError(f"--model {options.model!r}: not 'tiny', 'smollm2' or a local model folder")
    out = Path(options.out_dir)
    if out.exists() and not out.is_dir():
        raise ValueError(f"--out {out}: exists and is not a folder")
    out.mkdir(parents=True, exist_ok=True)
    say = StepLog(options.say_steps, options.width)
    say(f"starting: model {options.model}, {1 + options.load_requests} requests, output in {options.out_dir}")
    from instrument.otel.shutdown import StopSignals, export_summary, shutdown_tracing

    report = progress or (lambda _stage, _done, _total: None)
    server_path, client_path, db_path = out / "server-spans.jsonl", out / "client-spans.jsonl", out / "traces.duckdb"
    total = 1 + options.load_requests
    done = [0]
    stop = threading.Event()
    loading = [True]  # imports and the model: nothing is sent yet, a stop signal ends them at once

    def on_stop(_name: str) -> None:
        # SIGINT/SIGTERM (docker stop): before sending, stop at once; while sending, send
        # nothing more and give the requests in flight the grace.
        stop.set()
        if loading[0]:
            loading[0] = False
            raise _StopBeforeSending

    def counted(_result: Any) -> None:
        done[0] += 1
        report("requests", done[0], total)

    seed_results: list[Any] = []
    load_results: list[Any] = []
    url = ""
    signals = StopSignals(on_stop)
    server_provider = client_provider = None
    try:
        with signals:
            from analyzer.db.derived import build_derived
            from analyzer.formats.load import load_paths
            from analyzer.db.store import connect
            from instrument.client import SEED_PROMPT, chat_body, local_tracer_provider, run_load_sync
            from instrument.gateway.app import GatewaySettings, create_app
            from instrument.gateway.server import ServerThread
            from instrument.hf.model_handle import load_model_handle

            _fresh([server_path, client_path, db_path, out / "report.html"])  # no stale report without matplotlib
            server_provider = local_tracer_provider("tokentrace-gateway", json_path=str(server_path))
            client_provider = local_tracer_provider("tokentrace-client", json_path=str(client_path))
            say("importing torch and transformers; " + model_step(options.model))
            report(f"loading model {options.model}", 0, 1)
            handle = load_model_handle(options.model)
            loading[0] = False
            if stop.is_set():
                raise _StopBeforeSending
            report(f"loading model {options.model}", 1, 1)
            settings = GatewaySettings(max_tokens_limit=max(1024, options.max_tokens))
            offset_ns = round(options.clock_offset_ms * 1e6)
            app = create_app(handle, server_provider, settings)
            with ServerThread(app) as server:
                url = server.url
                say(f"serving {handle.model_id} at {server.url} (the traced gateway, in this process)")
                say(f"sending the seed request, then {options.load_requests} more at concurrency "
                    f"{max(1, options.concurrency)} (max_tokens {options.max_tokens})")
                report("requests", 0, total)
                seed_results = run_load_sync(
                    server.url, lambda _i: chat_body(handle.model_id, SEED_PROMPT, max_tokens=options.max_tokens),
                    requests=1, concurrency=1, tracer_provider=client_provider, clock_offset_ns=offset_ns,
                    on_result=counted, stop=stop, grace_s=options.shutdown_grace_s,
                ) if not stop.is_set() else []
                load_results = run_load_sync(
                    server.url,
                    lambda i: chat_body(handle.model_id, DEMO_PROMPTS[i % len(DEMO_PROMPTS)],
                                        max_tokens=options.max_tokens),
                    requests=options.load_requests, concurrency=max(1, options.concurrency),
                    tracer_provider=client_provider, clock_offset_ns=offset_ns, seed=options.seed,
                    on_result=counted, stop=stop, grace_s=options.shutdown_grace_s,
                ) if options.load_requests and not stop.is_set() else []
    except _StopBeforeSending:
        pass
    finally:
        # flushes the OTLP-JSON lines files (on an error too); bounded, so a stop never waits forever
        counts = [c for provider in (server_provider, client_provider) if provider is not None
                  for c in shutdown_tracing(provider, timeout_s=10.0)]
    if signals.received:
        raise DemoStopped(signals.received, len(seed_results) + len(load_results), total, export_summary(counts),
                          [client_path, server_path])
    completed = sum(1 for r in seed_results + load_results if getattr(r, "completed", False))
    say(f"sent {total} requests, {completed} completed; spans written to {client_path.name} and {server_path.name}")

    say(f"loading the spans into {db_path}")
    report("loading spans into DuckDB", 0, 1)
    con = connect(db_path)
    try:
        loaded = load_paths(con, [str(client_path), str(server_path)])
        build_derived(con)  # as tokentrace load: the query verbs read them afterwards
        queries = summary_queries(con)
        report("loading spans into DuckDB", 1, 1)
        say(f"loaded {loaded.total('spans_loaded')} spans; writing {out / 'report.html'}")
        report("writing the HTML report", 0, 1)
        report_path = _write_report(con, out / "report.html")
        report("writing the HTML report", 1, 1)
    finally:
        con.close()
    say("done" if report_path is not None else "done (no report.html: the report extra, matplotlib, is not installed)")
    return DemoResult(server_path, client_path, db_path, url, handle.model_id, seed_results + load_results,
                      loaded.total("spans_loaded"), queries=queries, report_path=report_path)


def _write_report(con: Any, path: Path) -> Path | None:
    """The HTML report of the demo's database (None when matplotlib is not installed)."""
    try:
        import matplotlib  # noqa: F401  (the report's plotting library, an optional extra)
    except ImportError:
        return None
    from analyzer.report import ReportInputs, build_report

    path.write_text(build_report(con, ReportInputs(title="tokentrace demo")), encoding="utf-8")
    return path
