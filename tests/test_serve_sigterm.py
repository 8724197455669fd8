"""SIGTERM stops ``tokentrace serve`` like SIGINT: in-flight requests finish within the grace,
every span reaches a real ``tokentrace collect``, and one line says what was exported.

Both are real subprocesses on 127.0.0.1 (ephemeral ports); the serve process exports over
OTLP/HTTP with the SDK's batch processor (5 s schedule delay), so at the signal most spans
are still queued: before the fix, uvicorn re-raised SIGTERM and the process died with them.
"""

from __future__ import annotations

import asyncio
import json
import os
import queue
import re
import signal
import subprocess
import threading
from pathlib import Path

import httpx
import pytest

from collect_fixtures import TOKENTRACE, start_collect, stderr_lines

pytest.importorskip("torch")
pytest.importorskip("fastapi")

START_TIMEOUT_S = 120.0
BURST = 6


def _spans_on_disk(out_dir: Path) -> list[dict]:
    spans = []
    for path in sorted(out_dir.iterdir()):
        for line in path.read_text(encoding="utf-8").splitlines():
            doc = json.loads(line)
            spans.extend(sp for rs in doc["resourceSpans"] for ss in rs["scopeSpans"] for sp in ss["spans"])
    return spans


def _start_serve(http_port: int, *args: str) -> tuple[subprocess.Popen, str, queue.Queue[str], str]:
    """The serve process, its URL, its stderr lines to come, and the line saying it listens."""
    env = dict(os.environ, OTEL_EXPORTER_OTLP_ENDPOINT=f"http://127.0.0.1:{http_port}",
               OTEL_EXPORTER_OTLP_PROTOCOL="http/protobuf")
    proc = subprocess.Popen([str(TOKENTRACE), "serve", "--model", "tiny", "--port", "0", *args],
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, env=env)
    lines = stderr_lines(proc)
    while True:
        try:
            line = lines.get(timeout=START_TIMEOUT_S)
        except queue.Empty:
            proc.kill()
            raise AssertionError("serve did not start listening in time") from None
        found = re.search(r" on (http://127\.0\.0\.1:\d+) ", line)
        if found:
            return proc, found.group(1), lines, line
        if line == "":
            raise AssertionError("serve exited before listening")


@pytest.mark.parametrize("engine", ["continuous-inline", "sequential", "continuous"])
def test_sigterm_mid_burst_finishes_requests_and_exports_every_span(tmp_path: Path, engine: str) -> None:
    """``continuous``: the default --span-export process, every span (the engine's from step
    records, the gateway's forwarded) flushed by the span exporter process, whose counts the
    shutdown line gives; ``continuous-inline``: --span-export inline, all in the serving process."""
    out = tmp_path / "traces"
    collect, _grpc, http_port = start_collect(out)
    try:
        _sigterm_mid_burst(collect, http_port, out, engine)
    finally:  # never leave a receiver running after a failed assertion
        if collect.poll() is None:
            collect.kill()


def _sigterm_mid_burst(collect: subprocess.Popen, http_port: int, out: Path, engine: str) -> None:
    extra = ("--span-export", "inline") if engine.endswith("-inline") else ()
    serve, url, lines, listening = _start_serve(http_port, "--engine", engine.removesuffix("-inline"), "--shutdown-grace-s", "20",
                                     *extra)
    assert f"span export {'process' if engine == 'continuous' else 'inline'})" in listening, listening
    body = {"model": "tiny", "messages": [{"role": "user", "content": "hello"}], "max_tokens": 40, "stream": True,
            "stream_options": {"include_usage": True}}
    first_chunks = threading.Semaphore(0)
    accepted = threading.Semaphore(0)  # response headers received: the server holds the request

    async def one(http: httpx.AsyncClient) -> tuple[int, str | None]:
        finish = None
        async with http.stream("POST", url + "/v1/chat/completions", json=body) as response:
            accepted.release()
            seen = False
            async for line in response.aiter_lines():
                if line.startswith("data: {"):
                    if not seen:
                        seen = True
                        first_chunks.release()
                    choices = json.loads(line[6:]).get("choices") or []
                    if choices and choices[0].get("finish_reason"):
                        finish = choices[0]["finish_reason"]
            return response.status_code, finish

    async def burst() -> list[tuple[int, str | None]]:
        async with httpx.AsyncClient(timeout=120.0, limits=httpx.Limits(max_connections=BURST)) as http:
            return await asyncio.gather(*(one(http) for _ in range(BURST)))

    results: list = []
    sender = threading.Thread(target=lambda: results.extend(asyncio.run(burst())), daemon=True)
    sender.start()
    try:
        # every request of the burst reached the server (on a busy box the last ones can still be
        # connecting when the first chunk arrives: a request sent after SIGTERM is not in flight)
        assert all(accepted.acquire(timeout=60) for _ in range(BURST)), "the burst did not reach the server"
        assert first_chunks.acquire(timeout=60), "no request started streaming"
        serve.send_signal(signal.SIGTERM)  # mid-burst: requests are still streaming
        sender.join(timeout=120)
        assert serve.wait(timeout=120) == 0
    finally:
        if serve.poll() is None:
            serve.kill()
    tail = []
    while True:
        line = lines.get(timeout=10)
        if line == "":
            break
        tail.append(line)
    # in-flight requests finished within the grace instead of being cut off
    assert len(results) == BURST and all(code == 200 and finish in ("stop", "length") for code, finish in results), results
    (stopped,) = [ln for ln in tail if ln.startswith("tokentrace serve: stopped on SIGTERM")]
    counts = re.search(r"submitted=(\d+) exported=(\d+) failed=(\d+) dropped=(\d+)", stopped)
    assert counts, stopped
    submitted, exported, failed, dropped = map(int, counts.groups())
    assert submitted > 0 and exported == submitted and failed == dropped == 0, stopped

    collect.send_signal(signal.SIGTERM)
    assert collect.wait(timeout=30) == 0
    spans = _spans_on_disk(out)
    assert len(spans) == exported
    gateway = [s for s in spans if s["name"] == "gateway"]
    decode = [s for s in spans if s["name"] == "decode"]
    assert len(gateway) == BURST
    generated = [next(a["value"]["intValue"] for a in g["attributes"] if a["key"] == "tokentrace.generated_tokens")
                 for g in gateway]
    assert len(decode) == sum(int(g) - 1 for g in generated)  # G - 1 decode spans per request
    if engine == "continuous":  # every span came through the exporter process, and it is gone
        assert len({s["name"] for s in spans} & {"engine_step", "engine", "prefill"}) == 3
        assert "exporter-process:" in stopped and stopped.count(" [exporter-process:") == 1, stopped
        assert stopped.count("/") == 1, f"one exporter row, none in the serving process: {stopped}"
    else:  # inline (and sequential): no exporter process at all
        assert "exporter-process" not in stopped, stopped
