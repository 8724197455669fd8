-- returns: one row per per-request record of a guidellm report (table guidellm_records, one
--   row per record of benchmarks[benchmark].requests.<status>, with the benchmark's measured
--   window in guidellm_windows), with guidellm 0.8's per-request figures recomputed from the
--   record's own timings (GenerativeRequestStats): start_time = request_start, else
--   resolve_start; end_time = request_end, else resolve_end; output_tokens = the usage's
--   output_metrics.total_tokens, else token_iterations (one token an iteration assumed), NULL
--   for 0; request_latency_s = request_end - request_start; ttft_ms = 1000 (first_token -
--   request_start); ttfot_ms = 1000 (first_output_token - request_start); tpot_ms = 1000
--   (last_token, else end_time, - request_start) / output_tokens (TTFT included: guidellm's
--   "time per output token"); itl_ms = 1000 (last_token - first_token) / (output_tokens - 1)
--   (NULL unless output_tokens > 1); total_tokens = prompt + output (NULL when both are);
--   tokens_per_second, output_tokens_per_second over request_latency_s (NULL when 0);
--   iter_tokens_per_iteration = (output_tokens - 1) / (token_iterations - 1) (NULL unless
--   both > 1); schedule-relative: dispatch_delay_s = request_start - targeted_start,
--   scheduled_latency_s = request_end - targeted_start, predecessor_delay_s = max(0, min(
--   request_start, predecessor_completed) - targeted_start) (0 without a predecessor),
--   scheduling_delay_s = dispatch - predecessor delay; the in_* flags say which of guidellm's windowed lists the record is in
--   (get_within_range, partial overlap: its end event >= measure_start and its start event,
--   else its end, <= measure_end): in_by_request (start -> end: the default),
--   in_by_first_token (start -> first token: TTFT), in_by_first_output_token (TTFOT),
--   in_after_first_token (first token -> end: ITL).
-- units: *_s seconds, *_ms milliseconds, times seconds since the epoch, tokens tokens,
--   *_per_second per second.
WITH r AS (
    SELECT g.*, w.measure_start, w.measure_end,
           coalesce(request_start, resolve_start) AS start_time,
           coalesce(request_end, resolve_end) AS end_time,
           coalesce(output_usage_tokens, nullif(token_iterations, 0)) AS output_tokens
    FROM guidellm_records g
    JOIN guidellm_windows w USING (benchmark)
),
derived AS (
    SELECT *,
           request_end - request_start AS request_latency_s,
           1000 * (first_token - request_start) AS ttft_ms,
           1000 * (first_output_token - request_start) AS ttfot_ms,
           CASE WHEN output_tokens <> 0
                THEN 1000 * (coalesce(last_token, end_time) - request_start) / output_tokens END AS tpot_ms,
           CASE WHEN output_tokens > 1
                THEN 1000 * (last_token - first_token) / (output_tokens - 1) END AS itl_ms,
           CASE WHEN prompt_tokens IS NOT NULL OR output_tokens IS NOT NULL
                THEN coalesce(prompt_tokens, 0) + coalesce(output_tokens, 0) END AS total_tokens,
           CASE WHEN output_tokens > 1 AND token_iterations > 1
                THEN (output_tokens - 1.0) / (token_iterations - 1.0) END AS iter_tokens_per_iteration,
           request_start - targeted_start AS dispatch_delay_s,
           request_end - targeted_start AS scheduled_latency_s,
           CASE WHEN targeted_start IS NULL OR request_start IS NULL THEN NULL
                WHEN predecessor_completed IS NULL THEN 0.0
                ELSE greatest(0.0, least(request_start, predecessor_completed) - targeted_start)
           END AS predecessor_delay_s
    FROM r
)
SELECT *,
       dispatch_delay_s - predecessor_delay_s AS scheduling_delay_s,
       CASE WHEN request_latency_s <> 0 THEN total_tokens / request_latency_s END AS tokens_per_second,
       CASE WHEN request_latency_s <> 0 THEN output_tokens / request_latency_s END AS output_tokens_per_second,
       coalesce(end_time >= measure_start AND coalesce(start_time, end_time) <= measure_end, false) AS in_by_request,
       coalesce(first_token >= measure_start AND coalesce(start_time, first_token) <= measure_end, false)
           AS in_by_first_token,
       coalesce(first_output_token >= measure_start AND coalesce(start_time, first_output_token) <= measure_end,
                false) AS in_by_first_output_token,
       coalesce(end_time >= measure_start AND coalesce(first_token, end_time) <= measure_end, false)
           AS in_after_first_token
FROM derived
ORDER BY benchmark, status, record_index;
