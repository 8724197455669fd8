-- returns: one row per engine step (one `engine_step` span of the continuous engine, view
--   engine_steps): when it ran, how long it took (step_ms = schedule_ms + execute_ms), the
--   sequences and tokens it held (batch_size, scheduled_tokens = prefill_tokens +
--   decode_tokens, their buckets), the sequences left waiting, and the paged KV cache's
--   blocks in use at scheduling; under speculative decoding (the vLLM plugin) the draft tokens
--   verified in the step and how many were accepted (spec_draft_tokens, spec_accepted_tokens:
--   0 for a step without drafts). device_ms: CUDA time of the step's forward and sampling,
--   NULL where not measured (CPU: the engine records no CUDA events). A clock domain whose request spans ran without engine steps
--   (traces from --engine sequential, or engine traces not loaded) gets one row with every
--   step column NULL and null_reason saying why (never 0). Ordered by clock domain, step.
-- param: $clock_domain VARCHAR default NULL -- only this clock domain (service.name|service.instance.id|host.name); NULL = all
-- units: *_ns nanoseconds since the Unix epoch on the engine's clock; *_ms milliseconds;
--   batch_size and waiting sequences; *_tokens tokens; kv_blocks_* KV blocks of kv_block_tokens
--   tokens; kv_used_fraction a fraction of kv_blocks_total.
WITH steps AS (
    SELECT * FROM engine_steps WHERE $clock_domain IS NULL OR clock_domain = $clock_domain
),
-- request spans by clock domain: how many name an engine step, how many do not
request_spans AS (
    SELECT clock_domain,
           count(*) AS prefill_spans,
           count(attr_int['tokentrace.engine.step']) AS prefill_spans_with_step
    FROM spans
    WHERE scope_name = 'tokentrace' AND name = 'prefill' AND ($clock_domain IS NULL OR clock_domain = $clock_domain)
    GROUP BY clock_domain
),
without_steps AS (
    SELECT r.clock_domain,
           CASE
               WHEN r.prefill_spans_with_step = 0 THEN
                   'no step data: ' || CAST(r.prefill_spans AS VARCHAR)
                   || ' prefill span(s) in this clock domain carry no tokentrace.engine.step (served without continuous batching, e.g. --engine sequential)'
               ELSE
                   'no engine_step span in this clock domain, though ' || CAST(r.prefill_spans_with_step AS VARCHAR)
                   || ' prefill span(s) name engine steps (engine traces not exported or not loaded, or engine_step '
                   || 'spans off: TOKENTRACE_VLLM_STEP_SAMPLE_RATIO=off)'
           END AS null_reason
    FROM request_spans r
    WHERE r.clock_domain IS NULL OR r.clock_domain NOT IN (SELECT DISTINCT clock_domain FROM steps WHERE clock_domain IS NOT NULL)
)
SELECT clock_domain, step, start_ns, end_ns, step_ms, schedule_ms, execute_ms, device_ms, batch_size, scheduled_tokens,
       prefill_tokens, decode_tokens, prefill_tokens_bucket, scheduled_tokens_bucket, waiting, kv_blocks_used,
       kv_blocks_total, kv_block_tokens, kv_used_fraction, spec_draft_tokens, spec_accepted_tokens, trace_id, span_id,
       CAST(NULL AS VARCHAR) AS null_reason
FROM steps
UNION ALL
SELECT clock_domain, CAST(NULL AS BIGINT), CAST(NULL AS BIGINT), CAST(NULL AS BIGINT), CAST(NULL AS DOUBLE),
       CAST(NULL AS DOUBLE), CAST(NULL AS DOUBLE), CAST(NULL AS DOUBLE), CAST(NULL AS BIGINT), CAST(NULL AS BIGINT), CAST(NULL AS BIGINT),
       CAST(NULL AS BIGINT), CAST(NULL AS VARCHAR), CAST(NULL AS VARCHAR), CAST(NULL AS BIGINT), CAST(NULL AS BIGINT),
       CAST(NULL AS BIGINT), CAST(NULL AS BIGINT), CAST(NULL AS DOUBLE), CAST(NULL AS BIGINT), CAST(NULL AS BIGINT),
       CAST(NULL AS VARCHAR), CAST(NULL AS VARCHAR), null_reason
FROM without_steps
ORDER BY clock_domain, step, start_ns;
