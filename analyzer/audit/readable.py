"""Verdicts a reader can trust: a kind never passes a report it could not read, and a run
with no successful request never passes.

:func:`require_kind_keys` refuses a report (AuditInputError, one line: file, kind, the keys
it looked for, the keys the file has, the kind ``auto`` would pick) when it holds none of
the keys the chosen kind's checks read: a guidellm ``benchmarks.json`` forced through
``--kind vllm`` would otherwise yield 0-of-18-keys findings and exit 0.
:func:`successful_requests` is the finding every kind adds for its count of successful
requests: ``fail`` at 0 (every latency and throughput figure of such a run describes no
served request), ``cannot_check`` when the report gives no count.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from pathlib import Path
from typing import Any

from analyzer.audit.claims import CANNOT, FAIL, PASS, Finding
from analyzer.errors import AuditInputError

__all__ = ["KIND_KEYS", "require_kind_keys", "successful_requests"]

_VLLM_STAT = re.compile(r"^(mean|median|std|p\d+(?:\.\d+)?)_(ttft|tpot|itl|e2el)_ms$")
_VLLM_KEYS = ("ttfts", "itls", "output_lens", "completed", "request_throughput", "output_throughput",
              "total_output_tokens")


def _vllm(data: Any) -> bool:
    return isinstance(data, dict) and (any(k in data for k in _VLLM_KEYS) or any(_VLLM_STAT.match(str(k))
                                                                               for k in data))


def _nightly(data: Any) -> bool:
    from analyzer.audit.vllm_nightly import NIGHTLY_COLUMNS

    return isinstance(data, list) and any(isinstance(r, dict) and any(c in r for c in NIGHTLY_COLUMNS)
                                          for r in data)


def _llmperf(data: Any) -> bool:
    return isinstance(data, dict) and any(str(k).startswith("results_") and k != "results_error_code_frequency"
                                          for k in data)


def _claims(data: Any) -> bool:
    from analyzer.audit.claims_file import FIGURES

    return isinstance(data, dict) and (any(data.get(k) is not None for k in FIGURES) or data.get("model") is not None)


def _tokentrace(data: Any) -> bool:
    from analyzer.audit.claims_file import FIGURES

    return isinstance(data, dict) and (any(data.get(k) is not None for k in FIGURES) or "kv_layout" in data)


def _guidellm(data: Any) -> bool:
    return isinstance(data, dict) and isinstance(data.get("benchmarks"), list)


def _aiperf_server_metrics(data: Any) -> bool:
    from analyzer.audit.aiperf_server_metrics import is_aiperf_server_metrics

    return is_aiperf_server_metrics(data)


#: kind -> (what its checks read, said in the error; the test)
KIND_KEYS: dict[str, tuple[str, Callable[[Any], bool]]] = {
    "vllm": (("per-request arrays (ttfts, itls, output_lens), *_ttft_ms / *_tpot_ms / *_itl_ms / *_e2el_ms "
              "statistics, completed or request_throughput"), _vllm),
    "vllm-nightly": ("a JSON list of rows with columns such as 'Tput (req/s)', 'Mean TTFT (ms)'", _nightly),
    "llmperf": ("results_* keys (results_ttft_s_mean, results_num_completed_requests, ...)", _llmperf),
    "claims": ("a figure (ttft_ms, tpot_ms, e2e_ms, ..., kv_bytes_per_token) or a model", _claims),
    "tokentrace": ("a figure (ttft_ms, tpot_ms, ..., window_s) or kv_layout", _tokentrace),
    "aiperf-server-metrics": (("'metrics' and a 'summary' with 'endpoints_configured' (AIPerf's "
                               "server_metrics_export.json)"), _aiperf_server_metrics),
    "guidellm": ("a top-level 'benchmarks' list (guidellm's benchmarks.json)", _guidellm),
}


def _top_keys(data: Any) -> str:
    if isinstance(data, dict):
        keys = list(map(str, data))
        return f"top-level keys: {', '.join(keys[:8])}{' ...' if len(keys) > 8 else ''}" if keys else "an empty object"
    if isinstance(data, list):
        return f"a JSON list of {len(data)} entries"
    return f"a JSON {type(data).__name__}"


def require_kind_keys(kind: str, path: Path, data: Any, detected: str | None) -> None:
    """AuditInputError when ``data`` holds none of the keys ``kind``'s checks read.

    ``detected``: the kind ``auto`` would pick for the file (None: none), named in the error
    so the reader knows what to pass instead. Kinds with their own key checks (aiperf reads
    its metric objects and refuses a file without them) are not in :data:`KIND_KEYS`.
    """
    entry = KIND_KEYS.get(kind)
    if entry is None:
        return
    what, readable = entry
    if readable(data):
        return
    hint = (f"; it looks like a {detected} report: pass --kind {detected} or --kind auto" if detected and
            detected != kind else "")
    raise AuditInputError(f"{path}: not a {kind} report: none of its expected keys ({what}) present "
                          f"({_top_keys(data)}){hint}")


def successful_requests(count: float | None, *, what: str, failed: float | None = None) -> Finding:
    """``successful_requests``: fail when the report counts no successful request (its figures
    then describe nothing served: zeros, or a throughput of tokens the server never produced),
    cannot_check without a count, else pass with the count (and the failed count when given)."""
    numbers = {"successful": count, "failed": failed}
    if count is None:
        return Finding("successful_requests", CANNOT, f"the report gives no count of successful requests ({what})",
                       numbers)
    failed_note = f", {failed:g} failed" if failed is not None else ""
    if count <= 0:
        return Finding("successful_requests", FAIL, f"{what} = {count:g}{failed_note}: no request succeeded, so no "
                       "latency or throughput figure of this report describes a served request", numbers)
    return Finding("successful_requests", PASS, f"{what} = {count:g}{failed_note}", numbers)
