-- Adapter: GenAI CLIENT spans written by other instrumentations -> client-perspective request
-- rows (docs/adapters.md). Any CLIENT span that carries gen_ai.operation.name (chat,
-- text_completion, generate_content, ...) or OpenLLMetry's older llm.request.type is one
-- client-perspective request, whatever instrumentation wrote it; source names the family:
--   'openai-v2'   official opentelemetry-instrumentation-openai-v2 (2.4b0 with
--                 opentelemetry-util-genai 1.1b0: scope opentelemetry.util.genai.handler;
--                 earlier releases: opentelemetry.instrumentation.openai_v2): span
--                 `chat {model}`, gen_ai.operation.name, gen_ai.request.model,
--                 gen_ai.response.id, gen_ai.usage.input_tokens / output_tokens,
--                 gen_ai.response.finish_reasons (non-streaming only), error.type on failures;
--                 NO chunk events and no streaming flag.
--   'openllmetry' traceloop's opentelemetry-instrumentation-openai (scope
--                 opentelemetry.instrumentation.openai.v1 / .v0): span `openai.chat` /
--                 `openai.completion`; 0.62.4 writes gen_ai.operation.name, gen_ai.is_streaming,
--                 gen_ai.response.finish_reasons and one gen_ai.content.completion.chunk event
--                 per received chunk, and no llm.request.type; older releases wrote
--                 llm.request.type, llm.is_streaming, gen_ai.usage.prompt_tokens /
--                 completion_tokens and llm.content.completion.chunk / gen_ai.completion.chunk.
--   'genai'       any other producer of that shape.
-- Facts: s = the CLIENT span's start; f / e = the first / last VISIBLE chunk event where the
-- producer writes chunk events (one per received SSE chunk, no attributes, no content):
--   * matched: when the request's server span carries tokentrace.chunk events (indexes
--     0..n-1, one per SSE chunk written, each marked visible or not) and the client received
--     no more chunks than the server wrote, client chunk event k (in time order) is server
--     chunk k, and is visible when that one is (with its token count): the role-only first
--     chunk, the finish chunk and the usage chunk are not;
--   * otherwise the role-only rule (docs/adapters.md): a streamed chat's first chunk event is
--     the role-only chunk OpenAI-compatible servers (tokentrace, vLLM, OpenAI) send before the
--     first token, so it is skipped and every later event counts as visible (one token each;
--     e may be the finish or usage chunk); the row's null_reason says so;
--   * other operations (text completions send no role chunk): every event counts.
-- A response known to be non-streamed (is_streaming false) arrived whole: f = e = the span's
-- end; otherwise f / e NULL with the reason. Usage from the current and the deprecated GenAI
-- names, then from the server span.
-- The server request: the nearest SERVER span under the client span in the same trace,
-- through up to two intermediate spans (httpx / aiohttp `POST` CLIENT spans): the tokentrace
-- gateway, vLLM's llm_request, ... . A client span with no server span below it (no
-- traceparent reached the server: stock openai-v2 with openai 3.x) is paired with the one
-- SERVER span, in any trace, that carries its gen_ai.response.id (gen_ai.response.id /
-- gen_ai.request.id there), else its X-Request-ID (tokentrace.client_request_id there; the
-- client's from OpenLLMetry's gen_ai.headers or http.request.header.x-request-id), when
-- exactly one client and one server span match. The row's trace_id / request_span_id are the
-- server span's (the request the server adapter reports, so both perspectives are one request
-- everywhere), else the client span's own; client_trace_id is the client span's trace.
-- Signature: kind = 'CLIENT' AND (attr gen_ai.operation.name OR llm.request.type) AND not our
-- scope (tokentrace's own CLIENT spans are 10_tokentrace_contract.sql's).
-- keep: genai_client_request_spans

CREATE OR REPLACE VIEW genai_client_request_spans AS
WITH client AS (
    SELECT trace_id, span_id, start_ns, end_ns, clock_domain, status_code, dropped_events_count,
           scope_name, attr_str, attr_int, attr_bool, attr_json,
           attr_str['gen_ai.response.id'] AS response_id,
           coalesce(json_extract_string(attr_json['http.request.header.x-request-id'], '$[0]'),
                    attr_str['http.request.header.x-request-id'],
                    nullif(regexp_extract(attr_str['gen_ai.headers'],
                                          '(?i)[''"]x-request-id[''"][ ]*:[ ]*[''"]([^''"]*)[''"]', 1), ''))
               AS client_request_id
    FROM spans
    WHERE kind = 'CLIENT'
      AND (attr_str['gen_ai.operation.name'] IS NOT NULL OR attr_str['llm.request.type'] IS NOT NULL)
      AND coalesce(scope_name, '') <> 'tokentrace'
),
-- spans up to three levels below each client span (one equality join per level). The first
-- level is a semi join (EXISTS), so the client spans are its build side: written as a join,
-- DuckDB built its hash table on every span instead (4.4 s on a 1e5-request dump with no
-- client span at all, against 0.09 s).
hop1 AS (
    SELECT x.trace_id, x.parent_span_id AS client_span_id, x.span_id, x.kind, 1 AS depth
    FROM spans x
    WHERE EXISTS (SELECT 1 FROM client c WHERE c.trace_id = x.trace_id AND c.span_id = x.parent_span_id)
),
hop2 AS (
    SELECT h.trace_id, h.client_span_id, x.span_id, x.kind, 2 AS depth
    FROM hop1 h JOIN spans x ON x.trace_id = h.trace_id AND x.parent_span_id = h.span_id
    WHERE h.kind <> 'SERVER'
),
hop3 AS (
    SELECT h.trace_id, h.client_span_id, x.span_id, x.kind, 3 AS depth
    FROM hop2 h JOIN spans x ON x.trace_id = h.trace_id AND x.parent_span_id = h.span_id
    WHERE h.kind <> 'SERVER'
),
below AS (
    SELECT trace_id, client_span_id, span_id, depth FROM hop1 WHERE kind = 'SERVER'
    UNION ALL
    SELECT trace_id, client_span_id, span_id, depth FROM hop2 WHERE kind = 'SERVER'
    UNION ALL
    SELECT trace_id, client_span_id, span_id, depth FROM hop3 WHERE kind = 'SERVER'
),
nearest AS (
    SELECT trace_id, client_span_id, span_id, depth,
           row_number() OVER (PARTITION BY trace_id, client_span_id ORDER BY depth, span_id) AS pick
    FROM below
),
-- client spans without a server span below: paired across traces by response id, else by
-- X-Request-ID. The SERVER spans are read through a semi join on these few ids.
unpaired AS (
    SELECT c.trace_id, c.span_id, c.response_id, c.client_request_id
    FROM client c
    WHERE NOT EXISTS (SELECT 1 FROM nearest n WHERE n.trace_id = c.trace_id AND n.client_span_id = c.span_id)
      AND (c.response_id IS NOT NULL OR c.client_request_id IS NOT NULL)
),
server_ids AS (
    SELECT trace_id, span_id,
           coalesce(attr_str['gen_ai.response.id'], attr_str['gen_ai.request.id']) AS response_id,
           attr_str['tokentrace.client_request_id'] AS client_request_id
    FROM spans
    WHERE kind = 'SERVER'
),
by_response AS (
    SELECT u.trace_id AS client_trace_id, u.span_id AS client_span_id, x.trace_id, x.span_id,
           'gen_ai.response.id' AS paired_by
    FROM unpaired u JOIN server_ids x ON x.response_id = u.response_id
),
by_request_id AS (
    SELECT u.trace_id AS client_trace_id, u.span_id AS client_span_id, x.trace_id, x.span_id,
           'X-Request-ID' AS paired_by
    FROM unpaired u JOIN server_ids x ON x.client_request_id = u.client_request_id
    WHERE NOT EXISTS (SELECT 1 FROM by_response b WHERE b.client_trace_id = u.trace_id AND b.client_span_id = u.span_id)
),
matches AS (
    SELECT *,
           count(*) OVER (PARTITION BY client_trace_id, client_span_id) AS servers_matched,
           count(*) OVER (PARTITION BY trace_id, span_id) AS clients_matched
    FROM (SELECT * FROM by_response UNION ALL SELECT * FROM by_request_id) m
),
across AS (
    SELECT client_trace_id, client_span_id, trace_id, span_id, paired_by
    FROM matches
    WHERE servers_matched = 1 AND clients_matched = 1
),
-- ids that match, but not one to one: not paired, and the note says so (not "none matched")
ambiguous AS (
    SELECT client_trace_id, client_span_id, max(servers_matched) AS servers_matched,
           max(clients_matched) AS clients_matched, min(paired_by) AS matched_by
    FROM matches
    GROUP BY client_trace_id, client_span_id
    HAVING NOT (max(servers_matched) = 1 AND max(clients_matched) = 1)
)
SELECT
    CASE WHEN c.attr_str['llm.request.type'] IS NOT NULL
              OR c.scope_name LIKE 'opentelemetry.instrumentation.openai.v%' THEN 'openllmetry'
         WHEN c.scope_name = 'opentelemetry.util.genai.handler'
              OR c.scope_name LIKE 'opentelemetry.instrumentation.openai_v2%' THEN 'openai-v2'
         ELSE 'genai' END AS source,
    coalesce(a.trace_id, c.trace_id) AS trace_id,
    c.trace_id AS client_trace_id,
    c.span_id,
    coalesce(n.span_id, a.span_id, c.span_id) AS request_span_id,
    coalesce(n.span_id, a.span_id) AS server_span_id,
    n.depth AS server_depth,
    CASE WHEN n.span_id IS NOT NULL THEN 'trace' ELSE a.paired_by END AS paired_by,
    c.start_ns,
    c.end_ns,
    c.clock_domain,
    c.status_code,
    c.dropped_events_count,
    coalesce(c.attr_bool['gen_ai.is_streaming'], c.attr_bool['llm.is_streaming']) AS is_streaming,
    coalesce(c.attr_str['gen_ai.operation.name'], c.attr_str['llm.request.type']) AS operation,
    c.attr_str['error.type'] AS error_type,
    c.response_id,
    c.client_request_id,
    am.servers_matched AS ambiguous_servers,  -- set only when an id matched, but not one to one
    am.clients_matched AS ambiguous_clients,
    am.matched_by AS ambiguous_by,
    c.attr_int['gen_ai.usage.input_tokens'] AS input_tokens_new,
    c.attr_int['gen_ai.usage.prompt_tokens'] AS input_tokens_old,
    c.attr_int['gen_ai.usage.output_tokens'] AS output_tokens_new,
    c.attr_int['gen_ai.usage.completion_tokens'] AS output_tokens_old,
    coalesce(json_extract_string(c.attr_json['gen_ai.response.finish_reasons'], '$[0]'),
             json_extract_string(c.attr_str['gen_ai.response.finish_reasons'], '$[0]'),
             c.attr_str['gen_ai.completion.0.finish_reason'],
             c.attr_str['llm.response.finish_reason']) AS finish_reason
FROM client c
LEFT JOIN nearest n ON n.trace_id = c.trace_id AND n.client_span_id = c.span_id AND n.pick = 1
LEFT JOIN across a ON a.client_trace_id = c.trace_id AND a.client_span_id = c.span_id
LEFT JOIN ambiguous am ON am.client_trace_id = c.trace_id AND am.client_span_id = c.span_id AND n.span_id IS NULL;

-- Every chunk event of the client spans, numbered 0.. in time order (k), and the server
-- span's tokentrace.chunk events: how the client's events are read (see the header).
CREATE OR REPLACE VIEW genai_client_chunk_match AS
WITH received AS (
    SELECT r.trace_id, r.client_trace_id, r.span_id, r.request_span_id, r.source, r.server_span_id,
           r.dropped_events_count, r.operation, r.is_streaming, e.time_ns,
           row_number() OVER (PARTITION BY r.client_trace_id, r.span_id ORDER BY e.time_ns, e.event_index) - 1 AS k,
           count(*) OVER (PARTITION BY r.client_trace_id, r.span_id) AS received_chunks
    FROM genai_client_request_spans r
    JOIN span_events e ON e.trace_id = r.client_trace_id AND e.span_id = r.span_id
    WHERE e.name IN ('gen_ai.content.completion.chunk', 'gen_ai.completion.chunk', 'llm.content.completion.chunk')
),
written AS (
    SELECT r.client_trace_id, r.span_id, s.chunk_index, s.chunk_tokens, s.visible,
           count(*) OVER (PARTITION BY r.client_trace_id, r.span_id) AS written_chunks,
           max(s.chunk_index) OVER (PARTITION BY r.client_trace_id, r.span_id) AS last_index
    FROM genai_client_request_spans r
    JOIN tt_chunk_events s ON s.trace_id = r.trace_id AND s.span_id = r.server_span_id
    WHERE EXISTS (SELECT 1 FROM received x WHERE x.client_trace_id = r.client_trace_id AND x.span_id = r.span_id)
),
written_count AS (
    SELECT DISTINCT client_trace_id, span_id, written_chunks, last_index FROM written
)
SELECT
    x.trace_id, x.client_trace_id, x.span_id, x.request_span_id, x.source, x.dropped_events_count,
    x.k, x.time_ns, x.received_chunks, wc.written_chunks,
    CASE WHEN wc.written_chunks > 0 AND wc.last_index = wc.written_chunks - 1
              AND x.received_chunks <= wc.written_chunks THEN 'matched'
         WHEN x.operation = 'chat' AND coalesce(x.is_streaming, true) THEN 'role_rule'
         ELSE 'every_event' END AS basis,
    w.visible AS server_visible,
    w.chunk_tokens AS server_chunk_tokens
FROM received x
LEFT JOIN written_count wc ON wc.client_trace_id = x.client_trace_id AND wc.span_id = x.span_id
LEFT JOIN written w ON w.client_trace_id = x.client_trace_id AND w.span_id = x.span_id AND w.chunk_index = x.k;

-- The visible chunks of each client perspective, numbered 0.. (chunk_index).
CREATE OR REPLACE VIEW genai_client_request_chunks AS
SELECT trace_id, request_span_id, 'client' AS perspective, source,
       CAST(row_number() OVER (PARTITION BY client_trace_id, span_id ORDER BY k) - 1 AS BIGINT) AS chunk_index,
       time_ns,
       CAST(CASE WHEN basis = 'matched' THEN server_chunk_tokens ELSE 1 END AS BIGINT) AS chunk_tokens,
       dropped_events_count AS events_dropped
FROM genai_client_chunk_match
WHERE CASE basis WHEN 'matched' THEN server_visible
                 WHEN 'role_rule' THEN k > 0
                 ELSE true END;

CREATE OR REPLACE VIEW genai_client_request_facts AS
WITH ch AS (
    SELECT trace_id, request_span_id, source, min(time_ns) AS first_ns, max(time_ns) AS last_ns,
           count(*) AS chunks, sum(chunk_tokens) AS chunk_tokens
    FROM genai_client_request_chunks
    GROUP BY trace_id, request_span_id, source
),
-- how each client span's chunk events were read (one basis per span), and how many it received
basis AS (
    SELECT DISTINCT client_trace_id, span_id, basis, received_chunks, written_chunks
    FROM genai_client_chunk_match
),
-- the server span's first visible tokentrace.chunk (the server TTFT's f)
server_first AS (
    SELECT r.trace_id, r.span_id AS client_span_id, min(s.time_ns) AS first_ns
    FROM genai_client_request_spans r
    JOIN tt_chunk_events s ON s.trace_id = r.trace_id AND s.span_id = r.server_span_id
    WHERE s.visible
    GROUP BY r.trace_id, r.span_id
),
server AS (
    SELECT r.trace_id, r.span_id AS client_span_id, x.start_ns, x.end_ns, x.clock_domain, x.status_code,
           x.name, x.scope_name,
           coalesce(x.attr_int['gen_ai.usage.input_tokens'], x.attr_int['gen_ai.usage.prompt_tokens']) AS input_tokens,
           x.attr_int['gen_ai.usage.output_tokens'] AS output_tokens_new,
           x.attr_int['gen_ai.usage.completion_tokens'] AS output_tokens_old,
           coalesce(json_extract_string(x.attr_json['gen_ai.response.finish_reasons'], '$[0]'),
                    json_extract_string(x.attr_str['gen_ai.response.finish_reasons'], '$[0]')) AS finish_reason,
           x.attr_str['error.type'] AS error_type,
           coalesce(x.attr_str['gen_ai.response.id'], x.attr_str['gen_ai.request.id']) AS response_id,
           x.attr_str['tokentrace.client_request_id'] AS client_request_id,
           x.dropped_events_count,
           x.attr_int['gen_ai.usage.cache_read.input_tokens'] AS cached_tokens
    FROM genai_client_request_spans r
    JOIN spans x ON x.trace_id = r.trace_id AND x.span_id = r.server_span_id
),
facts AS (
    SELECT
        r.*,
        sv.start_ns AS sv_start_ns, sv.end_ns AS sv_end_ns, sv.clock_domain AS sv_clock_domain,
        sv.status_code AS sv_status_code, sv.name AS sv_name, sv.scope_name AS sv_scope,
        sv.response_id AS sv_response_id, sv.client_request_id AS sv_client_request_id,
        sv.finish_reason AS sv_finish_reason, sv.error_type AS sv_error_type, sv.cached_tokens AS sv_cached_tokens,
        CASE WHEN sv.dropped_events_count = 0 THEN sf.first_ns END AS sv_first_chunk_ns,
        b.basis, b.received_chunks, b.written_chunks,
        coalesce(r.input_tokens_new, r.input_tokens_old, sv.input_tokens) AS input_tokens,
        coalesce(r.output_tokens_new, r.output_tokens_old, sv.output_tokens_new, sv.output_tokens_old,
                 CASE WHEN r.dropped_events_count = 0 THEN ch.chunk_tokens END) AS output_tokens,
        CASE WHEN r.output_tokens_new IS NOT NULL THEN 'gen_ai.usage.output_tokens'
             WHEN r.output_tokens_old IS NOT NULL THEN 'gen_ai.usage.completion_tokens'
             WHEN sv.output_tokens_new IS NOT NULL THEN 'gen_ai.usage.output_tokens (server span)'
             WHEN sv.output_tokens_old IS NOT NULL THEN 'gen_ai.usage.completion_tokens (server span)'
             WHEN r.dropped_events_count = 0 AND ch.chunks IS NOT NULL AND b.basis = 'matched'
                  THEN 'chunk events (tokens of the matched server chunks)'
             WHEN r.dropped_events_count = 0 AND ch.chunks IS NOT NULL THEN 'chunk events (one token each)'
        END AS output_tokens_basis,
        ch.first_ns, ch.last_ns, ch.chunks, ch.chunk_tokens,
        -- f / e: chunk events; a non-streamed response (is_streaming false) arrived whole at the end
        CASE WHEN r.dropped_events_count > 0 THEN NULL
             WHEN ch.first_ns IS NOT NULL THEN ch.first_ns
             WHEN r.is_streaming = false AND r.status_code <> 'ERROR' THEN r.end_ns END AS f_ns,
        CASE WHEN r.dropped_events_count > 0 THEN NULL
             WHEN ch.last_ns IS NOT NULL THEN ch.last_ns
             WHEN r.is_streaming = false AND r.status_code <> 'ERROR' THEN r.end_ns END AS e_ns
    FROM genai_client_request_spans r
    LEFT JOIN server sv ON sv.trace_id = r.trace_id AND sv.client_span_id = r.span_id
    LEFT JOIN ch ON ch.trace_id = r.trace_id AND ch.request_span_id = r.request_span_id AND ch.source = r.source
    LEFT JOIN basis b ON b.client_trace_id = r.client_trace_id AND b.span_id = r.span_id
    LEFT JOIN server_first sf ON sf.trace_id = r.trace_id AND sf.client_span_id = r.span_id
)
SELECT
    r.source,
    'client' AS perspective,
    r.trace_id,
    r.request_span_id,
    r.span_id AS perspective_span_id,
    r.server_span_id,
    r.span_id AS client_span_id,
    r.clock_domain,
    r.sv_clock_domain AS server_clock_domain,
    r.clock_domain AS client_clock_domain,
    r.start_ns AS s_ns,
    r.f_ns,
    r.e_ns,
    r.end_ns,
    r.input_tokens,
    r.sv_cached_tokens AS cached_tokens,
    r.output_tokens,
    CAST(NULL AS BIGINT) AS generated_tokens,
    coalesce(r.chunks, CAST(0 AS BIGINT)) AS visible_chunks,
    r.chunk_tokens AS visible_chunk_tokens,
    coalesce(r.finish_reason, r.sv_finish_reason) AS finish_reason,
    r.status_code,
    r.sv_status_code AS server_status_code,
    coalesce(r.error_type, r.sv_error_type) AS error_type,
    r.sv_start_ns AS server_start_ns,
    r.sv_end_ns AS server_end_ns,
    r.start_ns AS client_start_ns,
    r.end_ns AS client_end_ns,
    r.sv_first_chunk_ns AS server_first_chunk_ns,
    r.f_ns AS client_first_chunk_ns,
    CAST(NULL AS BIGINT) AS tokenize_start_ns,
    CAST(NULL AS BIGINT) AS tokenize_end_ns,
    CAST(NULL AS BIGINT) AS queue_start_ns,
    CAST(NULL AS BIGINT) AS queue_end_ns,
    CAST(NULL AS BIGINT) AS prefill_start_ns,
    CAST(NULL AS BIGINT) AS prefill_end_ns,
    CAST(NULL AS BIGINT) AS kv_bytes_per_token,
    CAST(NULL AS BIGINT) AS prompt_kv_bytes,
    CAST(NULL AS BIGINT) AS stop_kv_bytes,
    CAST(NULL AS BIGINT) AS physical_kv_bytes,
    CAST(NULL AS VARCHAR) AS kv_layout,
    CAST(0 AS BIGINT) AS decode_spans,
    false AS synthetic,
    coalesce(r.response_id, r.sv_response_id) AS response_id,
    coalesce(r.sv_client_request_id, r.client_request_id) AS client_request_id,
    nullif(concat_ws('; ',
        CASE WHEN r.paired_by IN ('gen_ai.response.id', 'X-Request-ID') THEN
            r.source || ': the client span (trace ' || r.client_trace_id || ') and the server span are in '
            || 'separate traces (no traceparent reached the server): paired by ' || r.paired_by
        END,
        CASE
            WHEN r.server_span_id IS NULL AND r.ambiguous_by IS NOT NULL THEN
                r.source || ': no server span below the client span in this trace, and its ' || r.ambiguous_by
                || ' is ambiguous across traces (' || CAST(r.ambiguous_servers AS VARCHAR) || ' server span(s) carry it, '
                || 'the server span is claimed by ' || CAST(r.ambiguous_clients AS VARCHAR)
                || ' client span(s)): not paired, counted as its own request'
            WHEN r.server_span_id IS NULL THEN
                r.source || ': no server span below the client span in this trace (no traceparent sent, or '
                || 'the server is not traced) and none in another trace with its '
                || 'gen_ai.response.id or X-Request-ID'
                || CASE WHEN r.client_request_id IS NULL THEN ': client_request_id unknown' ELSE '' END
                || CASE WHEN r.response_id IS NULL THEN '; no gen_ai.response.id (the request failed)' ELSE '' END
            WHEN r.sv_client_request_id IS NULL AND r.client_request_id IS NULL THEN
                r.source || ': client_request_id NULL: the server span (' || r.sv_name
                || ') carries no tokentrace.client_request_id'
        END), '') AS request_id_note,
    CAST(NULL AS VARCHAR) AS sampling_reason,
    r.output_tokens_basis,
    CASE
        WHEN r.dropped_events_count > 0 THEN
            'f/e unknown: ' || CAST(r.dropped_events_count AS VARCHAR) || ' events dropped by the span event limit'
        WHEN r.first_ns IS NULL AND r.status_code = 'ERROR' THEN
            r.source || ': the request failed (' || coalesce(r.error_type, 'status ERROR') || '): no output, f/e unknown'
        WHEN r.first_ns IS NULL AND r.is_streaming = false THEN
            r.source || ': non-streamed response: f = e = the client span''s end (the response arrived whole)'
        WHEN r.first_ns IS NULL THEN
            r.source || ': no chunk events'
            || CASE WHEN r.source = 'openai-v2' THEN ' (openai-v2 writes none)' ELSE '' END
            || ': f/e unknown (ttft, e2e, tpot, itl NULL); s and the span end are the client''s'
        WHEN r.basis = 'role_rule' THEN
            r.source || ': no server chunk events to match (' || CAST(r.received_chunks AS VARCHAR)
            || ' chunk events received): the first is taken as the role-only chunk and skipped (docs/adapters.md); '
            || 'e is the last chunk event (may be the finish or usage chunk)'
        WHEN r.basis = 'every_event' THEN
            r.source || ': every received chunk event counts as visible (events carry no content, no '
            || 'server chunk events to match)'
    END AS null_reason
FROM facts r;
