-- returns: one row per (family, q) of prom_buckets(family, le, cumulative): the quantile q (0.01,
--   0.05, 0.10, 0.25, 0.5, 0.75, 0.9, 0.95, 0.99) estimated as Prometheus' histogram_quantile does (promql/quantile.go
--   bucketQuantile) over the cumulative bucket counts of a window (the scrape minus its
--   baseline, summed over the family's series: sum by (le)): counts made monotonic (a bucket
--   below an earlier one takes its count); observations = the +Inf bucket's count; rank = q x
--   observations; the first finite bucket whose count reaches rank is the one interpolated in:
--   estimate = lower + (upper - lower) x (rank - count below) / (count in the bucket), the lower
--   bound of the first bucket 0 (its upper bound itself when <= 0); a rank only the +Inf bucket
--   reaches gives the largest finite upper bound. bucket_lower / bucket_upper: the bounds of
--   the bucket the estimate was interpolated in (upper NULL: the +Inf bucket); allowed_error:
--   how far the true quantile can lie from the estimate inside that bucket, max(estimate -
--   lower, upper - estimate) (NULL in the +Inf bucket: unbounded). rank_lower / rank_upper:
--   where the true q-quantile lies by any usual definition: from the lower bound of the bucket
--   holding the lowest of the observations it may be (nearest rank ceil(q x n); numpy's linear
--   between the floor(q (n - 1)) + 1-th and ceil(q (n - 1)) + 1-th) to the upper bound of the
--   bucket holding the highest (upper NULL: +Inf); an estimate outside cannot be right. NULL estimate: no observation in the window
--   (Prometheus: NaN).
-- units: le, estimate, bounds and allowed_error in the family's unit (seconds for *_seconds);
--   counts observations.
WITH b AS (
    SELECT family, le,
           max(cumulative) OVER (PARTITION BY family ORDER BY le ROWS UNBOUNDED PRECEDING) AS cum,
           row_number() OVER (PARTITION BY family ORDER BY le) AS idx,
           count(*) OVER (PARTITION BY family) AS n_buckets
    FROM prom_buckets
),
b2 AS (
    SELECT *, lag(le) OVER (PARTITION BY family ORDER BY le) AS prev_le,
              coalesce(lag(cum) OVER (PARTITION BY family ORDER BY le), 0) AS prev_cum
    FROM b
),
totals AS (
    SELECT family, max(cum) FILTER (WHERE le = 'infinity'::DOUBLE) AS observations,
           max(le) FILTER (WHERE le < 'infinity'::DOUBLE) AS largest_finite
    FROM b GROUP BY family
),
qs AS (SELECT CAST(q AS DOUBLE) AS q
       FROM (VALUES (0.01), (0.05), (0.10), (0.25), (0.5), (0.75), (0.9), (0.95), (0.99)) AS t(q)),
picked AS (
    SELECT t.family, qs.q, t.observations, t.largest_finite, qs.q * t.observations AS rank,
           (SELECT min(x.idx) FROM b2 x WHERE x.family = t.family AND x.idx < x.n_buckets
              AND x.cum >= qs.q * t.observations) AS idx,
           (SELECT min(x.idx) FROM b2 x WHERE x.family = t.family
              AND x.cum >= least(ceil(qs.q * t.observations - 1e-9),
                                 floor(qs.q * (t.observations - 1) + 1e-9) + 1)) AS rank_low_idx,
           (SELECT min(x.idx) FROM b2 x WHERE x.family = t.family
              AND x.cum >= greatest(ceil(qs.q * t.observations - 1e-9),
                                    ceil(qs.q * (t.observations - 1) - 1e-9) + 1)) AS rank_high_idx
    FROM totals t CROSS JOIN qs
)
SELECT p.family, p.q, p.observations,
       CASE WHEN coalesce(p.observations, 0) = 0 THEN NULL
            WHEN p.idx IS NULL THEN p.largest_finite
            WHEN p.idx = 1 AND x.le <= 0 THEN x.le
            ELSE coalesce(x.prev_le, 0) + (x.le - coalesce(x.prev_le, 0)) * (p.rank - x.prev_cum) / (x.cum - x.prev_cum)
       END AS estimate,
       CASE WHEN coalesce(p.observations, 0) = 0 THEN NULL
            WHEN p.idx IS NULL THEN p.largest_finite ELSE coalesce(x.prev_le, 0) END AS bucket_lower,
       CASE WHEN coalesce(p.observations, 0) = 0 OR p.idx IS NULL THEN NULL ELSE x.le END AS bucket_upper,
       p.idx IS NULL AND coalesce(p.observations, 0) > 0 AS in_inf_bucket,
       CASE WHEN coalesce(p.observations, 0) > 0 THEN coalesce(r.prev_le, 0) END AS rank_lower,
       CASE WHEN coalesce(p.observations, 0) > 0 AND h.le < 'infinity'::DOUBLE THEN h.le END AS rank_upper
FROM picked p
LEFT JOIN b2 x ON x.family = p.family AND x.idx = p.idx
LEFT JOIN b2 r ON r.family = p.family AND r.idx = p.rank_low_idx
LEFT JOIN b2 h ON h.family = p.family AND h.idx = p.rank_high_idx
ORDER BY p.family, p.q;
