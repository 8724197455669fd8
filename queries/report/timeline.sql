-- returns: the engine timeline of every request, one row per item (kind): 'request' (one per
--   request of queries/requests.sql, seen from the perspective nearest the engine: engine,
--   else server, else client; its lane is that perspective's span, lane_span_id), 'queue',
--   'prefill' and 'decode' (the lane span's tokentrace children: one row per span, step the
--   engine step it ran in, tokens its prompt tokens or 1 + draft tokens, recompute true for
--   the prefill that recomputes a preempted request), 'token' (each generated token's
--   emission on the engine's clock, view request_step_gaps: token 1 at the end of the last
--   prompt prefill chunk, token n at the end of the span that emitted it), 'chunk' (a lane
--   without a prefill span: each visible chunk of its perspective, view request_chunks) and
--   'preemption' (the continuous engine's tokentrace.preemption and the vLLM plugin's
--   tokentrace.preempted event, one name here). Ordered by request start, request, time.
-- param: $request_span_ids VARCHAR[] default NULL -- only these requests (request_span_id as requests.sql gives it); NULL = all
-- param: $kinds VARCHAR[] default NULL -- only rows of these kinds (e.g. ['request']: one row per request); NULL = all
-- units: *_ns nanoseconds since the Unix epoch on the lane's clock (clock_domain: the
--   engine's for engine-side lanes); e2e_ms and ttft_ms milliseconds on that clock; tokens
--   and generated_tokens tokens; token_index a count (token n); step an engine step id;
--   blocks_freed KV blocks.
WITH ranked AS (
    SELECT m.*,
           row_number() OVER (PARTITION BY m.trace_id, m.request_span_id
                              ORDER BY CASE m.perspective WHEN 'engine' THEN 0 WHEN 'server' THEN 1 ELSE 2 END) AS pick
    FROM request_metrics m
),
lanes AS (
    SELECT r.trace_id, r.request_span_id, r.perspective, r.perspective_span_id AS lane_span_id,
           coalesce(ls.trace_id, r.trace_id) AS lane_trace_id, r.clock_domain, r.s_ns,
           coalesce(r.end_ns, r.e_ns, r.s_ns) AS end_ns, r.response_id, r.generated_tokens, r.finish_reason,
           r.e2e_ms, r.ttft_ms
    FROM ranked r
    LEFT JOIN spans ls ON ls.span_id = r.perspective_span_id AND ls.clock_domain = r.clock_domain
    WHERE r.pick = 1 AND ($request_span_ids IS NULL OR list_contains($request_span_ids, r.request_span_id))
),
children AS (
    SELECT l.trace_id, l.request_span_id, l.lane_span_id, l.clock_domain, c.span_id, c.name, c.start_ns, c.end_ns,
           c.attr_tokentrace_engine_step AS step,
           CASE c.name WHEN 'prefill' THEN c.attr_int['tokentrace.prefill.tokens']
                       WHEN 'decode' THEN 1 + coalesce(c.attr_tokentrace_spec_draft_tokens, 0) END AS tokens,
           coalesce(c.attr_bool['tokentrace.prefill.recompute'], false) AS recompute,
           c.attr_tokentrace_step AS decode_step
    FROM lanes l
    JOIN spans c ON c.trace_id = l.lane_trace_id AND c.parent_span_id = l.lane_span_id
    WHERE c.scope_name = 'tokentrace' AND c.name IN ('queue', 'prefill', 'decode')
),
later_tokens AS (
    SELECT l.trace_id, l.request_span_id, l.lane_span_id, l.clock_domain, g.token_index, g.emit_ns, g.step
    FROM lanes l
    JOIN request_step_gaps g ON g.trace_id = l.lane_trace_id AND g.request_span_id = l.lane_span_id
),
first_later AS (
    SELECT trace_id, request_span_id, min(emit_ns) AS first_ns FROM later_tokens GROUP BY trace_id, request_span_id
),
-- token 1: the end of the last prompt chunk (no tokentrace.step: not a recompute standing for
-- a decode step) before any later token, as view request_step_gaps reads it
first_tokens AS (
    SELECT c.trace_id, c.request_span_id, max(c.lane_span_id) AS lane_span_id, max(c.clock_domain) AS clock_domain,
           1 AS token_index, max(c.end_ns) AS emit_ns, arg_max(c.step, c.end_ns) AS step
    FROM children c
    LEFT JOIN first_later f ON f.trace_id = c.trace_id AND f.request_span_id = c.request_span_id
    WHERE c.name = 'prefill' AND c.decode_step IS NULL AND (f.first_ns IS NULL OR c.end_ns <= f.first_ns)
    GROUP BY c.trace_id, c.request_span_id
),
with_prefill AS (
    SELECT DISTINCT trace_id, request_span_id FROM children WHERE name = 'prefill'
),
items AS (
    SELECT 'request' AS kind, trace_id, request_span_id, lane_span_id, perspective, clock_domain, s_ns AS start_ns,
           end_ns, CAST(NULL AS BIGINT) AS step, CAST(NULL AS BIGINT) AS tokens, CAST(NULL AS BIGINT) AS token_index,
           CAST(NULL AS BOOLEAN) AS recompute, response_id, generated_tokens, finish_reason, e2e_ms, ttft_ms,
           CAST(NULL AS VARCHAR) AS reason, CAST(NULL AS BIGINT) AS blocks_freed
    FROM lanes
    UNION ALL
    SELECT c.name, c.trace_id, c.request_span_id, c.lane_span_id, NULL, c.clock_domain, c.start_ns, c.end_ns, c.step,
           c.tokens, c.decode_step, c.recompute, NULL, NULL, NULL, NULL, NULL, NULL, NULL
    FROM children c
    UNION ALL
    SELECT 'token', trace_id, request_span_id, lane_span_id, NULL, clock_domain, emit_ns, emit_ns, step, NULL,
           token_index, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL
    FROM first_tokens
    UNION ALL
    SELECT 'token', trace_id, request_span_id, lane_span_id, NULL, clock_domain, emit_ns, emit_ns, step, NULL,
           token_index, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL
    FROM later_tokens
    UNION ALL
    SELECT 'chunk', l.trace_id, l.request_span_id, l.lane_span_id, NULL, l.clock_domain, k.time_ns, k.time_ns, NULL,
           k.chunk_tokens, k.chunk_index, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL
    FROM lanes l
    JOIN request_chunks k
      ON k.trace_id = l.trace_id AND k.request_span_id = l.request_span_id AND k.perspective = l.perspective
    LEFT JOIN with_prefill w ON w.trace_id = l.trace_id AND w.request_span_id = l.request_span_id
    WHERE w.trace_id IS NULL
    UNION ALL
    SELECT 'preemption', l.trace_id, l.request_span_id, l.lane_span_id, NULL, l.clock_domain, e.time_ns, e.time_ns,
           NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL,
           coalesce(e.attr_str['tokentrace.preemption.reason'], e.name),
           e.attr_int['tokentrace.kv.blocks_freed']
    FROM lanes l
    JOIN span_events e ON e.trace_id = l.lane_trace_id AND e.span_id = l.lane_span_id
    WHERE e.name IN ('tokentrace.preemption', 'tokentrace.preempted')
)
SELECT i.*
FROM items i
JOIN lanes l ON l.trace_id = i.trace_id AND l.request_span_id = i.request_span_id
WHERE $kinds IS NULL OR list_contains($kinds, i.kind)
ORDER BY l.s_ns, i.trace_id, i.request_span_id, CASE WHEN i.kind = 'request' THEN 0 ELSE 1 END, i.start_ns,
         i.kind, i.token_index;
