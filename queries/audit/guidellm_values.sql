-- returns: the (value, weight) observations of every per-request distribution of a guidellm 0.8
--   report, as GenerativeMetrics.compile builds them from guidellm_request_rows (the rows of
--   audit/guidellm_requests.sql): one row per (benchmark, metric, status, value, weight); each
--   observation also under status 'total' (guidellm's total = successful + incomplete +
--   errored). guidellm's None-to-0 rules are kept ("x or 0.0": a record without the figure
--   counts as 0 with weight 1). Weights: 1, except time_per_output_token_ms (weight
--   output_tokens: token-weighted) and inter_token_latency_ms (weight output_tokens - 1; 0 for
--   a one-token request). Windowed lists: request figures over in_by_request; TTFT over
--   in_by_first_token; TTFOT over in_by_first_output_token; ITL over in_after_first_token.
--   output_tokens_per_iteration: per request, 1 for the first token (0 with no output) then
--   iter_tokens_per_iteration for each of token_iterations - 1 later iterations (or the whole
--   output_tokens once without iteration data); iter_tokens_per_iteration: the later ones only.
--   time_to_last_round_trip_ms and avg_round_trip_time_ms: websocket send timings (NULL: 0).
--   Schedule-relative (request_dispatch_delay, request_scheduled_latency, turn_predecessor_delay,
--   turn_scheduling_delay; seconds): records without the figure left out (guidellm's None);
--   root_dispatch_delay: status 'all' (one summary over every status, first turns only).
-- units: metric names carry the unit (_ms milliseconds, request_latency seconds, *_count and
--   *_per_iteration tokens or iterations); weights tokens or 1.
WITH r AS (SELECT * FROM guidellm_request_rows),
iter_rows AS (
    SELECT r.benchmark, r.status, r.record_index, r.output_tokens, r.iter_tokens_per_iteration, r.token_iterations,
           r.first_token, r.last_token
    FROM r WHERE in_by_request
),
obs AS (
    SELECT benchmark, 'request_dispatch_delay' AS metric, status, dispatch_delay_s AS value, 1.0 AS weight
    FROM r WHERE in_by_request AND dispatch_delay_s IS NOT NULL
    UNION ALL
    SELECT benchmark, 'request_scheduled_latency', status, scheduled_latency_s, 1.0
    FROM r WHERE in_by_request AND scheduled_latency_s IS NOT NULL
    UNION ALL
    SELECT benchmark, 'turn_predecessor_delay', status, predecessor_delay_s, 1.0
    FROM r WHERE in_by_request AND predecessor_delay_s IS NOT NULL
    UNION ALL
    SELECT benchmark, 'turn_scheduling_delay', status, scheduling_delay_s, 1.0
    FROM r WHERE in_by_request AND scheduling_delay_s IS NOT NULL
    UNION ALL
    SELECT benchmark, 'request_latency' AS metric, status, coalesce(request_latency_s, 0) AS value, 1.0 AS weight
    FROM r WHERE in_by_request
    UNION ALL
    SELECT benchmark, 'request_streaming_iterations_count', status, coalesce(request_iterations, 0), 1.0
    FROM r WHERE in_by_request
    UNION ALL
    SELECT benchmark, 'prompt_token_count', status, coalesce(prompt_tokens, 0), 1.0 FROM r WHERE in_by_request
    UNION ALL
    SELECT benchmark, 'output_token_count', status, coalesce(output_tokens, 0), 1.0 FROM r WHERE in_by_request
    UNION ALL
    SELECT benchmark, 'total_token_count', status, coalesce(total_tokens, 0), 1.0 FROM r WHERE in_by_request
    UNION ALL
    SELECT benchmark, 'time_to_first_token_ms', status, coalesce(ttft_ms, 0), 1.0 FROM r WHERE in_by_first_token
    UNION ALL
    SELECT benchmark, 'time_to_first_output_token_ms', status, coalesce(ttfot_ms, 0), 1.0
    FROM r WHERE in_by_first_output_token
    UNION ALL
    SELECT benchmark, 'time_per_output_token_ms', status, coalesce(tpot_ms, 0), coalesce(output_tokens, 0)
    FROM r WHERE in_by_request
    UNION ALL
    SELECT benchmark, 'inter_token_latency_ms', status, coalesce(itl_ms, 0),
           CASE WHEN output_tokens IS NULL OR output_tokens = 0 THEN 1 ELSE output_tokens END - 1.0
    FROM r WHERE in_after_first_token
    UNION ALL
    SELECT benchmark, 'time_to_last_round_trip_ms', status,
           coalesce(1000 * (last_token - last_request_sent), 0), 1.0
    FROM r WHERE in_by_request
    UNION ALL
    SELECT benchmark, 'avg_round_trip_time_ms', status,
           CASE WHEN request_sent_count > 0 AND token_received_count > 0
                THEN 1000 * (token_received_sum / token_received_count - request_sent_sum / request_sent_count)
                ELSE 0 END, 1.0
    FROM r WHERE in_by_request
    UNION ALL
    -- output_tokens_per_iteration: the first token's iteration ...
    SELECT benchmark, 'output_tokens_per_iteration', status,
           CASE WHEN first_token IS NULL OR last_token IS NULL OR token_iterations <= 1
                THEN coalesce(output_tokens, 0)
                ELSE CASE WHEN coalesce(output_tokens, 0) <> 0 THEN 1.0 ELSE 0.0 END END, 1.0
    FROM iter_rows
    UNION ALL
    -- ... and each later iteration (both per-iteration metrics)
    SELECT i.benchmark, m.metric, i.status, i.iter_tokens_per_iteration, 1.0
    FROM iter_rows i
    CROSS JOIN (VALUES ('output_tokens_per_iteration'), ('iter_tokens_per_iteration')) AS m(metric)
    CROSS JOIN range(1, CAST(i.token_iterations AS BIGINT)) AS k(step)
    WHERE i.first_token IS NOT NULL AND i.last_token IS NOT NULL AND i.token_iterations > 1
      AND i.iter_tokens_per_iteration IS NOT NULL
)
SELECT benchmark, metric, status, value, weight FROM obs
UNION ALL
SELECT benchmark, metric, 'total', value, weight FROM obs
UNION ALL
-- root_dispatch_delay: one summary over every status, first turns (preceding_nodes 0) only
SELECT benchmark, 'root_dispatch_delay', 'all', dispatch_delay_s, 1.0
FROM r WHERE in_by_request AND preceding_nodes = 0 AND dispatch_delay_s IS NOT NULL;
