"""Dispatch: which kind of report a file is, and the audit of one report."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from analyzer.audit.claims import Finding
from analyzer.audit.compare import DEFAULT_REL_TOL
from analyzer.audit.inputs import read_json
from analyzer.db.store import connect
from analyzer.errors import AuditInputError

__all__ = ["KINDS", "audit_report", "detect_kind"]

KINDS = ("auto", "vllm", "vllm-nightly", "aiperf", "aiperf-server-metrics", "llmperf", "guidellm", "prometheus",
         "claims", "tokentrace")


def _looks_like(data: Any) -> str | None:
    if isinstance(data, list) and data and isinstance(data[0], dict) and "Test name" in data[0]:
        return "vllm-nightly"
    if not isinstance(data, dict):
        return None
    if isinstance(data.get("benchmarks"), list):  # guidellm (metadata + benchmarks from 0.8 on)
        return "guidellm"
    from analyzer.audit.aiperf_server_metrics import is_aiperf_server_metrics

    if is_aiperf_server_metrics(data):
        return "aiperf-server-metrics"
    if "ttfts" in data or "mean_ttft_ms" in data or ("request_throughput" in data and "duration" in data):
        return "vllm"
    if "schema_version" in data and "aiperf_version" in data or isinstance(data.get("records"), dict):
        return "aiperf"
    if "time_to_first_token" in data and isinstance(data.get("time_to_first_token"), dict):
        return "aiperf"
    if any(str(k).startswith("results_ttft_s") for k in data):
        return "llmperf"
    if "scope" in data and ("ttft_ms" in data or "kv_bytes_per_token" in data):
        return "tokentrace"
    return None


def _first_json_line(path: Path) -> Any:
    """The first line of a file parsed as JSON, or None (unreadable, empty, not JSON)."""
    try:
        with path.open("rb") as f:
            line = f.readline(1 << 20)
        return json.loads(line)
    except (OSError, ValueError):
        return None


def _is_trace_document(doc: Any) -> bool:
    """An OTLP traces document (optionally Jaeger api_v3-wrapped) or a Jaeger trace document."""
    if isinstance(doc, dict) and isinstance(doc.get("result"), dict):
        doc = doc["result"]
    if isinstance(doc, dict) and ("resourceSpans" in doc or "resource_spans" in doc):
        return True
    data = doc.get("data") if isinstance(doc, dict) else None
    return isinstance(data, list) and bool(data) and isinstance(data[0], dict) and "spans" in data[0] \
        and "traceID" in data[0]


def _trace_file_error(path: Path) -> AuditInputError:
    return AuditInputError(f"{path}: a trace file (spans), not a latency report: load it with tokentrace load "
                           f"{path} --db traces.duckdb, then audit a report against those traces with "
                           "tokentrace audit REPORT --db traces.duckdb")


def refuse_per_request_file(path: Path) -> None:
    """AuditInputError naming the report a per-request records file belongs with and the flag
    (--individual), for AIPerf's profile_export.jsonl and LLMPerf's *_individual_responses.json
    given as the report; and naming a trace file (OTLP JSON lines, Jaeger JSON) as one."""
    first = _first_json_line(path)
    if _is_trace_document(first):
        raise _trace_file_error(path)
    if isinstance(first, dict) and isinstance(first.get("metadata"), dict) and isinstance(first.get("metrics"), dict):
        beside = path.with_name("profile_export_aiperf.json")
        summary = str(beside) if beside.is_file() else "profile_export_aiperf.json (the summary AIPerf wrote beside it)"
        raise AuditInputError(f"{path}: AIPerf's per-request records (profile_export.jsonl), not a report: audit "
                              f"its summary with them, tokentrace audit {summary} --individual {path}")
    data = None
    if path.suffix.lower() == ".json":
        try:
            data = json.loads(path.read_text())
        except (OSError, ValueError):
            return
    if _is_trace_document(data):
        raise _trace_file_error(path)
    if isinstance(data, list) and data and isinstance(data[0], dict) and \
            {"end_to_end_latency_s", "ttft_s"} <= set(data[0]):
        name = path.name
        summary_name = (name[: -len("_individual_responses.json")] + "_summary.json"
                        if name.endswith("_individual_responses.json") else "<prefix>_summary.json")
        beside = path.with_name(summary_name)
        summary = str(beside) if beside.is_file() else f"{summary_name} (LLMPerf's summary of the same run)"
        raise AuditInputError(f"{path}: LLMPerf's per-request responses, not a report: audit its summary with them, "
                              f"tokentrace audit {summary} --individual {path}")


def detect_kind(path: str | Path) -> str:
    """The report kind of a file, from its suffix and keys; AuditInputError when unknown."""
    path = Path(path)
    if path.suffix.lower() in (".yaml", ".yml"):
        from analyzer.audit.guidellm_report import is_guidellm_report, read_report_file

        # guidellm writes a YAML twin of its benchmarks.json: told by its top-level keys
        return "guidellm" if is_guidellm_report(read_report_file(path)) else "claims"
    if path.is_file():
        from analyzer.audit.prom_text import looks_like_prometheus_text

        if looks_like_prometheus_text(path):
            return "prometheus"
        refuse_per_request_file(path)
    data = read_json(path)
    kind = _looks_like(data)
    if kind is not None:
        return kind
    if _is_trace_document(data):
        raise _trace_file_error(path)
    if isinstance(data, dict):
        from analyzer.audit.claims_file import FIGURES

        if any(k in data for k in FIGURES):
            return "claims"
        shown = ", ".join(list(map(str, data))[:8])
        raise AuditInputError(f"{path}: unknown report shape (top-level keys: {shown}); pass --kind, one of "
                              f"{', '.join(KINDS[1:])}")
    raise AuditInputError(f"{path}: unknown report shape (a JSON {type(data).__name__}); pass --kind, one of "
                          f"{', '.join(KINDS[1:])}")


def _require_forced_kind(kind: str, path: Path) -> None:
    """A forced ``--kind`` must find the keys its checks read (AuditInputError otherwise,
    naming the kind ``auto`` would pick): never a verdict on a report it could not read."""
    from analyzer.audit.readable import require_kind_keys

    if kind == "guidellm":
        from analyzer.audit.guidellm_report import read_report_file

        data = read_report_file(path)
    else:
        data = read_json(path)
    detected = _looks_like(data)
    require_kind_keys(kind, path, data, detected)


def audit_report(
    path: str | Path,
    kind: str = "auto",
    *,
    individual: str | Path | None = None,
    db: str | Path | None = None,
    model_config: str | Path | None = None,
    rel_tol: float = DEFAULT_REL_TOL,
    baseline: str | Path | None = None,
) -> list[Finding]:
    """Run every check for one report and return the findings (one per check).

    ``individual``: per-request records (LLMPerf individual responses, AIPerf
    profile_export.jsonl, or the vLLM JSON behind a nightly table). ``db``: a tokentrace
    DuckDB database whose traces the claims are recomputed from. ``baseline``: for a
    Prometheus scrape, the scrape taken before the run (the window is their difference).
    """
    if kind not in KINDS:
        raise AuditInputError(f"unknown report kind {kind!r}; kinds: {', '.join(KINDS)}")
    path = Path(path)
    if kind == "auto":
        kind = detect_kind(path)
    elif kind != "prometheus":  # a scrape is text: its reader names what it lacks
        if kind in ("aiperf", "llmperf", "vllm") and path.is_file():
            refuse_per_request_file(path)
        if kind not in ("claims", "aiperf"):
            _require_forced_kind(kind, path)
    if baseline is not None and kind != "prometheus":
        raise AuditInputError(f"--baseline {baseline}: only for a Prometheus scrape (--kind prometheus); {path} is a "
                              f"{kind} report")
    con = connect(None)
    try:
        if kind == "prometheus":
            from analyzer.audit.server_histograms import audit_server_histograms

            return audit_server_histograms(path, None if baseline is None else Path(baseline), con, db, individual)
        if kind == "claims" or kind == "tokentrace":
            from analyzer.audit.claim_checks import check_claims
            from analyzer.audit.claims_file import read_claims_file, read_tokentrace_artifact

            if kind == "claims":
                claims = read_claims_file(path, model_config)
            else:
                data = read_json(path)
                if not isinstance(data, dict):
                    raise AuditInputError(f"{path}: a tokentrace artifact is a JSON object (tokentrace timeline --json)")
                claims = read_tokentrace_artifact(path, data, model_config)
            findings = check_claims(claims, con, rel_tol)
            if db is not None:
                from analyzer.audit.traces import check_claims_against_traces

                findings += check_claims_against_traces(claims, db, rel_tol)
            return findings
        if kind == "aiperf-server-metrics":
            from analyzer.audit.aiperf_server_metrics import audit_aiperf_server_metrics

            return audit_aiperf_server_metrics(path, read_json(path), con, db, individual)
        if kind == "guidellm":
            from analyzer.audit.guidellm import audit_guidellm
            from analyzer.audit.guidellm_report import read_report_file

            if individual is not None:
                raise AuditInputError(f"--individual {individual}: a guidellm report carries its per-request "
                                      "records itself (benchmarks[].requests); give the report alone")
            return audit_guidellm(path, read_report_file(path), con, rel_tol, db)
        if kind == "vllm":
            from analyzer.audit.vllm import audit_vllm

            return audit_vllm(path, read_json(path), con, rel_tol, db)
        elif kind == "vllm-nightly":
            from analyzer.audit.vllm_nightly import audit_vllm_nightly

            findings = audit_vllm_nightly(path, read_json(path), con, rel_tol, individual)
        elif kind == "aiperf":
            from analyzer.audit.aiperf import audit_aiperf

            return audit_aiperf(path, read_json(path), con, rel_tol, individual, db)
        else:
            from analyzer.audit.llmperf import audit_llmperf

            findings = audit_llmperf(path, read_json(path), con, rel_tol, individual)
        if db is not None:
            findings.append(Finding("traces", "cannot_check", f"--db compares claims files, tokentrace artifacts, "
                                    f"and vLLM / AIPerf reports request by request; a {kind} report names no request "
                                    "of the traces (no request id)", {}))
        return findings
    finally:
        con.close()
