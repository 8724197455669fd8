"""SIGTERM stops ``tokentrace demo`` like SIGINT: nothing more is sent, the requests in flight
finish within the grace, both OTLP-JSON span files are flushed, and one line gives the counts.

A real subprocess (the demo serves the tiny model on 127.0.0.1 in its own process); the span
files are written by the SDK's batch processor, so at the signal most spans are still queued.
"""

from __future__ import annotations

import json
import re
import signal
import subprocess
import time
from pathlib import Path

import httpx
import pytest

from collect_fixtures import TOKENTRACE, stderr_lines

pytest.importorskip("torch")
pytest.importorskip("fastapi")

START_TIMEOUT_S = 180.0
PLANNED = 60  # load requests after the worked example's: far more than are sent before the signal


def _spans(path: Path) -> list[dict]:
    spans = []
    for line in path.read_text(encoding="utf-8").splitlines():
        doc = json.loads(line)
        spans.extend(sp for rs in doc["resourceSpans"] for ss in rs["scopeSpans"] for sp in ss["spans"])
    return spans


def _answered(url: str) -> int:
    """Requests the demo's gateway has answered (its /metrics request-duration count)."""
    text = httpx.get(url + "/metrics", timeout=30).text
    return int(sum(float(line.rsplit(" ", 1)[1]) for line in text.splitlines()
                   if line.startswith("gen_ai_server_request_duration_seconds_count")))


@pytest.mark.timing  # bounded waits; the grace (30 s) must cover the two requests in flight
def test_sigterm_while_sending_flushes_both_span_files(tmp_path: Path) -> None:
    out = tmp_path / "demo"
    proc = subprocess.Popen(
        [str(TOKENTRACE), "demo", "--tiny", "--out", str(out), "--requests", str(PLANNED), "--concurrency", "2",
         "--max-tokens", "24", "--shutdown-grace-s", "30"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    lines = stderr_lines(proc)
    stderr: list[str] = []
    try:
        deadline = time.monotonic() + START_TIMEOUT_S
        while not any("sending the example request" in line for line in stderr):
            line = lines.get(timeout=max(0.1, deadline - time.monotonic()))
            assert line != "", f"demo exited before sending: {''.join(stderr)}"
            stderr.append(line)
        (url,) = {m.group(1) for line in stderr for m in [re.search(r" at (http://127\.0\.0\.1:\d+) ", line)] if m}
        # the worked example's request and one load request answered: the load is under way, two requests in flight,
        # their spans still queued (waiting for that, not sleeping: a busy machine is slower)
        while _answered(url) < 2:
            assert time.monotonic() < deadline and proc.poll() is None, f"no load answered: {''.join(stderr)}"
            time.sleep(0.02)
        proc.send_signal(signal.SIGTERM)
        proc.wait(timeout=90)
    finally:
        if proc.poll() is None:
            proc.kill()
    while (line := lines.get(timeout=10)) != "":
        stderr.append(line)
    assert proc.returncode == 128 + signal.SIGTERM, "".join(stderr)
    assert not any("Traceback" in line for line in stderr), "".join(stderr)
    stopped = [line for line in stderr if "stopped on SIGTERM" in line]
    assert len(stopped) == 1, "".join(stderr)
    found = re.search(r"after sending (\d+) of (\d+) requests; spans submitted=(\d+) exported=(\d+) failed=(\d+) "
                      r"dropped=(\d+)", stopped[0])
    assert found, stopped[0]
    sent, total, submitted, exported, failed, dropped = map(int, found.groups())
    assert total == PLANNED + 1 and 2 <= sent < total
    assert (failed, dropped) == (0, 0) and exported == submitted
    client, server = _spans(out / "client-spans.jsonl"), _spans(out / "server-spans.jsonl")
    assert len(client) + len(server) == exported  # every span counted is in a file
    roots = [sp for sp in client if not sp.get("parentSpanId")]
    assert len(roots) == sent  # one client request span per request sent, none after the signal
    gateway = {sp["traceId"] for sp in server if sp["name"] == "gateway"}
    ok = [sp for sp in roots
          if any(a["key"] == "http.response.status_code" and a["value"].get("intValue") in (200, "200")
                 for a in sp.get("attributes", []))]
    assert ok and {sp["traceId"] for sp in ok} <= gateway  # each answered request's server trace is complete
    assert not (out / "traces.duckdb").exists()  # stopped before the load
    assert "tokentrace load" in stopped[0]
