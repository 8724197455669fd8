-- returns: one row per request of one perspective, the figures `tokentrace compare` resamples
--   (analyzer/compare/): its start s and span end (the run's window is min s .. max end, as
--   window.sql's default bounds), token counts, outcome, TTFT, TPOT, E2E, the whole-request
--   output rate, and meets_slo: succeeded and within every stated SLO, window.sql's rule (a
--   TPOT SLO passes a request whose TPOT is NULL, a TTFT/E2E SLO fails one without that
--   figure). model: the perspective span's gen_ai.response.model, else gen_ai.request.model
--   (NULL when it names neither). Per-request formulas: view request_metrics (docs/metrics.md).
-- param: $perspective VARCHAR default 'client' -- client, server or engine
-- param: $slo_ttft_ms DOUBLE default NULL -- TTFT SLO (ms, <=); NULL = not applied
-- param: $slo_tpot_ms DOUBLE default NULL -- TPOT SLO (ms, <=); NULL = not applied
-- param: $slo_e2e_ms DOUBLE default NULL -- E2E SLO (ms, <=); NULL = not applied
-- units: *_ns nanoseconds since the Unix epoch on the perspective's clock; *_ms milliseconds;
--   whole_request_output_tokens_per_second output tokens per second; *_tokens tokens.
SELECT
    r.trace_id,
    r.request_span_id,
    r.s_ns,
    r.end_ns,
    r.input_tokens,
    r.output_tokens,
    r.outcome,
    r.ttft_ms,
    r.tpot_ms,
    r.e2e_ms,
    r.whole_request_output_tokens_per_second,
    r.outcome = 'succeeded'
      AND ($slo_ttft_ms IS NULL OR coalesce(r.ttft_ms <= $slo_ttft_ms, false))
      AND ($slo_tpot_ms IS NULL OR r.tpot_ms IS NULL OR r.tpot_ms <= $slo_tpot_ms)
      AND ($slo_e2e_ms IS NULL OR coalesce(r.e2e_ms <= $slo_e2e_ms, false)) AS meets_slo,
    coalesce(s.attr_str['gen_ai.response.model'], s.attr_str['gen_ai.request.model']) AS model
FROM request_metrics r
LEFT JOIN spans s ON s.trace_id = r.trace_id AND s.span_id = r.perspective_span_id
WHERE r.perspective = $perspective
ORDER BY r.s_ns, r.trace_id, r.request_span_id;
