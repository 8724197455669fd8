-- returns: one row per decode step of one request: step k, its duration, the prefix length
--   it attended, the logical KV bytes retained after it, and its device time when measured.
-- param: $trace_id VARCHAR default NULL -- the request's trace (32 lowercase hex)
-- param: $request_span_id VARCHAR default NULL -- the request's span id (16 lowercase hex)
-- units: duration_ms milliseconds (host clock); device_ms milliseconds of accelerator time;
--   kv_bytes bytes; kv_mib MiB (2^20 bytes).
SELECT
    s.attr_int['tokentrace.step'] AS step,
    (s.end_ns - s.start_ns) / 1e6 AS duration_ms,
    s.attr_int['tokentrace.context_tokens'] AS context_tokens,
    s.attr_int['tokentrace.kv.bytes'] AS kv_bytes,
    s.attr_int['tokentrace.kv.bytes'] / 1048576.0 AS kv_mib,
    s.attr_int['tokentrace.device_ns'] / 1e6 AS device_ms
FROM spans s
JOIN (
    SELECT DISTINCT trace_id, server_span_id
    FROM request_facts
    WHERE trace_id = $trace_id AND request_span_id = $request_span_id
) r ON s.trace_id = r.trace_id AND s.parent_span_id = r.server_span_id
WHERE s.scope_name = 'tokentrace' AND s.name = 'decode'
ORDER BY step;
