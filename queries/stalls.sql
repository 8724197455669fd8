-- returns: one row per generated token after the first, per request (view
--   request_step_gaps): the gap before it (itl_ms, on the engine's clock: from the previous
--   token's emission to this token's emission, which is the end of the engine step that
--   produced it) joined to that engine step (view engine_steps, on clock domain and step):
--   the step's time, what it held (batch_size, scheduled_tokens, the co-scheduled
--   prefill_tokens and their bucket 0 / 1-128 / 129-1024 / >1024), the sequences waiting and
--   the KV blocks in use. steps_in_gap = 1 when the sequence ran in consecutive steps;
--   between_steps_ms + step_ms = itl_ms. A request with G generated tokens has G - 1 rows
--   (a final stop token included: these are engine gaps, not the visible chunks of
--   queries/itl.sql; under speculative decoding the drafts a step accepted came with the token
--   before them: itl_ms 0, steps_in_gap 0, between_steps_ms NULL with the reason). Step
--   columns of a gap without step data (traces from --engine sequential) are NULL with
--   null_reason (never 0); so is itl_ms when the previous token's span is missing. Ordered by
--   trace, request span, token.
-- param: $trace_id VARCHAR default NULL -- only requests of this trace (32 lowercase hex); NULL = all
-- param: $request_span_ids VARCHAR[] default NULL -- only the request whose span is one of these (--request gives every span id of the request's perspectives); NULL = all
-- param: $clock_domain VARCHAR default NULL -- only gaps of this clock domain (the engine's); NULL = all
--   response_id: the id the client got (gen_ai.response.id, chatcmpl-...), as in requests.sql;
--   NULL when no span of the request carries one. sampling_reason: a keep policy's decision on
--   the request (head: the random sample; a rule that kept it whole: slow by selection), as in
--   requests.sql; NULL without a policy.
-- units: *_ns nanoseconds since the Unix epoch on the engine's clock; *_ms milliseconds;
--   token_index and decode_step counts (token n = k + 1 comes from decode step k); step an
--   engine step id; batch_size and waiting sequences; *_tokens tokens; kv_blocks_* KV blocks.
SELECT
    g.trace_id,
    g.request_span_id,
    r.response_id,
    g.clock_domain,
    g.token_index,
    g.decode_step,
    g.prev_emit_ns,
    g.emit_ns,
    g.itl_ms,
    g.step,
    g.steps_in_gap,
    g.between_steps_ms,
    g.step_ms,
    g.batch_size,
    g.scheduled_tokens,
    g.prefill_tokens,
    g.prefill_tokens_bucket,
    g.waiting,
    g.kv_blocks_used,
    g.kv_blocks_total,
    r.sampling_reason,
    g.null_reason
FROM request_step_gaps g
LEFT JOIN request_ids_by_span r ON r.span_id = g.request_span_id
WHERE ($trace_id IS NULL OR g.trace_id = $trace_id)
  AND ($request_span_ids IS NULL OR list_contains($request_span_ids, g.request_span_id))
  AND ($clock_domain IS NULL OR g.clock_domain = $clock_domain)
ORDER BY g.trace_id, g.request_span_id, g.token_index;
