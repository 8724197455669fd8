-- Adapter: OpenLLMetry (traceloop opentelemetry-instrumentation-openai and siblings) CLIENT
-- spans -> client-perspective request rows.
-- Shape (traceloop/openllmetry packages/opentelemetry-instrumentation-openai
-- opentelemetry/instrumentation/openai/shared/chat_wrappers.py ChatStream._process_item;
-- names from opentelemetry-semantic-conventions-ai SpanAttributes): span `openai.chat` /
-- `openai.completion` (kind CLIENT) with llm.request.type = 'chat' | 'completion', token
-- counts under the OLD GenAI names gen_ai.usage.prompt_tokens / completion_tokens (newer
-- releases: input_tokens / output_tokens; both read), and when streaming one event per
-- received chunk named llm.content.completion.chunk (older releases),
-- gen_ai.completion.chunk (newer) or gen_ai.content.completion.chunk; events carry no content
-- or visibility, so every chunk counts (a role-only first chunk makes f early; flagged).
-- Signature: kind = 'CLIENT' AND attr llm.request.type present AND not our scope.
-- The request is keyed by the client span itself: a traced server span below it (vLLM, TGI,
-- SGLang) is a separate request row from its own adapter (not joined; docs/adapters.md).
-- keep: openllmetry_request_spans

CREATE OR REPLACE VIEW openllmetry_request_spans AS
SELECT trace_id, span_id, start_ns, end_ns, clock_domain, status_code, dropped_events_count,
       attr_str, attr_int, attr_json
FROM spans
WHERE kind = 'CLIENT'
  AND attr_str['llm.request.type'] IS NOT NULL
  AND coalesce(scope_name, '') <> 'tokentrace';

CREATE OR REPLACE VIEW openllmetry_request_chunks AS
SELECT r.trace_id, r.span_id AS request_span_id, 'client' AS perspective, 'openllmetry' AS source,
       CAST(row_number() OVER (PARTITION BY r.trace_id, r.span_id ORDER BY e.time_ns, e.event_index) - 1
            AS BIGINT) AS chunk_index,
       e.time_ns,
       CAST(1 AS BIGINT) AS chunk_tokens,
       r.dropped_events_count AS events_dropped
FROM openllmetry_request_spans r
JOIN span_events e ON e.trace_id = r.trace_id AND e.span_id = r.span_id
WHERE e.name IN ('llm.content.completion.chunk', 'gen_ai.completion.chunk', 'gen_ai.content.completion.chunk');

CREATE OR REPLACE VIEW openllmetry_request_facts AS
WITH ch AS (
    SELECT trace_id, request_span_id, min(time_ns) AS first_ns, max(time_ns) AS last_ns, count(*) AS chunks
    FROM openllmetry_request_chunks
    GROUP BY trace_id, request_span_id
)
SELECT
    'openllmetry' AS source,
    'client' AS perspective,
    r.trace_id,
    r.span_id AS request_span_id,
    r.span_id AS perspective_span_id,
    CAST(NULL AS VARCHAR) AS server_span_id,
    r.span_id AS client_span_id,
    r.clock_domain,
    CAST(NULL AS VARCHAR) AS server_clock_domain,
    r.clock_domain AS client_clock_domain,
    r.start_ns AS s_ns,
    CASE WHEN r.dropped_events_count = 0 THEN ch.first_ns END AS f_ns,
    CASE WHEN r.dropped_events_count = 0 THEN ch.last_ns END AS e_ns,
    r.end_ns,
    coalesce(r.attr_int['gen_ai.usage.input_tokens'], r.attr_int['gen_ai.usage.prompt_tokens']) AS input_tokens,
    coalesce(r.attr_int['gen_ai.usage.output_tokens'], r.attr_int['gen_ai.usage.completion_tokens'],
             CASE WHEN r.dropped_events_count = 0 THEN ch.chunks END) AS output_tokens,
    CAST(NULL AS BIGINT) AS generated_tokens,
    coalesce(ch.chunks, CAST(0 AS BIGINT)) AS visible_chunks,
    ch.chunks AS visible_chunk_tokens,
    coalesce(json_extract_string(r.attr_json['gen_ai.response.finish_reasons'], '$[0]'),
             r.attr_str['gen_ai.completion.0.finish_reason'],
             r.attr_str['llm.response.finish_reason']) AS finish_reason,
    r.status_code,
    CAST(NULL AS VARCHAR) AS server_status_code,
    r.attr_str['error.type'] AS error_type,
    CAST(NULL AS BIGINT) AS server_start_ns,
    CAST(NULL AS BIGINT) AS server_end_ns,
    r.start_ns AS client_start_ns,
    r.end_ns AS client_end_ns,
    CAST(NULL AS BIGINT) AS server_first_chunk_ns,
    CASE WHEN r.dropped_events_count = 0 THEN ch.first_ns END AS client_first_chunk_ns,
    CAST(NULL AS BIGINT) AS tokenize_start_ns,
    CAST(NULL AS BIGINT) AS tokenize_end_ns,
    CAST(NULL AS BIGINT) AS queue_start_ns,
    CAST(NULL AS BIGINT) AS queue_end_ns,
    CAST(NULL AS BIGINT) AS prefill_start_ns,
    CAST(NULL AS BIGINT) AS prefill_end_ns,
    CAST(NULL AS BIGINT) AS kv_bytes_per_token,
    CAST(NULL AS BIGINT) AS prompt_kv_bytes,
    CAST(NULL AS BIGINT) AS stop_kv_bytes,
    CAST(NULL AS VARCHAR) AS kv_layout,
    CAST(0 AS BIGINT) AS decode_spans,
    false AS synthetic,
    CASE
        WHEN r.dropped_events_count > 0 THEN
            'f/e unknown: ' || CAST(r.dropped_events_count AS VARCHAR) || ' events dropped by the span event limit'
        WHEN ch.first_ns IS NULL THEN 'openllmetry: no chunk events (not streamed): f/e unknown'
        ELSE 'openllmetry: every received chunk event counts as visible (events carry no content): '
             || 'a role-only first chunk makes f early'
    END AS null_reason
FROM openllmetry_request_spans r
LEFT JOIN ch ON ch.trace_id = r.trace_id AND ch.request_span_id = r.span_id;
