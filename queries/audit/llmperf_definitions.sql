-- returns: one row per successful LLMPerf response (llmperf_responses as in
--   audit/llmperf_values.sql): its published inter-token latency and output rate beside what
--   each candidate definition gives, so the audit can say which definition LLMPerf's figures
--   follow: per-token latency including the first token (E2E / O, LLMPerf's: the sum of its
--   time_to_next_token list, which starts with TTFT, divided by O), decode-only TPOT
--   ((E2E - TTFT) / (O - 1), vLLM's and docs/metrics.md's), whole-request rate (O / E2E, LLMPerf's
--   request_output_throughput) and decode-only rate ((O - 1) / (E2E - TTFT)).
-- units: *_s seconds; *_per_s tokens per second.
SELECT
    response_index,
    number_output_tokens AS output_tokens,
    inter_token_latency_s,
    CASE WHEN number_output_tokens > 0 THEN end_to_end_latency_s / number_output_tokens END
        AS e2e_over_output_tokens_s,
    CASE WHEN number_output_tokens > 1 THEN (end_to_end_latency_s - ttft_s) / (number_output_tokens - 1) END
        AS decode_tpot_s,
    request_output_throughput_token_per_s,
    CASE WHEN end_to_end_latency_s > 0 THEN number_output_tokens / end_to_end_latency_s END
        AS whole_request_output_tokens_per_s,
    CASE WHEN number_output_tokens > 1 AND end_to_end_latency_s > ttft_s
         THEN (number_output_tokens - 1) / (end_to_end_latency_s - ttft_s) END AS decode_output_tokens_per_s
FROM llmperf_responses
WHERE error_code IS NULL
ORDER BY response_index;
