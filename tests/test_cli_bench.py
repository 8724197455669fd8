"""``tokentrace bench`` against a real gateway on 127.0.0.1 (ephemeral port, tiny model)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Iterator

import pytest

pytest.importorskip("fastapi")
pytest.importorskip("torch")

from opentelemetry.sdk.trace import SpanLimits, TracerProvider  # noqa: E402
from opentelemetry.sdk.trace.export import SimpleSpanProcessor  # noqa: E402
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter  # noqa: E402

from analyzer.cli import cli  # noqa: E402
from instrument.client import poisson_arrival_offsets_s  # noqa: E402
from instrument.gateway.app import GatewaySettings, create_app  # noqa: E402
from instrument.gateway.server import ServerThread  # noqa: E402
from instrument.model_handle import load_model_handle  # noqa: E402


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
                                 "--max-tokens", "4", "--otlp-json", str(spans_file), "--clock-offset-ms", "-250"],
                           catch_exceptions=False)
    assert result.exit_code == 0, result.output
    assert "HTTP status: 200=4" in result.output
    assert "Window summary" in result.output and "attempted" in result.output
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


def test_bench_sigterm_stops_sending_finishes_and_flushes(server, tmp_path: Path) -> None:
    import signal
    import subprocess
    import sys
    import time

    srv, _ = server
    spans_file = tmp_path / "bench.jsonl"
    tokentrace = Path(sys.executable).with_name("tokentrace")
    proc = subprocess.Popen([str(tokentrace), "bench", "--url", srv.url, "--requests", "400", "--concurrency", "2",
                             "--api-key", "k", "--max-tokens", "24", "--ignore-eos", "--otlp-json", str(spans_file),
                             "--shutdown-grace-s", "20"], stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline and (not spans_file.exists() or not spans_file.read_text().strip()):
        time.sleep(0.1)  # the first batch of spans was written: requests are under way
    assert proc.poll() is None
    proc.send_signal(signal.SIGTERM)
    out, _ = proc.communicate(timeout=120)
    assert proc.returncode == 0, out
    (line,) = [ln for ln in out.splitlines() if ln.startswith("bench: stopped on SIGTERM after sending")]
    sent = int(line.split("after sending ")[1].split(" of ")[0])
    assert 0 < sent < 400
    assert "dropped=0" in line and "failed=0" in line
    spans = _client_spans(spans_file)
    assert len(spans) == sent  # every request sent has its span on disk, none cut off
    finished = [next(a["value"]["arrayValue"]["values"][0]["stringValue"] for a in s["attributes"]
                     if a["key"] == "gen_ai.response.finish_reasons") for s in spans]
    assert set(finished) == {"length"}, "requests in flight at the signal finished within the grace"


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

    from analyzer.query.runner import derived_status, install_views

    con = duckdb.connect(str(db), read_only=True)
    try:
        install_views(con)
        assert derived_status(con) == "read"  # the stored tables answer; without them: "none"
    finally:
        con.close()
