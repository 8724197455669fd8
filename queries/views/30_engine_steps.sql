-- Engine steps under continuous batching (docs/spans.md, "Under continuous batching"):
-- one row per `engine_step` span, the request spans that name each step, and every
-- generated token's gap joined to the engine step that produced it. Read by
-- queries/steps.sql, steps_summary.sql, stalls.sql, stalls_groups.sql, stalls_slowest.sql
-- and the report. Reads `spans` only (no request view): installed with the adapters.
-- A step is named by (clock_domain, step): step ids are unique within one engine process,
-- and the process's resource names the clock domain. Traces from the sequential engine
-- have no `engine_step` span and no step attribute on their request spans: every step
-- column of their gaps is NULL with a reason (never 0).

-- The co-scheduled prefill token buckets of docs/metrics.md ("Engine steps and stalls"), one place:
-- bucket_order 1..4, inclusive bounds in tokens, max_tokens NULL = no upper bound.
CREATE OR REPLACE VIEW prefill_token_buckets AS
SELECT * FROM (VALUES (1, '0', 0, 0), (2, '1-128', 1, 128), (3, '129-1024', 129, 1024), (4, '>1024', 1025, NULL))
    AS b (bucket_order, bucket, min_tokens, max_tokens);

-- Buckets of the tokens scheduled in one step (prefill chunks + 1 per decoding sequence).
CREATE OR REPLACE VIEW scheduled_token_buckets AS
SELECT * FROM (VALUES (1, '1-16', 1, 16), (2, '17-128', 17, 128), (3, '129-1024', 129, 1024), (4, '>1024', 1025, NULL))
    AS b (bucket_order, bucket, min_tokens, max_tokens);

-- One row per engine_step span. step_spans counts the engine_step spans that carry the same
-- (clock_domain, step): 1, unless two engine processes shared one service.instance.id;
-- the gap view below joins only steps with step_spans = 1 (an ambiguous step is NULL with
-- a reason there, never joined twice).
CREATE OR REPLACE VIEW engine_steps AS
WITH step_spans AS (
    SELECT clock_domain, trace_id, span_id, parent_span_id, start_ns, end_ns,
           attr_int['tokentrace.engine.step'] AS step,
           attr_int['tokentrace.engine.schedule_ns'] AS schedule_ns,
           attr_int['tokentrace.device_ns'] AS device_ns,
           attr_int['tokentrace.batch.size'] AS batch_size,
           attr_int['tokentrace.batch.tokens'] AS scheduled_tokens,
           attr_int['tokentrace.batch.prefill_tokens'] AS prefill_tokens,
           attr_int['tokentrace.batch.waiting'] AS waiting,
           attr_int['tokentrace.kv.blocks_used'] AS kv_blocks_used,
           attr_int['tokentrace.kv.blocks_total'] AS kv_blocks_total,
           attr_int['tokentrace.kv.block_tokens'] AS kv_block_tokens,
           attr_int['tokentrace.spec.draft_tokens'] AS spec_draft_tokens,
           attr_int['tokentrace.spec.accepted_tokens'] AS spec_accepted_tokens
    FROM spans
    WHERE scope_name = 'tokentrace' AND name = 'engine_step'
)
SELECT
    s.clock_domain,
    s.step,
    s.start_ns,
    s.end_ns,
    (s.end_ns - s.start_ns) / 1e6 AS step_ms,
    s.schedule_ns / 1e6 AS schedule_ms,
    (s.end_ns - s.start_ns - s.schedule_ns) / 1e6 AS execute_ms,
    s.device_ns / 1e6 AS device_ms,
    s.batch_size,
    s.scheduled_tokens,
    s.prefill_tokens,
    s.scheduled_tokens - s.prefill_tokens AS decode_tokens,
    p.bucket AS prefill_tokens_bucket,
    p.bucket_order AS prefill_bucket_order,
    q.bucket AS scheduled_tokens_bucket,
    q.bucket_order AS scheduled_bucket_order,
    s.waiting,
    s.kv_blocks_used,
    s.kv_blocks_total,
    s.kv_block_tokens,
    CASE WHEN s.kv_blocks_total > 0 THEN s.kv_blocks_used / s.kv_blocks_total END AS kv_used_fraction,
    -- speculative decoding (the vLLM plugin): draft tokens verified in the step and accepted;
    -- 0 when the step carries none (no draft was scheduled in it)
    coalesce(s.spec_draft_tokens, 0) AS spec_draft_tokens,
    coalesce(s.spec_accepted_tokens, 0) AS spec_accepted_tokens,
    count(*) OVER (PARTITION BY s.clock_domain, s.step) AS step_spans,
    s.trace_id,
    s.span_id,
    s.parent_span_id AS engine_span_id
FROM step_spans s
LEFT JOIN prefill_token_buckets p
  ON s.prefill_tokens >= p.min_tokens AND (p.max_tokens IS NULL OR s.prefill_tokens <= p.max_tokens)
LEFT JOIN scheduled_token_buckets q
  ON s.scheduled_tokens >= q.min_tokens AND (q.max_tokens IS NULL OR s.scheduled_tokens <= q.max_tokens);

-- The request spans that name an engine step: one row per prefill chunk (tokens = the
-- chunk's prompt tokens) and per decode span (tokens = 1), with the request (the span's
-- parent: the gateway span, or a root generate span) it belongs to. O(batch) rows per step.
CREATE OR REPLACE VIEW engine_step_requests AS
SELECT clock_domain, attr_tokentrace_engine_step AS step, trace_id, parent_span_id AS request_span_id, span_id,
       'prefill' AS phase, attr_int['tokentrace.prefill.tokens'] AS tokens,
       attr_int['tokentrace.prefill.chunk'] AS prefill_chunk, CAST(NULL AS BIGINT) AS decode_step, start_ns, end_ns
FROM spans
WHERE scope_name = 'tokentrace' AND name = 'prefill' AND attr_tokentrace_engine_step IS NOT NULL
UNION ALL
SELECT clock_domain, attr_tokentrace_engine_step AS step, trace_id, parent_span_id AS request_span_id, span_id,
       -- its own token and, under speculative decoding, the draft tokens verified with it
       'decode' AS phase, 1 + coalesce(attr_tokentrace_spec_draft_tokens, 0) AS tokens,
       CAST(NULL AS BIGINT) AS prefill_chunk, attr_tokentrace_step AS decode_step,
       start_ns, end_ns
FROM spans
WHERE scope_name = 'tokentrace' AND name = 'decode' AND attr_tokentrace_engine_step IS NOT NULL;

-- Every generated token after the first, per request, on the engine's clock: token n's
-- emission is the end of the span that produced it (n = 1: the request's last prompt
-- prefill chunk; n = k + 1: decode step k, whose end is the end of its engine step, or the
-- recompute prefill chunk that stands for decode step k after a preemption). The gap before
-- token n (itl_ms) ends at its emission, so it maps to exactly one engine step: the one its
-- decode span names (tokentrace.engine.step), joined on (clock_domain, step). A request
-- with G generated tokens has G - 1 rows (the final stop token included). steps_in_gap =
-- this step - the step of the previous token (1 when the sequence ran in consecutive
-- steps); between_steps_ms = the step's start - the previous emission (loop time between
-- the steps); itl_ms = between_steps_ms + step_ms when the emission is the step's end.
-- Speculative decoding (vLLM): a decode span that emitted m tokens (tokentrace.decode.tokens)
-- gives m rows; the m - 1 after the first came with the one before them in the same step:
-- itl_ms = 0, steps_in_gap = 0, between_steps_ms NULL (null_reason says so).
CREATE OR REPLACE VIEW request_step_gaps AS
WITH emitted AS (
    -- tokens 2.. : decode step k emits token k + 1; so does a recompute prefill chunk that
    -- emitted a token after a preemption (it carries the k of the decode step it stands for).
    -- A speculative decode step (vLLM plugin: tokentrace.decode.tokens = m) emits tokens
    -- k + 1 .. k + m at once: one row each (the generator alone in its select list, as Spark
    -- SQL wants it)
    SELECT trace_id, parent_span_id AS request_span_id, clock_domain, end_ns AS emit_ns,
           attr_tokentrace_engine_step AS step, attr_tokentrace_step AS decode_step,
           unnest(generate_series(1, coalesce(attr_tokentrace_decode_tokens, 1))) AS nth
    FROM spans
    WHERE scope_name = 'tokentrace'
      AND (name = 'decode' OR (name = 'prefill' AND attr_tokentrace_step IS NOT NULL))
),
later AS (
    SELECT trace_id, request_span_id, clock_domain, decode_step + nth AS token_index, emit_ns, step, decode_step
    FROM emitted
),
first_later AS (
    SELECT trace_id, request_span_id, min(emit_ns) AS first_ns FROM later GROUP BY trace_id, request_span_id
),
-- recompute chunks that do not say which token they emitted (files written before they did)
silent_recomputes AS (
    SELECT trace_id, parent_span_id AS request_span_id, end_ns
    FROM spans
    WHERE scope_name = 'tokentrace' AND name = 'prefill' AND coalesce(attr_bool['tokentrace.prefill.recompute'], false)
      AND attr_tokentrace_step IS NULL
),
emissions AS (
    -- token 1: the end of the last prompt chunk before any later token (a recompute after a
    -- preemption follows decode steps: it is not the prompt's prefill)
    SELECT p.trace_id, p.parent_span_id AS request_span_id, max(p.clock_domain) AS clock_domain, 1 AS token_index,
           max(p.end_ns) AS emit_ns, arg_max(p.attr_tokentrace_engine_step, p.end_ns) AS step,
           CAST(NULL AS BIGINT) AS decode_step
    FROM spans p
    LEFT JOIN first_later f ON f.trace_id = p.trace_id AND f.request_span_id = p.parent_span_id
    WHERE p.scope_name = 'tokentrace' AND p.name = 'prefill' AND p.attr_tokentrace_step IS NULL
      AND (f.first_ns IS NULL OR p.end_ns <= f.first_ns)
    GROUP BY p.trace_id, p.parent_span_id
    UNION ALL
    SELECT * FROM later
),
ordered AS (
    SELECT e.*,
           lag(e.token_index) OVER w AS prev_token_index,
           lag(e.emit_ns) OVER w AS prev_emit_ns,
           lag(e.step) OVER w AS prev_step
    FROM emissions e
    WINDOW w AS (PARTITION BY e.trace_id, e.request_span_id ORDER BY e.token_index, e.emit_ns)
),
ambiguous AS (
    SELECT DISTINCT clock_domain, step FROM engine_steps WHERE step_spans > 1
),
joined AS (
    SELECT
        o.trace_id,
        o.request_span_id,
        o.clock_domain,
        o.token_index,
        o.decode_step,
        CASE WHEN o.prev_token_index = o.token_index - 1 THEN o.prev_emit_ns END AS prev_emit_ns,
        o.emit_ns,
        CASE WHEN o.prev_token_index = o.token_index - 1 THEN (o.emit_ns - o.prev_emit_ns) / 1e6 END AS itl_ms,
        o.step,
        CASE WHEN o.prev_token_index = o.token_index - 1 THEN o.prev_step END AS prev_step,
        CASE WHEN o.prev_token_index = o.token_index - 1 THEN o.step - o.prev_step END AS steps_in_gap,
        -- (a token emitted in the same step as the one before it has no gap before its step)
        CASE WHEN o.prev_token_index = o.token_index - 1 AND o.prev_step IS DISTINCT FROM o.step
             THEN (s.start_ns - o.prev_emit_ns) / 1e6 END AS between_steps_ms,
        s.step_ms,
        s.batch_size,
        s.scheduled_tokens,
        s.prefill_tokens,
        s.prefill_tokens_bucket,
        s.prefill_bucket_order,
        s.waiting,
        s.kv_blocks_used,
        s.kv_blocks_total,
        CASE
            WHEN o.step IS NULL THEN
                'no step data: the decode span carries no tokentrace.engine.step (not traced by the continuous engine, e.g. --engine sequential)'
            WHEN a.step IS NOT NULL THEN
                'step id ambiguous: several engine_step spans carry it in this clock domain (two engines with one service.instance.id?)'
            WHEN s.step IS NULL THEN
                'no engine_step span with this step id in the clock domain (engine traces not exported or not loaded, '
                || 'or the step not sampled: TOKENTRACE_VLLM_STEP_SAMPLE_RATIO)'
        END AS step_null_reason,
        CASE
            WHEN o.prev_token_index IS NULL THEN 'gap unknown: the request has no prefill span (token 1 emission unknown)'
            WHEN o.prev_token_index <> o.token_index - 1 AND EXISTS (
                    SELECT 1 FROM silent_recomputes r
                    WHERE r.trace_id = o.trace_id AND r.request_span_id = o.request_span_id
                      AND r.end_ns > o.prev_emit_ns AND r.end_ns < o.emit_ns) THEN
                'gap unknown: a recompute prefill after a preemption emitted the previous token and does not say '
                || 'which (no tokentrace.step on it: spans written before tokentrace carried it)'
            WHEN o.prev_token_index <> o.token_index - 1 THEN
                'gap unknown: the previous token''s decode span is missing (decode_spans every:N, or spans lost)'
        END AS itl_null_reason,
        CASE WHEN o.prev_token_index = o.token_index - 1 AND o.prev_step = o.step THEN
            'between_steps_ms NULL: emitted in the same engine step as the token before it (speculative decoding: '
            || 'an accepted draft token), so itl_ms = 0 and steps_in_gap = 0'
        END AS same_step_reason
    FROM ordered o
    LEFT JOIN ambiguous a ON a.clock_domain = o.clock_domain AND a.step = o.step
    LEFT JOIN engine_steps s ON s.clock_domain = o.clock_domain AND s.step = o.step AND s.step_spans = 1
    WHERE o.token_index > 1
)
SELECT
    * EXCLUDE (same_step_reason),
    nullif(concat_ws('; ', itl_null_reason, same_step_reason, step_null_reason), '') AS null_reason
FROM joined;
