-- returns: one row per per-request record of a benchmark report, loaded as
--   audit_records(record_index, match_id, ttft_ms, e2e_ms, tpot_ms, input_tokens,
--   output_tokens, error), beside the traced request it joins: audit_traced holds the rows of
--   queries/requests.sql over the traces, and a record joins the request whose
--   client_request_id (the id the client sent: X-Request-ID, vLLM bench's
--   --request-id-prefix ids) or, failing that, response_id (the id the server returned)
--   equals its match_id; the request's best perspective is used (client, else server, else
--   engine). matches counts the traced requests the id matched (more than one: the id was
--   sent twice). The *_diff_* columns are record minus trace. record_error: the record's
--   error code (NULL: a successful record); trace_outcome: succeeded / failed / cancelled;
--   trace_generated_tokens: G, the generated tokens (a final stop token included).
-- units: *_ms milliseconds; token counts tokens.
WITH ranked AS (
    SELECT *,
           row_number() OVER (
               PARTITION BY trace_id, request_span_id
               ORDER BY CASE perspective WHEN 'client' THEN 0 WHEN 'server' THEN 1 ELSE 2 END, source
           ) AS perspective_rank
    FROM audit_traced
),
ids AS (
    SELECT client_request_id AS id, 'client_request_id' AS id_column, 0 AS id_rank, *
    FROM ranked WHERE perspective_rank = 1 AND client_request_id IS NOT NULL
    UNION ALL
    SELECT response_id, 'response_id', 1, *
    FROM ranked WHERE perspective_rank = 1 AND response_id IS NOT NULL
),
joined AS (
    SELECT r.record_index, r.match_id, r.ttft_ms AS record_ttft_ms, r.e2e_ms AS record_e2e_ms,
           r.tpot_ms AS record_tpot_ms, r.input_tokens AS record_input_tokens,
           r.output_tokens AS record_output_tokens, r.error AS record_error,
           t.id_column, t.trace_id, t.request_span_id, t.perspective, t.source,
           t.ttft_ms AS trace_ttft_ms, t.e2e_ms AS trace_e2e_ms, t.tpot_ms AS trace_tpot_ms,
           t.input_tokens AS trace_input_tokens, t.output_tokens AS trace_output_tokens,
           t.output_tokens_basis, t.outcome AS trace_outcome, t.generated_tokens AS trace_generated_tokens,
           count(t.trace_id) OVER (PARTITION BY r.record_index, t.id_rank) AS matches,
           row_number() OVER (PARTITION BY r.record_index ORDER BY t.id_rank, t.s_ns, t.trace_id) AS pick
    FROM audit_records r
    LEFT JOIN ids t ON t.id = r.match_id
)
SELECT
    record_index,
    match_id,
    record_error,
    trace_outcome,
    id_column,
    matches,
    trace_id,
    request_span_id,
    perspective,
    source,
    output_tokens_basis,
    record_ttft_ms,
    trace_ttft_ms,
    record_ttft_ms - trace_ttft_ms AS ttft_diff_ms,
    record_e2e_ms,
    trace_e2e_ms,
    record_e2e_ms - trace_e2e_ms AS e2e_diff_ms,
    record_tpot_ms,
    trace_tpot_ms,
    record_tpot_ms - trace_tpot_ms AS tpot_diff_ms,
    record_input_tokens,
    trace_input_tokens,
    record_output_tokens,
    trace_output_tokens,
    trace_generated_tokens
FROM joined
WHERE pick = 1
ORDER BY record_index;
