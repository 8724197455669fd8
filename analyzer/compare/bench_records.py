"""A benchmark report's per-request records as one side of a comparison, so a run without
traces still gets intervals: AIPerf's ``profile_export.jsonl`` and vLLM's bench JSON saved
with its per-request arrays (``ttfts``, ``itls``, ``latencies``, ``start_times``, ...).

The figures are the tool's own per request, read as they are (docs/compare.md): TTFT, E2E
(AIPerf request_latency, vLLM latencies), TPOT (AIPerf inter_token_latency; vLLM (latency -
TTFT) / (output length - 1), its own formula), every inter-chunk gap, token counts. The
request output rate is output tokens / E2E (metrics.md's whole-request rate). A record with
an error counts as failed, its latencies not counted. The records are the client's view:
perspective client. Queue and prefill are not known.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np

from analyzer.compare.run_data import RunData
from analyzer.errors import AuditInputError, UserError

__all__ = ["read_benchmark_run"]


def _is_aiperf_records(path: Path) -> bool:
    if path.suffix != ".jsonl" or not path.is_file():
        return False
    with path.open(encoding="utf-8", errors="replace") as f:
        for line in f:
            if line.strip():
                try:
                    first = json.loads(line)
                except json.JSONDecodeError:
                    return False
                return isinstance(first, dict) and "metrics" in first and "metadata" in first
    return False


def _vllm_report(path: Path) -> dict[str, Any] | None:
    if path.suffix != ".json" or not path.is_file():
        return None
    try:
        data = json.loads(path.read_text())
    except (json.JSONDecodeError, UnicodeDecodeError):
        return None
    if isinstance(data, dict) and "ttfts" in data and "latencies" in data and "itls" in data:
        return data
    return None


def _run(label: str, starts_ns: list[int], ends_ns: list[int], failed: list[bool], ttft: list[float | None],
         e2e: list[float | None], tpot: list[float | None], input_tokens: list[float | None],
         output_tokens: list[float | None], gaps: list[list[float]], models: tuple[str, ...]) -> RunData:
    def floats(values: list[float | None]) -> np.ndarray:
        return np.array([np.nan if v is None else float(v) for v in values], dtype=float)

    failed_arr = np.array(failed, dtype=bool)
    ttft_arr, e2e_arr, tpot_arr = (np.where(failed_arr, np.nan, floats(v)) for v in (ttft, e2e, tpot))
    out_arr = floats(output_tokens)
    with np.errstate(invalid="ignore", divide="ignore"):
        rate = np.where(e2e_arr > 0, out_arr / (e2e_arr / 1000.0), np.nan)
    owner = [i for i, request_gaps in enumerate(gaps) if not failed[i] for _ in request_gaps]
    values = [g for i, request_gaps in enumerate(gaps) if not failed[i] for g in request_gaps]
    n = len(starts_ns)
    return RunData(
        label=label, perspective="client", s_ns=np.array(starts_ns, dtype=np.int64),
        end_ns=np.array(ends_ns, dtype=np.int64), input_tokens=floats(input_tokens), output_tokens=out_arr,
        succeeded=~failed_arr, failed=failed_arr, meets_slo=np.zeros(n, dtype=bool), ttft_ms=ttft_arr,
        tpot_ms=tpot_arr, e2e_ms=e2e_arr, output_tokens_per_s=rate, queue_ms=np.full(n, np.nan),
        prefill_ms=np.full(n, np.nan), gap_ms=np.array(values, dtype=float),
        gap_request=np.array(owner, dtype=np.int64), slo_known=False, models=models,
        notes=[f"{label}: a benchmark report's records (the client's figures): queue and prefill not known"],
    )


def _aiperf_run(path: Path, label: str) -> RunData:
    from analyzer.audit.aiperf_records import read_aiperf_records

    records = read_aiperf_records(path)
    starts, ends, failed = [], [], []
    cols = {name: [r[i] for r in records.rows] for i, name in enumerate(
        ("record_index", "error_code", "ttft_ms", "request_latency_ms", "output_sequence_length",
         "output_token_count", "reasoning_token_count", "inter_token_latency_ms"))}
    for i, row in enumerate(records.rows):
        start, latency = row[13], row[3]
        if start is None:
            raise UserError(f"{path}:{i + 1}: record without a request start (metadata.request_start_ns)")
        end = records.request_end_ns[i] or row[14] or (start + round(latency * 1e6) if latency is not None else start)
        starts.append(int(start))
        ends.append(int(end))
        failed.append(row[1] is not None)
    return _run(label, starts, ends, failed, cols["ttft_ms"], cols["request_latency_ms"],
                cols["inter_token_latency_ms"], records.input_sequence_lengths, cols["output_sequence_length"],
                records.chunk_gaps_ms, ())


def _vllm_run(path: Path, data: dict[str, Any], label: str) -> RunData:
    n = len(data["ttfts"])
    for key in ("itls", "latencies", "start_times", "output_lens"):
        if not isinstance(data.get(key), list) or len(data[key]) != n:
            raise UserError(f"{path}: key {key!r} is not a list of {n} entries (one per request, as 'ttfts')")
    errors: Any = data.get("errors") if isinstance(data.get("errors"), list) and len(data["errors"]) == n else [""] * n
    inputs: Any = data.get("input_lens") if isinstance(data.get("input_lens"), list) and len(data["input_lens"]) == n \
        else [None] * n

    def number(value: Any, where: str) -> float:
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise UserError(f"{path}: {where} is {value!r}, expected a number")
        return float(value)

    starts: list[int] = []
    ends: list[int] = []
    failed: list[bool] = []
    ttft: list[float | None] = []
    e2e: list[float | None] = []
    tpot: list[float | None] = []
    gaps: list[list[float]] = []
    for i in range(n):
        start_s = number(data["start_times"][i], f"start_times[{i}]")
        latency_s = number(data["latencies"][i], f"latencies[{i}]")
        first_s = number(data["ttfts"][i], f"ttfts[{i}]")
        out = number(data["output_lens"][i], f"output_lens[{i}]")
        if not isinstance(data["itls"][i], list):
            raise UserError(f"{path}: itls[{i}] is not a list")
        starts.append(round(start_s * 1e9))
        ends.append(round((start_s + latency_s) * 1e9))
        failed.append(bool(errors[i]))
        ttft.append(first_s * 1000.0)
        e2e.append(latency_s * 1000.0)
        tpot.append((latency_s - first_s) * 1000.0 / (out - 1) if out > 1 else None)  # vLLM's own TPOT
        gaps.append([number(g, f"itls[{i}][{j}]") * 1000.0 for j, g in enumerate(data["itls"][i])])
    model = data.get("model_id")
    return _run(label, starts, ends, failed, ttft, e2e, tpot, list(inputs), [float(v) for v in data["output_lens"]],
                gaps, (str(model),) if model else ())


def read_benchmark_run(path: str, label: str) -> RunData | None:
    """``path`` as one side when it is a benchmark report with per-request records; None
    when it is something else (a database, a dump folder)."""
    target = Path(path)
    try:
        if _is_aiperf_records(target):
            return _aiperf_run(target, label)
    except AuditInputError as exc:
        raise UserError(f"{label}: {exc}") from None
    data = _vllm_report(target)
    return _vllm_run(target, data, label) if data is not None else None
