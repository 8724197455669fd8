-- returns: guidellm 0.8's count of each per-request distribution, one row per (benchmark,
--   metric, status) of guidellm_windows x the value metrics x the four statuses: round(sum of
--   the observations' weights) of guidellm_values_loaded (the rows of audit/guidellm_values.sql),
--   0 without observations. For the token-weighted metrics the count is tokens, not requests
--   (time_per_output_token_ms counts output tokens; inter_token_latency_ms output tokens - 1).
--   root_dispatch_delay has one status, 'all'.
-- units: observations (requests, iterations or tokens).
WITH keys AS (
    SELECT w.benchmark, m.metric, s.status
    FROM guidellm_windows w
    CROSS JOIN (VALUES ('request_latency'), ('request_streaming_iterations_count'), ('prompt_token_count'),
                       ('output_token_count'), ('total_token_count'), ('time_to_first_token_ms'),
                       ('time_to_first_output_token_ms'), ('time_per_output_token_ms'),
                       ('inter_token_latency_ms'), ('time_to_last_round_trip_ms'), ('avg_round_trip_time_ms'),
                       ('output_tokens_per_iteration'), ('iter_tokens_per_iteration'), ('request_dispatch_delay'),
                       ('request_scheduled_latency'), ('turn_predecessor_delay'), ('turn_scheduling_delay')) AS m(metric)
    CROSS JOIN (VALUES ('successful'), ('incomplete'), ('errored'), ('total')) AS s(status)
    UNION ALL
    SELECT benchmark, 'root_dispatch_delay', 'all' FROM guidellm_windows
)
SELECT k.benchmark, k.metric, k.status, coalesce(round_even(sum(v.weight), 0), 0) AS count
FROM keys k
LEFT JOIN guidellm_values_loaded v USING (benchmark, metric, status)
GROUP BY k.benchmark, k.metric, k.status;
