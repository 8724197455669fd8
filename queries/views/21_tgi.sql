-- Adapter: Hugging Face text-generation-inference (TGI) router spans -> request rows.
-- Shape (router/src/server.rs generate / generate_stream / chat_completions #[instrument]
-- fields; backends/v3/src/backend.rs and queue.rs; huggingface/text-generation-inference
-- commits d957e32601a9 (server.rs) and 1d0847a90e6b (backend.rs)), exported through
-- tracing-opentelemetry:
--   request span `generate` | `generate_stream` | `chat_completions` | `completions` with
--   string attributes total_time, validation_time, queue_time, inference_time, time_per_token
--   written as Rust Duration Debug strings with units: "812.3ms", "2.1s", "15µs", "100ns";
--   each scheduling step is its own ROOT trace `batch` -> `prefill` | `decode`, joined to the
--   request by follows-from links both ways with a per-request `infer` span (child of the
--   request's entry span); `send_generation` (child of that `infer`) once per generated token.
-- Signature: name in the list above AND (attr_str inference_time or parameters present) AND
-- not our scope. Durations are parsed with regexp_extract (DuckDB and Spark both have it).
-- f = first `send_generation` start, e = last; chunk rows = send_generation spans (one token
-- each: speculative multi-token generations are not split). Without send_generation spans
-- (sampled out) f is unknown and e = s + total_time (derived, flagged in null_reason).
-- TGI spans carry no prompt token count and no finish reason: NULL.
-- keep: tgi_request_spans

CREATE OR REPLACE VIEW tgi_request_spans AS
SELECT trace_id, span_id, start_ns, end_ns, clock_domain, status_code, attr_str
FROM spans
WHERE name IN ('generate', 'generate_stream', 'chat_completions', 'completions')
  AND (attr_str['inference_time'] IS NOT NULL OR attr_str['parameters'] IS NOT NULL)
  AND coalesce(scope_name, '') <> 'tokentrace';

-- Each duration field of each request span in nanoseconds (NULL when absent or unparsable).
CREATE OR REPLACE VIEW tgi_durations AS
WITH raw AS (
    SELECT r.trace_id, r.span_id, k.field, r.attr_str[k.field] AS text
    FROM tgi_request_spans r
    CROSS JOIN (VALUES ('total_time'), ('validation_time'), ('queue_time'), ('inference_time'),
                       ('time_per_token')) AS k(field)
),
split AS (
    SELECT trace_id, span_id, field, text,
           nullif(regexp_extract(text, '^([0-9]+(\.[0-9]+)?)(ns|µs|us|ms|s)$', 1), '') AS number_text,
           regexp_extract(text, '^([0-9]+(\.[0-9]+)?)(ns|µs|us|ms|s)$', 3) AS unit
    FROM raw
)
SELECT trace_id, span_id, field, text,
       CAST(number_text AS DOUBLE) * CASE unit
           WHEN 'ns' THEN 1.0 WHEN 'µs' THEN 1e3 WHEN 'us' THEN 1e3 WHEN 'ms' THEN 1e6 WHEN 's' THEN 1e9
       END AS duration_ns
FROM split;

-- `infer` and `send_generation` spans mapped to the nearest enclosing request span (up to
-- seven levels up: send_generation -> infer -> entry span -> ... -> request).
CREATE OR REPLACE VIEW tgi_span_requests AS
WITH s0 AS (
    SELECT s.trace_id, s.span_id, s.name, s.start_ns, s.end_ns, s.parent_span_id AS a1
    FROM spans s
    WHERE s.name IN ('infer', 'send_generation')
      AND s.trace_id IN (SELECT trace_id FROM tgi_request_spans)
),
up AS (
    SELECT s0.*, p1.parent_span_id AS a2, p2.parent_span_id AS a3, p3.parent_span_id AS a4,
           p4.parent_span_id AS a5, p5.parent_span_id AS a6, p6.parent_span_id AS a7
    FROM s0
    LEFT JOIN spans p1 ON p1.trace_id = s0.trace_id AND p1.span_id = s0.a1
    LEFT JOIN spans p2 ON p2.trace_id = s0.trace_id AND p2.span_id = p1.parent_span_id
    LEFT JOIN spans p3 ON p3.trace_id = s0.trace_id AND p3.span_id = p2.parent_span_id
    LEFT JOIN spans p4 ON p4.trace_id = s0.trace_id AND p4.span_id = p3.parent_span_id
    LEFT JOIN spans p5 ON p5.trace_id = s0.trace_id AND p5.span_id = p4.parent_span_id
    LEFT JOIN spans p6 ON p6.trace_id = s0.trace_id AND p6.span_id = p5.parent_span_id
)
SELECT up.trace_id, up.span_id, up.name, up.start_ns, up.end_ns,
       coalesce(r1.span_id, r2.span_id, r3.span_id, r4.span_id, r5.span_id, r6.span_id, r7.span_id)
           AS request_span_id
FROM up
LEFT JOIN tgi_request_spans r1 ON r1.trace_id = up.trace_id AND r1.span_id = up.a1
LEFT JOIN tgi_request_spans r2 ON r2.trace_id = up.trace_id AND r2.span_id = up.a2
LEFT JOIN tgi_request_spans r3 ON r3.trace_id = up.trace_id AND r3.span_id = up.a3
LEFT JOIN tgi_request_spans r4 ON r4.trace_id = up.trace_id AND r4.span_id = up.a4
LEFT JOIN tgi_request_spans r5 ON r5.trace_id = up.trace_id AND r5.span_id = up.a5
LEFT JOIN tgi_request_spans r6 ON r6.trace_id = up.trace_id AND r6.span_id = up.a6
LEFT JOIN tgi_request_spans r7 ON r7.trace_id = up.trace_id AND r7.span_id = up.a7;

-- Batch steps (`prefill` / `decode` under a root `batch` span, in their own traces) of each
-- request, found through the follows-from links between `batch` and the request's `infer`.
CREATE OR REPLACE VIEW tgi_request_steps AS
WITH pairs AS (
    SELECT trace_id AS batch_trace_id, span_id AS batch_span_id,
           linked_trace_id AS infer_trace_id, linked_span_id AS infer_span_id
    FROM span_links
    UNION
    SELECT linked_trace_id, linked_span_id, trace_id, span_id
    FROM span_links
)
SELECT DISTINCT m.trace_id, m.request_span_id, c.trace_id AS step_trace_id, c.span_id AS step_span_id,
       c.name AS step_name, c.start_ns, c.end_ns
FROM pairs p
JOIN tgi_span_requests m
  ON m.trace_id = p.infer_trace_id AND m.span_id = p.infer_span_id AND m.name = 'infer'
JOIN spans b
  ON b.trace_id = p.batch_trace_id AND b.span_id = p.batch_span_id AND b.name = 'batch'
JOIN spans c
  ON c.trace_id = b.trace_id AND c.parent_span_id = b.span_id AND c.name IN ('prefill', 'decode')
WHERE m.request_span_id IS NOT NULL;

CREATE OR REPLACE VIEW tgi_request_chunks AS
SELECT trace_id, request_span_id, 'server' AS perspective, 'tgi' AS source,
       CAST(row_number() OVER (PARTITION BY trace_id, request_span_id ORDER BY start_ns, span_id) - 1
            AS BIGINT) AS chunk_index,
       start_ns AS time_ns,
       CAST(1 AS BIGINT) AS chunk_tokens,
       CAST(0 AS BIGINT) AS events_dropped
FROM tgi_span_requests
WHERE name = 'send_generation' AND request_span_id IS NOT NULL;

CREATE OR REPLACE VIEW tgi_request_facts AS
WITH d AS (
    SELECT trace_id, span_id,
           max(CASE WHEN field = 'total_time' THEN duration_ns END) AS total_ns,
           max(CASE WHEN field = 'validation_time' THEN duration_ns END) AS validation_ns,
           max(CASE WHEN field = 'queue_time' THEN duration_ns END) AS queue_ns,
           max(CASE WHEN field = 'inference_time' THEN duration_ns END) AS inference_ns,
           max(CASE WHEN field = 'time_per_token' THEN duration_ns END) AS per_token_ns
    FROM tgi_durations
    GROUP BY trace_id, span_id
),
gen AS (
    SELECT trace_id, request_span_id, min(time_ns) AS first_ns, max(time_ns) AS last_ns,
           count(*) AS generations
    FROM tgi_request_chunks
    GROUP BY trace_id, request_span_id
),
steps AS (
    SELECT trace_id, request_span_id,
           min(CASE WHEN step_name = 'prefill' THEN start_ns END) AS prefill_start_ns,
           min(CASE WHEN step_name = 'prefill' THEN end_ns END) AS prefill_end_ns,
           sum(CASE WHEN step_name = 'decode' THEN 1 ELSE 0 END) AS decode_steps
    FROM tgi_request_steps
    GROUP BY trace_id, request_span_id
),
r AS (
    SELECT q.*, CAST(round(d.total_ns) AS BIGINT) AS total_ns, CAST(round(d.validation_ns) AS BIGINT) AS validation_ns,
           CAST(round(d.queue_ns) AS BIGINT) AS queue_ns, d.inference_ns, d.per_token_ns,
           g.first_ns, g.last_ns, g.generations, st.prefill_start_ns, st.prefill_end_ns, st.decode_steps
    FROM tgi_request_spans q
    LEFT JOIN d ON d.trace_id = q.trace_id AND d.span_id = q.span_id
    LEFT JOIN gen g ON g.trace_id = q.trace_id AND g.request_span_id = q.span_id
    LEFT JOIN steps st ON st.trace_id = q.trace_id AND st.request_span_id = q.span_id
)
SELECT
    'tgi' AS source,
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
    r.first_ns AS f_ns,
    coalesce(r.last_ns, r.start_ns + r.total_ns) AS e_ns,
    r.end_ns,
    CAST(NULL AS BIGINT) AS input_tokens,
    CAST(NULL AS BIGINT) AS cached_tokens,
    coalesce(r.generations,
             CAST(round(r.inference_ns / nullif(r.per_token_ns, 0)) AS BIGINT)) AS output_tokens,
    coalesce(r.generations,
             CAST(round(r.inference_ns / nullif(r.per_token_ns, 0)) AS BIGINT)) AS generated_tokens,
    coalesce(r.generations, CAST(0 AS BIGINT)) AS visible_chunks,
    r.generations AS visible_chunk_tokens,
    CAST(NULL AS VARCHAR) AS finish_reason,
    r.status_code,
    r.status_code AS server_status_code,
    r.attr_str['error.type'] AS error_type,
    r.start_ns AS server_start_ns,
    r.end_ns AS server_end_ns,
    CAST(NULL AS BIGINT) AS client_start_ns,
    CAST(NULL AS BIGINT) AS client_end_ns,
    r.first_ns AS server_first_chunk_ns,
    CAST(NULL AS BIGINT) AS client_first_chunk_ns,
    -- TGI's validation (tokenization included) runs from the span start for validation_time.
    CASE WHEN r.validation_ns IS NOT NULL THEN r.start_ns END AS tokenize_start_ns,
    r.start_ns + r.validation_ns AS tokenize_end_ns,
    r.start_ns + r.validation_ns AS queue_start_ns,
    r.start_ns + r.validation_ns + r.queue_ns AS queue_end_ns,
    r.prefill_start_ns,
    r.prefill_end_ns,
    CAST(NULL AS BIGINT) AS kv_bytes_per_token,
    CAST(NULL AS BIGINT) AS prompt_kv_bytes,
    CAST(NULL AS BIGINT) AS stop_kv_bytes,
    CAST(NULL AS BIGINT) AS physical_kv_bytes,
    CAST(NULL AS VARCHAR) AS kv_layout,
    CAST(coalesce(r.decode_steps, 0) AS BIGINT) AS decode_spans,
    false AS synthetic,
    CAST(NULL AS VARCHAR) AS response_id,
    CAST(NULL AS VARCHAR) AS client_request_id,
    'tgi: the router spans record no request or response id' AS request_id_note,
    CAST(NULL AS VARCHAR) AS sampling_reason,
    CASE WHEN r.generations IS NOT NULL THEN 'send_generation spans'
         WHEN r.inference_ns IS NOT NULL AND r.per_token_ns > 0 THEN 'inference_time / time_per_token' END
        AS output_tokens_basis,
    CASE
        WHEN r.first_ns IS NULL AND r.total_ns IS NOT NULL THEN
            'tgi: no send_generation spans: f unknown (ttft/tpot/itl NULL); e = s + total_time '
            || '(monotonic duration added to the span''s wall-clock start); output tokens from '
            || 'inference_time / time_per_token; input tokens and finish reason not recorded'
        WHEN r.first_ns IS NULL THEN
            'tgi: no send_generation spans and no timing fields (request failed or was cut): '
            || 'f/e unknown'
        ELSE
            'tgi: f/e and itl from send_generation span starts (router-side token hand-off, one '
            || 'token each); input tokens and finish reason not recorded; kv figures not recorded'
    END AS null_reason
FROM r;
