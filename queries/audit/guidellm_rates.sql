-- returns: the (rate, duration) observations of guidellm 0.8's rate distributions
--   (DistributionSummary.rate_distribution_from_timings) from guidellm_rate_events
--   (audit/guidellm_rate_events.sql) and guidellm_windows: per (benchmark, metric, status),
--   events before measure_start or after measure_end dropped and the two window edges added
--   with weight 0; equal times summed; times within $threshold_s of a group's first time
--   merged into it (greedy, left to right: the group keeps its first time and the sum of its
--   weights); then each time i gets the local duration between the midpoints to its
--   neighbours (the first from itself, the last to itself, at least $epsilon) and the rate
--   weight_i / duration_i, an observation of that rate weighted by that duration. So the
--   duration-weighted mean rate is the events per second of the window (a throughput), while
--   the median and percentiles are rates over sub-millisecond-to-second local intervals: not
--   throughputs. n_events: the merged times; event_count: round(sum of weights), guidellm's
--   count (with <= 1 merged time: no observation and event_count = the number of times).
-- param: $threshold_s DOUBLE default 0.0001 -- guidellm's merge threshold (s)
-- param: $epsilon DOUBLE default 0.000001 -- guidellm's smallest last duration (s)
-- units: value events per second (requests/s, tokens/s); weight seconds; counts events.
WITH keys AS (
    SELECT w.benchmark, m.metric, s.status, w.measure_start, w.measure_end
    FROM guidellm_windows w
    CROSS JOIN (VALUES ('requests_per_second'), ('prompt_tokens_per_second'), ('output_tokens_per_second'),
                       ('tokens_per_second')) AS m(metric)
    CROSS JOIN (VALUES ('successful'), ('incomplete'), ('errored'), ('total')) AS s(status)
),
windowed AS (
    SELECT e.benchmark, e.metric, e.status, e.t, e.weight
    FROM guidellm_rate_events e
    JOIN keys k USING (benchmark, metric, status)
    WHERE e.t >= k.measure_start AND e.t <= k.measure_end
    UNION ALL
    SELECT benchmark, metric, status, measure_start, 0.0 FROM keys
    UNION ALL
    SELECT benchmark, metric, status, measure_end, 0.0 FROM keys
),
unique_times AS (
    SELECT benchmark, metric, status, t, sum(weight) AS weight
    FROM windowed GROUP BY benchmark, metric, status, t
),
ordered AS (
    SELECT *,
           row_number() OVER k AS rn,
           -- how many times are <= t + threshold: the next group starts at reach + 1
           count(*) OVER (PARTITION BY benchmark, metric, status ORDER BY t
                          RANGE BETWEEN UNBOUNDED PRECEDING AND $threshold_s FOLLOWING) AS reach,
           coalesce(t - lag(t) OVER k > $threshold_s, true) AS run_start
    FROM unique_times
    WINDOW k AS (PARTITION BY benchmark, metric, status ORDER BY t)
),
group_starts AS (
    -- a time more than threshold after its predecessor always starts a group; inside a run of
    -- closer times, follow the greedy walk from the run's first time
    WITH RECURSIVE walk(benchmark, metric, status, rn) AS (
        SELECT benchmark, metric, status, rn FROM ordered WHERE run_start
        UNION ALL
        SELECT n.benchmark, n.metric, n.status, n.rn
        FROM walk w
        JOIN ordered s ON s.benchmark = w.benchmark AND s.metric = w.metric AND s.status = w.status AND s.rn = w.rn
        JOIN ordered n ON n.benchmark = s.benchmark AND n.metric = s.metric AND n.status = s.status
                      AND n.rn = s.reach + 1 AND NOT n.run_start
    )
    SELECT DISTINCT benchmark, metric, status, rn FROM walk
),
grouped AS (
    SELECT o.*, sum(CASE WHEN g.rn IS NOT NULL THEN 1 ELSE 0 END) OVER (
               PARTITION BY o.benchmark, o.metric, o.status ORDER BY o.rn ROWS UNBOUNDED PRECEDING) AS group_id
    FROM ordered o
    LEFT JOIN group_starts g USING (benchmark, metric, status, rn)
),
merged AS (
    SELECT benchmark, metric, status, group_id, min(t) AS t, sum(weight) AS weight
    FROM grouped GROUP BY benchmark, metric, status, group_id
),
timed AS (
    SELECT *,
           count(*) OVER p AS n_events,
           (lead(t) OVER w + t) / 2 AS mid_next,
           (t + lag(t) OVER w) / 2 AS mid_prev,
           row_number() OVER w AS position
    FROM merged
    WINDOW p AS (PARTITION BY benchmark, metric, status),
           w AS (PARTITION BY benchmark, metric, status ORDER BY t)
),
durations AS (
    SELECT *,
           CASE WHEN position = 1 THEN mid_next - t
                WHEN position = n_events THEN greatest(t - mid_prev, $epsilon)
                ELSE mid_next - mid_prev END AS duration
    FROM timed
),
counts AS (
    SELECT benchmark, metric, status, max(n_events) AS n_events,
           CASE WHEN max(n_events) <= 1 THEN max(n_events) ELSE round(sum(weight)) END AS event_count
    FROM durations GROUP BY benchmark, metric, status
)
SELECT d.benchmark, d.metric, d.status, d.weight / d.duration AS value, d.duration AS weight, c.n_events,
       c.event_count
FROM durations d JOIN counts c USING (benchmark, metric, status)
WHERE c.n_events > 1
UNION ALL
SELECT benchmark, metric, status, NULL, NULL, n_events, event_count FROM counts WHERE n_events <= 1;
