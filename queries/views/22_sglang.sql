-- Adapter: SGLang request tracing (--enable-trace) -> request rows (docs/adapters.md).
-- Shape (sgl-project/sglang python/sglang/srt/tracing/trace.py, commit bad7b92eb043; stage
-- names from RequestStage in python/sglang/srt/observability/req_time_stats.py; verified on
-- PyPI sglang 0.5.23, tests/test_real_captures.py):
--   root span f"{role} Req {rid[:8]}" -- role is empty on a unified server, so the real name
--   has a LEADING SPACE (" Req 4bb804bd"); a prefill/decode-split server puts its role there.
--   Root attrs: rid, gen_ai.request.id (= rid), gen_ai.usage.prompt_tokens /
--   completion_tokens / cached_tokens, gen_ai.response.finish_reasons (a JSON STRING such
--   as '["stop"]'), gen_ai.latency.time_to_first_token / e2e / time_in_model_* (seconds).
--   Scope "sglang server", service "sglang"; 64-bit trace ids (SglangTraceCustomIdGenerator)
--   sent as 32 hex digits (left half zero). Started at trace_req_start and ended at
--   trace_req_finish (tokenizer manager's finished_time).
--   -> one thread span per process/thread, e.g. "Tokenizer(host:3d1219c7 | pid:9967)",
--      "Scheduler [TP 0]  [PP 0] (host:3d1219c7 | pid:9974)" (attrs host_id, pid,
--      thread_label, tp_rank, pp_rank)
--      -> stage slices: tokenize, api_server_dispatch (tokenizer); request_process,
--         prefill_waiting, prefill_forward, decode_waiting, decode_forward (scheduler),
--         chunked_prefill ...; decode_forward -> one decode_loop per decode step (attr
--         decode_ct, trace level 3, the default).
-- Signature: scope_name = 'sglang server' AND attr_str rid present (only the root carries
-- rid; the name is not matched: its role prefix varies). Slices are found two or three levels
-- below the root.
-- A token is produced by prefill_forward (token 1) and by each decode_loop step: f = end of
-- prefill_forward, chunk k = end of decode_loop k, e = end of the last decode_loop. These are
-- scheduler times on the scheduler's clock: when the token was computed, not when it was sent
-- (SGLang's own gen_ai.latency.time_to_first_token is taken when the tokenizer process
-- receives the first output: 2-8 ms later on the real capture; for a non-streaming request
-- SGLang's TTFT is its E2E). O = gen_ai.usage.completion_tokens, else 1 + decode steps (the
-- two agree on every real request); I = gen_ai.usage.prompt_tokens.
-- The root's start is on the tokenizer process's clock; both are time.time() wall clocks.
-- keep: sglang_request_spans

CREATE OR REPLACE VIEW sglang_request_spans AS
SELECT trace_id, span_id, start_ns, end_ns, clock_domain, status_code,
       attr_str['rid'] AS rid,
       coalesce(attr_str['gen_ai.request.id'], attr_str['rid']) AS request_id,
       attr_int['gen_ai.usage.prompt_tokens'] AS prompt_tokens,
       attr_int['gen_ai.usage.completion_tokens'] AS completion_tokens,
       attr_int['gen_ai.usage.cached_tokens'] AS cached_tokens,
       coalesce(json_extract_string(attr_str['gen_ai.response.finish_reasons'], '$[0]'),
                json_extract_string(attr_json['gen_ai.response.finish_reasons'], '$[0]')) AS sglang_finish_reason
FROM spans
WHERE scope_name = 'sglang server'
  AND attr_str['rid'] IS NOT NULL;

-- Stage slices of each request: children of its thread spans, or one level deeper (a slice
-- nested in a slice). Written as LEFT JOINs up the parent chain, not a UNION ALL of two join
-- branches: DuckDB 2.0.1 returned duplicated rows for that UNION ALL form.
CREATE OR REPLACE VIEW sglang_request_slices AS
SELECT s.trace_id, coalesce(r2.span_id, r3.span_id) AS request_span_id, s.span_id, s.name, s.start_ns,
       s.end_ns, s.attr_int['decode_ct'] AS decode_ct
FROM spans s
JOIN spans p1 ON p1.trace_id = s.trace_id AND p1.span_id = s.parent_span_id
LEFT JOIN spans p2 ON p2.trace_id = s.trace_id AND p2.span_id = p1.parent_span_id
LEFT JOIN sglang_request_spans r2 ON r2.trace_id = s.trace_id AND r2.span_id = p1.parent_span_id
LEFT JOIN sglang_request_spans r3 ON r3.trace_id = s.trace_id AND r3.span_id = p2.parent_span_id
WHERE s.trace_id IN (SELECT trace_id FROM sglang_request_spans)
  AND (r2.span_id IS NOT NULL OR r3.span_id IS NOT NULL);

CREATE OR REPLACE VIEW sglang_request_chunks AS
WITH tokens AS (
    SELECT trace_id, request_span_id, end_ns AS time_ns, span_id
    FROM sglang_request_slices
    WHERE name = 'prefill_forward'
    UNION ALL
    SELECT trace_id, request_span_id, end_ns AS time_ns, span_id
    FROM sglang_request_slices
    WHERE name = 'decode_loop'
)
SELECT trace_id, request_span_id, 'server' AS perspective, 'sglang' AS source,
       CAST(row_number() OVER (PARTITION BY trace_id, request_span_id ORDER BY time_ns, span_id) - 1
            AS BIGINT) AS chunk_index,
       time_ns,
       CAST(1 AS BIGINT) AS chunk_tokens,
       CAST(0 AS BIGINT) AS events_dropped
FROM tokens;

CREATE OR REPLACE VIEW sglang_request_facts AS
WITH st AS (
    SELECT trace_id, request_span_id,
           min(CASE WHEN name = 'tokenize' THEN start_ns END) AS tokenize_start_ns,
           max(CASE WHEN name = 'tokenize' THEN end_ns END) AS tokenize_end_ns,
           min(CASE WHEN name = 'prefill_waiting' THEN start_ns END) AS queue_start_ns,
           max(CASE WHEN name = 'prefill_waiting' THEN end_ns END) AS queue_end_ns,
           min(CASE WHEN name IN ('prefill_forward', 'chunked_prefill') THEN start_ns END) AS prefill_start_ns,
           max(CASE WHEN name = 'prefill_forward' THEN end_ns END) AS prefill_end_ns,
           sum(CASE WHEN name = 'decode_loop' THEN 1 ELSE 0 END) AS decode_steps,
           sum(CASE WHEN name = 'decode_forward' THEN 1 ELSE 0 END) AS decode_forward_slices,
           -- decode steps are traced (decode_loop slices), or there was no decode at all: e and O known
           sum(CASE WHEN name = 'decode_loop' THEN 1 ELSE 0 END) > 0
               OR sum(CASE WHEN name = 'decode_forward' THEN 1 ELSE 0 END) = 0 AS decode_traced
    FROM sglang_request_slices
    GROUP BY trace_id, request_span_id
),
ch AS (
    SELECT trace_id, request_span_id, min(time_ns) AS first_ns, max(time_ns) AS last_ns, count(*) AS tokens
    FROM sglang_request_chunks
    GROUP BY trace_id, request_span_id
)
SELECT
    'sglang' AS source,
    'server' AS perspective,
    r.trace_id,
    r.span_id AS request_span_id,
    r.span_id AS perspective_span_id,
    r.span_id AS server_span_id,
    CAST(NULL AS VARCHAR) AS client_span_id,
    r.clock_domain,
    r.clock_domain AS server_clock_domain,
    CAST(NULL AS VARCHAR) AS client_clock_domain,
    r.start_ns AS s_ns,
    st.prefill_end_ns AS f_ns,
    CASE WHEN st.decode_traced THEN ch.last_ns END AS e_ns,
    r.end_ns,
    r.prompt_tokens AS input_tokens,
    r.cached_tokens,
    coalesce(r.completion_tokens, CASE WHEN st.decode_traced THEN ch.tokens END) AS output_tokens,
    coalesce(r.completion_tokens, CASE WHEN st.decode_traced THEN ch.tokens END) AS generated_tokens,
    coalesce(ch.tokens, CAST(0 AS BIGINT)) AS visible_chunks,
    ch.tokens AS visible_chunk_tokens,
    CASE r.sglang_finish_reason WHEN 'abort' THEN 'cancelled' ELSE r.sglang_finish_reason END AS finish_reason,
    r.status_code,
    r.status_code AS server_status_code,
    CAST(NULL AS VARCHAR) AS error_type,
    r.start_ns AS server_start_ns,
    r.end_ns AS server_end_ns,
    CAST(NULL AS BIGINT) AS client_start_ns,
    CAST(NULL AS BIGINT) AS client_end_ns,
    st.prefill_end_ns AS server_first_chunk_ns,
    CAST(NULL AS BIGINT) AS client_first_chunk_ns,
    st.tokenize_start_ns,
    st.tokenize_end_ns,
    st.queue_start_ns,
    st.queue_end_ns,
    st.prefill_start_ns,
    st.prefill_end_ns,
    CAST(NULL AS BIGINT) AS kv_bytes_per_token,
    CAST(NULL AS BIGINT) AS prompt_kv_bytes,
    CAST(NULL AS BIGINT) AS stop_kv_bytes,
    CAST(NULL AS BIGINT) AS physical_kv_bytes,
    CAST(NULL AS VARCHAR) AS kv_layout,
    CAST(coalesce(st.decode_steps, 0) AS BIGINT) AS decode_spans,
    false AS synthetic,
    r.request_id AS response_id,
    CAST(NULL AS VARCHAR) AS client_request_id,
    'sglang: response_id = gen_ai.request.id (the rid, also the response''s id); client_request_id '
    || 'NULL: SGLang records no client-sent id apart from its rid' AS request_id_note,
    CAST(NULL AS VARCHAR) AS sampling_reason,
    CASE WHEN r.completion_tokens IS NOT NULL THEN 'gen_ai.usage.completion_tokens'
         WHEN st.decode_traced AND ch.tokens IS NOT NULL THEN '1 + decode_loop slices' END AS output_tokens_basis,
    CASE
        WHEN st.prefill_end_ns IS NULL THEN
            'sglang: no prefill_forward slice (trace level too low or request aborted): f/e unknown'
        WHEN st.decode_steps = 0 AND st.decode_forward_slices > 0 THEN
            'sglang: decode_forward but no decode_loop slices (trace level below 3): e'
            || CASE WHEN r.completion_tokens IS NULL THEN ', output tokens' ELSE '' END || ' and itl unknown'
        ELSE
            'sglang: f/e and itl from scheduler step slices (prefill_forward / decode_loop ends: '
            || 'token computed, not sent); '
            || CASE WHEN r.completion_tokens IS NULL THEN 'O = 1 + decode steps; ' ELSE '' END
            || CASE WHEN r.prompt_tokens IS NULL THEN 'input tokens not recorded; ' ELSE '' END
            || CASE WHEN r.sglang_finish_reason IS NULL THEN 'finish reason not recorded; ' ELSE '' END
            || 'kv not recorded'
    END AS null_reason
FROM sglang_request_spans r
LEFT JOIN st ON st.trace_id = r.trace_id AND st.request_span_id = r.span_id
LEFT JOIN ch ON ch.trace_id = r.trace_id AND ch.request_span_id = r.span_id;
