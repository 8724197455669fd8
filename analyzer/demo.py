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

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

__all__ = ["DEMO_PROMPTS", "DemoOptions", "DemoResult", "run_demo", "summary_queries", "REQUEST_COLUMNS"]

DEMO_PROMPTS = (
    "Which Kyoto temples have step-free access?",
    "Suggest a two-day Kyoto itinerary for a wheelchair user.",
    "What is an onsen, and are private onsen baths common in ryokan?",
    "How do I get from Kansai airport to Kyoto station with luggage?",
    "List three accessible restaurants near Gion.",
    "Is the Arashiyama bamboo grove accessible by wheelchair?",
)

# The per-request columns the demo and bench print (queries/requests.sql has more).
REQUEST_COLUMNS = ("perspective", "finish_reason", "input_tokens", "output_tokens", "ttft_ms", "tpot_ms", "e2e_ms",
                   "decode_output_tokens_per_second", "stop_kv_bytes", "null_reason")


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
    queries: dict[str, Any] = field(default_factory=dict)  # name -> analyzer.queries.QueryResult


ProgressFn = Callable[[str, int, int], None]  # (stage description, done, total)


def summary_queries(con: Any, *, perspective: str | None = None, skew: bool = True) -> dict[str, Any]:
    """Run requests.sql, window.sql and (when present and asked) skew_offsets.sql on ``con``."""
    from analyzer.queries import list_queries, run_query

    results = {
        "requests": run_query(con, "requests", {"perspective": perspective}),
        "window": run_query(con, "window", {"perspective": perspective}, views=False),
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
    """Serve, send, export, load, query. ``progress`` is told each stage (and request counts)."""
    from analyzer.load import load_paths
    from analyzer.store import connect
    from instrument.client import SEED_PROMPT, chat_body, local_tracer_provider, run_load_sync
    from instrument.gateway.app import GatewaySettings, create_app
    from instrument.gateway.server import ServerThread
    from instrument.model_handle import load_model_handle

    report = progress or (lambda _stage, _done, _total: None)
    out = Path(options.out_dir)
    out.mkdir(parents=True, exist_ok=True)
    server_path, client_path, db_path = out / "server-spans.jsonl", out / "client-spans.jsonl", out / "traces.duckdb"
    _fresh([server_path, client_path, db_path, out / "report.html"])  # no stale report when matplotlib is gone
    server_provider = local_tracer_provider("tokentrace-gateway", json_path=str(server_path))
    client_provider = local_tracer_provider("tokentrace-client", json_path=str(client_path))

    report(f"loading model {options.model}", 0, 1)
    handle = load_model_handle(options.model)
    report(f"loading model {options.model}", 1, 1)
    settings = GatewaySettings(max_tokens_limit=max(1024, options.max_tokens))
    offset_ns = round(options.clock_offset_ms * 1e6)
    total = 1 + options.load_requests
    done = [0]

    def counted(_result: Any) -> None:
        done[0] += 1
        report("requests", done[0], total)

    app = create_app(handle, server_provider, settings)
    with ServerThread(app) as server:
        report("requests", 0, total)
        seed_results = run_load_sync(
            server.url, lambda _i: chat_body(handle.model_id, SEED_PROMPT, max_tokens=options.max_tokens),
            requests=1, concurrency=1, tracer_provider=client_provider, clock_offset_ns=offset_ns, on_result=counted,
        )
        load_results = run_load_sync(
            server.url,
            lambda i: chat_body(handle.model_id, DEMO_PROMPTS[i % len(DEMO_PROMPTS)], max_tokens=options.max_tokens),
            requests=options.load_requests, concurrency=max(1, options.concurrency), tracer_provider=client_provider,
            clock_offset_ns=offset_ns, seed=options.seed, on_result=counted,
        ) if options.load_requests else []
        url = server.url
    server_provider.shutdown()  # flushes the OTLP-JSON lines files
    client_provider.shutdown()

    report("loading spans into DuckDB", 0, 1)
    con = connect(db_path)
    try:
        loaded = load_paths(con, [str(client_path), str(server_path)])
        queries = summary_queries(con)
        report("loading spans into DuckDB", 1, 1)
        report("writing the HTML report", 0, 1)
        report_path = _write_report(con, out / "report.html")
        report("writing the HTML report", 1, 1)
    finally:
        con.close()
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
