-- returns: (metric, value) rows derived from vLLM benchmark_serving's saved per-request
--   arrays, loaded as vllm_requests(request_index, ttft_s, input_len, output_len, error)
--   and vllm_itls(request_index, gap_index, itl_s), exactly as vLLM builds its summary:
--   'ttft' per successful request; 'e2el' = ttft + sum(itls) (vLLM's latency ends at the
--   last chunk); 'tpot' = (e2el - ttft) / (output_len - 1) for successful requests with
--   output_len > 1 only; 'itl' every chunk gap of successful requests (per chunk, not per
--   token). Variants that wrong reports follow, for diagnosis: 'tpot_one_token_as_zero'
--   (one-token requests counted as TPOT 0), 'tpot_including_first_token' (e2el /
--   output_len), 'ttft_failed_as_zero' (the ttfts array as stored, failed requests' zeros included).
--   A request succeeded when its error string is empty.
-- units: value in milliseconds (the arrays are in seconds).
WITH gap_sums AS (
    SELECT request_index, sum(itl_s) AS itl_sum_s, count(*) AS gaps
    FROM vllm_itls
    GROUP BY request_index
),
req AS (
    SELECT
        r.request_index,
        r.ttft_s,
        r.output_len,
        coalesce(r.error, '') = '' AS succeeded,
        coalesce(g.gaps, 0) AS gaps,
        r.ttft_s + coalesce(g.itl_sum_s, 0) AS e2el_s
    FROM vllm_requests r
    LEFT JOIN gap_sums g USING (request_index)
)
SELECT 'ttft' AS metric, ttft_s * 1000 AS value FROM req WHERE succeeded
UNION ALL
SELECT 'e2el', e2el_s * 1000 FROM req WHERE succeeded
UNION ALL
SELECT 'tpot', (e2el_s - ttft_s) * 1000 / (output_len - 1) FROM req WHERE succeeded AND output_len > 1
UNION ALL
SELECT 'itl', i.itl_s * 1000
FROM vllm_itls i JOIN req USING (request_index) WHERE req.succeeded
UNION ALL
SELECT 'tpot_one_token_as_zero',
       CASE WHEN output_len > 1 THEN (e2el_s - ttft_s) * 1000 / (output_len - 1) ELSE 0 END
FROM req WHERE succeeded
UNION ALL
SELECT 'tpot_including_first_token', e2el_s * 1000 / output_len FROM req WHERE succeeded AND output_len > 0
UNION ALL
SELECT 'ttft_failed_as_zero', ttft_s * 1000 FROM req;
