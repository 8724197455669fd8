-- returns: the timed events of guidellm 0.8's rate distributions, one row per (benchmark,
--   metric, status, t, weight) from guidellm_request_rows (audit/guidellm_requests.sql,
--   records in_by_request), each also under status 'total': requests_per_second, one event of
--   weight 1 at each request's end_time; prompt_tokens_per_second, the prompt's tokens at the
--   first token (else end_time); output_tokens_per_second, 1 token at the first token (0 with
--   no output) then iter_tokens_per_iteration tokens at each of token_iterations - 1 later
--   iterations, **evenly spaced** between the first and the last token (guidellm has no
--   per-token times: numpy.linspace(first_token, last_token, token_iterations)[1:], the last
--   exactly last_token), or the whole output at last_token (else end_time) without iteration
--   data; tokens_per_second, the prompt event plus the output events.
-- units: t seconds since the epoch; weight requests or tokens.
WITH r AS (SELECT * FROM guidellm_request_rows WHERE in_by_request),
output_events AS (
    SELECT benchmark, status,
           CASE WHEN first_token IS NULL OR last_token IS NULL OR token_iterations <= 1
                THEN coalesce(last_token, end_time) ELSE first_token END AS t,
           CASE WHEN first_token IS NULL OR last_token IS NULL OR token_iterations <= 1
                THEN coalesce(output_tokens, 0)
                ELSE CASE WHEN coalesce(output_tokens, 0) <> 0 THEN 1.0 ELSE 0.0 END END AS weight
    FROM r
    UNION ALL
    SELECT benchmark, status,
           CASE WHEN k.step = token_iterations - 1 THEN last_token
                ELSE k.step * ((last_token - first_token) / (token_iterations - 1)) + first_token END,
           iter_tokens_per_iteration
    FROM r CROSS JOIN unnest(range(1, CAST(token_iterations AS BIGINT))) AS k(step)
    WHERE first_token IS NOT NULL AND last_token IS NOT NULL AND token_iterations > 1
      AND iter_tokens_per_iteration IS NOT NULL
),
prompt_events AS (
    SELECT benchmark, status, coalesce(first_token, end_time) AS t, coalesce(prompt_tokens, 0) AS weight FROM r
),
events AS (
    SELECT benchmark, 'requests_per_second' AS metric, status, end_time AS t, 1.0 AS weight FROM r
    UNION ALL
    SELECT benchmark, 'prompt_tokens_per_second', status, t, weight FROM prompt_events
    UNION ALL
    SELECT benchmark, 'output_tokens_per_second', status, t, weight FROM output_events
    UNION ALL
    SELECT benchmark, 'tokens_per_second', status, t, weight FROM prompt_events
    UNION ALL
    SELECT benchmark, 'tokens_per_second', status, t, weight FROM output_events
)
SELECT benchmark, metric, status, t, weight FROM events WHERE t IS NOT NULL
UNION ALL
SELECT benchmark, metric, 'total', t, weight FROM events WHERE t IS NOT NULL;
