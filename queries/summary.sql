-- returns: one row per per-request metric and perspective (client | server | engine): the
--   distribution over requests (ttft_ms, tpot_ms, e2e_ms, decode_output_tokens_per_second,
--   whole_request_output_tokens_per_second) or over gaps (itl_ms, itl_per_token_ms): count
--   of known values, count of NULL values, mean, population standard deviation, min,
--   p50/p90/p95/p99 and max. Percentiles interpolate linearly between order statistics
--   (DuckDB quantile_cont = numpy's default 'linear' method = Spark percentile); the
--   method is named in the interpolation column. A metric without any value has NULL
--   statistics and null_reason says so (never 0). Per-request values come from view
--   request_metrics, gaps from view request_gaps.
-- param: $perspective VARCHAR default NULL -- client, server or engine; NULL = every perspective
-- param: $include_unsuccessful BOOLEAN default false -- also count failed and cancelled requests (default: succeeded only, as vLLM's benchmark)
-- units: ttft_ms, tpot_ms, e2e_ms, itl_ms, itl_per_token_ms milliseconds; *_per_second tokens
--   per second; count and null_count values (requests, or gaps for itl_*).
WITH req AS (
    SELECT *
    FROM request_metrics
    WHERE ($perspective IS NULL OR perspective = $perspective)
      AND ($include_unsuccessful OR outcome = 'succeeded')
),
gaps AS (
    SELECT g.*
    FROM request_gaps g
    JOIN req r ON r.trace_id = g.trace_id AND r.request_span_id = g.request_span_id
              AND r.perspective = g.perspective
),
vals AS (
    SELECT perspective, 1 AS metric_order, 'ttft_ms' AS metric, 'ms' AS unit, ttft_ms AS value FROM req
    UNION ALL
    SELECT perspective, 2, 'tpot_ms', 'ms/token', tpot_ms FROM req
    UNION ALL
    SELECT perspective, 3, 'e2e_ms', 'ms', e2e_ms FROM req
    UNION ALL
    SELECT perspective, 4, 'itl_ms', 'ms per chunk gap', itl_ms FROM gaps
    UNION ALL
    SELECT perspective, 5, 'itl_per_token_ms', 'ms per token', itl_per_token_ms FROM gaps
    UNION ALL
    SELECT perspective, 6, 'decode_output_tokens_per_second', 'tokens/s', decode_output_tokens_per_second FROM req
    UNION ALL
    SELECT perspective, 7, 'whole_request_output_tokens_per_second', 'tokens/s', whole_request_output_tokens_per_second
    FROM req
)
SELECT
    metric,
    perspective,
    unit,
    count(value) AS count,
    count(*) - count(value) AS null_count,
    avg(value) AS mean,
    stddev_pop(value) AS std_pop,
    min(value) AS min,
    quantile_cont(value, 0.5) AS p50,
    quantile_cont(value, 0.9) AS p90,
    quantile_cont(value, 0.95) AS p95,
    quantile_cont(value, 0.99) AS p99,
    max(value) AS max,
    'linear' AS interpolation,
    CASE WHEN count(value) = 0 THEN 'no known value of ' || metric END AS null_reason
FROM vals
GROUP BY metric_order, metric, perspective, unit
ORDER BY metric_order, perspective;
