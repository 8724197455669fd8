-- returns: step time against what the step held (view engine_steps): one row for all steps
--   (grouping 'all'), one per batch size (grouping 'batch_size', group_min = group_max = the
--   size) and one per scheduled-token bucket (grouping 'scheduled_tokens': 1-16, 17-128,
--   129-1024, >1024; every bucket listed, an empty one with steps = 0 and a reason). Per
--   group: steps, step_ms mean / p50 / p90 / p99 / max (linear interpolation, as
--   summary.sql), mean schedule_ms, batch size, scheduled and prefill tokens, and the least-
--   squares line step_ms = fixed_ms + ms_per_scheduled_token x scheduled_tokens with its r2
--   (NULL with a reason when the group's steps have fewer than two distinct token counts).
--   A fit that does not hold is not a finding: below $min_fit_steps steps or an r2 below
--   $min_fit_r2, ms_per_scheduled_token and fixed_ms are NULL and null_reason says "fit does
--   not hold" with the steps and r2 (fit_r2 is still given: it is the evidence).
--   Without any engine_step span (traces from --engine sequential) one 'all' row with
--   steps = 0, every figure NULL and null_reason saying why (never 0).
-- param: $clock_domain VARCHAR default NULL -- only this clock domain; NULL = every engine's steps together
-- param: $min_fit_steps BIGINT default 5 -- fewer steps in a group: its line is not given (two points always fit)
-- param: $min_fit_r2 DOUBLE default 0.5 -- a lower r2: its line is not given (it explains too little of step_ms)
-- units: *_ms milliseconds; ms_per_scheduled_token milliseconds per token; steps a count;
--   batch_size_mean sequences; *_tokens_mean tokens; fit_r2 a fraction (0..1).
WITH steps AS (
    SELECT * FROM engine_steps WHERE $clock_domain IS NULL OR clock_domain = $clock_domain
),
total AS (
    SELECT count(*) AS steps_total FROM steps
),
groups AS (
    SELECT 'all' AS grouping, 0 AS group_order, 'all' AS group_label,
           CAST(NULL AS BIGINT) AS group_min, CAST(NULL AS BIGINT) AS group_max
    UNION ALL
    SELECT DISTINCT 'batch_size', batch_size, CAST(batch_size AS VARCHAR), batch_size, batch_size
    FROM steps WHERE batch_size IS NOT NULL
    UNION ALL
    SELECT 'scheduled_tokens', b.bucket_order, b.bucket, b.min_tokens, b.max_tokens
    FROM scheduled_token_buckets b CROSS JOIN total t WHERE t.steps_total > 0
),
members AS (
    SELECT 'all' AS grouping, 0 AS group_order, s.* FROM steps s
    UNION ALL
    SELECT 'batch_size', s.batch_size, s.* FROM steps s WHERE s.batch_size IS NOT NULL
    UNION ALL
    SELECT 'scheduled_tokens', s.scheduled_bucket_order, s.* FROM steps s WHERE s.scheduled_bucket_order IS NOT NULL
),
stats AS (
    SELECT grouping, group_order,
           count(*) AS steps,
           avg(step_ms) AS step_ms_mean,
           quantile_cont(step_ms, [0.5, 0.9, 0.99]) AS step_ms_percentiles,
           max(step_ms) AS step_ms_max,
           avg(schedule_ms) AS schedule_ms_mean,
           avg(batch_size) AS batch_size_mean,
           avg(scheduled_tokens) AS scheduled_tokens_mean,
           avg(prefill_tokens) AS prefill_tokens_mean,
           count(DISTINCT scheduled_tokens) AS distinct_scheduled_tokens,
           regr_slope(step_ms, scheduled_tokens) AS slope,
           regr_intercept(step_ms, scheduled_tokens) AS intercept,
           regr_r2(step_ms, scheduled_tokens) AS r2
    FROM members
    GROUP BY grouping, group_order
)
SELECT
    g.grouping,
    g.group_label,
    g.group_min,
    g.group_max,
    coalesce(st.steps, 0) AS steps,
    st.step_ms_mean,
    st.step_ms_percentiles[1] AS step_ms_p50,
    st.step_ms_percentiles[2] AS step_ms_p90,
    st.step_ms_percentiles[3] AS step_ms_p99,
    st.step_ms_max,
    st.schedule_ms_mean,
    st.batch_size_mean,
    st.scheduled_tokens_mean,
    st.prefill_tokens_mean,
    CASE WHEN f.fit_holds THEN st.slope END AS ms_per_scheduled_token,
    CASE WHEN f.fit_holds THEN st.intercept END AS fixed_ms,
    CASE WHEN st.distinct_scheduled_tokens > 1 THEN least(st.r2, 1.0) END AS fit_r2,
    CASE
        WHEN t.steps_total = 0 THEN
            'no engine_step spans: no step data (traces from --engine sequential, or engine traces not loaded)'
        WHEN st.steps IS NULL THEN 'no step in this group'
        WHEN st.distinct_scheduled_tokens < 2 THEN
            'fit needs steps with at least two distinct scheduled_tokens values'
        WHEN st.steps < $min_fit_steps THEN
            'fit does not hold: ' || st.steps || ' steps, fewer than ' || $min_fit_steps || ' (min_fit_steps)'
        WHEN NOT f.fit_holds THEN
            'fit does not hold: r2 ' || printf('%.3f', least(st.r2, 1.0)) || ' below ' || $min_fit_r2
            || ' (min_fit_r2) over ' || st.steps || ' steps'
    END AS null_reason
FROM groups g
CROSS JOIN total t
LEFT JOIN stats st ON st.grouping = g.grouping AND st.group_order = g.group_order
CROSS JOIN LATERAL (
    SELECT coalesce(st.distinct_scheduled_tokens > 1 AND st.steps >= $min_fit_steps
                    AND least(st.r2, 1.0) >= $min_fit_r2, false) AS fit_holds
) f
ORDER BY CASE g.grouping WHEN 'all' THEN 0 WHEN 'batch_size' THEN 1 ELSE 2 END, g.group_order;
