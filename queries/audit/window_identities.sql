-- returns: one row: the system-window figures a report's counts imply (docs/metrics.md,
--   "Per window"): request_throughput_rps = succeeded / window_s, observed_goodput_rps =
--   slo_passing / window_s, error_rate = failed / attempted with failed = attempted -
--   succeeded unless given; and the wrong variants real reports use: throughput over
--   attempted instead of succeeded, error rate as a percentage, error rate over succeeded.
-- param: $window_s DOUBLE default NULL -- measurement window (s)
-- param: $attempted BIGINT default NULL -- requests attempted
-- param: $succeeded BIGINT default NULL -- requests that succeeded
-- param: $failed BIGINT default NULL -- requests that failed; NULL = attempted - succeeded
-- param: $slo_passing BIGINT default NULL -- succeeded requests meeting every SLO
-- units: *_rps requests per second; error_rate a fraction (0.02 = 2 %).
WITH counts AS (
    SELECT coalesce($failed, $attempted - $succeeded) AS failed
)
SELECT
    CASE WHEN $window_s > 0 THEN $succeeded / $window_s END AS request_throughput_rps,
    CASE WHEN $window_s > 0 THEN $slo_passing / $window_s END AS observed_goodput_rps,
    CASE WHEN $attempted > 0 THEN failed / CAST($attempted AS DOUBLE) END AS error_rate,
    CASE WHEN $window_s > 0 THEN $attempted / $window_s END AS request_throughput_rps_counting_attempted,
    CASE WHEN $attempted > 0 THEN 100.0 * failed / $attempted END AS error_rate_as_percent,
    CASE WHEN $succeeded > 0 THEN failed / CAST($succeeded AS DOUBLE) END AS error_rate_over_succeeded,
    failed
FROM counts;
