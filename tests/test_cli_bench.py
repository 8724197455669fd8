"""``tokentrace bench`` against a real gateway on 127.0.0.1 (ephemeral port, tiny model)."""

from __future__ import annotations

import io
import json
import re
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

pytest.importorskip("fastapi")
pytest.importorskip("torch")

from opentelemetry.sdk.trace import SpanLimits, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from analyzer.cli import cli
from instrument.client import poisson_arrival_offsets_s
from instrument.gateway.app import GatewaySettings, create_app
from instrument.gateway.server import ServerThread
from instrument.hf.model_handle import load_model_handle


@pytest.fixture(scope="module")
def server() -> Iterator[tuple[ServerThread, InMemorySpanExporter]]:
    exporter = InMemorySpanExporter()
    provider = TracerProvider(span_limits=SpanLimits(max_events=2048))
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    srv = ServerThread(create_app(load_model_handle("tiny"), provider, GatewaySettings(api_keys=frozenset({"k"})))).start()
    yield srv, exporter
    srv.stop()


def test_bench_closed_loop_summary_from_sql(runner, server, tmp_path: Path) -> None:
    srv, exporter = server
    spans_file = tmp_path / "bench.jsonl"
    result = runner.invoke(cli, ["bench", "--url", srv.url, "--requests", "4", "--concurrency", "2", "--api-key", "k",
                                 "--max-tokens", "4", "--otlp-json", str(spans_file), "--clock-offset-ms", "-250",
                                 "--per-request"],
                           catch_exceptions=False)
    assert result.exit_code == 0, result.output
    assert "HTTP status: 200=4" in result.output
    assert "Window summary" in result.output and "attempted" in result.output  # --per-request's tables
    assert "=== tokentrace bench result ===" in result.output
    client_spans = [s for line in spans_file.read_text().splitlines()
                    for rs in json.loads(line)["resourceSpans"] for ss in rs["scopeSpans"] for s in ss["spans"]]
    assert len(client_spans) == 4 and all(s["kind"] == 3 for s in client_spans)  # SPAN_KIND_CLIENT
    # traceparent join: every client trace has its gateway span on the server
    server_traces = {f"{s.context.trace_id:032x}" for s in exporter.get_finished_spans() if s.name == "gateway"}
    assert {s["traceId"] for s in client_spans} <= server_traces
    # the client clock was shifted back 250 ms: client start is before server arrival by more than that
    gw = {f"{s.context.trace_id:032x}": s.start_time for s in exporter.get_finished_spans() if s.name == "gateway"}
    assert all(gw[s["traceId"]] - int(s["startTimeUnixNano"]) > 250_000_000 for s in client_spans)


def test_bench_open_loop_and_errors(runner, server) -> None:
    srv, _ = server
    result = runner.invoke(cli, ["bench", "--url", srv.url, "--requests", "3", "--rate", "50", "--api-key", "k",
                                 "--max-tokens", "2"], catch_exceptions=False)
    assert result.exit_code == 0, result.output
    assert "Poisson rate 50/s" in result.output
    no_key = runner.invoke(cli, ["bench", "--url", srv.url, "--requests", "1", "--concurrency", "1"])
    assert no_key.exit_code == 1 and "401" in no_key.output
    both = runner.invoke(cli, ["bench", "--url", srv.url, "--requests", "1", "--concurrency", "1", "--rate", "1"])
    assert both.exit_code == 1 and "exactly one" in both.output


def test_poisson_arrivals_are_seeded() -> None:
    a = poisson_arrival_offsets_s(50, 10.0, seed=7)
    assert a == poisson_arrival_offsets_s(50, 10.0, seed=7) and a != poisson_arrival_offsets_s(50, 10.0, seed=8)
    assert a[0] == 0.0 and all(y > x for x, y in zip(a, a[1:]))
    assert 2.0 < a[-1] < 10.0  # 49 gaps of mean 0.1 s


def _client_spans(path: Path) -> list[dict]:
    return [s for line in path.read_text().splitlines()
            for rs in json.loads(line)["resourceSpans"] for ss in rs["scopeSpans"] for s in ss["spans"]]


def test_bench_json_is_one_object_from_the_same_sql(runner, server, tmp_path: Path) -> None:
    srv, _ = server
    spans_file = tmp_path / "bench.jsonl"
    result = runner.invoke(cli, ["bench", "--url", srv.url, "--requests", "4", "--concurrency", "2", "--api-key", "k",
                                 "--max-tokens", "6", "--ignore-eos", "--format", "json", "--otlp-json",
                                 str(spans_file)], catch_exceptions=False)
    assert result.exit_code == 0, result.output
    report = json.loads(result.stdout)  # stdout holds the object alone; progress lines go to stderr
    assert report["requests_completed"] == 4 and report["requests_failed"] == 0
    assert report["http_status"] == {"200": 4}
    for metric in ("ttft_ms", "tpot_ms", "e2e_ms"):
        assert set(report[metric]) >= {"mean", "p50", "p90", "p99"}
    # independently, from the client spans themselves: s = span start, f / e = first / last visible chunk
    spans = _client_spans(spans_file)
    ttft, e2e, tokens = [], [], 0
    for span in spans:
        visible = [int(e["timeUnixNano"]) for e in span["events"]
                   if any(a["key"] == "tokentrace.chunk.visible" and a["value"]["boolValue"] for a in e["attributes"])]
        start = int(span["startTimeUnixNano"])
        ttft.append((visible[0] - start) / 1e6)
        e2e.append((visible[-1] - start) / 1e6)
        tokens += int(next(a["value"]["intValue"] for a in span["attributes"] if a["key"] == "gen_ai.usage.output_tokens"))
    assert tokens == 4 * 6  # --ignore-eos: every answer ran to --max-tokens
    assert report["ttft_ms"]["mean"] == pytest.approx(sum(ttft) / 4)
    assert report["e2e_ms"]["mean"] == pytest.approx(sum(e2e) / 4)
    window_s = (max(int(s["endTimeUnixNano"]) for s in spans) - min(int(s["startTimeUnixNano"]) for s in spans)) / 1e9
    assert report["window_s"] == pytest.approx(window_s)
    assert report["output_tokens_per_second"] == pytest.approx(tokens / window_s)
    assert report["request_throughput_rps"] == pytest.approx(4 / window_s)


def _wait_for_answered(exporter: InMemorySpanExporter, prefix: str, timeout_s: float = 60.0) -> None:
    """Wait (bounded) until the server has ended a gateway span for one of bench's requests
    (X-Request-ID ``prefix``...): bench is past its start-up and requests are under way."""
    deadline = time.monotonic() + timeout_s
    while not any(str(s.attributes.get("tokentrace.client_request_id", "")).startswith(prefix)
                  for s in exporter.get_finished_spans() if s.name == "gateway"):
        assert time.monotonic() < deadline, f"no request {prefix}* answered in {timeout_s:.0f} s"
        time.sleep(0.02)


@pytest.mark.timing  # bounded waits; the grace (20 s) must cover the requests in flight
def test_bench_sigterm_stops_sending_finishes_and_flushes(server, tmp_path: Path) -> None:
    import signal
    import subprocess
    import sys

    srv, exporter = server
    spans_file = tmp_path / "bench.jsonl"
    tokentrace = Path(sys.executable).with_name("tokentrace")
    proc = subprocess.Popen([str(tokentrace), "bench", "--url", srv.url, "--requests", "400", "--concurrency", "2",
                             "--api-key", "k", "--max-tokens", "24", "--ignore-eos", "--otlp-json", str(spans_file),
                             "--request-id-prefix", "term-", "--shutdown-grace-s", "20"],
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    _wait_for_answered(exporter, "term-")  # (not a sleep: the signal comes once requests are under way)
    assert proc.poll() is None
    proc.send_signal(signal.SIGTERM)
    out, _ = proc.communicate(timeout=120)
    assert proc.returncode == 128 + signal.SIGTERM, out
    (line,) = [ln for ln in out.splitlines() if ln.startswith("bench: stopped on SIGTERM: sent ")]
    sent = int(line.split("sent ")[1].split(" of ")[0])
    assert 0 < sent < 400 and f"sent {sent} of 400 requests, {400 - sent} not sent; " in line
    assert _block_figure(out, "Requests completed:") == sent  # the grace let every one in flight finish
    assert _block_figure(out, "Requests cancelled by the stop:") == 0
    assert _block_figure(out, "Requests not sent (SIGTERM):") == 400 - sent
    assert "dropped=0" in line and "failed=0" in line
    spans = _client_spans(spans_file)
    assert len(spans) == sent  # every request sent has its span on disk, none cut off
    finished = [next(a["value"]["arrayValue"]["values"][0]["stringValue"] for a in s["attributes"]
                     if a["key"] == "gen_ai.response.finish_reasons") for s in spans]
    assert set(finished) == {"length"}, "requests in flight at the signal finished within the grace"


def _block_figure(out: str, label: str) -> int:
    """A count of the summary block bench ends with."""
    (line,) = [ln for ln in out.splitlines() if ln.startswith(label)]
    return int(line.split()[-1])


@pytest.mark.timing  # a bounded wait; a request must still be in flight when bench reads the signal
def test_bench_ctrl_c_counts_agree_with_the_spans_and_exit_130(server, tmp_path: Path) -> None:
    """Ctrl-C with no grace: the requests in flight are cancelled, and every count (sent,
    completed, cancelled, not sent) agrees with the client spans kept in --db.

    The signal comes once the server holds one of bench's requests, each 400 tokens long (on a
    busy machine, seconds): one is still in flight when bench acts on it. (Waiting for a first
    answer instead sent it just as the continuous engine's batch of four ended together, and
    bench had sent no next one yet: nothing to cancel, 1 run in 18 under load.)"""
    import signal
    import subprocess
    import sys

    import duckdb

    srv, _ = server
    db = tmp_path / "bench.duckdb"
    tokentrace = Path(sys.executable).with_name("tokentrace")
    proc = subprocess.Popen([str(tokentrace), "bench", "--url", srv.url, "--requests", "400", "--concurrency", "4",
                             "--api-key", "k", "--max-tokens", "400", "--ignore-eos", "--db", str(db),
                             "--shutdown-grace-s", "0"], stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    admission = srv.config.app.state.gateway.admission
    deadline = time.monotonic() + 60
    while admission.requests_in_flight == 0:  # bench is past its start-up: requests are under way
        assert time.monotonic() < deadline and proc.poll() is None, "no request of bench's reached the server"
        time.sleep(0.005)
    proc.send_signal(signal.SIGINT)
    out, _ = proc.communicate(timeout=120)
    assert proc.returncode == 130, out
    (line,) = [ln for ln in out.splitlines() if ln.startswith("bench: stopped on SIGINT: sent ")]
    sent = int(line.split("sent ")[1].split(" of ")[0])
    completed, cancelled = _block_figure(out, "Requests completed:"), _block_figure(out, "Requests cancelled by the stop:")
    assert cancelled >= 1 and completed + cancelled + _block_figure(out, "Requests failed:") == sent, out
    assert _block_figure(out, "Requests not sent (SIGINT):") == 400 - sent
    # a request cancelled before its response began has no HTTP status ("no response")
    statuses = re.search(rf"\n  {completed} completed, 0 failed, {cancelled} cancelled by the stop; "
                         r"HTTP status: (.+)\n", out)
    assert statuses, out
    by_status = {k: int(v) for k, v in (item.split("=") for item in statuses.group(1).split(", "))}
    assert set(by_status) <= {"200", "no response"} and sum(by_status.values()) == sent, out
    assert by_status.get("no response", 0) <= cancelled, out
    con = duckdb.connect(str(db), read_only=True)
    spans = con.execute("SELECT count(*), count(*) FILTER (WHERE status_code = 'ERROR') FROM spans").fetchone()
    con.close()
    assert spans == (sent, cancelled)  # every request sent has its span, the cancelled ones in error


def test_bench_db_is_left_with_current_derived_tables(runner, server, tmp_path: Path) -> None:
    """bench --db writes the client spans as tokentrace load would, derived tables included:
    a read verb afterwards derives nothing and prints no stale note."""
    srv, _exporter = server
    db = tmp_path / "bench.duckdb"
    result = runner.invoke(cli, ["bench", "--url", srv.url, "--requests", "2", "--concurrency", "1", "--api-key", "k",
                                 "--max-tokens", "4", "--db", str(db)], catch_exceptions=False)
    assert result.exit_code == 0, result.output
    after = runner.invoke(cli, ["requests", "--db", str(db), "--format", "json"])
    assert after.exit_code == 0, after.output
    assert "derived tables were built over other data" not in after.stderr
    assert len(json.loads(after.stdout)) == 2  # the two client-perspective requests
    import duckdb

    from analyzer.db.views import derived_status, install_views

    con = duckdb.connect(str(db), read_only=True)
    try:
        install_views(con)
        assert derived_status(con) == "read"  # the stored tables answer; without them: "none"
    finally:
        con.close()


# --- failures named and counted, exit status, ids, progress --------------------------

class _Flaky(BaseHTTPRequestHandler):
    """A real OpenAI-style streaming server on 127.0.0.1 whose answers depend on the request's
    X-Request-ID suffix i: i % 3 == 0 streams one chunk then stalls past the client's timeout,
    i % 3 == 1 answers 503, i % 3 == 2 streams a complete answer (two chunks)."""

    protocol_version = "HTTP/1.0"
    stall_s = 30.0  # far past any --timeout-s used here: the client's timeout, never the server, ends the wait

    def log_message(self, *_args) -> None:
        pass

    def do_POST(self) -> None:
        self.rfile.read(int(self.headers.get("content-length", 0)))
        i = int(self.headers["x-request-id"].rsplit("-", 1)[1])
        if i % 3 == 1:
            body = json.dumps({"error": {"message": "server overloaded", "type": "overloaded"}}).encode()
            self.send_response(503)
            self.send_header("content-type", "application/json")
            self.send_header("content-length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)
            return
        self.send_response(200)
        self.send_header("content-type", "text/event-stream")
        self.send_header("x-request-id", self.headers["x-request-id"])
        self.end_headers()

        def chunk(text, finish=None):
            payload = {"id": f"chatcmpl-flaky{i}", "object": "chat.completion.chunk", "model": "flaky",
                       "choices": [{"index": 0, "delta": {"content": text}, "finish_reason": finish}]}
            self.wfile.write(f"data: {json.dumps(payload)}\n\n".encode())
            self.wfile.flush()

        chunk("Hello")
        if i % 3 == 0:
            time.sleep(self.stall_s)
            return
        chunk(" world", "stop")
        self.wfile.write(b"data: [DONE]\n\n")


@pytest.fixture(scope="module")
def flaky() -> Iterator[str]:
    httpd = ThreadingHTTPServer(("127.0.0.1", 0), _Flaky)
    httpd.daemon_threads = True
    thread = threading.Thread(target=httpd.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{httpd.server_address[1]}"
    httpd.shutdown()
    httpd.server_close()


def _flaky_bench(url: str, *extra: str, timeout_s: str = "0.5") -> list[str]:
    return ["bench", "--url", url, "--model", "flaky", "--requests", "3", "--concurrency", "1", "--timeout-s", timeout_s,
            "--request-id-prefix", "t-", *extra]


@pytest.mark.timing  # request 0's wait is timed (only its lower bound, the timeout, is asserted)
def test_bench_names_counts_and_exits_1_on_failed_requests(runner, flaky) -> None:
    result = runner.invoke(cli, _flaky_bench(flaky))
    out = result.output
    assert result.exit_code == 1, out
    # a 200 whose stream then timed out is a failure, not a success: HTTP status alone says 200=2
    assert "concurrency 1\n  1 completed, 2 failed; HTTP status: 200=2, 503=1\n" in out, out
    lines = out.splitlines()
    at = lines.index(next(ln for ln in lines if ln.startswith("  request 0: ")))
    timeout_line, ids_line = lines[at], lines[at + 1]
    assert re.fullmatch(r"  request 0: HTTP 200, 1 chunk, then ReadTimeout after (\d+\.\d) s \(--timeout-s 0\.5\)",
                        timeout_line), out
    # it waited the timeout (how much longer depends on the load; the stall, 30 s, bounds it)
    assert 0.5 <= float(re.search(r"after (\S+) s", timeout_line).group(1)) < _Flaky.stall_s
    assert ids_line == "    client_request_id t-0, response_id chatcmpl-flaky0"
    assert re.fullmatch(r"  request 1: HTTP 503: server overloaded after \d+\.\d s", lines[at + 2]), out
    assert lines[at + 3] == "    client_request_id t-1"  # a 503 has no response id
    assert "request 2:" not in out  # the completed one is not listed as failed
    assert result.stderr.strip().splitlines()[-1] == ("Error: 2 of 3 requests failed (listed above); "
                                                      "hint: --allow-failures exits 0 when failures are expected")
    assert "ReadTimeout: " not in out  # never an empty message after the exception's name


@pytest.mark.timing  # request 0 waits for --timeout-s
def test_bench_allow_failures_exits_0_and_json_lists_every_failure(runner, flaky) -> None:
    ok = runner.invoke(cli, _flaky_bench(flaky, "--allow-failures"))
    assert ok.exit_code == 0 and "1 completed, 2 failed" in ok.output, ok.output
    as_json = runner.invoke(cli, _flaky_bench(flaky, "--format", "json"))
    assert as_json.exit_code == 1
    report = json.loads(as_json.stdout)
    assert report["requests_failed"] == 2 and report["requests_completed"] == 1  # window.sql agrees
    assert report["http_status"] == {"200": 2, "503": 1}
    assert [(f["index"], f["client_request_id"], f["response_id"], f["http_status"]) for f in report["failures"]] == [
        (0, "t-0", "chatcmpl-flaky0", 200), (1, "t-1", None, 503)]
    assert report["failures"][0]["error"] == "ReadTimeout" and report["failures"][0]["waited_s"] >= 0.5
    assert report["request_ids"] == [{"index": i, "client_request_id": f"t-{i}", "response_id": rid}
                                     for i, rid in enumerate(["chatcmpl-flaky0", None, "chatcmpl-flaky2"])]
    assert "Error: 2 of 3 requests failed" in as_json.stderr


def test_bench_prints_the_response_and_client_request_ids_requests_shows(runner, server, tmp_path: Path) -> None:
    """bench's ids are requests.sql's response_id and client_request_id: after loading the
    server's spans, `tokentrace requests` shows the same ids for the same requests."""
    from analyzer.db.store import connect, insert_rows
    from analyzer.formats.sdk_spans import rows_from_sdk_spans
    from analyzer.query.runner import run_query

    srv, exporter = server
    exporter.clear()
    db = tmp_path / "bench.duckdb"
    result = runner.invoke(cli, ["bench", "--url", srv.url, "--requests", "3", "--concurrency", "2", "--api-key", "k",
                                 "--max-tokens", "3", "--request-id-prefix", "run7-", "--db", str(db),
                                 "--per-request"],
                           catch_exceptions=False)
    assert result.exit_code == 0, result.output
    ids_table = result.output.split("Request ids (queries/requests.sql; X-Request-ID = client_request_id)")[1]
    gateway = {s.attributes["tokentrace.client_request_id"]: s.attributes["gen_ai.response.id"]
               for s in exporter.get_finished_spans() if s.name == "gateway"}
    assert sorted(gateway) == ["run7-0", "run7-1", "run7-2"]
    lines = ids_table.strip("\n").split("\n\n")[0].splitlines()
    assert lines[0].split() == ["response_id", "client_request_id", "request_span_id"], ids_table
    assert max(len(line) for line in lines) <= 80 and "trace_id" in lines[-1], ids_table  # named, not shown at 80
    for client_id, response_id in gateway.items():  # the gateway's own ids, one table row each
        assert re.search(rf"^{response_id}\s+{client_id}\s+[0-9a-f]{{16}}\s*$", ids_table, re.M), ids_table
    con = connect(str(db))
    try:
        insert_rows(con, *rows_from_sdk_spans(exporter.get_finished_spans()))
        rows = run_query(con, "requests").dicts()
    finally:
        con.close()
    by_perspective = {(r["perspective"], r["client_request_id"]): r["response_id"] for r in rows}
    for client_id, response_id in gateway.items():
        assert by_perspective[("client", client_id)] == by_perspective[("server", client_id)] == response_id


def test_bench_progress_line_counts_and_fits_80_columns() -> None:
    from types import SimpleNamespace

    from analyzer.cli._bench_progress import BenchProgress

    now = [100.0]
    progress = BenchProgress(99_999, io.StringIO(), enabled=False, clock=lambda: now[0])
    with progress:
        for i in range(5):
            progress.on_send(i)
        for _ in range(40):
            progress.on_chunk(True)
        progress.on_chunk(False)  # a chunk without text carries no token
        progress.on_result(SimpleNamespace(completed=True, finish_reason="stop"))
        progress.on_result(SimpleNamespace(completed=False, finish_reason=None))
        now[0] += 75.0
    line = progress.line()
    assert line == "bench 1:15  2/99999 done, 1 failed, 3 in flight, 99994 to send  0.5 tok/s"
    assert len(line) <= 80


@pytest.mark.timing  # the line is drawn every 0.5 s while request 0 waits its --timeout-s (3 s)
def test_bench_draws_progress_on_a_terminal_and_erases_it(flaky) -> None:
    """stderr a real pseudo-terminal: the progress line is drawn while requests run (request 0
    in flight for its whole --timeout-s, 3 s: several draws, however late the drawing thread
    runs; at 0.5 s, one draw and the timeout came together and the draw could miss it)."""
    import os
    import pty
    import subprocess
    import sys

    master, slave = pty.openpty()
    tokentrace = Path(sys.executable).with_name("tokentrace")
    proc = subprocess.Popen([str(tokentrace), *_flaky_bench(flaky, "--allow-failures", timeout_s="3")],
                            stdout=subprocess.PIPE, stderr=slave, text=True)
    os.close(slave)
    seen = b""
    while True:
        try:
            data = os.read(master, 4096)
        except OSError:  # the child closed the terminal
            break
        if not data:
            break
        seen += data
    out, _ = proc.communicate(timeout=60)
    os.close(master)
    assert proc.returncode == 0, out
    drawn = [part for part in seen.decode().split("\r") if part.startswith("bench ")]
    assert any(re.match(r"bench 0:0\d  0/3 done, 0 failed, 1 in flight, 2 to send  \d+\.\d tok/s", p) for p in drawn), seen
    assert "1 completed, 2 failed" in out and "bench 0:" not in out  # the line went to the terminal only
