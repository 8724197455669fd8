"""``tokentrace demo --tiny`` end to end: gateway + traced client in one process, OTLP-JSON
files, DuckDB, and the metric queries (a few requests, few tokens)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

pytest.importorskip("fastapi")
pytest.importorskip("torch")

from analyzer.cli import cli


def test_demo_tiny_end_to_end(runner, tmp_path: Path) -> None:
    out = tmp_path / "demo"
    result = runner.invoke(cli, ["demo", "--tiny", "--out", str(out), "--requests", "2", "--concurrency", "2",
                                 "--max-tokens", "6", "--quiet"], catch_exceptions=False)
    assert result.exit_code == 0, result.output
    text = result.output
    assert "3 requests sent, 3 completed" in text
    for title in ("Per-request metrics", "Window summary", "Clock skew check"):
        assert title in text
    assert f"tokentrace requests --db {out / 'traces.duckdb'}" in text
    # The hints run as printed: bare `tokentrace` only when it is on PATH.
    hints = text.split("Query them:\n")[1].splitlines()
    import shlex
    import subprocess

    done = subprocess.run(shlex.split(hints[0]), capture_output=True, text=True, timeout=120)
    assert hints[0].split()[1:] == ["summary", "--db", str(out / "traces.duckdb")]  # the figures people look for
    assert done.returncode == 0 and "TTFT" in done.stdout, done.stderr
    assert hints[1].split()[1:] == ["requests", "--db", str(out / "traces.duckdb")]
    # the answer to the worked example's request is shown on one line, quoted, with no escaped newline in it
    (answer,) = [line for line in text.splitlines() if line.startswith("example request's answer (6 tokens): \"")]
    assert "\\n" not in answer
    assert "Loading weights" not in text
    # The demo ends with the HTML report of its own database.
    page = (out / "report.html").read_text()
    assert f"HTML report   {out / 'report.html'}" in text
    assert ">Request waterfall<" in page and ">Clock skew<" in page
    client_lines = (out / "client-spans.jsonl").read_text().splitlines()
    server_lines = (out / "server-spans.jsonl").read_text().splitlines()
    assert client_lines and server_lines
    names = {s["name"] for line in server_lines for rs in json.loads(line)["resourceSpans"]
             for ss in rs["scopeSpans"] for s in ss["spans"]}
    assert {"gateway", "tokenize", "queue", "prefill", "decode"} <= names

    # The database the demo wrote answers the query verbs: 3 requests x (client, server).
    rows = runner.invoke(cli, ["requests", "--db", str(out / "traces.duckdb"), "--format", "json"],
                         catch_exceptions=False)
    assert rows.exit_code == 0, rows.output
    metrics = json.loads(rows.output)
    assert sorted(m["perspective"] for m in metrics) == ["client"] * 3 + ["server"] * 3
    assert all(m["ttft_ms"] is not None and m["ttft_ms"] > 0 for m in metrics)
    seed = [m for m in metrics if m["perspective"] == "client"][0]
    assert seed["output_tokens"] == 6 and seed["finish_reason"] == "length"


def test_demo_rejects_contradicting_model_flags(runner, tmp_path: Path) -> None:
    result = runner.invoke(cli, ["demo", "--tiny", "--model", "smollm2", "--out", str(tmp_path)])
    assert result.exit_code == 1 and "contradict" in result.output


def test_demo_says_each_step_with_its_elapsed_time(runner, tmp_path: Path) -> None:
    import re

    out = tmp_path / "steps"
    result = runner.invoke(cli, ["demo", "--tiny", "--out", str(out), "--requests", "1", "--max-tokens", "4"],
                           catch_exceptions=False)
    assert result.exit_code == 0, result.output
    lines = result.stderr.splitlines()
    steps = [line for line in lines if line.startswith("[demo ")]
    assert all(re.match(r"^\[demo \d+:\d\d\] \S", line) for line in steps), steps
    # a step wider than the terminal (80 here) goes on indented lines below it; a path is not cut
    ours = [line for line in lines if line.startswith(("[demo ", " " * 12))]
    assert all(len(line) <= 80 or " " not in line.strip() for line in ours), ours
    said = re.sub(r"\n {12,}", " ", "\n".join(ours))
    for words in ("starting: model tiny, 2 requests", "importing torch and transformers; loading the tiny random model",
                  "serving tokentrace/", "sending the example request, then 1 more", "sent 2 requests, 2 completed",
                  f"loading the spans into {out / 'traces.duckdb'}", "writing", "done"):
        assert words in said, (words, said)
    minutes = [int(line[6:].split(":")[0]) * 60 + int(line.split(":")[1][:2]) for line in steps]
    assert minutes == sorted(minutes)  # elapsed time never goes back


def test_model_step_says_when_smollm2_is_converted_once(tmp_path: Path, monkeypatch) -> None:
    from analyzer.verbs.demo import model_step

    monkeypatch.setenv("TOKENTRACE_CACHE_DIR", str(tmp_path))
    assert model_step("smollm2").startswith("converting SmolLM2-135M-Instruct from its GGUF file, once, into ")
    copy = tmp_path / "smollm2-135m-instruct"
    copy.mkdir()
    (copy / "config.json").write_text("{}")
    (copy / "tokenizer.json").write_text("{}")
    assert model_step("smollm2") == f"loading SmolLM2-135M-Instruct (converted copy in {copy})"


def test_a_long_hint_command_is_continued_and_runs_as_pasted() -> None:
    """Hint commands wider than the terminal go on `` \\``-continued lines, cut at spaces:
    every line fits, and bash reads the same words back."""
    import subprocess

    from analyzer.cli.demo import _command

    line = ("  OTEL_EXPORTER_OTLP_ENDPOINT=http://localhost:4318 .venv/bin/tokentrace demo --out "
            "/some/rather/long/folder/of/the/user/tokentrace-demo")
    shown = _command(line, 80)
    assert shown.count("\n") >= 1 and all(len(part) <= 80 for part in shown.splitlines()), shown
    words = subprocess.run(["bash", "-c", "printf '%s\\n' " + shown], capture_output=True, text=True, check=True)
    assert words.stdout.split("\n")[:-1] == line.split()
    assert _command("  short --db x", 80) == "  short --db x"


def test_the_demos_skew_table_names_clocks_whole(runner, tmp_path: Path) -> None:
    """The demo's clock-skew table shows each clock by its service name (no cut instance id)
    and spells the full clock domain out below."""
    out = tmp_path / "demo"
    result = runner.invoke(cli, ["demo", "--tiny", "--out", str(out), "--requests", "1", "--max-tokens", "4",
                                 "--quiet"], catch_exceptions=False, env={"COLUMNS": "80"})
    assert result.exit_code == 0, result.output
    block = result.output.split("Clock skew check")[1].split("Files:")[0]
    (row,) = [line for line in block.splitlines() if line.startswith("tokentrace-client ")]
    assert row.split()[:2] == ["tokentrace-client", "tokentrace-gateway"] and "…" not in row, block
    assert "note: clock tokentrace-client:" in block
