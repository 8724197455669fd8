-- returns: the gaps of queries/stalls.sql (view request_step_gaps) grouped by what shared
--   the engine step that produced them: by the co-scheduled prefill tokens of the step
--   (grouping 'prefill_tokens': buckets 0, 1-128, 129-1024, >1024, every bucket listed once
--   any gap has step data, an empty one with gaps = 0 and a reason) and by the step's batch
--   size (grouping 'batch_size', one row per size seen; group_min = group_max = the size).
--   Per group: gaps, requests, ITL count / mean / p50 / p90 / p99 / max (linear
--   interpolation, as summary.sql) and the mean step_ms and between_steps_ms. Gaps without
--   step data (traces from --engine sequential, or engine traces not loaded) form, in each
--   grouping, one row per reason with group_label, group_min and group_max NULL and
--   null_reason saying why: they are never counted in bucket 0.
--   Under a keep policy only the random sample's gaps are grouped (sampling_reason head, as in
--   requests.sql); request_set says which requests the rows count, with the sample's size.
-- param: $trace_id VARCHAR default NULL -- only requests of this trace (32 lowercase hex); NULL = all
-- param: $request_span_ids VARCHAR[] default NULL -- only the request whose span is one of these (--request gives every span id of the request's perspectives); NULL = all
-- param: $clock_domain VARCHAR default NULL -- only gaps of this clock domain (the engine's); NULL = all
-- units: itl_*_ms, step_ms_mean, between_steps_ms_mean milliseconds; gaps, requests and
--   itl_count counts; group_min / group_max tokens (prefill_tokens) or sequences (batch_size).
WITH scoped AS (
    SELECT g.*, s.sampling_reason
    FROM request_step_gaps g
    LEFT JOIN request_ids_by_span s ON s.span_id = g.request_span_id
    WHERE ($trace_id IS NULL OR g.trace_id = $trace_id)
      AND ($request_span_ids IS NULL OR list_contains($request_span_ids, g.request_span_id))
      AND ($clock_domain IS NULL OR g.clock_domain = $clock_domain)
),
-- under a keep policy, the random sample's gaps only: a request kept for a rule is slow by
-- selection and would tilt every group's distribution
gaps AS (
    SELECT * FROM scoped WHERE sampling_reason IS NULL OR sampling_reason = 'head'
),
request_set AS (
    SELECT CASE WHEN count(sampling_reason) = 0 THEN 'every request'
                ELSE 'random sample: ' || CAST(count(*) FILTER (WHERE sampling_reason = 'head') AS VARCHAR)
                     || ' of ' || CAST(count(*) AS VARCHAR) || ' requests with gaps ('
                     || CAST(count(*) FILTER (WHERE sampling_reason NOT IN ('head', 'summary')) AS VARCHAR)
                     || ' kept for a rule left out: tokentrace stalls --section slowest lists them)' END AS request_set
    FROM (SELECT DISTINCT trace_id, request_span_id, sampling_reason FROM scoped)
),
known AS (
    SELECT count(*) AS gaps_with_steps FROM gaps WHERE batch_size IS NOT NULL
),
groups AS (
    SELECT 'prefill_tokens' AS grouping, b.bucket_order AS group_order, b.bucket AS group_label,
           b.min_tokens AS group_min, b.max_tokens AS group_max, CAST(NULL AS VARCHAR) AS reason
    FROM prefill_token_buckets b CROSS JOIN known k WHERE k.gaps_with_steps > 0
    UNION ALL
    SELECT DISTINCT 'batch_size', batch_size, CAST(batch_size AS VARCHAR), batch_size, batch_size, CAST(NULL AS VARCHAR)
    FROM gaps WHERE batch_size IS NOT NULL
    UNION ALL
    SELECT DISTINCT grouping, 1000000 AS group_order, CAST(NULL AS VARCHAR), CAST(NULL AS BIGINT), CAST(NULL AS BIGINT),
           step_null_reason
    FROM gaps CROSS JOIN (VALUES ('prefill_tokens'), ('batch_size')) AS g (grouping)
    WHERE batch_size IS NULL
),
members AS (
    SELECT 'prefill_tokens' AS grouping, prefill_bucket_order AS group_order, CAST(NULL AS VARCHAR) AS reason, *
    FROM gaps WHERE batch_size IS NOT NULL
    UNION ALL
    SELECT 'batch_size', batch_size, CAST(NULL AS VARCHAR), * FROM gaps WHERE batch_size IS NOT NULL
    UNION ALL
    SELECT g.grouping, 1000000, x.step_null_reason, x.*
    FROM gaps x CROSS JOIN (VALUES ('prefill_tokens'), ('batch_size')) AS g (grouping)
    WHERE x.batch_size IS NULL
),
stats AS (
    SELECT grouping, group_order, reason,
           count(*) AS gaps,
           count(DISTINCT trace_id || '/' || request_span_id) AS requests,
           count(itl_ms) AS itl_count,
           avg(itl_ms) AS itl_mean_ms,
           quantile_cont(itl_ms, [0.5, 0.9, 0.99]) AS itl_percentiles,
           max(itl_ms) AS itl_max_ms,
           avg(step_ms) AS step_ms_mean,
           avg(between_steps_ms) AS between_steps_ms_mean
    FROM members
    GROUP BY grouping, group_order, reason
)
SELECT
    g.grouping,
    g.group_label,
    g.group_min,
    g.group_max,
    coalesce(s.gaps, 0) AS gaps,
    coalesce(s.requests, 0) AS requests,
    coalesce(s.itl_count, 0) AS itl_count,
    s.itl_mean_ms,
    s.itl_percentiles[1] AS itl_p50_ms,
    s.itl_percentiles[2] AS itl_p90_ms,
    s.itl_percentiles[3] AS itl_p99_ms,
    s.itl_max_ms,
    s.step_ms_mean,
    s.between_steps_ms_mean,
    CASE
        WHEN g.reason IS NOT NULL THEN g.reason
        WHEN s.gaps IS NULL THEN 'no gap in this group'
        WHEN s.itl_count = 0 THEN 'no known itl_ms in this group (previous tokens'' spans missing)'
    END AS null_reason,
    rs.request_set
FROM groups g
CROSS JOIN request_set rs
LEFT JOIN stats s
  ON s.grouping = g.grouping AND s.group_order = g.group_order
 AND (s.reason = g.reason OR (s.reason IS NULL AND g.reason IS NULL))
ORDER BY CASE g.grouping WHEN 'prefill_tokens' THEN 0 ELSE 1 END, g.group_order, g.reason;
