-- returns: every visible chunk of one request, per perspective, relative to the request's
--   origin (client send, else server arrival), for marking chunk events on a waterfall.
-- param: $trace_id VARCHAR default NULL -- the request's trace (32 lowercase hex)
-- param: $request_span_id VARCHAR default NULL -- the request's span id (16 lowercase hex)
-- units: time_ms milliseconds after the origin, on the perspective's own clock.
WITH origin AS (
    SELECT min(coalesce(client_start_ns, s_ns)) AS origin_ns
    FROM request_facts
    WHERE trace_id = $trace_id AND request_span_id = $request_span_id
)
SELECT c.perspective, c.chunk_index, (c.time_ns - o.origin_ns) / 1e6 AS time_ms, c.chunk_tokens
FROM request_chunks c, origin o
WHERE c.trace_id = $trace_id AND c.request_span_id = $request_span_id
ORDER BY c.perspective, c.chunk_index;
