"""``tokentrace demo``: serve a model through the traced gateway, send the worked example's request and a
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
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

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
    ``SIGINT`` | ``SIGTERM``; ``sent``/``total``: requests sent (including the first, the worked example's) and planned;
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
    out = _output_folder(options)
    say = StepLog(options.say_steps, options.width)
    say(f"starting: model {options.model}, {1 + options.load_requests} requests, output in {options.out_dir}")
    report = progress or (lambda _stage, _done, _total: None)
    server_path, client_path, db_path = out / "server-spans.jsonl", out / "client-spans.jsonl", out / "traces.duckdb"
    sending = _Sending(options, say, report)
    # no stale report without matplotlib
    sending.run([server_path, client_path, db_path, out / "report.html"], server_path, client_path)
    completed = sum(1 for r in sending.results if getattr(r, "completed", False))
    say(f"sent {sending.total} requests, {completed} completed; spans written to {client_path.name} and "
        f"{server_path.name}")

    say(f"loading the spans into {db_path}")
    spans_loaded, queries, report_path = _load_and_query(db_path, [client_path, server_path], out / "report.html",
                                                         say, report)
    say("done" if report_path is not None else "done (no report.html: the report extra, matplotlib, is not installed)")
    return DemoResult(server_path, client_path, db_path, sending.url, sending.model_id, sending.results,
                      spans_loaded, queries=queries, report_path=report_path)


def _output_folder(options: DemoOptions) -> Path:
    """The output folder, made when missing, once --model is known to name a model."""
    if options.model not in ("tiny", "smollm2") and not Path(options.model).is_dir():
        raise ValueError(f"--model {options.model!r}: not 'tiny', 'smollm2' or a local model folder")
    out = Path(options.out_dir)
    if out.exists() and not out.is_dir():
        raise ValueError(f"--out {out}: exists and is not a folder")
    out.mkdir(parents=True, exist_ok=True)
    return out


class _Sending:
    """The demo's serving-and-sending step: the model served by the traced gateway on 127.0.0.1,
    the worked example's request then the load sent by the traced client, each side's spans to its OTLP-JSON
    file. SIGINT/SIGTERM set ``stop``: while the model loads (nothing sent yet) the step ends at
    once; while sending, nothing more is sent and the requests in flight get the grace."""

    def __init__(self, options: DemoOptions, say: StepLog, report: ProgressFn) -> None:
        self.options, self.say, self.report = options, say, report
        self.total = 1 + options.load_requests  # requests planned, the worked example's included
        self.done = 0  # requests answered
        self.stop = threading.Event()
        self.loading = True  # imports and the model: nothing is sent yet, a stop signal ends them at once
        self.providers: list[Any] = []  # the server's tracer provider, then the client's
        self.url = ""
        self.model_id = ""
        self.seed_results: list[Any] = []
        self.load_results: list[Any] = []

    @property
    def results(self) -> list[Any]:
        """The client's results: the worked example's request's, then the load's."""
        return self.seed_results + self.load_results

    def run(self, fresh: list[Path], server_path: Path, client_path: Path) -> None:
        """Serve and send (``fresh``: files removed first), then flush both span files. Raises
        DemoStopped when SIGINT or SIGTERM stopped it."""
        from instrument.otel.shutdown import StopSignals, export_summary, shutdown_tracing

        signals = StopSignals(self._on_stop)
        try:
            with signals:
                self._serve_and_send(fresh, server_path, client_path)
        except _StopBeforeSending:
            pass
        finally:
            # flushes the OTLP-JSON lines files (on an error too); bounded, so a stop never waits forever
            counts = [c for provider in self.providers for c in shutdown_tracing(provider, timeout_s=10.0)]
        if signals.received:
            raise DemoStopped(signals.received, len(self.results), self.total, export_summary(counts),
                              [client_path, server_path])

    def _on_stop(self, _name: str) -> None:
        # SIGINT/SIGTERM (docker stop): before sending, stop at once; while sending, send
        # nothing more and give the requests in flight the grace.
        self.stop.set()
        if self.loading:
            self.loading = False
            raise _StopBeforeSending

    def _counted(self, _result: Any) -> None:
        self.done += 1
        self.report("requests", self.done, self.total)

    def _serve_and_send(self, fresh: list[Path], server_path: Path, client_path: Path) -> None:
        """Load the model, serve it through the traced gateway in this process and send."""
        from instrument.client import local_tracer_provider
        from instrument.gateway.app import GatewaySettings, create_app
        from instrument.gateway.server import ServerThread
        from instrument.hf.model_handle import load_model_handle

        options, say = self.options, self.say
        _fresh(fresh)
        self.providers.append(local_tracer_provider("tokentrace-gateway", json_path=str(server_path)))
        self.providers.append(local_tracer_provider("tokentrace-client", json_path=str(client_path)))
        say("importing torch and transformers; " + model_step(options.model))
        self.report(f"loading model {options.model}", 0, 1)
        handle = load_model_handle(options.model)
        self.loading = False
        if self.stop.is_set():
            raise _StopBeforeSending
        self.report(f"loading model {options.model}", 1, 1)
        self.model_id = handle.model_id
        app = create_app(handle, self.providers[0], GatewaySettings(max_tokens_limit=max(1024, options.max_tokens)))
        with ServerThread(app) as server:
            self.url = server.url
            say(f"serving {handle.model_id} at {server.url} (the traced gateway, in this process)")
            say(f"sending the example request, then {options.load_requests} more at concurrency "
                f"{max(1, options.concurrency)} (max_tokens {options.max_tokens})")
            self.report("requests", 0, self.total)
            self._send(server.url)

    def _send(self, url: str) -> None:
        """The worked example's request alone, then the load at the options' concurrency; none once stopped."""
        from instrument.client import SEED_PROMPT, chat_body, run_load_sync

        options, model_id = self.options, self.model_id
        common: dict[str, Any] = {"tracer_provider": self.providers[1],
                                  "clock_offset_ns": round(options.clock_offset_ms * 1e6),
                                  "on_result": self._counted, "stop": self.stop, "grace_s": options.shutdown_grace_s}
        if not self.stop.is_set():
            self.seed_results = run_load_sync(
                url, lambda _i: chat_body(model_id, SEED_PROMPT, max_tokens=options.max_tokens),
                requests=1, concurrency=1, **common)
        if options.load_requests and not self.stop.is_set():
            self.load_results = run_load_sync(
                url, lambda i: chat_body(model_id, DEMO_PROMPTS[i % len(DEMO_PROMPTS)], max_tokens=options.max_tokens),
                requests=options.load_requests, concurrency=max(1, options.concurrency), seed=options.seed, **common)


def _load_and_query(db_path: Path, span_paths: list[Path], report_file: Path, say: StepLog,
                    report: ProgressFn) -> tuple[int, dict[str, Any], Path | None]:
    """Load the span files into a DuckDB database, derive as tokentrace load does, run the
    summary queries and write the HTML report; returns (spans loaded, the query results, the
    report's path or None when matplotlib is missing)."""
    from analyzer.db.derived import build_derived
    from analyzer.db.store import connect
    from analyzer.formats.load import load_paths

    report("loading spans into DuckDB", 0, 1)
    con = connect(db_path)
    try:
        loaded = load_paths(con, [str(path) for path in span_paths])
        build_derived(con)  # as tokentrace load: the query verbs read them afterwards
        queries = summary_queries(con)
        report("loading spans into DuckDB", 1, 1)
        say(f"loaded {loaded.total('spans_loaded')} spans; writing {report_file}")
        report("writing the HTML report", 0, 1)
        report_path = _write_report(con, report_file)
        report("writing the HTML report", 1, 1)
    finally:
        con.close()
    return loaded.total("spans_loaded"), queries, report_path


def _write_report(con: Any, path: Path) -> Path | None:
    """The HTML report of the demo's database (None when matplotlib is not installed)."""
    try:
        import matplotlib  # noqa: F401 - the report's plotting library, an optional extra
    except ImportError:
        return None
    from analyzer.report import ReportInputs, build_report

    path.write_text(build_report(con, ReportInputs(title="tokentrace demo")), encoding="utf-8")
    return path
