-- returns: the $per_request slowest gaps of each request (largest itl_ms of view
--   request_step_gaps; ties: the earlier token first), gap_rank 1 = the slowest, with the
--   engine step that produced each and what shared that step: the other sequences in it
--   (from the request spans that name the step, view engine_step_requests), how many were
--   decoding and how many prefilling, their prefill tokens, the largest co-scheduled
--   prefill chunk and its request, and every co-scheduled prefilling request.
--   untraced_sequences = batch_size - 1 - shared_sequences: sequences of the step whose
--   spans are not in the data (sampled out, not loaded, or a decode span skipped by
--   --decode-spans every:N / none). A gap without step data
--   (--engine sequential) keeps its itl_ms; its step and shared_* columns are NULL with
--   null_reason (never 0). Gaps whose itl_ms is unknown are not ranked.
--   sampling_reason: a keep policy's decision on the request (head: the random sample; a rule
--   that kept it whole, e.g. gap: slow by selection), as in requests.sql; NULL without a policy.
-- param: $per_request BIGINT default 3 -- how many gaps per request (the slowest first)
-- param: $trace_id VARCHAR default NULL -- only requests of this trace (32 lowercase hex); NULL = all
-- param: $request_span_ids VARCHAR[] default NULL -- only the request whose span is one of these (--request gives every span id of the request's perspectives); NULL = all
-- param: $clock_domain VARCHAR default NULL -- only gaps of this clock domain (the engine's); NULL = all
-- units: *_ms milliseconds; *_tokens tokens; batch_size, waiting, shared_* and
--   untraced_sequences sequences (shared_prefill_tokens, largest_shared_prefill_tokens
--   tokens); shared_prefill_request_span_ids a comma-separated list of span ids.
--   response_id / largest_shared_prefill_response_id: the id the client got of the request and
--   of the largest co-scheduled prefill's request (gen_ai.response.id, as in requests.sql);
--   NULL when no span of that request carries one.
WITH ranked AS (
    SELECT g.*,
           row_number() OVER (PARTITION BY g.trace_id, g.request_span_id ORDER BY g.itl_ms DESC, g.token_index) AS gap_rank
    FROM request_step_gaps g
    WHERE g.itl_ms IS NOT NULL
      AND ($trace_id IS NULL OR g.trace_id = $trace_id)
      AND ($request_span_ids IS NULL OR list_contains($request_span_ids, g.request_span_id))
      AND ($clock_domain IS NULL OR g.clock_domain = $clock_domain)
),
slowest AS (
    SELECT * FROM ranked WHERE gap_rank <= $per_request
),
shared AS (
    SELECT t.trace_id, t.request_span_id, t.token_index,
           count(m.span_id) AS shared_sequences,
           count(m.span_id) FILTER (WHERE m.phase = 'decode') AS shared_decode_sequences,
           count(m.span_id) FILTER (WHERE m.phase = 'prefill') AS shared_prefill_sequences,
           coalesce(sum(m.tokens) FILTER (WHERE m.phase = 'prefill'), 0) AS shared_prefill_tokens,
           max(m.tokens) FILTER (WHERE m.phase = 'prefill') AS largest_shared_prefill_tokens,
           -- ties on tokens: the largest span id, so every engine picks the same one
           arg_max(m.request_span_id, struct_pack(m.tokens, m.request_span_id)) FILTER (WHERE m.phase = 'prefill')
               AS largest_shared_prefill_request_span_id,
           array_to_string(list_sort(list(m.request_span_id) FILTER (WHERE m.phase = 'prefill')), ',')
               AS shared_prefill_request_span_ids
    FROM slowest t
    JOIN engine_step_requests m
      ON m.clock_domain = t.clock_domain AND m.step = t.step
     AND NOT (m.trace_id = t.trace_id AND m.request_span_id = t.request_span_id)
    WHERE t.batch_size IS NOT NULL
    GROUP BY t.trace_id, t.request_span_id, t.token_index
)
SELECT
    t.trace_id,
    t.request_span_id,
    r.response_id,
    t.gap_rank,
    t.token_index,
    t.itl_ms,
    t.step,
    t.step_ms,
    t.steps_in_gap,
    t.between_steps_ms,
    t.batch_size,
    t.scheduled_tokens,
    t.prefill_tokens,
    t.prefill_tokens_bucket,
    t.waiting,
    t.kv_blocks_used,
    t.kv_blocks_total,
    CASE WHEN t.batch_size IS NOT NULL THEN coalesce(s.shared_sequences, 0) END AS shared_sequences,
    CASE WHEN t.batch_size IS NOT NULL THEN coalesce(s.shared_decode_sequences, 0) END AS shared_decode_sequences,
    CASE WHEN t.batch_size IS NOT NULL THEN coalesce(s.shared_prefill_sequences, 0) END AS shared_prefill_sequences,
    CASE WHEN t.batch_size IS NOT NULL THEN coalesce(s.shared_prefill_tokens, 0) END AS shared_prefill_tokens,
    s.largest_shared_prefill_request_span_id,
    lp.response_id AS largest_shared_prefill_response_id,
    s.largest_shared_prefill_tokens,
    CASE WHEN t.batch_size IS NOT NULL THEN coalesce(s.shared_prefill_request_span_ids, '') END
        AS shared_prefill_request_span_ids,
    CASE WHEN t.batch_size IS NOT NULL THEN t.batch_size - 1 - coalesce(s.shared_sequences, 0) END AS untraced_sequences,
    t.clock_domain,
    r.sampling_reason,
    t.null_reason
FROM slowest t
LEFT JOIN shared s
  ON s.trace_id = t.trace_id AND s.request_span_id = t.request_span_id AND s.token_index = t.token_index
LEFT JOIN request_ids_by_span r ON r.span_id = t.request_span_id
LEFT JOIN request_ids_by_span lp ON lp.span_id = s.largest_shared_prefill_request_span_id
ORDER BY t.trace_id, t.request_span_id, t.gap_rank;
