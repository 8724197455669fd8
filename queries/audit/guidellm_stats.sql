-- returns: one row per (benchmark, metric, status) of guidellm_counts, with guidellm 0.8's
--   summary of the weighted observations in guidellm_weighted (DistributionSummary.from_values
--   and from_pdf): equal values merged (weights summed), zero weights dropped, probabilities =
--   weight / total weight (uniform when the total is <= 1e-6); mean = sum(value x p);
--   variance = sum((value - mean)^2 x p) (population, weighted); std_dev its root; mode = the
--   value of largest p (the smallest such); min, max; count = guidellm_counts.count;
--   total_sum = mean x count; percentile pq = the first value (ascending) whose cumulative p
--   >= q (numpy searchsorted 'left' on the cumulative sum: a weighted nearest-rank percentile,
--   never interpolated), for q = 0.001, 0.01, 0.05, 0.10, 0.25, 0.50 (median), 0.75, 0.90,
--   0.95, 0.99, 0.999. Where the cumulative p lands on q itself (within 1e-9: n x q a whole
--   number of equal weights), guidellm's float cumsum decides between two neighbours:
--   <pq>_low is the value at cumulative >= q - 1e-9, <pq>_high at >= q + 1e-9 (equal when
--   unambiguous). interpolated_p50 / p90 / p99: numpy's linear percentiles of the unweighted
--   values and unweighted_mean their plain mean (each observation once), for comparison with
--   the weighted figures. No observation: every statistic 0 (guidellm's empty summary).
-- units: the metric's own (named in it); count observations (tokens for token-weighted ones).
WITH combined AS (
    SELECT benchmark, metric, status, value, sum(weight) AS weight
    FROM guidellm_weighted WHERE value IS NOT NULL
    GROUP BY benchmark, metric, status, value
),
nonzero AS (SELECT * FROM combined WHERE weight > 0),
totals AS (
    SELECT benchmark, metric, status, sum(weight) AS total_weight, count(*) AS n_values
    FROM nonzero GROUP BY benchmark, metric, status
),
probs AS (
    SELECT n.benchmark, n.metric, n.status, n.value,
           CASE WHEN t.total_weight <= 1e-6 THEN 1.0 / t.n_values ELSE n.weight / t.total_weight END AS p
    FROM nonzero n JOIN totals t USING (benchmark, metric, status)
),
cdf AS (
    SELECT *, sum(p) OVER (PARTITION BY benchmark, metric, status ORDER BY value ROWS UNBOUNDED PRECEDING) AS cum
    FROM probs
),
means AS (
    SELECT benchmark, metric, status, sum(value * p) AS mean, min(value) AS min_value, max(value) AS max_value,
           first(value ORDER BY p DESC, value) AS mode
    FROM cdf GROUP BY benchmark, metric, status
),
spread AS (
    SELECT c.benchmark, c.metric, c.status, sum((c.value - m.mean) ^ 2 * c.p) AS variance
    FROM cdf c JOIN means m USING (benchmark, metric, status)
    GROUP BY c.benchmark, c.metric, c.status
),
qs AS (
    SELECT * FROM (VALUES ('p001', 0.001), ('p01', 0.01), ('p05', 0.05), ('p10', 0.10), ('p25', 0.25),
                          ('p50', 0.50), ('p75', 0.75), ('p90', 0.90), ('p95', 0.95), ('p99', 0.99),
                          ('p999', 0.999)) AS q(name, q)
),
ranks AS (
    SELECT c.benchmark, c.metric, c.status, qs.name,
           coalesce(min(c.value) FILTER (WHERE c.cum >= qs.q - 1e-9), max(c.value)) AS low,
           coalesce(min(c.value) FILTER (WHERE c.cum >= qs.q + 1e-9), max(c.value)) AS high
    FROM cdf c CROSS JOIN qs
    GROUP BY c.benchmark, c.metric, c.status, qs.name
),
pivoted AS (
    SELECT benchmark, metric, status,
           max(low) FILTER (WHERE name = 'p001') AS p001_low, max(high) FILTER (WHERE name = 'p001') AS p001_high,
           max(low) FILTER (WHERE name = 'p01') AS p01_low, max(high) FILTER (WHERE name = 'p01') AS p01_high,
           max(low) FILTER (WHERE name = 'p05') AS p05_low, max(high) FILTER (WHERE name = 'p05') AS p05_high,
           max(low) FILTER (WHERE name = 'p10') AS p10_low, max(high) FILTER (WHERE name = 'p10') AS p10_high,
           max(low) FILTER (WHERE name = 'p25') AS p25_low, max(high) FILTER (WHERE name = 'p25') AS p25_high,
           max(low) FILTER (WHERE name = 'p50') AS p50_low, max(high) FILTER (WHERE name = 'p50') AS p50_high,
           max(low) FILTER (WHERE name = 'p75') AS p75_low, max(high) FILTER (WHERE name = 'p75') AS p75_high,
           max(low) FILTER (WHERE name = 'p90') AS p90_low, max(high) FILTER (WHERE name = 'p90') AS p90_high,
           max(low) FILTER (WHERE name = 'p95') AS p95_low, max(high) FILTER (WHERE name = 'p95') AS p95_high,
           max(low) FILTER (WHERE name = 'p99') AS p99_low, max(high) FILTER (WHERE name = 'p99') AS p99_high,
           max(low) FILTER (WHERE name = 'p999') AS p999_low, max(high) FILTER (WHERE name = 'p999') AS p999_high
    FROM ranks GROUP BY benchmark, metric, status
),
interpolated AS (
    SELECT benchmark, metric, status, quantile_cont(value, 0.50) AS interpolated_p50,
           quantile_cont(value, 0.90) AS interpolated_p90, quantile_cont(value, 0.99) AS interpolated_p99,
           avg(value) AS unweighted_mean
    FROM guidellm_weighted WHERE value IS NOT NULL
    GROUP BY benchmark, metric, status
)
SELECT k.benchmark, k.metric, k.status, k.count,
       coalesce(t.n_values, 0) AS n_values,
       coalesce(m.mean, 0) AS mean, coalesce(p.p50_low, 0) AS median_low, coalesce(p.p50_high, 0) AS median_high,
       coalesce(m.mode, 0) AS mode, coalesce(s.variance, 0) AS variance, coalesce(sqrt(s.variance), 0) AS std_dev,
       coalesce(m.min_value, 0) AS min, coalesce(m.max_value, 0) AS max,
       coalesce(m.mean, 0) * k.count AS total_sum,
       p.* EXCLUDE (benchmark, metric, status),
       i.interpolated_p50, i.interpolated_p90, i.interpolated_p99, i.unweighted_mean
FROM guidellm_counts k
LEFT JOIN totals t USING (benchmark, metric, status)
LEFT JOIN means m USING (benchmark, metric, status)
LEFT JOIN spread s USING (benchmark, metric, status)
LEFT JOIN pivoted p USING (benchmark, metric, status)
LEFT JOIN interpolated i USING (benchmark, metric, status)
ORDER BY k.benchmark, k.metric, k.status;
