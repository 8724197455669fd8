"""The human view of each query (``--format table``): which of its columns a person reads
first, under which header and unit. docs/cli.md lists them; the column names are the
query's (csv/json), the headers are short and name their unit. A query without a view here
gets :func:`analyzer.cli._human.auto_view`. Not a verb (the leading underscore keeps it out
of verb discovery)."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

from analyzer.cli._human import Col, View, auto_view

__all__ = ["VIEWS", "echo_human", "perspective_clock", "request_id", "view_for"]

#: (perspective, source) -> whose clock a row's figures are on (the block titles of requests
#: and itl): the source is the adapter that wrote the row (queries/views/, docs/adapters.md)
_CLOCKS = {
    ("client", "tokentrace"): "the client span's clock",
    ("client", "openllmetry"): "the client's clock, OpenLLMetry's CLIENT span",
    ("client", "openai-v2"): "the client's clock, openai-v2's CLIENT span",
    ("client", "genai"): "the client's clock, a GenAI CLIENT span",
    ("server", "tokentrace"): "the gateway's clock",
    ("server", "vllm"): "the vLLM frontend's clock, vLLM's own llm_request span",
    ("server", "tgi"): "the TGI router's clock",
    ("server", "sglang"): "the SGLang server's clock",
    ("engine", "tokentrace"): "the engine span's clock",
    ("engine", "vllm"): "the vLLM engine's clock, tokentrace's vLLM plugin's engine_request span",
}
#: a perspective whose rows name no source (a query without that column), or an unknown one
_PERSPECTIVE_CLOCK = {"client": "the client span's clock", "server": "the server span's clock",
                      "engine": "the engine span's clock"}


def perspective_clock(perspective: Any, source: Any = None) -> str:
    """Whose clock the rows of one perspective of one source are on (a gateway, vLLM's
    frontend, vLLM's engine through tokentrace's plugin, a client, ...)."""
    return _CLOCKS.get((str(perspective), str(source)),
                       _PERSPECTIVE_CLOCK.get(str(perspective), "its own clock"))


def request_id(row: Mapping[str, Any]) -> Any:
    """The id a user can find again: the response id (``gen_ai.response.id``, what the client
    got back), else the caller's X-Request-ID (``client_request_id``), else the span id."""
    return row.get("response_id") or row.get("client_request_id") or row.get("request_span_id")


def _shown_id(row: Mapping[str, Any]) -> Any:
    """The id a gap's row shows for its request: the one every verb shows (``request_id``, set
    for the table by analyzer/cli/_query_verb.py ``with_request_ids``), else its response id,
    else its span id."""
    return row.get("request_id") or row.get("response_id") or row.get("request_span_id")


def _unique_request_ids(rows: list[dict[str, Any]]) -> list[str]:
    """Set ``_request_id`` of each requests row: :func:`request_id`, or the span id where that
    id is shared by several requests (a fixed response id, a reused X-Request-ID)."""
    owners: dict[Any, set[tuple[Any, Any]]] = {}
    for r in rows:
        owners.setdefault(request_id(r), set()).add((r.get("trace_id"), r.get("request_span_id")))
    shared = sorted(str(i) for i, o in owners.items() if len(o) > 1)
    for r in rows:
        r["_request_id"] = r.get("request_span_id") if str(request_id(r)) in shared else request_id(r)
    if not shared:
        return []
    return [f"request id: the span id where the response id or X-Request-ID is shared by several requests "
            f"({', '.join(repr(i) for i in shared[:3])}{', ...' if len(shared) > 3 else ''})"]


def _plural(count: int, noun: str) -> str:
    return f"{count} {noun}{'' if count == 1 else 's'}"


def _perspective_title(noun: str) -> Any:
    """One block's title: the perspective and whose clock its rows are on, by the rows'
    sources; a block of several sources (a gateway's rows beside vLLM's) names each clock
    with its count of rows."""
    def title(value: Any, members: Sequence[Mapping[str, Any]]) -> str:
        clocks: dict[str, int] = {}
        for r in members:
            clock = perspective_clock(value, r.get("source"))
            clocks[clock] = clocks.get(clock, 0) + 1
        if len(clocks) == 1:
            return f"{value} perspective ({next(iter(clocks))}): {_plural(len(members), noun)}"
        each = "; ".join(f"{clock}: {_plural(n, noun)}" for clock, n in clocks.items())
        return f"{value} perspective ({each}): {_plural(len(members), noun)}"
    return title


def _domain_title(noun: str) -> Any:
    def title(value: Any, members: Sequence[Mapping[str, Any]]) -> str:
        return f"clock domain {value}: {_plural(len(members), noun)}"
    return title


_REQUESTS = View((
    Col("response_id", "request id", cut=True, value=lambda r: r.get("_request_id", request_id(r))),
    Col("client_request_id", "X-Request-ID", rank=1, cut=True),
    Col("s_ns", "sent", "UTC", kind="utc", rank=3),
    Col("input_tokens", "in", "tok", kind="count"),
    Col("output_tokens", "out", "tok", kind="count"),
    Col("ttft_ms", "TTFT", "ms", kind="ms"),
    Col("tpot_ms", "TPOT", "ms", kind="ms"),
    Col("e2e_ms", "E2E", "ms", kind="ms"),
    Col("whole_request_output_tokens_per_second", "rate", "tok/s", rank=4),
    Col("finish_reason", "finish"),
    Col("outcome", "outcome", rank=2),
    Col("null_reason", "why empty", rank=5, cut=True, fill=True),
), group_by="perspective", group_title=_perspective_title("request"), prepare=_unique_request_ids)

_ITL = View((
    Col("response_id", "request id", cut=True, value=_shown_id),
    Col("gap_index", "gap", "#", kind="count"),
    Col("time_ns", "chunk at", "UTC", kind="utc", rank=2),
    Col("chunk_tokens", "chunk", "tok", kind="count"),
    Col("itl_ms", "ITL", "ms", kind="ms"),
    Col("itl_per_token_ms", "ITL/tok", "ms", kind="ms", rank=1),
    Col("null_reason", "why empty", rank=3, cut=True, fill=True),
), group_by="perspective", group_title=_perspective_title("gap"))

_METRIC_LABELS = {
    "ttft_ms": "TTFT ms", "tpot_ms": "TPOT ms", "e2e_ms": "E2E ms", "itl_ms": "ITL ms/gap",
    "itl_per_token_ms": "ITL ms/token", "decode_output_tokens_per_second": "decode tok/s",
    "whole_request_output_tokens_per_second": "request tok/s",
    "ttft_ms_prefix_cache_hit": "TTFT ms cache hit", "ttft_ms_prefix_cache_miss": "TTFT ms no hit",
    "prefix_cache_hit_share": "cached input frac",
}

def _summary_figure(key: str) -> Callable[[Mapping[str, Any]], Any]:
    """A summary statistic as text, by its row's unit: milliseconds to 0.1 ms (as every *_ms
    column prints), fractions to three decimals, other figures to four significant digits
    (right-aligned: the column's kind is numeric)."""
    from analyzer.cli._human import cell_text, decimals_for

    def figure(row: Mapping[str, Any]) -> Any:
        unit = str(row.get("unit") or "")
        kind = "ms" if unit.startswith("ms") else "fraction" if unit.startswith("fraction") else "auto"
        value = row.get(key)
        # one number of decimals across the row's statistics (one metric): 14.90 beside 16.89
        decimals = decimals_for([row.get(k) for k in _SUMMARY_STATS]) if kind == "auto" else None
        return None if value is None else cell_text(value, kind, decimals=decimals)
    return figure


#: summary.sql's statistics of one metric (one row)
_SUMMARY_STATS = ("mean", "std_pop", "min", "p50", "p90", "p95", "p99", "max")


_SUMMARY = View((
    Col("metric", "metric", value=lambda r: _METRIC_LABELS.get(str(r.get("metric")), r.get("metric"))),
    Col("perspective", "perspective"),
    Col("count", "n", kind="count"),
    Col("null_count", "empty", kind="count", rank=3),
    Col("mean", "mean", rank=1, kind="ms", value=_summary_figure("mean")),
    Col("std_pop", "std", rank=4, kind="ms", value=_summary_figure("std_pop")),
    Col("min", "min", rank=4, kind="ms", value=_summary_figure("min")),
    Col("p50", "p50", kind="ms", value=_summary_figure("p50")),
    Col("p90", "p90", kind="ms", value=_summary_figure("p90")),
    Col("p95", "p95", rank=2, kind="ms", value=_summary_figure("p95")),
    Col("p99", "p99", kind="ms", value=_summary_figure("p99")),
    Col("max", "max", kind="ms", value=_summary_figure("max")),
    Col("null_reason", "why empty", rank=5, cut=True, fill=True),
))

def _slo_passing(row: Mapping[str, Any]) -> Any:
    """slo_passing, saying so when no SLO was set (then every succeeded request passes)."""
    value = row.get("slo_passing")
    if value is None or any(row.get(k) is not None for k in ("slo_ttft_ms", "slo_tpot_ms", "slo_e2e_ms")):
        return value
    return f"{value} (no SLO set: every succeeded request)"


_WINDOW = View((
    Col("mode", "mode"), Col("perspective", "perspective"),
    Col("window_start_ns", "window start", "UTC", kind="utc"), Col("window_end_ns", "window end", "UTC", kind="utc"),
    Col("window_s", "window", "s"), Col("attempted", "attempted"), Col("succeeded", "succeeded"),
    Col("failed", "failed"), Col("cancelled", "cancelled"), Col("slo_passing", "slo passing", value=_slo_passing),
    Col("not_finished_in_window", "not finished in window"),
    Col("requests_crossing_boundary", "requests crossing a bound"),
    Col("request_throughput_rps", "request throughput", "req/s"),
    Col("observed_goodput_rps", "goodput", "req/s"), Col("error_rate", "error rate", "fraction", kind="fraction"),
    Col("output_tokens", "output tokens", "tok"), Col("output_tokens_per_s", "output throughput", "tok/s"),
    Col("slo_ttft_ms", "SLO TTFT", "ms", kind="ms"), Col("slo_tpot_ms", "SLO TPOT", "ms", kind="ms"),
    Col("slo_e2e_ms", "SLO E2E", "ms", kind="ms"),
    Col("token_counting_rule", "tokens counted"), Col("request_counting_rule", "requests counted"),
), transpose=True)

def _phases_prepare(rows: list[dict[str, Any]]) -> list[str]:
    """The unique request ids, and where the phases of vLLM's rows come from (phases_basis):
    the plugin's spans or vLLM's own figures, said only of the rows that have them."""
    notes = _unique_request_ids(rows)
    bases: dict[str, int] = {}
    for r in rows:
        basis = r.get("phases_basis")
        if basis and "vLLM" in str(basis):
            bases[str(basis)] = bases.get(str(basis), 0) + 1
    notes += [f"{_plural(n, 'request')}: {basis}" for basis, n in bases.items()]
    return notes


_PHASES = View((
    Col("response_id", "request id", cut=True, value=lambda r: r.get("_request_id", request_id(r))),
    Col("ttft_ms", "TTFT", "ms", kind="ms"),
    Col("server_ttft_ms", "srv TTFT", "ms", kind="ms", rank=1),
    Col("network_in_ms", "net in", "ms", kind="ms", rank=2),
    Col("gateway_overhead_ms", "gateway", "ms", kind="ms", rank=3),
    Col("tokenize_ms", "tokenize", "ms", kind="ms", rank=3),
    Col("queue_ms", "queue", "ms", kind="ms", rank=1),
    Col("vllm_queue_ms", "vLLM's queue", "ms", kind="ms", rank=2),
    Col("prefill_ms", "prefill", "ms", kind="ms", rank=1),
    Col("vllm_prefill_ms", "vLLM's prefill", "ms", kind="ms", rank=3),
    Col("first_emit_ms", "1st emit", "ms", kind="ms", rank=3),
    Col("network_out_ms", "net out", "ms", kind="ms", rank=2),
    Col("network_round_trip_ms", "net rtt", "ms", kind="ms", rank=4),
    Col("residual_ms", "residual", "ms", kind="ms", rank=3),
    Col("decode_ms", "decode", "ms", kind="ms", rank=4),
    Col("vllm_decode_ms", "vLLM's decode", "ms", kind="ms", rank=4),
    Col("clock_pair_verdict", "clocks", rank=5),
    Col("cross_clock_reason", "why no network figure", rank=6, cut=True, fill=True),
    Col("null_reason", "why empty", rank=7, cut=True, fill=True),
), prepare=_phases_prepare)

_SKEW_RULES = View((
    Col("rule", "rule"),
    Col("span_name", "span", rank=2),
    Col("span_id", "span id", rank=1),
    Col("magnitude_ms", "by", "ms", kind="ms"),
    Col("finding", "finding"),
    Col("trace_id", "trace", rank=3),
    Col("detail", "detail", rank=4, cut=True, fill=True),
))

_SKEW_OFFSETS = View((
    Col("client_domain", "client clock", cut=True),
    Col("server_domain", "server clock", cut=True),
    Col("requests", "requests", kind="count", rank=2),
    Col("offset_min_ms", "offset min", "ms", kind="ms"),
    Col("offset_max_ms", "offset max", "ms", kind="ms"),
    Col("verdict", "verdict"),
    Col("assumed_offset_ms", "assumed", "ms", kind="ms", rank=1),
    Col("assumed_offset_within_bounds", "in bounds", rank=1),
))

_STEPS = View((
    Col("step", "step", kind="count"),
    Col("start_ns", "start", "UTC", kind="utc", rank=3),
    Col("step_ms", "step", "ms", kind="ms"),
    Col("schedule_ms", "sched", "ms", kind="ms", rank=4),
    Col("batch_size", "batch", "seq", kind="count"),
    Col("scheduled_tokens", "sched", "tok", kind="count"),
    Col("prefill_tokens", "prefill", "tok", kind="count"),
    Col("decode_tokens", "decode", "tok", kind="count", rank=1),
    Col("waiting", "waiting", "seq", kind="count", rank=2),
    Col("kv_blocks_used", "KV used", "blocks", kind="count", rank=2),
    Col("kv_used_fraction", "KV used", "fraction", kind="fraction", rank=1),
    Col("null_reason", "why empty", rank=5, cut=True, fill=True),
), group_by="clock_domain", group_title=_domain_title("step"))

def _step_line(row: Mapping[str, Any]) -> str | None:
    """steps_summary's least-squares line as people read it, or that it does not hold
    (steps_summary.sql leaves its slope NULL below $min_fit_steps / $min_fit_r2)."""
    slope, fixed = row.get("ms_per_scheduled_token"), row.get("fixed_ms")
    if slope is not None and fixed is not None:
        return f"{fixed:.1f} + {slope:.3g} x tok"
    reason = str(row.get("null_reason") or "")
    if reason.startswith("fit does not hold"):
        return "no fit: few steps" if "min_fit_steps" in reason else "no fit: r2 too low"
    return None


_STEPS_SUMMARY = View((
    Col("grouping", "group by"),
    Col("group_label", "group"),
    Col("steps", "steps", kind="count"),
    Col("step_ms_mean", "mean", "ms", kind="ms", rank=2),
    Col("step_ms_p50", "p50", "ms", kind="ms"),
    Col("step_ms_p90", "p90", "ms", kind="ms", rank=3),
    Col("step_ms_p99", "p99", "ms", kind="ms"),
    Col("step_ms_max", "max", "ms", kind="ms", rank=3),
    Col("ms_per_scheduled_token", "step ms = fixed", "+ ms/tok x tok", value=_step_line),
    Col("fit_r2", "r2", kind="fraction"),
    Col("null_reason", "why no line", rank=1, cut=True, fill=True),
))

_STALLS = View((
    Col("response_id", "request id", cut=True, value=_shown_id),
    Col("token_index", "token", "#", kind="count"),
    Col("itl_ms", "ITL", "ms", kind="ms"),
    Col("step", "step", kind="count"),
    Col("step_ms", "step", "ms", kind="ms"),
    Col("batch_size", "batch", "seq", kind="count"),
    Col("prefill_tokens", "prefill", "tok", kind="count"),
    Col("between_steps_ms", "between", "ms", kind="ms", rank=1),
    Col("emit_ns", "emitted", "UTC", kind="utc", rank=3),
    Col("null_reason", "why empty", rank=4, cut=True, fill=True),
), group_by="clock_domain", group_title=_domain_title("gap"))

_STALLS_GROUPS = View((
    Col("grouping", "group by"),
    Col("group_label", "group"),
    Col("gaps", "gaps", kind="count"),
    Col("requests", "requests", kind="count", rank=2),
    Col("itl_mean_ms", "mean", "ms", kind="ms", rank=1),
    Col("itl_p50_ms", "p50", "ms", kind="ms"),
    Col("itl_p90_ms", "p90", "ms", kind="ms"),
    Col("itl_p99_ms", "p99", "ms", kind="ms"),
    Col("itl_max_ms", "max", "ms", kind="ms"),
    Col("step_ms_mean", "step", "ms", kind="ms", rank=3),
    Col("null_reason", "why empty", rank=4, cut=True, fill=True),
))

_STALLS_SLOWEST = View((
    Col("response_id", "request id", cut=True, value=_shown_id),
    Col("gap_rank", "rank", kind="count"),
    Col("token_index", "token", "#", kind="count"),
    Col("itl_ms", "ITL", "ms", kind="ms"),
    Col("step", "step", kind="count"),
    Col("batch_size", "batch", "seq", kind="count"),
    Col("shared_prefill_tokens", "prefill", "tok", kind="count"),
    Col("largest_shared_prefill_request_span_id", "largest prefill", "request", rank=1, cut=True,
        value=lambda r: (r.get("largest_shared_prefill_request_id") or r.get("largest_shared_prefill_response_id")
                         or r.get("largest_shared_prefill_request_span_id"))),
    Col("null_reason", "why empty", rank=2, cut=True, fill=True),
))

#: query name -> its human view
VIEWS: dict[str, View] = {
    "requests": _REQUESTS, "itl": _ITL, "summary": _SUMMARY, "window": _WINDOW, "phases": _PHASES,
    "skew_rules": _SKEW_RULES, "skew_offsets": _SKEW_OFFSETS, "steps": _STEPS, "steps_summary": _STEPS_SUMMARY,
    "stalls": _STALLS, "stalls_groups": _STALLS_GROUPS, "stalls_slowest": _STALLS_SLOWEST,
}


def view_for(query: str, columns: Sequence[str]) -> View:
    """The view of ``query``, else one of its columns as they come."""
    return VIEWS.get(query) or auto_view(columns)


def echo_human(query: str, columns: Sequence[str], rows: Sequence[Sequence[Any]], *, notes: Sequence[str] = (),
               chosen: Sequence[str] | None = None, columns_flag: bool = True) -> None:
    """Print the human view of one query's rows at the terminal's width (stdout)."""
    import click

    from analyzer.cli._human import render, terminal_width

    for line in render(view_for(query, columns), columns, rows, width=terminal_width(), chosen=chosen,
                       notes=notes, columns_flag=columns_flag):
        click.echo(line)
