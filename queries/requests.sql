-- returns: one row per request and perspective (client | server | engine): the request's
--   timestamps s/f/e, token counts, finish reason, status and outcome, TTFT, E2E, TPOT, the
--   decode-only and whole-request output rates, and its KV figures, each on the
--   perspective's own clock (never mixed). Metrics that cannot be computed are NULL and
--   null_reason says why (never 0); every reason that applies, joined by '; '.
--   output_tokens_basis names the attribute (or rule) output_tokens was read from.
--   response_id = the id the server returned (gen_ai.response.id; vLLM / SGLang:
--   gen_ai.request.id) and client_request_id = the id the client sent (the gateway's
--   tokentrace.client_request_id = X-Request-ID; vLLM: its request id less 'chatcmpl-'):
--   what joins a benchmark's per-request records to the traces (tokentrace audit --db);
--   request_id_note says where they came from, or why one is NULL. sampling_reason: a keep
--   policy's decision (head: the random sample; a rule: ttft, gap, tpot, e2e, slowest, error,
--   preempted; summary: not kept whole, its figures from the span's attributes); NULL: no policy. Formulas: view request_metrics (queries/views/
--   90_request_metrics.sql) and docs/metrics.md.
-- param: $perspective VARCHAR default NULL -- client, server or engine; NULL = every perspective
-- param: $trace_id VARCHAR default NULL -- only requests of this trace (32 lowercase hex); NULL = all
-- units: *_ns nanoseconds since the Unix epoch on the perspective's clock; *_ms milliseconds;
--   *_per_second output tokens per second; *_bytes bytes; *_mib MiB (2^20 bytes);
--   cached_tokens prompt tokens served from a prefix cache (NULL: the source reports none).
--   physical_kv_bytes: the paged KV blocks the request held at its end x bytes per block
--   (the engine's figure; prompt_kv / stop_kv are the logical formula). kv_null_reason says
--   why a KV figure is NULL.
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
    ttft_ms,
    e2e_ms,
    tpot_ms,
    decode_output_tokens_per_second,
    whole_request_output_tokens_per_second,
    kv_bytes_per_token,
    prompt_kv_bytes,
    prompt_kv_mib,
    stop_kv_bytes,
    stop_kv_mib,
    cached_tokens,
    physical_kv_bytes,
    physical_kv_mib,
    kv_null_reason,
    synthetic,
    outcome,
    output_tokens_basis,
    response_id,
    client_request_id,
    request_id_note,
    sampling_reason,
    null_reason
FROM request_metrics
WHERE ($perspective IS NULL OR perspective = $perspective)
  AND ($trace_id IS NULL OR trace_id = $trace_id)
ORDER BY s_ns, trace_id, request_span_id, perspective;
