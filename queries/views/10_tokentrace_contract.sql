-- Adapter: tokentrace's own span contract (docs/spans.md) -> request rows.
-- Spans are ours when scope_name = 'tokentrace'. A request is one `gateway` SERVER span, or
-- one root `generate` span (no gateway), or one CLIENT span whose server side was not traced.
-- Each request gives one row per perspective: client (CLIENT span clock), server (gateway
-- clock), engine (bare generate root).
-- keep: tt_request_candidates, tt_request_spans
-- keep chunks: tt_candidate_chunks ORDER BY candidate_key, chunk_index, time_ns

-- The spans that can carry a request perspective (gateway SERVER, CLIENT, root generate),
-- with every column the facts read, numbered by candidate_key (dense_rank over trace_id,
-- span_id: the same number on every engine and every evaluation). The request views join
-- this small set on that integer, never all of `spans` (a request has ~150 decode spans).
-- Three disjoint scans with one equality each, not one OR: DuckDB pushes an equality into
-- the Parquet/table scan and decodes the attribute maps of the matching rows only.
CREATE OR REPLACE VIEW tt_request_candidates AS
WITH found AS (
    SELECT trace_id, span_id, parent_span_id, name, kind, start_ns, end_ns, status_code, clock_domain,
           attr_int, attr_bool, attr_str, attr_json, dropped_events_count
    FROM spans
    WHERE scope_name = 'tokentrace' AND name = 'gateway' AND kind = 'SERVER'
    UNION ALL
    SELECT trace_id, span_id, parent_span_id, name, kind, start_ns, end_ns, status_code, clock_domain,
           attr_int, attr_bool, attr_str, attr_json, dropped_events_count
    FROM spans
    WHERE scope_name = 'tokentrace' AND kind = 'CLIENT'
    UNION ALL
    SELECT trace_id, span_id, parent_span_id, name, kind, start_ns, end_ns, status_code, clock_domain,
           attr_int, attr_bool, attr_str, attr_json, dropped_events_count
    FROM spans
    WHERE scope_name = 'tokentrace' AND name = 'generate' AND parent_span_id IS NULL AND kind <> 'CLIENT'
)
SELECT dense_rank() OVER (ORDER BY trace_id, span_id) AS candidate_key, *
FROM found;

-- One row per request perspective: the perspective's span and the request's server and
-- client spans, by span id and by candidate_key (perspective_key, server_key, client_key).
CREATE OR REPLACE VIEW tt_request_spans AS
WITH gateway AS (
    SELECT trace_id, span_id, parent_span_id, candidate_key
    FROM tt_request_candidates WHERE name = 'gateway' AND kind = 'SERVER'
),
client AS (
    SELECT trace_id, span_id, candidate_key FROM tt_request_candidates WHERE kind = 'CLIENT'
),
engine AS (
    SELECT trace_id, span_id, candidate_key
    FROM tt_request_candidates WHERE name = 'generate' AND parent_span_id IS NULL
)
SELECT g.trace_id, g.span_id AS request_span_id, 'server' AS perspective,
       g.span_id AS perspective_span_id, g.span_id AS server_span_id, c.span_id AS client_span_id,
       g.candidate_key AS perspective_key, g.candidate_key AS server_key, c.candidate_key AS client_key
FROM gateway g
LEFT JOIN client c ON c.trace_id = g.trace_id AND c.span_id = g.parent_span_id
UNION ALL
SELECT c.trace_id, coalesce(g.span_id, c.span_id) AS request_span_id, 'client' AS perspective,
       c.span_id AS perspective_span_id, g.span_id AS server_span_id, c.span_id AS client_span_id,
       c.candidate_key AS perspective_key, g.candidate_key AS server_key, c.candidate_key AS client_key
FROM client c
LEFT JOIN gateway g ON g.trace_id = c.trace_id AND g.parent_span_id = c.span_id
UNION ALL
SELECT e.trace_id, e.span_id AS request_span_id, 'engine' AS perspective,
       e.span_id AS perspective_span_id, e.span_id AS server_span_id, NULL AS client_span_id,
       e.candidate_key AS perspective_key, e.candidate_key AS server_key, CAST(NULL AS BIGINT) AS client_key
FROM engine e;

-- One row per `tokentrace.chunk` event: when visible output moved, and how many tokens.
-- A chunk without `tokentrace.chunk.tokens` counts 1 token; without `.visible`, visible.
-- The three attributes are read from their dedicated columns (docs/tables.md): one typed
-- column each, not a map decoded per event.
CREATE OR REPLACE VIEW tt_chunk_events AS
SELECT
    trace_id,
    span_id,
    event_index,
    time_ns,
    coalesce(attr_tokentrace_chunk_index, event_index) AS chunk_index,
    coalesce(attr_tokentrace_chunk_tokens, 1) AS chunk_tokens,
    coalesce(attr_tokentrace_chunk_visible, true) AS visible
FROM span_events
WHERE name = 'tokentrace.chunk';

-- The visible chunks of the candidate spans, on integers only: the one pass over the chunk
-- events that the facts (first/last chunk per span) and the chunks (every gap) share.
CREATE OR REPLACE VIEW tt_candidate_chunks AS
SELECT k.candidate_key, c.chunk_index, c.time_ns, c.chunk_tokens
FROM tt_chunk_events c
JOIN (SELECT DISTINCT candidate_key, trace_id, span_id FROM tt_request_candidates) k
  ON k.trace_id = c.trace_id AND k.span_id = c.span_id
WHERE c.visible;

-- Every gap of a candidate span's visible chunks, on integers only: each chunk after the
-- first, ordered by chunk index (then time), with the previous chunk's time; gap_index
-- counts from 1. view tt_request_gap_rows gives them their request perspective. Where the
-- chunk table is kept in this order, queries/keep/tt_request_gap_rows.sql computes the same
-- rows in one ordered pass, without this window's partition and sort.
CREATE OR REPLACE VIEW tt_candidate_gaps AS
WITH ordered AS (
    SELECT candidate_key, chunk_index, time_ns, chunk_tokens,
           lag(time_ns) OVER w AS prev_time_ns,
           row_number() OVER w - 1 AS gap_index
    FROM tt_candidate_chunks
    WINDOW w AS (PARTITION BY candidate_key ORDER BY chunk_index, time_ns)
)
SELECT candidate_key, gap_index, chunk_index, prev_time_ns, time_ns, chunk_tokens
FROM ordered
WHERE gap_index > 0;

-- Visible chunks of every request perspective, for per-gap (ITL) and steady-state window
-- questions. perspective_span_id is the span that carried the events.
CREATE OR REPLACE VIEW tt_request_chunks AS
-- events_dropped > 0: the carrying span lost events to the SDK's limit, so gaps around the
-- lost chunks are unknown (itl_ms NULL with a reason) and token counts are incomplete.
SELECT r.trace_id, r.request_span_id, r.perspective, 'tokentrace' AS source,
       c.chunk_index, c.time_ns, c.chunk_tokens, p.dropped_events_count AS events_dropped
FROM tt_request_spans r
JOIN tt_request_candidates p ON p.candidate_key = r.perspective_key
JOIN tt_candidate_chunks c ON c.candidate_key = r.perspective_key;

CREATE OR REPLACE VIEW tt_request_facts AS
WITH chunk_agg AS (
    SELECT candidate_key,
           min(time_ns) AS first_chunk_ns,
           max(time_ns) AS last_chunk_ns,
           count(*) AS visible_chunks,
           sum(chunk_tokens) AS visible_chunk_tokens
    FROM tt_candidate_chunks
    GROUP BY candidate_key
),
-- tokenize / queue / prefill: a few spans per request. One equality per scan (pushed into
-- the scan; an IN list is not, and would decode every span's attribute maps).
phase_spans AS (
    SELECT trace_id, parent_span_id, name, start_ns, end_ns, attr_int, attr_str
    FROM spans WHERE scope_name = 'tokentrace' AND name = 'tokenize'
    UNION ALL
    SELECT trace_id, parent_span_id, name, start_ns, end_ns, attr_int, attr_str
    FROM spans WHERE scope_name = 'tokentrace' AND name = 'queue'
    UNION ALL
    SELECT trace_id, parent_span_id, name, start_ns, end_ns, attr_int, attr_str
    FROM spans WHERE scope_name = 'tokentrace' AND name = 'prefill'
          -- a prefill recomputing a preempted sequence (after its first decode steps) is not
          -- part of the prompt's prefill: prefill_end_ns stays the first prefill's end
          AND NOT coalesce(attr_bool['tokentrace.prefill.recompute'], false)
),
phase AS (
    SELECT trace_id, parent_span_id,
           min(CASE WHEN name = 'tokenize' THEN start_ns END) AS tokenize_start_ns,
           max(CASE WHEN name = 'tokenize' THEN end_ns END) AS tokenize_end_ns,
           min(CASE WHEN name = 'queue' THEN start_ns END) AS queue_start_ns,
           max(CASE WHEN name = 'queue' THEN end_ns END) AS queue_end_ns,
           min(CASE WHEN name = 'prefill' THEN start_ns END) AS prefill_start_ns,
           max(CASE WHEN name = 'prefill' THEN end_ns END) AS prefill_end_ns,
           max(CASE WHEN name = 'prefill' THEN attr_int['tokentrace.kv.bytes_per_token'] END) AS kv_bytes_per_token,
           max(CASE WHEN name = 'prefill' THEN attr_int['tokentrace.kv.bytes'] END) AS prompt_kv_bytes,
           max(CASE WHEN name = 'prefill' THEN attr_str['tokentrace.kv.layout'] END) AS kv_layout,
           -- the continuous engine's prefix-cache hit (first prefill chunk only), tokens
           -- contract v2 writes the semconv name on the first prefill span; v1 wrote only
           -- tokentrace.cached_tokens there (0 on later chunks)
           max(CASE WHEN name = 'prefill' THEN coalesce(attr_int['gen_ai.usage.cache_read.input_tokens'],
                                                          attr_int['tokentrace.cached_tokens']) END) AS cached_tokens
    FROM phase_spans
    GROUP BY trace_id, parent_span_id
),
-- the traced decode steps: how many, the last one, and the KV held after it (kv.bytes grows
-- with every step, so the largest is the last traced step's; see stop_kv_bytes below).
decode AS (
    SELECT trace_id, parent_span_id,
           count(*) AS decode_spans,
           max(attr_tokentrace_step) AS last_decode_step,  -- dedicated columns: a decode span per token
           max(attr_tokentrace_kv_bytes) AS stop_kv_bytes
    FROM spans
    WHERE scope_name = 'tokentrace' AND name = 'decode'
    GROUP BY trace_id, parent_span_id
),
-- a gateway span a keep policy summarized (docs/gateway.md, "Keeping the slow requests"): no
-- chunk events, its figures as attributes, TTFT and E2E in seconds from its start
summarized AS (
    SELECT trace_id, span_id,
           start_ns + CAST(round(attr_double['gen_ai.latency.time_to_first_token'] * 1e9) AS BIGINT) AS f_ns,
           start_ns + CAST(round(attr_double['gen_ai.latency.e2e'] * 1e9) AS BIGINT) AS e_ns
    FROM spans
    WHERE scope_name = 'tokentrace' AND name = 'gateway' AND attr_str['tokentrace.sampling.reason'] = 'summary'
)
SELECT
    'tokentrace' AS source,
    r.perspective,
    r.trace_id,
    r.request_span_id,
    r.perspective_span_id,
    r.server_span_id,
    r.client_span_id,
    p.clock_domain,
    sv.clock_domain AS server_clock_domain,
    cl.clock_domain AS client_clock_domain,
    p.start_ns AS s_ns,
    CASE WHEN p.dropped_events_count = 0 THEN coalesce(ca.first_chunk_ns, sm.f_ns) END AS f_ns,
    CASE WHEN p.dropped_events_count = 0 THEN coalesce(ca.last_chunk_ns, sm.e_ns) END AS e_ns,
    p.end_ns AS end_ns,
    -- Newest GenAI names first; the deprecated prompt_tokens / completion_tokens are read too.
    coalesce(p.attr_int['gen_ai.usage.input_tokens'], p.attr_int['gen_ai.usage.prompt_tokens'],
             sv.attr_int['gen_ai.usage.input_tokens'], sv.attr_int['gen_ai.usage.prompt_tokens']) AS input_tokens,
    -- prompt tokens served from a prefix cache (OTel GenAI semconv name); NULL: not reported
    coalesce(p.attr_int['gen_ai.usage.cache_read.input_tokens'], sv.attr_int['gen_ai.usage.cache_read.input_tokens'],
             ph.cached_tokens) AS cached_tokens,
    coalesce(p.attr_int['gen_ai.usage.output_tokens'], p.attr_int['gen_ai.usage.completion_tokens'],
             sv.attr_int['gen_ai.usage.output_tokens'], sv.attr_int['gen_ai.usage.completion_tokens'],
             CASE WHEN p.dropped_events_count = 0 THEN coalesce(ca.visible_chunk_tokens, 0) END) AS output_tokens,
    coalesce(sv.attr_int['tokentrace.generated_tokens'], p.attr_int['tokentrace.generated_tokens']) AS generated_tokens,
    coalesce(ca.visible_chunks, 0) AS visible_chunks,
    ca.visible_chunk_tokens,
    coalesce(
        json_extract_string(p.attr_json['gen_ai.response.finish_reasons'], '$[0]'),
        json_extract_string(sv.attr_json['gen_ai.response.finish_reasons'], '$[0]')
    ) AS finish_reason,
    p.status_code,
    sv.status_code AS server_status_code,
    coalesce(p.attr_str['error.type'], sv.attr_str['error.type']) AS error_type,
    sv.start_ns AS server_start_ns,
    sv.end_ns AS server_end_ns,
    cl.start_ns AS client_start_ns,
    cl.end_ns AS client_end_ns,
    CASE WHEN sv.dropped_events_count = 0 THEN sca.first_chunk_ns END AS server_first_chunk_ns,
    CASE WHEN cl.dropped_events_count = 0 THEN cca.first_chunk_ns END AS client_first_chunk_ns,
    ph.tokenize_start_ns,
    ph.tokenize_end_ns,
    ph.queue_start_ns,
    ph.queue_end_ns,
    ph.prefill_start_ns,
    ph.prefill_end_ns,
    ph.kv_bytes_per_token,
    ph.prompt_kv_bytes,
    -- KV after the last decode step, only when that step was traced: it is step G - 1 (one
    -- token per step), or every step 1..n has a span (a gateway's multi-token steps). With
    -- decode_spans = every:N the last step can be missing: NULL, not an earlier step's KV.
    CASE WHEN dc.last_decode_step = coalesce(sv.attr_int['tokentrace.generated_tokens'],
                                             p.attr_int['tokentrace.generated_tokens']) - 1
              OR (dc.decode_spans > 1 AND dc.decode_spans = dc.last_decode_step)
         THEN dc.stop_kv_bytes END AS stop_kv_bytes,
    -- paged KV the request's blocks held at its end (blocks x bytes per block; the engine's own figure)
    coalesce(sv.attr_int['tokentrace.kv.physical_bytes'], p.attr_int['tokentrace.kv.physical_bytes']) AS physical_kv_bytes,
    ph.kv_layout,
    coalesce(dc.decode_spans, 0) AS decode_spans,
    coalesce(p.attr_bool['tokentrace.synthetic'], false) AS synthetic,
    -- ids that join a benchmark's per-request records to the traces: the gateway's response
    -- id (what the client receives as the response's `id`) and the X-Request-ID the client
    -- sent (docs/gateway.md), each read from the server span, else the perspective's own.
    coalesce(sv.attr_str['gen_ai.response.id'], p.attr_str['gen_ai.response.id']) AS response_id,
    coalesce(sv.attr_str['tokentrace.client_request_id'], p.attr_str['tokentrace.client_request_id'])
        AS client_request_id,
    CASE
        WHEN coalesce(sv.attr_str['tokentrace.client_request_id'], p.attr_str['tokentrace.client_request_id']) IS NULL
        THEN CASE WHEN sv.name = 'gateway'
                  THEN 'client_request_id NULL: the gateway span has no tokentrace.client_request_id '
                       || '(the request carried no X-Request-ID header)'
                  ELSE 'client_request_id NULL: no gateway span (tokentrace.client_request_id is recorded there)' END
    END AS request_id_note,
    -- a keep policy's decision (docs/spans.md, "Kept and summarized requests"); NULL: no policy
    coalesce(sv.attr_str['tokentrace.sampling.reason'], p.attr_str['tokentrace.sampling.reason']) AS sampling_reason,
    CASE
        WHEN p.attr_int['gen_ai.usage.output_tokens'] IS NOT NULL THEN 'gen_ai.usage.output_tokens'
        WHEN p.attr_int['gen_ai.usage.completion_tokens'] IS NOT NULL THEN 'gen_ai.usage.completion_tokens'
        WHEN sv.attr_int['gen_ai.usage.output_tokens'] IS NOT NULL THEN 'gen_ai.usage.output_tokens (server span)'
        WHEN sv.attr_int['gen_ai.usage.completion_tokens'] IS NOT NULL THEN 'gen_ai.usage.completion_tokens (server span)'
        WHEN p.dropped_events_count = 0 THEN 'tokentrace.chunk tokens (visible chunks)'
    END AS output_tokens_basis,
    CASE
        WHEN p.dropped_events_count > 0 THEN
            'f/e unknown: ' || CAST(p.dropped_events_count AS VARCHAR)
            || ' events dropped by the span event limit'
        WHEN ca.first_chunk_ns IS NULL AND sm.f_ns IS NULL THEN 'no visible chunk events'
    END AS null_reason
FROM tt_request_spans r
JOIN tt_request_candidates p ON p.candidate_key = r.perspective_key
LEFT JOIN tt_request_candidates sv ON sv.candidate_key = r.server_key
LEFT JOIN tt_request_candidates cl ON cl.candidate_key = r.client_key
LEFT JOIN chunk_agg ca ON ca.candidate_key = r.perspective_key
LEFT JOIN chunk_agg sca ON sca.candidate_key = r.server_key
LEFT JOIN chunk_agg cca ON cca.candidate_key = r.client_key
LEFT JOIN phase ph ON ph.trace_id = r.trace_id AND ph.parent_span_id = r.server_span_id
LEFT JOIN decode dc ON dc.trace_id = r.trace_id AND dc.parent_span_id = r.server_span_id
LEFT JOIN summarized sm ON sm.trace_id = r.trace_id AND sm.span_id = r.perspective_span_id;
