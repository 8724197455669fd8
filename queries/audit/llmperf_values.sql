-- returns: (metric, value) rows of LLMPerf's individual responses, loaded as
--   llmperf_responses(response_index, error_code, inter_token_latency_s, ttft_s,
--   end_to_end_latency_s, request_output_throughput_token_per_s, number_input_tokens,
--   number_output_tokens), for the responses LLMPerf summarises: those without an error code
--   (token_benchmark_ray.py metrics_summary drops errored requests). Metric names are the
--   summary's (results_<metric>_...).
-- units: value in the unit its metric name says (_s seconds, _token_per_s tokens per second,
--   number_* tokens).
SELECT metric, value FROM (
    SELECT response_index, 'inter_token_latency_s' AS metric, inter_token_latency_s AS value FROM llmperf_responses WHERE error_code IS NULL
    UNION ALL SELECT response_index, 'ttft_s', ttft_s FROM llmperf_responses WHERE error_code IS NULL
    UNION ALL SELECT response_index, 'end_to_end_latency_s', end_to_end_latency_s FROM llmperf_responses WHERE error_code IS NULL
    UNION ALL SELECT response_index, 'request_output_throughput_token_per_s', request_output_throughput_token_per_s
        FROM llmperf_responses WHERE error_code IS NULL
    UNION ALL SELECT response_index, 'number_input_tokens', number_input_tokens FROM llmperf_responses WHERE error_code IS NULL
    UNION ALL SELECT response_index, 'number_output_tokens', number_output_tokens FROM llmperf_responses WHERE error_code IS NULL
)
ORDER BY metric, response_index;
