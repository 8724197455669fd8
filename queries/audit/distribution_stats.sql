-- returns: one row per metric of the table audit_values(metric VARCHAR, value DOUBLE): the
--   count, sum, mean, median, population and sample standard deviation, min, max, linear
--   percentiles p1 ... p99.9 (DuckDB quantile_cont = numpy.percentile's default 'linear' =
--   pandas Series.quantile's default) and nearest-rank p50/p90/p99 (quantile_disc), so a
--   report's figure can be matched to the method that produced it. NULL values are ignored;
--   a metric with no values has NULL statistics (never 0).
-- units: the unit of audit_values.value (the caller loads milliseconds, seconds or tokens
--   and says which); n_values a count.
SELECT
    metric,
    count(value) AS n_values,
    sum(value) AS sum_value,
    avg(value) AS mean_value,
    median(value) AS median_value,
    stddev_pop(value) AS std_pop,
    stddev_samp(value) AS std_samp,
    min(value) AS min_value,
    max(value) AS max_value,
    quantile_cont(value, 0.01) AS p1,
    quantile_cont(value, 0.05) AS p5,
    quantile_cont(value, 0.10) AS p10,
    quantile_cont(value, 0.25) AS p25,
    quantile_cont(value, 0.50) AS p50,
    quantile_cont(value, 0.75) AS p75,
    quantile_cont(value, 0.90) AS p90,
    quantile_cont(value, 0.95) AS p95,
    quantile_cont(value, 0.99) AS p99,
    quantile_cont(value, 0.999) AS p99_9,
    quantile_disc(value, 0.50) AS p50_nearest_rank,
    quantile_disc(value, 0.90) AS p90_nearest_rank,
    quantile_disc(value, 0.99) AS p99_nearest_rank
FROM audit_values
GROUP BY metric
ORDER BY metric;
