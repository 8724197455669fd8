"""The definitions a reader of a guidellm report must know, stated with the report's own
numbers (each a ``pass`` that says what the figure is, or a ``fail`` when a figure describes no
served request): TPOT with TTFT inside, nearest-rank percentiles, token weights, rate
distributions, errored requests in the totals. Numbers from audit/guidellm_stats.sql."""

from __future__ import annotations

from typing import Any

from analyzer.audit.compare import CANNOT, FAIL, PASS, Finding

__all__ = ["definition_findings"]


def definition_findings(b: int, metrics: dict[str, Any], stats: dict[tuple[int, str, str], dict[str, Any]],
                        windowed: dict[str, int], bench: dict[str, Any]) -> list[Finding]:
    """``tpot_definition``, ``percentile_method``, ``token_weighting``, ``rate_definitions``,
    ``errored_in_totals`` for benchmark ``b``."""
    def row(metric: str, status: str = "successful") -> dict[str, Any]:
        return stats.get((b, metric, status)) or {}

    ok = windowed["successful"]
    out: list[Finding] = []
    tpot, itl, ttft = row("time_per_output_token_ms"), row("inter_token_latency_ms"), row("time_to_first_token_ms")
    if ok and tpot.get("count") and itl.get("count"):
        out.append(Finding("tpot_definition", PASS,
                           f"guidellm's time_per_output_token_ms is (last token - request start) / O, TTFT included: "
                           f"mean {tpot['mean']:.4g} ms, against a decode-only TPOT (its inter_token_latency_ms, "
                           f"(last - first token) / (O - 1)) of {itl['mean']:.4g} ms and a mean TTFT of "
                           f"{ttft.get('mean', 0):.4g} ms: compare its ITL, not its TPOT, with vLLM's or AIPerf's "
                           "TPOT", {"tpot_mean_ms": tpot["mean"], "decode_tpot_mean_ms": itl["mean"],
                                    "ttft_mean_ms": ttft.get("mean")}))
    else:
        out.append(Finding("tpot_definition", CANNOT, "no successful request with output tokens", {}))
    if ok and ttft.get("n_values"):
        n = int(ttft["n_values"])
        tail = (f"at n = {n}, p99 is the maximum ({ttft['p99_low']:.4g} ms)" if n <= 100 else
                f"p99 {ttft['p99_low']:.4g} ms")
        out.append(Finding("percentile_method", PASS,
                           f"percentiles are weighted nearest-rank (the first value whose cumulative weight reaches "
                           f"q), never interpolated: {tail}; TTFT p90 {ttft['p90_low']:.4g} ms nearest-rank vs "
                           f"{ttft['interpolated_p90']:.4g} ms interpolated (numpy's linear), p50 "
                           f"{ttft['p50_low']:.4g} vs {ttft['interpolated_p50']:.4g} ms",
                           {"n": n, "ttft_p90_nearest_rank_ms": ttft["p90_low"],
                            "ttft_p90_interpolated_ms": ttft["interpolated_p90"],
                            "ttft_p99_nearest_rank_ms": ttft["p99_low"],
                            "ttft_p99_interpolated_ms": ttft["interpolated_p99"], "ttft_max_ms": ttft["max"]}))
    else:
        out.append(Finding("percentile_method", CANNOT, "no successful request with a first token", {}))
    if ok and tpot.get("count"):
        out.append(Finding("token_weighting", PASS,
                           f"time_per_output_token_ms is weighted by output tokens (count {tpot['count']:g} tokens, "
                           f"not {ok} requests) and inter_token_latency_ms by O - 1 (count {itl.get('count', 0):g}): "
                           f"their means are total time / total tokens (TPOT {tpot['mean']:.4g} ms, ITL "
                           f"{itl.get('mean', 0):.4g} ms), not the mean over requests (TPOT "
                           f"{tpot['unweighted_mean']:.4g} ms, ITL {itl.get('unweighted_mean') or 0:.4g} ms"
                           + (": equal here, every request has the same O" if row("output_token_count").get("min")
                              == row("output_token_count").get("max") else "")
                           + "); their percentiles are percentiles of tokens: long requests weigh more",
                           {"tpot_token_weighted_mean_ms": tpot["mean"], "tpot_request_mean_ms": tpot["unweighted_mean"],
                            "itl_token_weighted_mean_ms": itl.get("mean"),
                            "itl_request_mean_ms": itl.get("unweighted_mean")}))
    else:
        out.append(Finding("token_weighting", CANNOT, "no successful request with output tokens", {}))
    rps, ops = row("requests_per_second"), row("output_tokens_per_second")
    window = bench.get("duration")
    if ok and rps.get("count"):
        out.append(Finding("rate_definitions", PASS,
                           f"requests_per_second and *_tokens_per_second are distributions of local rates (each event "
                           "over the interval between the midpoints to its neighbours, weighted by that interval): "
                           f"their mean is events / measured window, a throughput ({rps['count']:g} of {ok} requests "
                           "end inside the window, "
                           f"mean {rps['mean']:.4g} requests/s over {window if window is None else f'{window:.4g}'} s), "
                           f"but their median ({rps['median_low']:.4g} requests/s) and percentiles are not "
                           "throughputs; output token events are spaced evenly between each request's first and last "
                           f"token (guidellm keeps no per-token times): output_tokens_per_second median "
                           f"{ops.get('median_low', 0):.4g} vs mean {ops.get('mean', 0):.4g} tokens/s",
                           {"requests": rps["count"], "mean_requests_per_s": rps["mean"],
                            "median_requests_per_s": rps["median_low"], "window_s": window,
                            "output_tokens_per_s_mean": ops.get("mean"),
                            "output_tokens_per_s_median": ops.get("median_low")}))
    else:
        out.append(Finding("rate_definitions", CANNOT, "no successful request", {}))
    failed = windowed["errored"] + windowed["incomplete"]
    total_in, ok_in = row("prompt_tokens_per_second", "total"), row("prompt_tokens_per_second")
    numbers = {"errored": windowed["errored"], "incomplete": windowed["incomplete"], "successful": ok,
               "total_prompt_tokens_per_s": total_in.get("mean"), "successful_prompt_tokens_per_s": ok_in.get("mean")}
    if not failed:
        out.append(Finding("errored_in_totals", PASS, "no errored or incomplete request: total and successful "
                           "figures describe the same requests", numbers))
    elif not ok:
        out.append(Finding("errored_in_totals", FAIL,
                           f"no request succeeded ({windowed['errored']} errored, {windowed['incomplete']} incomplete), "
                           f"yet the total (\"all requests\") figures show {total_in.get('mean', 0):.5g} input tokens/s: "
                           "the prompts of failed requests, sent to a server that produced nothing", numbers))
    else:
        out.append(Finding("errored_in_totals", PASS,
                           f"the total (\"all requests\") figures include {windowed['errored']} errored and "
                           f"{windowed['incomplete']} incomplete requests: input {total_in.get('mean', 0):.5g} tokens/s "
                           f"total vs {ok_in.get('mean', 0):.5g} tokens/s successful", numbers))
    return out
