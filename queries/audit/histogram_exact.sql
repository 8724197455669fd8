-- returns: one row per (family, q) of histogram_exact_values(family, value_ms): the exact figures of
--   the same window from the traces, to judge a histogram's estimates: n_values, min, max, and
--   the nearest-rank quantile q (the smallest value with at least q x n values <= it: DuckDB
--   quantile_disc), for q = 0.5, 0.9, 0.95, 0.99; also the linear one (quantile_cont) for
--   comparison. The traced figures are milliseconds; the histograms' unit, seconds: value_ms / 1000.
-- units: seconds; n_values values.
WITH v AS (SELECT family, value_ms / 1000.0 AS value FROM histogram_exact_values),
stats AS (
    SELECT family, count(value) AS n_values, min(value) AS min_value, max(value) AS max_value,
           quantile_disc(value, [0.5, 0.9, 0.95, 0.99]) AS nearest, quantile_cont(value, [0.5, 0.9, 0.95, 0.99]) AS linear
    FROM v GROUP BY family
)
SELECT family, CAST([0.5, 0.9, 0.95, 0.99][i] AS DOUBLE) AS q, n_values, min_value, max_value,
       nearest[i] AS exact_nearest_rank, linear[i] AS exact_linear
FROM stats CROSS JOIN range(1, 5) AS r(i)
ORDER BY family, q;
