-- returns: one row per successful request of vLLM benchmark_serving's saved arrays
--   (vllm_requests, vllm_itls as in audit/vllm_values.sql), with vLLM's own per-request
--   figures: ttft_ms; e2el_ms = ttft + sum(itls) (vLLM's latency ends at the last chunk);
--   tpot_ms = (e2el - ttft) / (output_len - 1) (NULL unless output_len > 1); input_len and
--   output_len (tokens). request_index is the request's position in the arrays, which is the
--   <index> of its --request-id-prefix id.
-- units: *_ms milliseconds; *_len tokens.
WITH gap_sums AS (
    SELECT request_index, sum(itl_s) AS itl_sum_s FROM vllm_itls GROUP BY request_index
)
SELECT
    r.request_index,
    r.ttft_s * 1000 AS ttft_ms,
    (r.ttft_s + coalesce(g.itl_sum_s, 0)) * 1000 AS e2el_ms,
    CASE WHEN r.output_len > 1 THEN coalesce(g.itl_sum_s, 0) * 1000 / (r.output_len - 1) END AS tpot_ms,
    r.input_len,
    r.output_len
FROM vllm_requests r
LEFT JOIN gap_sums g USING (request_index)
WHERE coalesce(r.error, '') = ''
ORDER BY r.request_index;
