"""The report's table headers: a human label with its unit for each SQL column it shows.

The label is what a person reads (``window_start_ns`` -> "window start (UTC)", ``ttft_ms`` ->
"TTFT (ms)"); the SQL name stays in the header's tooltip, so a column can still be found in
``--format csv`` / ``json`` (which keep the query's names). Only the headers change: the
values are the query's, formatted as :func:`analyzer.report.build._fmt` always did. A column
missing here still reads as words, with the unit its name's suffix implies (:func:`label`),
and tests/test_report.py fails until it is added.
"""

from __future__ import annotations

__all__ = ["LABELS", "METRIC_LABELS", "label", "metric_label"]

LABELS: dict[str, str] = {
    # queries/window.sql (the run summary)
    "mode": "window mode",
    "perspective": "perspective",
    "window_start_ns": "window start (UTC)",
    "window_end_ns": "window end (UTC)",
    "window_s": "window length (s)",
    "attempted": "attempted (requests)",
    "succeeded": "succeeded (requests)",
    "failed": "failed (requests)",
    "cancelled": "cancelled (requests)",
    "slo_passing": "meeting every SLO (requests)",
    "not_finished_in_window": "not finished in the window (requests)",
    "requests_crossing_boundary": "crossing a window bound (requests)",
    "request_throughput_rps": "request throughput (req/s)",
    "observed_goodput_rps": "goodput (req/s)",
    "error_rate": "error rate (fraction)",
    "output_tokens": "output tokens",
    "output_tokens_per_s": "output throughput (tokens/s)",
    "slo_ttft_ms": "TTFT SLO (ms)",
    "slo_tpot_ms": "TPOT SLO (ms per token)",
    "slo_e2e_ms": "E2E SLO (ms)",
    "prefix_cache_hit_share": "prompt tokens from the prefix cache (fraction)",
    "prefix_cache_hit_requests": "requests with a prefix-cache hit",
    "prefix_cache_note": "prefix cache: why no share",
    # queries/summary.sql (distributions; each row's unit is in its metric cell)
    "metric": "metric (unit)",
    "count": "values",
    "null_count": "empty values",
    "mean": "mean",
    "std_pop": "std dev",
    "min": "min",
    "p50": "p50",
    "p90": "p90",
    "p95": "p95",
    "p99": "p99",
    "max": "max",
    "null_reason": "why empty",
    # queries/requests.sql (the waterfall's request)
    "response_id": "response id",
    "client_request_id": "client request id (X-Request-ID)",
    "trace_id": "trace id",
    "request_span_id": "request span id",
    "input_tokens": "input tokens",
    "finish_reason": "finish reason",
    "status_code": "span status",
    "ttft_ms": "TTFT (ms)",
    "e2e_ms": "E2E (ms)",
    "tpot_ms": "TPOT (ms per token)",
    "decode_output_tokens_per_second": "decode output rate (tokens/s)",
    "whole_request_output_tokens_per_second": "whole-request output rate (tokens/s)",
    "prompt_kv_mib": "KV after the prompt (MiB)",
    "stop_kv_mib": "KV at the stop (MiB)",
    # queries/steps_summary.sql
    "grouping": "grouped by",
    "group_label": "group",
    "steps": "steps",
    "step_ms_mean": "step mean (ms)",
    "step_ms_p50": "step p50 (ms)",
    "step_ms_p90": "step p90 (ms)",
    "step_ms_p99": "step p99 (ms)",
    "step_ms_max": "step max (ms)",
    "batch_size_mean": "batch size mean (sequences)",
    "ms_per_scheduled_token": "slope (ms per scheduled token)",
    "fixed_ms": "fixed part (ms)",
    "fit_r2": "fit r² (0-1)",
    # queries/stalls_groups.sql
    "gaps": "gaps",
    "requests": "requests",
    "itl_count": "gaps with an ITL",
    "itl_mean_ms": "ITL mean (ms)",
    "itl_p50_ms": "ITL p50 (ms)",
    "itl_p90_ms": "ITL p90 (ms)",
    "itl_p99_ms": "ITL p99 (ms)",
    "itl_max_ms": "ITL max (ms)",
    "between_steps_ms_mean": "between steps mean (ms)",
    # the Timeline's slowest gaps (queries/stalls_slowest.sql)
    "gap": "gap (number on the plot)",
    "request": "request",
    "token_index": "token (n)",
    "itl_ms": "gap before it (ms)",
    "step": "engine step",
    "batch_size": "batch size (sequences)",
    "shared_decode_sequences": "others decoding (sequences)",
    "shared_prefill_sequences": "others prefilling (sequences)",
    "shared_prefill_tokens": "their prefill tokens",
    "untraced_sequences": "untraced (sequences)",
    "waiting": "waiting (sequences)",
    "kv_blocks_used": "KV blocks used",
    # queries/phases.sql
    "network_in_ms": "network in (ms)",
    "gateway_overhead_ms": "gateway overhead (ms)",
    "tokenize_ms": "tokenize (ms)",
    "queue_ms": "queue (ms)",
    "prefill_ms": "prefill (ms)",
    "first_emit_ms": "first emit (ms)",
    "network_out_ms": "network out (ms)",
    "network_round_trip_ms": "network round trip (ms)",
    "residual_ms": "residual (ms)",
    "server_ttft_ms": "server TTFT (ms)",
    "decode_ms": "decode (ms)",
    "vllm_queue_ms": "vLLM's queue (ms)",
    "vllm_prefill_ms": "vLLM's prefill (ms)",
    "vllm_decode_ms": "vLLM's decode (ms)",
    "cross_clock_reason": "why no network figure",
    "assumed_offset_ms": "assumed offset (ms)",
    # queries/skew_offsets.sql
    "client_domain": "client clock domain",
    "server_domain": "server clock domain",
    "offset_min_ms": "offset min (ms)",
    "offset_max_ms": "offset max (ms)",
    "verdict": "verdict",
    "tolerance_ms": "tolerance (ms)",
    "assumed_offset_within_bounds": "assumed offset within bounds",
    # queries/skew_rules.sql
    "rule": "rule",
    "span_id": "span id",
    "span_name": "span",
    "domain": "clock domain",
    "related_domain": "related span's clock domain",
    "magnitude_ms": "by (ms)",
    "detail": "detail",
    "finding": "finding",
    # tokentrace audit --format json
    "check": "check",
}

#: summary.sql's metric names, as the Distributions table's first column prints them (with the unit).
METRIC_LABELS: dict[str, str] = {
    "ttft_ms": "TTFT (ms)",
    "tpot_ms": "TPOT (ms per token)",
    "e2e_ms": "E2E (ms)",
    "itl_ms": "ITL (ms per gap)",
    "itl_per_token_ms": "ITL per token (ms)",
    "decode_output_tokens_per_second": "decode output rate (tokens/s)",
    "whole_request_output_tokens_per_second": "whole-request output rate (tokens/s)",
    "ttft_ms_prefix_cache_hit": "TTFT, prefix-cache hit (ms)",
    "ttft_ms_prefix_cache_miss": "TTFT, no prefix-cache hit (ms)",
    "prefix_cache_hit_share": "prompt tokens from the prefix cache (fraction)",
}

#: name suffix -> (suffix dropped, unit) for a column without a label of its own
_SUFFIX_UNITS = (("_per_second", "tokens/s"), ("_per_s", "per s"), ("_rps", "req/s"), ("_ms", "ms"),
                 ("_mib", "MiB"), ("_bytes", "bytes"), ("_s", "s"))


def label(name: str) -> str:
    """The header of SQL column ``name``: its label, else its words and the unit its suffix implies."""
    if name in LABELS:
        return LABELS[name]
    for suffix, unit in _SUFFIX_UNITS:
        if name.endswith(suffix) and len(name) > len(suffix):
            return f"{name[: -len(suffix)].replace('_', ' ')} ({unit})"
    return name.replace("_", " ")


def metric_label(metric: str, unit: str | None) -> str:
    """A summary.sql metric with its unit: its label, else ``metric (unit)`` in words."""
    if metric in METRIC_LABELS:
        return METRIC_LABELS[metric]
    words = str(metric).replace("_", " ")
    return f"{words} ({unit})" if unit else words
