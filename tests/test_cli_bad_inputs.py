"""Every verb over a table of bad paths and inputs: one line on stderr, a non-zero exit, no
traceback. Each case runs in-process through the click group (as the console script
does); a few run through the real ``tokentrace`` entry point in a subprocess."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import duckdb
import pytest
from click.testing import CliRunner

from analyzer.cli import cli
from data_paths import SAMPLES

TRACES = SAMPLES / "python_sdk_otlp_json_file_exporter.jsonl"
VLLM = SAMPLES / "vllm_benchmark_serving_sharegpt_qps04_llm-k8s.json"
SEED_CSV = Path(__file__).resolve().parents[1] / "analyzer" / "examples" / "request-timeline.csv"
CLOSED_PORT = "http://127.0.0.1:9"  # discard port, nothing listens: connection refused at once


@pytest.fixture(scope="module")
def bad(tmp_path_factory) -> Path:
    """A folder of bad inputs: text that is not a database, an empty file, random bytes, cut
    JSON, a folder, a DuckDB file that is not a tokentrace database, a broken dump."""
    root = tmp_path_factory.mktemp("bad")
    (root / "victim.csv").write_text("a,b\n1,2\n")
    (root / "empty.duckdb").write_bytes(b"")
    (root / "garbage.bin").write_bytes(bytes(range(256)) * 8)
    (root / "cut.json").write_text('{"resourceSpans": [{"scopeSpans": [')
    (root / "config_cut.json").write_text('{"num_hidden_layers": 2, "num_key')
    (root / "array.json").write_text("[1, 2, 3]")
    (root / "emptydir").mkdir()
    con = duckdb.connect(str(root / "other.duckdb"))
    con.execute("CREATE TABLE spans (a INTEGER)")
    con.close()
    (root / "baddump" / "spans").mkdir(parents=True)
    (root / "baddump" / "spans" / "x.parquet").write_bytes(b"PAR1 not really")
    assert CliRunner().invoke(cli, ["load", str(TRACES), "--db", str(root / "ok.duckdb"), "-q"]).exit_code == 0
    return root


# (verb, arguments with {d} for the bad-input folder). Every verb of the CLI has cases here.
CASES: list[tuple[str, str]] = [
    ("tables", "nosuchtable"),
    ("tables", "spans --format xml"),
    ("load", "{d}/missing.json --db {d}/n1.duckdb"),
    ("load", "{d}/emptydir --db {d}/n2.duckdb"),
    ("load", "{d}/garbage.bin --db {d}/n3.duckdb"),
    ("load", "{d}/array.json --db {d}/n4.duckdb"),
    ("load", "{d}/victim.csv --db {d}/n5.duckdb"),
    ("load", "{d}/baddump --db {d}/n6.duckdb"),
    ("load", f"{TRACES} --db {{d}}/victim.csv"),
    ("load", f"{TRACES} --db {{d}}/empty.duckdb"),
    ("load", f"{TRACES} --db {{d}}/no/such/folder/x.duckdb"),
    ("load", f"{TRACES} --db {{d}}/emptydir"),
    ("load", f"{TRACES} --db {{d}}/ok.duckdb --input-format nope"),
    ("load", "--db {d}/other.duckdb"),  # no PATH: rebuild derived tables, but it is no tokentrace database
    ("requests", "--db {d}/victim.csv"),
    ("requests", "--db {d}/empty.duckdb"),
    ("requests", "--db {d}/missing.duckdb"),
    ("requests", "--db {d}/other.duckdb"),
    ("requests", "--db {d}/emptydir"),
    ("requests", "--parquet {d}/missing"),
    ("requests", "--parquet {d}/emptydir"),
    ("requests", "--parquet {d}/baddump"),
    ("requests", "--parquet {d}/ok.duckdb"),
    ("requests", "--db {d}/ok.duckdb --param nope=1"),
    ("requests", "--db {d}/ok.duckdb --trace-id xyz"),
    ("requests", "--db {d}/ok.duckdb --parquet {d}/baddump"),
    ("itl", "--db {d}/garbage.bin"),
    ("itl", "--parquet {d}/baddump --format csv"),
    ("phases", "--db {d}/ok.duckdb --assume-offset foo"),
    ("phases", "--db {d}/ok.duckdb --param tolerance_ms=abc"),
    ("summary", "--db {d}/cut.json"),
    ("window", "--db {d}/ok.duckdb --start-ns 10 --end-ns 5"),
    ("window", "--db {d}/ok.duckdb --mode nope"),
    ("skew", "--db {d}/ok.duckdb --assume-offset x=y"),
    ("skew", "--parquet {d}/baddump"),
    ("steps", "--db {d}/victim.csv"),
    ("steps", "--parquet {d}/baddump --section summary"),
    ("steps", "--db {d}/ok.duckdb --section nope"),
    ("stalls", "--db {d}/garbage.bin"),
    ("stalls", "--db {d}/ok.duckdb --trace-id xyz"),
    ("stalls", "--db {d}/ok.duckdb --per-request -3"),
    ("sql", "--db {d}/ok.duckdb SELEC"),
    ("sql", "--db {d}/victim.csv SELECT"),
    ("export", "--db {d}/ok.duckdb --parquet {d}/victim.csv"),
    ("export", "--db {d}/garbage.bin --parquet {d}/out1"),
    ("export", "--db {d}/missing.duckdb --parquet {d}/out2"),
    ("report", "--db {d}/ok.duckdb --html {d}/no/such/folder/r.html"),
    ("report", "--db {d}/ok.duckdb --html {d}/r1.html --audit {d}/garbage.bin"),
    ("report", "--db {d}/ok.duckdb --html {d}/r2.html --audit {d}/emptydir"),
    ("report", "--db {d}/victim.csv --html {d}/r3.html"),
    ("report", "--db {d}/ok.duckdb --html {d}/r4.html"),  # a database without a request
    ("timeline", "{d}/missing.csv --output-tokens 3"),
    ("timeline", "{d}/garbage.bin --output-tokens 3"),
    ("timeline", "{d}/victim.csv --output-tokens 3"),
    ("timeline", f"{SEED_CSV} --output-tokens 150 --db {{d}}/victim.csv"),
    ("kv", "--model-config {d}/config_cut.json"),
    ("kv", "--model-config {d}/missing.json"),
    ("kv", "--model-config {d}/garbage.bin"),
    ("kv", "--model-config {d}/emptydir"),
    ("kv", "--tokens -1"),
    ("audit", "{d}/missing.json"),
    ("audit", "{d}/garbage.bin"),
    ("audit", "{d}/cut.json"),
    ("audit", f"{VLLM} --db {{d}}/missing.duckdb"),
    ("collect", "--out {d}/victim.csv --max-seconds 0.1"),
    ("collect", "--out {d}/c1 --http nonsense --grpc off --max-seconds 0.1"),
    ("collect", "--out {d}/c2 --grpc 127.0.0.1:99999 --http off --max-seconds 0.1"),
    ("pull", f"--jaeger {CLOSED_PORT} --service x --out {{d}}/p.json --timeout 2"),
    ("pull", "--jaeger nonsense --service x --out {d}/p.json"),
    ("pull", f"--jaeger {CLOSED_PORT} --service x --since 5y --out {{d}}/p.json"),
    ("serve", "--model {d}/missing-model"),
    ("serve", "--model {d}/garbage.bin"),
    ("serve", "--model tiny --decode-spans bogus"),
    ("serve", "--model tiny --host 0.0.0.0"),
    ("serve", "--model tiny --engine sequential --span-export process"),
    ("serve", "--model tiny --keep-gap-ms 200 --span-export inline"),
    ("serve", "--model tiny --keep-slowest 2"),
    ("bench", "--url nonsense --requests 1 --concurrency 1"),
    ("bench", f"--url {CLOSED_PORT} --requests 1 --concurrency 1 --timeout-s 2"),
    ("bench", "--url http://127.0.0.1:9 --requests 1"),
    ("demo", "--out {d}/victim.csv --tiny"),
    ("demo", "--model {d}/missing-model --out {d}/d1"),
    ("compare", "{d}/missing.duckdb {d}/ok.duckdb"),
    ("compare", "{d}/ok.duckdb {d}/victim.csv"),
    ("compare", "{d}/ok.duckdb {d}/baddump"),
    ("compare", "{d}/ok.duckdb {d}/ok.duckdb"),  # no request on either side: no common metric
    ("compare", "{d}/ok.duckdb {d}/ok.duckdb --min-effect -1"),
    ("nosuchverb", ""),
]


def test_every_verb_has_bad_input_cases() -> None:
    assert {verb for verb, _ in CASES} - {"nosuchverb"} == set(cli.commands)


@pytest.mark.parametrize(("verb", "args"), CASES, ids=[f"{v}:{a.split(' ')[0][-24:]}-{i}" for i, (v, a) in enumerate(CASES)])
def test_bad_input_is_one_line_nonzero_and_no_traceback(bad, verb, args) -> None:
    argv = [verb, *[a.replace("{d}", str(bad)) for a in args.split()]]
    before = {p: p.read_bytes() for p in bad.iterdir() if p.is_file()}
    result = CliRunner().invoke(cli, argv)
    err = result.stderr
    assert result.exit_code != 0, (argv, result.output)
    assert isinstance(result.exception, SystemExit), (argv, repr(result.exception))  # nothing else escaped
    assert "Traceback" not in result.output and "Traceback" not in err, (argv, err)
    lines = err.splitlines()
    assert len(lines) == 1 and lines[0].startswith("Error: ") and len(lines[0]) > len("Error: ") + 10, (argv, err)
    after = {p: p.read_bytes() for p in bad.iterdir() if p.is_file()}
    assert after == before, f"{argv} changed a file of the bad-input folder"


def _tokentrace() -> list[str]:
    exe = Path(sys.executable).with_name("tokentrace")
    return [str(exe)] if exe.exists() else [sys.executable, "-c", "from analyzer.cli import main; main()"]


@pytest.mark.parametrize("args", [
    ["load", "{d}/garbage.bin", "--db", "{d}/n9.duckdb"],
    ["requests", "--db", "{d}/victim.csv"],
    ["sql", "SELECT * FROM nosuch", "--db", "{d}/ok.duckdb"],
    ["requests", "--format", "xml"],
])
def test_through_the_console_script(bad, args) -> None:
    argv = [*_tokentrace(), *[a.replace("{d}", str(bad)) for a in args]]
    proc = subprocess.run(argv, capture_output=True, text=True, timeout=120, env={**os.environ, "TOKENTRACE_DEBUG": ""})
    assert proc.returncode != 0
    assert "Traceback" not in proc.stderr and len(proc.stderr.splitlines()) == 1, proc.stderr
    assert proc.stderr.startswith("Error: ")


def test_an_internal_error_is_one_line_and_debug_shows_the_traceback(bad, monkeypatch) -> None:
    import analyzer.cli.requests as verb

    def broken(*_a, **_k):
        raise RuntimeError("a bug\nwith two lines")

    monkeypatch.setattr(verb, "run_verb", broken)
    result = CliRunner().invoke(cli, ["requests", "--db", str(bad / "ok.duckdb")])
    assert result.exit_code == 70
    assert result.stderr == ("Error: internal error in tokentrace requests: RuntimeError: a bug with two lines "
                             "(TOKENTRACE_DEBUG=1 shows the traceback; please report it)\n")
    monkeypatch.setenv("TOKENTRACE_DEBUG", "1")
    result = CliRunner().invoke(cli, ["requests", "--db", str(bad / "ok.duckdb")])
    assert isinstance(result.exception, RuntimeError)


def test_a_closed_pipe_is_not_a_traceback(bad) -> None:
    db = bad / "pipe.duckdb"
    assert CliRunner().invoke(cli, ["load", str(TRACES), "--db", str(db), "-q"]).exit_code == 0
    # `sql ... | head -1`: the reader exits after one line
    cmd = [*_tokentrace(), "sql", "SELECT range AS n FROM range(200000)", "--db", str(db), "--format", "csv"]
    producer = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    assert producer.stdout is not None
    first = producer.stdout.readline()
    producer.stdout.close()
    _, err = producer.communicate(timeout=120)
    assert first == b"n\n"
    assert b"Traceback" not in err and b"BrokenPipe" not in err, err
