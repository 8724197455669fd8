-- returns: the (concurrency, duration) observations of guidellm 0.8's request_concurrency
--   (DistributionSummary.concurrency_distribution_from_timings) per (benchmark, status) from
--   guidellm_request_rows (audit/guidellm_requests.sql, records in_by_request with a start and
--   an end time) and guidellm_windows, each status also as 'total': +1 at each request's
--   start_time, -1 at its end_time; equal times summed, times within $threshold_s of a group's
--   first time merged into it (greedy, as audit/guidellm_rates.sql); the changes before
--   measure_start folded into one change at measure_start, times after measure_end dropped and
--   measure_end added with 0; concurrency = the running sum (at least 0) held until the next
--   time: an observation of that concurrency weighted by the time it held (the last time's none).
--   n_intervals: the requests counted (guidellm's count); n_times the merged times (<= 1: no
--   observation).
-- param: $threshold_s DOUBLE default 0.0001 -- guidellm's merge threshold (s)
-- units: value requests in flight; weight seconds; counts requests.
WITH keys AS (
    SELECT w.benchmark, s.status, w.measure_start, w.measure_end
    FROM guidellm_windows w
    CROSS JOIN (VALUES ('successful'), ('incomplete'), ('errored'), ('total')) AS s(status)
),
intervals AS (
    SELECT benchmark, status, start_time, end_time FROM guidellm_request_rows
    WHERE in_by_request AND start_time IS NOT NULL AND end_time IS NOT NULL
    UNION ALL
    SELECT benchmark, 'total', start_time, end_time FROM guidellm_request_rows
    WHERE in_by_request AND start_time IS NOT NULL AND end_time IS NOT NULL
),
counted AS (
    SELECT k.benchmark, k.status, count(i.start_time) AS n_intervals
    FROM keys k LEFT JOIN intervals i USING (benchmark, status)
    GROUP BY k.benchmark, k.status
),
changes AS (
    SELECT benchmark, status, start_time AS t, 1.0 AS weight FROM intervals
    UNION ALL
    SELECT benchmark, status, end_time, -1.0 FROM intervals
),
unique_times AS (
    SELECT benchmark, status, t, sum(weight) AS weight FROM changes GROUP BY benchmark, status, t
),
ordered AS (
    SELECT *,
           row_number() OVER k AS rn,
           count(*) OVER (PARTITION BY benchmark, status ORDER BY t
                          RANGE BETWEEN UNBOUNDED PRECEDING AND $threshold_s FOLLOWING) AS reach,
           coalesce(t - lag(t) OVER k > $threshold_s, true) AS run_start
    FROM unique_times
    WINDOW k AS (PARTITION BY benchmark, status ORDER BY t)
),
group_starts AS (
    WITH RECURSIVE walk(benchmark, status, rn) AS (
        SELECT benchmark, status, rn FROM ordered WHERE run_start
        UNION ALL
        SELECT n.benchmark, n.status, n.rn
        FROM walk w
        JOIN ordered s ON s.benchmark = w.benchmark AND s.status = w.status AND s.rn = w.rn
        JOIN ordered n ON n.benchmark = s.benchmark AND n.status = s.status AND n.rn = s.reach + 1
                      AND NOT n.run_start
    )
    SELECT DISTINCT benchmark, status, rn FROM walk
),
merged AS (
    SELECT benchmark, status, min(t) AS t, sum(weight) AS weight
    FROM (
        SELECT o.*, sum(CASE WHEN g.rn IS NOT NULL THEN 1 ELSE 0 END) OVER (
                   PARTITION BY o.benchmark, o.status ORDER BY o.rn ROWS UNBOUNDED PRECEDING) AS group_id
        FROM ordered o LEFT JOIN group_starts g USING (benchmark, status, rn)
    ) GROUP BY benchmark, status, group_id
),
edged AS (
    -- the changes before measure_start, folded into one at measure_start (only when any time exists)
    SELECT k.benchmark, k.status, k.measure_start AS t, coalesce(sum(m.weight) FILTER (WHERE m.t < k.measure_start), 0)
           AS weight
    FROM keys k JOIN merged m USING (benchmark, status)
    GROUP BY k.benchmark, k.status, k.measure_start
    UNION ALL
    SELECT m.benchmark, m.status, m.t, m.weight
    FROM merged m JOIN keys k USING (benchmark, status)
    WHERE m.t >= k.measure_start AND m.t <= k.measure_end
    UNION ALL
    SELECT k.benchmark, k.status, k.measure_end, 0.0
    FROM keys k WHERE EXISTS (SELECT 1 FROM merged m WHERE m.benchmark = k.benchmark AND m.status = k.status)
),
levels AS (
    SELECT *,
           greatest(sum(weight) OVER w, 0) AS concurrency,
           greatest(lead(t) OVER w - t, 0) AS duration,
           count(*) OVER (PARTITION BY benchmark, status) AS n_times
    FROM edged
    WINDOW w AS (PARTITION BY benchmark, status ORDER BY t ROWS UNBOUNDED PRECEDING)
)
SELECT l.benchmark, l.status, l.concurrency AS value, l.duration AS weight, c.n_intervals, l.n_times
FROM levels l JOIN counted c USING (benchmark, status)
WHERE l.duration IS NOT NULL
UNION ALL
SELECT c.benchmark, c.status, NULL, NULL, c.n_intervals, 0 FROM counted c;
