-- returns: one row per per-request metric and perspective (client | server | engine): the
--   distribution over requests (ttft_ms, tpot_ms, e2e_ms, decode_output_tokens_per_second,
--   whole_request_output_tokens_per_second) or over gaps (itl_ms, itl_per_token_ms): count
--   of known values, count of NULL values, mean, population standard deviation, min,
--   p50/p90/p95/p99 and max. Percentiles interpolate linearly between order statistics
--   (DuckDB quantile_cont = numpy's default 'linear' method = Spark percentile); the
--   method is named in the interpolation column. A per-request metric without any known
--   value has NULL statistics and null_reason says so (never 0); the gap metrics (itl_*)
--   have no row for a perspective without any gap (every counted request has at most one
--   chunk), and NULL statistics with a reason when gaps exist but none has a value. Per-request values come from view
--   request_metrics, gaps from view request_gap_times. request_set says which requests a row
--   counts: 'every request', or for the gap rows under a keep policy the random sample (its
--   size, and the requests kept for a rule and summarized that are left out: docs/metrics.md).
--   Prefix cache (engines that report gen_ai.usage.cache_read.input_tokens, e.g. tokentrace's
--   continuous engine): ttft_ms_prefix_cache_hit / ttft_ms_prefix_cache_miss are the TTFT
--   distribution over the requests reporting both cached and input tokens (request_metrics'
--   cache_reporting, the rule window.sql uses too) with cached_tokens > 0 / = 0 (no row for a
--   perspective without such a request, as itl_*); prefix_cache_hit_share is one figure in
--   mean: cached prompt tokens / input tokens over those requests (count them, null_count the
--   others), NULL with its reason when none reports cached tokens.
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
-- the gaps of the counted requests, matched on the integer request_key (view request_keys):
-- request_gap_times holds the gap figures without the request's names. Under a keep policy
-- only the random sample's (sampling_reason head): a request kept for a rule is slow by
-- selection and would bias the distribution; a summarized one has no gaps
req_keys AS (
    SELECT r.perspective, k.request_key
    FROM req r
    JOIN request_keys k
      ON k.trace_id = r.trace_id AND k.request_span_id = r.request_span_id
     AND k.perspective = r.perspective AND k.source = r.source
    WHERE r.sampling_reason IS NULL OR r.sampling_reason = 'head'
),
-- which requests each figure counts, per perspective: every counted request, except the gap
-- figures under a keep policy (the random sample only)
request_sets AS (
    SELECT perspective,
           CASE WHEN count(sampling_reason) = 0 THEN 'every request'
                ELSE 'random sample: ' || CAST(count(*) FILTER (WHERE sampling_reason = 'head') AS VARCHAR)
                     || ' of ' || CAST(count(*) AS VARCHAR) || ' requests ('
                     || CAST(count(*) FILTER (WHERE sampling_reason NOT IN ('head', 'summary')) AS VARCHAR)
                     || ' kept for a rule and '
                     || CAST(count(*) FILTER (WHERE sampling_reason = 'summary') AS VARCHAR)
                     || ' summarized left out)' END AS gap_set
    FROM req
    GROUP BY perspective
),
metrics (metric_order, metric, unit) AS (
    VALUES (1, 'ttft_ms', 'ms'), (2, 'tpot_ms', 'ms/token'), (3, 'e2e_ms', 'ms'),
           (4, 'itl_ms', 'ms per chunk gap'), (5, 'itl_per_token_ms', 'ms per token'),
           (6, 'decode_output_tokens_per_second', 'tokens/s'),
           (7, 'whole_request_output_tokens_per_second', 'tokens/s'),
           (8, 'ttft_ms_prefix_cache_hit', 'ms'), (9, 'ttft_ms_prefix_cache_miss', 'ms'),
           (10, 'prefix_cache_hit_share', 'fraction of input tokens')
),
-- one (perspective, metric number, value) row per known-or-NULL per-request figure
vals AS (
    SELECT perspective, 1 AS metric_order, ttft_ms AS value FROM req
    UNION ALL
    SELECT perspective, 2, tpot_ms FROM req
    UNION ALL
    SELECT perspective, 3, e2e_ms FROM req
    UNION ALL
    SELECT perspective, 6, decode_output_tokens_per_second FROM req
    UNION ALL
    SELECT perspective, 7, whole_request_output_tokens_per_second FROM req
    UNION ALL
    SELECT perspective, 8, ttft_ms FROM req WHERE cache_reporting AND cached_tokens > 0
    UNION ALL
    SELECT perspective, 9, ttft_ms FROM req WHERE cache_reporting AND cached_tokens = 0
),
-- the token share: one ratio of sums per perspective, over the requests that report both
cache_share AS (
    SELECT
        10 AS metric_order,
        perspective,
        count(*) FILTER (WHERE cache_reporting) AS count,
        count(*) - count(*) FILTER (WHERE cache_reporting) AS null_count,
        sum(cached_tokens) FILTER (WHERE cache_reporting) / sum(input_tokens) FILTER (WHERE cache_reporting) AS mean
    FROM req
    GROUP BY perspective
),
-- the four percentiles in one pass (one sorted copy of the values, not four)
request_distributions AS (
    SELECT
        metric_order,
        perspective,
        count(value) AS count,
        count(*) - count(value) AS null_count,
        avg(value) AS mean,
        stddev_pop(value) AS std_pop,
        min(value) AS min,
        quantile_cont(value, [0.5, 0.9, 0.95, 0.99]) AS percentiles,
        max(value) AS max
    FROM vals
    GROUP BY metric_order, perspective
),
-- both gap metrics from one scan, one join and one aggregation of the gaps, the widest
-- input (at 1e6 requests 298M rows, mostly evicted to DuckDB's temp directory); a
-- perspective without any gap has no group, hence no itl_* row. The statistics and the four
-- fractions are those of request_distributions (tests/test_queries_summary.py checks each
-- metric's p50-p99 against numpy)
gap_aggregates AS (
    SELECT
        r.perspective,
        count(*) AS gaps,
        count(g.itl_ms) AS itl_count,
        avg(g.itl_ms) AS itl_mean,
        stddev_pop(g.itl_ms) AS itl_std_pop,
        min(g.itl_ms) AS itl_min,
        quantile_cont(g.itl_ms, [0.5, 0.9, 0.95, 0.99]) AS itl_percentiles,
        max(g.itl_ms) AS itl_max,
        count(g.itl_per_token_ms) AS per_token_count,
        avg(g.itl_per_token_ms) AS per_token_mean,
        stddev_pop(g.itl_per_token_ms) AS per_token_std_pop,
        min(g.itl_per_token_ms) AS per_token_min,
        quantile_cont(g.itl_per_token_ms, [0.5, 0.9, 0.95, 0.99]) AS per_token_percentiles,
        max(g.itl_per_token_ms) AS per_token_max
    FROM request_gap_times g
    JOIN req_keys r ON r.request_key = g.request_key
    GROUP BY r.perspective
),
distributions AS (
    SELECT * FROM request_distributions
    UNION ALL
    SELECT 4, perspective, itl_count, gaps - itl_count, itl_mean, itl_std_pop, itl_min,
           itl_percentiles, itl_max
    FROM gap_aggregates
    UNION ALL
    SELECT 5, perspective, per_token_count, gaps - per_token_count, per_token_mean,
           per_token_std_pop, per_token_min, per_token_percentiles, per_token_max
    FROM gap_aggregates
    UNION ALL
    SELECT metric_order, perspective, count, null_count, CAST(mean AS DOUBLE), CAST(NULL AS DOUBLE),
           CAST(NULL AS DOUBLE), CAST(NULL AS DOUBLE[]), CAST(NULL AS DOUBLE)
    FROM cache_share
)
SELECT
    metric,
    perspective,
    unit,
    count,
    null_count,
    mean,
    std_pop,
    min,
    percentiles[1] AS p50,
    percentiles[2] AS p90,
    percentiles[3] AS p95,
    percentiles[4] AS p99,
    max,
    'linear' AS interpolation,
    CASE WHEN metric_order IN (4, 5) THEN coalesce(s.gap_set, 'every request') ELSE 'every request' END
        AS request_set,
    CASE WHEN count = 0 AND metric_order = 10
         THEN 'no request reports prefix-cache tokens (gen_ai.usage.cache_read.input_tokens)'
         WHEN count = 0 THEN 'no known value of ' || metric END AS null_reason
FROM distributions
JOIN metrics USING (metric_order)
LEFT JOIN request_sets s USING (perspective)
ORDER BY metric_order, perspective;
