-- returns: one row per request and perspective (client | server | engine): the request's
--   timestamps s/f/e, token counts, finish reason, status, TTFT, E2E, TPOT, the decode-only
--   and whole-request output rates, and its KV figures. Metrics that cannot be computed are
--   NULL and null_reason says why (never 0). Formulas: docs/metrics.md.
-- param: $perspective VARCHAR default NULL -- client, server or engine; NULL = every perspective
-- param: $trace_id VARCHAR default NULL -- only requests of this trace (32 lowercase hex); NULL = all
-- units: *_ns nanoseconds since the Unix epoch on the perspective's clock; *_ms milliseconds;
--   *_per_second output tokens per second; *_bytes bytes; *_mib MiB (2^20 bytes).
SELECT
    source,
    perspective,
    trace_id,
    request_span_id,
    clock_domain,
    s_ns,
    f_ns,
    e_ns,
    input_tokens,
    output_tokens,
    generated_tokens,
    finish_reason,
    status_code,
    (f_ns - s_ns) / 1e6 AS ttft_ms,
    (e_ns - s_ns) / 1e6 AS e2e_ms,
    CASE WHEN output_tokens > 1
         THEN ((e_ns - s_ns) - (f_ns - s_ns)) / 1e6 / (output_tokens - 1) END AS tpot_ms,
    CASE WHEN output_tokens > 1 AND e_ns > f_ns
         THEN (output_tokens - 1) / ((e_ns - f_ns) / 1e9) END AS decode_output_tokens_per_second,
    CASE WHEN e_ns > s_ns
         THEN output_tokens / ((e_ns - s_ns) / 1e9) END AS whole_request_output_tokens_per_second,
    kv_bytes_per_token,
    prompt_kv_bytes,
    prompt_kv_bytes / 1048576.0 AS prompt_kv_mib,
    stop_kv_bytes,
    stop_kv_bytes / 1048576.0 AS stop_kv_mib,
    synthetic,
    CASE
        WHEN null_reason IS NOT NULL THEN null_reason
        WHEN output_tokens IS NULL THEN 'output token count unknown'
        WHEN output_tokens <= 1 THEN 'tpot_ms and decode rate need more than one output token'
        WHEN e_ns = f_ns THEN 'decode rate needs e > f'
    END AS null_reason
FROM request_facts
WHERE ($perspective IS NULL OR perspective = $perspective)
  AND ($trace_id IS NULL OR trace_id = $trace_id)
ORDER BY s_ns, trace_id, request_span_id, perspective;
