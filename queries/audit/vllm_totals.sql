-- returns: one row of counts and throughputs recomputed from vLLM benchmark_serving's saved
--   arrays (vllm_requests, vllm_itls as in audit/vllm_values.sql) over the report's own
--   duration: completed and failed requests, failed requests stored as zeros in the arrays
--   (empty output, zero TTFT), total input tokens of completed requests (vLLM's rule) and of
--   all prompts, total output tokens, the requests with one output token, with multi-token
--   chunks (output_len > chunks = gaps + 1), with as many gaps as output tokens (a chunk
--   without a token timed: extra_gap_requests, their largest first gap in ms, and the ratio
--   mean ITL / mean TPOT that gives when every request has the same O), the distinct output
--   lengths, and the request,
--   output-token and total-token throughputs over $duration_s (vLLM's denominator: first
--   send to last completion).
-- param: $duration_s DOUBLE default NULL -- the report's benchmark duration (s); NULL = rates NULL
-- units: *_tokens tokens; *_throughput per second (requests/s or tokens/s); counts requests.
WITH gaps AS (
    SELECT request_index, count(*) AS gaps, max(itl_s) FILTER (WHERE gap_index = 0) AS first_gap_s
    FROM vllm_itls GROUP BY request_index
),
req AS (
    SELECT r.*, coalesce(r.error, '') = '' AS succeeded, coalesce(g.gaps, 0) AS gaps, g.first_gap_s
    FROM vllm_requests r LEFT JOIN gaps g USING (request_index)
),
totals AS (
    SELECT
        count(*) AS requests_in_arrays,
        count(*) FILTER (WHERE succeeded) AS completed,
        count(*) FILTER (WHERE NOT succeeded) AS failed,
        count(*) FILTER (WHERE NOT succeeded AND coalesce(output_len, 0) = 0 AND coalesce(ttft_s, 0) = 0)
            AS failed_stored_as_zeros,
        coalesce(sum(input_len) FILTER (WHERE succeeded), 0) AS total_input_tokens,
        coalesce(sum(input_len), 0) AS total_input_tokens_all_prompts,
        coalesce(sum(output_len) FILTER (WHERE succeeded), 0) AS total_output_tokens,
        count(*) FILTER (WHERE succeeded AND output_len = 1) AS one_token_requests,
        count(*) FILTER (WHERE succeeded AND output_len > gaps + 1) AS multi_token_chunk_requests,
        -- as many gaps as output tokens (one more than O - 1): a chunk without a token was
        -- timed, e.g. the openai-chat backend's role-only first chunk
        count(*) FILTER (WHERE succeeded AND output_len > 1 AND gaps = output_len) AS extra_gap_requests,
        max(first_gap_s * 1000) FILTER (WHERE succeeded AND output_len > 1 AND gaps = output_len)
            AS extra_gap_max_first_gap_ms,
        count(DISTINCT output_len) FILTER (WHERE succeeded) AS distinct_output_lens,
        max(output_len) FILTER (WHERE succeeded) AS max_output_len
    FROM req
)
SELECT
    *,
    -- with one output length O for every request and one extra gap each, mean ITL = mean
    -- TPOT x (O - 1) / O (ITL divides each request's decode time by O gaps, TPOT by O - 1)
    CASE WHEN distinct_output_lens = 1 AND max_output_len > 1 AND extra_gap_requests = completed
         THEN (max_output_len - 1) / max_output_len END AS extra_gap_itl_over_tpot,
    CASE WHEN $duration_s > 0 THEN completed / $duration_s END AS request_throughput,
    CASE WHEN $duration_s > 0 THEN total_output_tokens / $duration_s END AS output_throughput,
    CASE WHEN $duration_s > 0 THEN (total_input_tokens + total_output_tokens) / $duration_s END
        AS total_token_throughput
FROM totals;
