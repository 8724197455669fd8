"""``tokentrace pull`` against a loopback server replaying real Jaeger answers from
tests/data/samples (api_v3 ``{"result": ...}`` and the old ``/api/traces`` document)."""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from urllib.parse import parse_qs, urlsplit

import duckdb
import pytest
from click.testing import CliRunner

from analyzer.cli import cli
from analyzer.collect.pull import parse_since, pull_traces, rfc3339_nano

NO_TRACES = b'{"error":{"httpCode":404,"message":"No traces found"}}'


class Replay:
    """Answers per path, served in order; afterwards api_v3 says "No traces found" and any
    other path is a plain-text 404 (as Go's mux). Records every request's path and query."""

    def __init__(self, answers: dict[str, list[tuple[int, bytes]]]) -> None:
        self.answers = {path: list(items) for path, items in answers.items()}
        self.requests: list[tuple[str, dict[str, str]]] = []
        self.lock = threading.Lock()

    def answer(self, path: str) -> tuple[int, bytes, str]:
        with self.lock:
            queue = self.answers.get(path)
            if queue:
                status, body = queue.pop(0)
                return status, body, "application/json"
        if path in self.answers and path.endswith("/api/v3/traces"):
            return 404, NO_TRACES, "application/json"
        return 404, b"404 page not found\n", "text/plain"


@pytest.fixture
def jaeger() -> Iterator[tuple[str, Replay]]:
    replay = Replay({})

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            parts = urlsplit(self.path)
            replay.requests.append((parts.path, {k: v[-1] for k, v in parse_qs(parts.query).items()}))
            status, body, ctype = replay.answer(parts.path)
            self.send_response(status)
            self.send_header("Content-Type", ctype)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args: object) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}", replay
    finally:
        server.shutdown()
        server.server_close()
        thread.join(timeout=5)


def _wrap(path: Path) -> bytes:
    return json.dumps({"result": json.loads(path.read_bytes())}).encode()


def _db_spans(runner: CliRunner, path: Path, db: Path, *extra: str) -> int:
    result = runner.invoke(cli, ["load", str(path), "--db", str(db), "-q", *extra], catch_exceptions=False)
    assert result.exit_code == 0, result.output
    with duckdb.connect(str(db), read_only=True) as con:
        return con.execute("SELECT count(*) FROM spans").fetchone()[0]


def test_v3_pages_back_in_time_and_skips_traces_already_seen(jaeger, samples_dir: Path, tmp_path: Path, runner: CliRunner) -> None:
    url, replay = jaeger
    replay.answers["/api/v3/traces"] = [
        (200, _wrap(samples_dir / "jaeger_otlp2jaeger_in.otlp.json")),
        (200, (samples_dir / "jaeger_apiv3_GetTrace.json").read_bytes()),
        (200, _wrap(samples_dir / "jaeger_fixture_span_tags_trace.otlp.json")),  # trace ...01 again: nothing new
    ]
    out = tmp_path / "pulled.jsonl"
    result = runner.invoke(cli, ["pull", "--jaeger", url + "/", "--service", "telemetrygen", "--since", "2h",
                                 "--page-size", "1", "--out", str(out)], catch_exceptions=False)
    assert result.exit_code == 0, result.output
    assert "2 traces, 3 spans from 3 page(s) of Jaeger's v3 API" in result.output
    lines = [json.loads(line) for line in out.read_text().splitlines()]
    assert len(lines) == 2 and all(set(doc) == {"resourceSpans"} for doc in lines)
    assert lines[1] == json.loads((samples_dir / "jaeger_apiv3_GetTrace.json").read_bytes())["result"]
    (first_path, first), (_, second), (_, third) = replay.requests
    assert first_path == "/api/v3/traces"
    assert first["query.service_name"] == "telemetrygen" and first["query.search_depth"] == "1" == first["query.num_traces"]
    assert first["query.start_time_min"].endswith("Z") and first["query.start_time_min"] < first["query.start_time_max"]
    assert second["query.start_time_max"] == rfc3339_nano(1706678909209712000)  # earliest start of page 1
    assert third["query.start_time_max"] == second["query.start_time_max"]  # page 2 carried no start times
    # Jaeger's GetTrace snapshot span has no start time (the loader rejects it); the telemetrygen
    # sample holds one span twice (same trace and span id), which the loader deduplicates
    assert _db_spans(runner, tmp_path / "pulled.jsonl", tmp_path / "t.duckdb", "--lenient") == 1


def test_v3_limit_stops_the_walk(jaeger, samples_dir: Path, tmp_path: Path) -> None:
    url, replay = jaeger
    replay.answers["/api/v3/traces"] = [(200, _wrap(samples_dir / "jaeger_otlp2jaeger_in.otlp.json"))] * 3
    report = pull_traces(url, "telemetrygen", tmp_path / "o.jsonl", limit=1, timeout_s=5)
    assert (report.traces, report.spans, report.pages) == (1, 2, 1)


def test_auto_falls_back_to_the_old_api_and_writes_its_document(jaeger, samples_dir: Path, tmp_path: Path, runner: CliRunner) -> None:
    url, replay = jaeger
    raw = (samples_dir / "jaeger_otlp2jaeger_out.api_traces.json").read_bytes()
    replay.answers["/api/traces"] = [(200, raw)]
    out = tmp_path / "pulled.json"
    result = runner.invoke(cli, ["pull", "--jaeger", url, "--service", "telemetrygen", "--since", "30m",
                                 "--limit", "5", "--out", str(out)], catch_exceptions=False)
    assert result.exit_code == 0, result.output
    assert "used /api/traces" in result.output and "1 traces, 2 spans" in result.output
    assert json.loads(out.read_text())["data"] == json.loads(raw)["data"]
    (v3_path, _), (v1_path, v1) = replay.requests
    assert (v3_path, v1_path) == ("/api/v3/traces", "/api/traces")
    assert v1["service"] == "telemetrygen" and v1["limit"] == "5" and v1["lookback"] == "1800s"
    assert int(v1["end"]) - int(v1["start"]) == 1800 * 1_000_000  # microseconds
    assert _db_spans(runner, out, tmp_path / "t.duckdb") == 1  # the sample's two spans share one span id


def test_explicit_v1(jaeger, samples_dir: Path, tmp_path: Path) -> None:
    url, replay = jaeger
    replay.answers["/api/traces"] = [(200, (samples_dir / "jaeger_otlp2jaeger_out.api_traces.json").read_bytes())]
    report = pull_traces(url, "telemetrygen", tmp_path / "o.json", api="v1", page_size=10, timeout_s=5)
    assert (report.api, report.traces, report.pages) == ("v1", 1, 1)
    assert [p for p, _ in replay.requests] == ["/api/traces"]


def test_no_traces_is_one_line_error_and_writes_nothing(jaeger, tmp_path: Path, runner: CliRunner) -> None:
    url, replay = jaeger
    replay.answers["/api/v3/traces"] = []
    out = tmp_path / "o.jsonl"
    result = runner.invoke(cli, ["pull", "--jaeger", url, "--service", "nobody", "--out", str(out)], catch_exceptions=False)
    assert result.exit_code == 1 and "no traces of service 'nobody'" in result.output
    assert not out.exists()


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--jaeger", "localhost:16686"], "expected http(s)://"),
        (["--jaeger", "http://127.0.0.1:9", "--since", "soon"], "--since 'soon'"),
        (["--jaeger", "http://127.0.0.1:9", "--timeout", "1"], "GET http://127.0.0.1:9/api/v3/traces"),
    ],
)
def test_pull_user_errors_are_one_line(tmp_path: Path, runner: CliRunner, args: list[str], message: str) -> None:
    result = runner.invoke(cli, ["pull", "--service", "s", "--out", str(tmp_path / "o"), *args], catch_exceptions=False)
    assert result.exit_code == 1 and message in result.output and "Traceback" not in result.output


def test_server_error_is_reported(jaeger, tmp_path: Path, runner: CliRunner) -> None:
    url, replay = jaeger
    replay.answers["/api/v3/traces"] = [(500, b'{"error":{"httpCode":500,"message":"storage down"}}')]
    result = runner.invoke(cli, ["pull", "--jaeger", url, "--service", "s", "--out", str(tmp_path / "o")], catch_exceptions=False)
    assert result.exit_code == 1 and "HTTP 500" in result.output and "storage down" in result.output


@pytest.mark.parametrize(("text", "seconds"), [("90s", 90), ("15m", 900), ("1h", 3600), ("2d", 172800), ("1h30m", 5400), ("45", 45)])
def test_parse_since(text: str, seconds: float) -> None:
    assert parse_since(text) == seconds


@pytest.mark.parametrize("text", ["", "1x", "h", "0s", "1h-2m", "-5"])
def test_parse_since_rejects(text: str) -> None:
    with pytest.raises(ValueError):
        parse_since(text)


def test_rfc3339_nano() -> None:
    assert rfc3339_nano(1706678909209712345) == "2024-01-31T05:28:29.209712345Z"
