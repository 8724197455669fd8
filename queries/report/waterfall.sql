-- returns: the spans of one request for a waterfall: the client span, the request span
--   (gateway or generate) and its direct children (tokenize, queue, prefill, decode steps),
--   with start/end relative to the request's s, the clock domain each time was read on, and
--   the number of chunk events each span carries.
-- param: $trace_id VARCHAR default NULL -- the request's trace (32 lowercase hex)
-- param: $request_span_id VARCHAR default NULL -- the request's span id (16 lowercase hex)
-- units: start_ms / end_ms milliseconds after s (the client send, or the server arrival
--   when the request has no client span), each on its own span's clock (clock_domain);
--   duration_ms milliseconds.
WITH req AS (
    SELECT trace_id, request_span_id, server_span_id, client_span_id,
           coalesce(client_start_ns, s_ns) AS origin_ns
    FROM request_facts
    WHERE trace_id = $trace_id AND request_span_id = $request_span_id
    ORDER BY CASE perspective WHEN 'client' THEN 0 WHEN 'server' THEN 1 ELSE 2 END
    LIMIT 1
),
members AS (
    SELECT s.*, r.origin_ns,
           CASE WHEN s.span_id = r.client_span_id THEN 0
                WHEN s.span_id = r.server_span_id THEN 1
                ELSE 2 END AS depth
    FROM spans s
    JOIN req r ON s.trace_id = r.trace_id
    WHERE s.span_id = r.client_span_id
       OR s.span_id = r.server_span_id
       OR (s.parent_span_id = r.server_span_id AND s.scope_name = 'tokentrace')
),
chunk_counts AS (
    SELECT e.trace_id, e.span_id, count(*) AS chunk_events
    FROM span_events e
    JOIN members m ON m.trace_id = e.trace_id AND m.span_id = e.span_id
    WHERE e.name = 'tokentrace.chunk'
    GROUP BY e.trace_id, e.span_id
)
SELECT
    m.span_id,
    m.parent_span_id,
    m.name,
    m.kind,
    m.depth,
    m.clock_domain,
    m.attr_int['tokentrace.step'] AS step,
    (m.start_ns - m.origin_ns) / 1e6 AS start_ms,
    (m.end_ns - m.origin_ns) / 1e6 AS end_ms,
    (m.end_ns - m.start_ns) / 1e6 AS duration_ms,
    coalesce(c.chunk_events, 0) AS chunk_events
FROM members m
LEFT JOIN chunk_counts c ON c.trace_id = m.trace_id AND c.span_id = m.span_id
ORDER BY m.depth, m.start_ns, step;
