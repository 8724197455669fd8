-- Adapter: tokentrace's vLLM plugin (instrument/vllm/, docs/spans.md "vLLM") -> the ENGINE
-- perspective of vLLM requests, merged with vLLM's own `llm_request` (20_vllm.sql, the
-- server perspective). Signature: scope_name = 'tokentrace' AND name = 'engine_request'.
-- The plugin writes per request one `engine_request` span (arrival .. end, on the engine-core
-- process's clock) with `gen_ai.request.id` = the id `llm_request` carries, one
-- `tokentrace.chunk` event per generated token (end of the step that produced it; the last
-- token of a request that ended on `stop` is not visible), and below it `queue`, `prefill`
-- per chunk and `decode` per token after the first (their step spans: 30_engine_steps.sql).
-- Merge: the `llm_request` with the same gen_ai.request.id in the same trace (the client
-- sent a traceparent: both are children of it), else the one with that id anywhere when the
-- engine_request is a root (no traceparent) and exactly one llm_request carries the id. A
-- merged request has one identity over both perspectives: trace_id and request_span_id are
-- the llm_request's; unmerged (an aborted request: vLLM 0.32 writes no llm_request for it;
-- a choice of a request with n > 1, whose llm_requests do not say which choice they are),
-- the engine_request's own.
-- keep: vllm_engine_request_spans

CREATE OR REPLACE VIEW vllm_engine_request_spans AS
WITH engine AS (
    SELECT trace_id, span_id, parent_span_id, start_ns, end_ns, clock_domain, status_code,
           attr_int, attr_str, attr_json, dropped_events_count,
           attr_str['gen_ai.request.id'] AS request_id
    FROM spans
    WHERE scope_name = 'tokentrace' AND name = 'engine_request'
),
llm AS (
    SELECT trace_id, span_id, start_ns, end_ns, clock_domain, status_code, request_id,
           count(*) OVER (PARTITION BY request_id) AS id_spans
    FROM vllm_request_spans
    WHERE request_id IS NOT NULL
),
matched AS (
    SELECT e.span_id AS engine_span_id, e.trace_id AS engine_trace_id,
           arg_min(l.span_id, CASE WHEN l.trace_id = e.trace_id THEN 0 ELSE 1 END) AS llm_span_id,
           arg_min(l.trace_id, CASE WHEN l.trace_id = e.trace_id THEN 0 ELSE 1 END) AS llm_trace_id,
           max(CASE WHEN l.trace_id = e.trace_id THEN 'trace' ELSE 'request id' END) AS merged_by
    FROM engine e
    JOIN llm l ON l.request_id = e.request_id
              AND (l.trace_id = e.trace_id OR (e.parent_span_id IS NULL AND l.id_spans = 1))
    GROUP BY e.span_id, e.trace_id
)
SELECT
    coalesce(m.llm_trace_id, e.trace_id) AS trace_id,
    coalesce(m.llm_span_id, e.span_id) AS request_span_id,
    e.trace_id AS engine_trace_id,
    e.span_id AS engine_span_id,
    m.merged_by,
    l.span_id AS llm_span_id,
    l.start_ns AS llm_start_ns,
    l.end_ns AS llm_end_ns,
    l.clock_domain AS llm_clock_domain,
    l.status_code AS llm_status_code,
    e.start_ns, e.end_ns, e.clock_domain, e.status_code, e.request_id, e.dropped_events_count,
    e.attr_int['gen_ai.usage.input_tokens'] AS input_tokens,
    e.attr_int['gen_ai.usage.output_tokens'] AS output_tokens,
    e.attr_int['tokentrace.generated_tokens'] AS generated_tokens,
    coalesce(e.attr_int['gen_ai.usage.cache_read.input_tokens'], e.attr_int['tokentrace.cached_tokens']) AS cached_tokens,
    e.attr_int['tokentrace.kv.physical_bytes'] AS physical_kv_bytes,
    json_extract_string(e.attr_json['gen_ai.response.finish_reasons'], '$[0]') AS finish_reason,
    e.attr_str['error.type'] AS error_type,
    e.attr_str['tokentrace.sampling.reason'] AS sampling_reason
FROM engine e
LEFT JOIN matched m ON m.engine_span_id = e.span_id AND m.engine_trace_id = e.trace_id
LEFT JOIN vllm_request_spans l ON l.span_id = m.llm_span_id AND l.trace_id = m.llm_trace_id;

-- One row per visible generated token (the plugin's chunk events): ITL on the engine clock.
CREATE OR REPLACE VIEW vllm_engine_request_chunks AS
SELECT r.trace_id, r.request_span_id, 'engine' AS perspective, 'vllm' AS source,
       c.chunk_index, c.time_ns, c.chunk_tokens, r.dropped_events_count AS events_dropped
FROM vllm_engine_request_spans r
JOIN tt_chunk_events c ON c.trace_id = r.engine_trace_id AND c.span_id = r.engine_span_id
WHERE c.visible;

CREATE OR REPLACE VIEW vllm_engine_request_facts AS
WITH chunk_agg AS (
    SELECT trace_id, request_span_id, min(time_ns) AS f_ns, max(time_ns) AS last_visible_ns,
           count(*) AS visible_chunks, sum(chunk_tokens) AS visible_chunk_tokens
    FROM vllm_engine_request_chunks
    GROUP BY trace_id, request_span_id
),
-- e: the emission of the last generated token, the stop token included. vLLM counts a final
-- stop token in completion_tokens (O) without showing it (its chunk event is not visible),
-- and sends its finish chunk when that token is sampled: e there keeps O and e in step
-- (TPOT = (e - f) / (O - 1) over O - 1 real gaps), as tokentrace's gateway does by writing
-- its last visible chunk once the stop token came (docs/adapters.md).
last_token AS (
    SELECT r.trace_id, r.request_span_id, max(c.time_ns) AS e_ns
    FROM vllm_engine_request_spans r
    JOIN tt_chunk_events c ON c.trace_id = r.engine_trace_id AND c.span_id = r.engine_span_id
    GROUP BY r.trace_id, r.request_span_id
),
-- an engine_request a keep policy summarized (docs/vllm.md, "Keeping the slow requests"): no
-- chunk events, its TTFT and E2E as attributes in seconds from its start (E2E to its last
-- token, a final stop token included, as e above)
summarized AS (
    SELECT trace_id, span_id,
           start_ns + CAST(round(attr_double['gen_ai.latency.time_to_first_token'] * 1e9) AS BIGINT) AS f_ns,
           start_ns + CAST(round(attr_double['gen_ai.latency.e2e'] * 1e9) AS BIGINT) AS e_ns
    FROM spans
    WHERE scope_name = 'tokentrace' AND name = 'engine_request' AND attr_str['tokentrace.sampling.reason'] = 'summary'
),
children AS (
    SELECT trace_id, parent_span_id,
           min(CASE WHEN name = 'queue' THEN start_ns END) AS queue_start_ns,
           max(CASE WHEN name = 'queue' THEN end_ns END) AS queue_end_ns,
           min(CASE WHEN name = 'prefill' THEN start_ns END) AS prefill_start_ns,
           -- a recompute prefill (after a preemption, past the first decode steps) is not part of
           -- the prompt's prefill, as in 10_tokentrace_contract.sql
           max(CASE WHEN name = 'prefill' AND NOT coalesce(attr_bool['tokentrace.prefill.recompute'], false)
                    THEN end_ns END) AS prefill_end_ns,
           max(CASE WHEN name = 'prefill' THEN attr_int['tokentrace.kv.bytes_per_token'] END) AS kv_bytes_per_token,
           count(*) FILTER (WHERE name = 'decode') AS decode_spans
    FROM spans
    WHERE scope_name = 'tokentrace' AND name IN ('queue', 'prefill', 'decode')
    GROUP BY trace_id, parent_span_id
)
SELECT
    'vllm' AS source,
    'engine' AS perspective,
    r.trace_id,
    r.request_span_id,
    r.engine_span_id AS perspective_span_id,
    r.llm_span_id AS server_span_id,
    CAST(NULL AS VARCHAR) AS client_span_id,
    r.clock_domain,
    r.llm_clock_domain AS server_clock_domain,
    CAST(NULL AS VARCHAR) AS client_clock_domain,
    r.start_ns AS s_ns,
    CASE WHEN r.dropped_events_count = 0 THEN coalesce(a.f_ns, sm.f_ns) END AS f_ns,
    CASE WHEN r.dropped_events_count = 0 AND a.f_ns IS NOT NULL THEN t.e_ns
         WHEN r.dropped_events_count = 0 THEN sm.e_ns END AS e_ns,
    r.end_ns,
    r.input_tokens,
    r.cached_tokens,  -- prompt tokens vLLM's prefix cache served (the plugin's engine_request span)
    r.output_tokens,
    r.generated_tokens,
    coalesce(a.visible_chunks, 0) AS visible_chunks,
    a.visible_chunk_tokens,
    r.finish_reason,
    r.status_code,
    r.llm_status_code AS server_status_code,
    r.error_type,
    r.llm_start_ns AS server_start_ns,
    r.llm_end_ns AS server_end_ns,
    CAST(NULL AS BIGINT) AS client_start_ns,
    CAST(NULL AS BIGINT) AS client_end_ns,
    CAST(NULL AS BIGINT) AS server_first_chunk_ns,
    CAST(NULL AS BIGINT) AS client_first_chunk_ns,
    CAST(NULL AS BIGINT) AS tokenize_start_ns,
    CAST(NULL AS BIGINT) AS tokenize_end_ns,
    c.queue_start_ns,
    c.queue_end_ns,
    c.prefill_start_ns,
    c.prefill_end_ns,
    c.kv_bytes_per_token,
    r.input_tokens * c.kv_bytes_per_token AS prompt_kv_bytes,
    -- logical KV after the last decode step (I + G - 1 tokens); none before a first token
    CASE WHEN r.generated_tokens >= 1 THEN (r.input_tokens + r.generated_tokens - 1) * c.kv_bytes_per_token END
        AS stop_kv_bytes,
    r.physical_kv_bytes,  -- vLLM's paged blocks held at the end x bytes per block (its KV cache spec)
    CAST(NULL AS VARCHAR) AS kv_layout,
    coalesce(c.decode_spans, 0) AS decode_spans,
    false AS synthetic,
    r.request_id AS response_id,
    CASE WHEN r.request_id LIKE 'chatcmpl-%' THEN substr(r.request_id, 10)
         WHEN r.request_id LIKE 'cmpl-%' THEN substr(r.request_id, 6) END AS client_request_id,
    CASE
        WHEN r.llm_span_id IS NULL AND regexp_matches(r.request_id, '^[0-9]+_') AND EXISTS (
                SELECT 1 FROM vllm_request_spans v WHERE v.request_id = regexp_replace(r.request_id, '^[0-9]+_', '')) THEN
            'vllm engine: choice ' || regexp_extract(r.request_id, '^([0-9]+)_', 1) || ' of a request with n > 1 '
            || '(vLLM runs each choice as a request of its own, id <choice>_<request id>, and writes one llm_request '
            || 'per choice, each with the request''s id and none saying which choice): not merged, response_id = '
            || 'gen_ai.request.id'
        WHEN r.llm_span_id IS NULL THEN
            'vllm engine: no llm_request with this gen_ai.request.id (vLLM 0.32 writes none for an aborted '
            || 'request, or vLLM''s spans were not loaded): response_id = gen_ai.request.id'
        ELSE 'vllm engine: merged with llm_request by ' || r.merged_by || '; response_id = gen_ai.request.id; '
             || 'client_request_id = it without its chatcmpl-/cmpl- prefix'
    END AS request_id_note,
    r.sampling_reason,
    'gen_ai.usage.output_tokens (vllm engine: generated tokens, a final stop token included)' AS output_tokens_basis,
    CASE
        WHEN r.dropped_events_count > 0 THEN
            'f/e unknown: ' || CAST(r.dropped_events_count AS VARCHAR) || ' events dropped by the span event limit'
        WHEN a.f_ns IS NULL AND sm.f_ns IS NULL THEN 'no visible chunk events (the request produced no visible token)'
    END AS null_reason
FROM vllm_engine_request_spans r
LEFT JOIN chunk_agg a ON a.trace_id = r.trace_id AND a.request_span_id = r.request_span_id
LEFT JOIN last_token t ON t.trace_id = r.trace_id AND t.request_span_id = r.request_span_id
LEFT JOIN summarized sm ON sm.trace_id = r.engine_trace_id AND sm.span_id = r.engine_span_id
LEFT JOIN children c ON c.trace_id = r.engine_trace_id AND c.parent_span_id = r.engine_span_id;
