"""``tokentrace serve`` with nowhere to send its spans says so in one line at start (not only as
"submitted=0" at stop), naming the flag and the variable that give it one; with a destination it
says nothing of the kind. The real server, as a subprocess on 127.0.0.1."""

from __future__ import annotations

import logging
import os
import queue
import re
import signal
import subprocess
from pathlib import Path

import pytest

from collect_fixtures import TOKENTRACE, stderr_lines
from instrument.otel.tracing import NO_DESTINATION, setup_tracing

START_TIMEOUT_S = 120.0
STOP_TIMEOUT_S = 60.0


def _serve_stderr(tmp_path: Path, *args: str) -> list[str]:
    """Every stderr line of a serve started with ``args`` and no OTEL_EXPORTER_OTLP_* set,
    stopped by SIGTERM once it listens."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("OTEL_EXPORTER_OTLP", "OTEL_TRACES_EXPORTER"))}
    proc = subprocess.Popen([str(TOKENTRACE), "serve", "--model", "tiny", "--port", "0", *args],
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, env=env, cwd=tmp_path)
    lines = stderr_lines(proc)
    seen: list[str] = []
    try:
        while not any(re.search(r" on http://127\.0\.0\.1:\d+ ", line) for line in seen):
            line = lines.get(timeout=START_TIMEOUT_S)
            if line == "":
                raise AssertionError(f"serve exited before listening: {seen}")
            seen.append(line.rstrip("\n"))
        proc.send_signal(signal.SIGTERM)
        proc.wait(timeout=STOP_TIMEOUT_S)
        while (line := lines.get(timeout=STOP_TIMEOUT_S)) != "":
            seen.append(line.rstrip("\n"))
    except queue.Empty:
        raise AssertionError(f"serve did not start or stop in time: {seen}") from None
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    return seen


@pytest.mark.parametrize("engine", ["sequential", "continuous"])
def test_serve_with_no_span_destination_says_so_once_at_start(tmp_path: Path, engine: str) -> None:
    """``continuous``: spans exported by the span exporter process, which does not repeat it."""
    pytest.importorskip("torch")
    pytest.importorskip("fastapi")
    seen = _serve_stderr(tmp_path, "--engine", engine)
    said = [i for i, line in enumerate(seen) if "no span destination" in line]
    listening = next(i for i, line in enumerate(seen) if " on http://127.0.0.1:" in line)
    assert len(said) == 1 and said[0] < listening, seen
    assert seen[said[0]] == NO_DESTINATION
    assert "--otlp-json FILE" in NO_DESTINATION and "OTEL_EXPORTER_OTLP_ENDPOINT" in NO_DESTINATION


def test_serve_with_a_span_file_says_nothing_of_it(tmp_path: Path) -> None:
    pytest.importorskip("torch")
    pytest.importorskip("fastapi")
    seen = _serve_stderr(tmp_path, "--engine", "sequential", "--otlp-json", str(tmp_path / "spans.jsonl"))
    assert not [line for line in seen if "no span destination" in line], seen


def test_setup_tracing_with_no_destination_warns_once(caplog) -> None:
    with caplog.at_level(logging.WARNING, logger="tokentrace.export"):
        setup_tracing("t", exporter="none").shutdown()
    assert [r.getMessage() for r in caplog.records] == [NO_DESTINATION]
    caplog.clear()
    from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

    with caplog.at_level(logging.WARNING, logger="tokentrace.export"):
        setup_tracing("t", exporter="none", span_exporters=[InMemorySpanExporter()]).shutdown()
        setup_tracing("t", exporter="none", say_no_destination=False).shutdown()
    assert not [r for r in caplog.records if "no span destination" in r.getMessage()]
