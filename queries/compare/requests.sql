-- returns: one row per request of one perspective, the figures `tokentrace compare` resamples
--   (analyzer/compare/): its start s and span end (the run's window is min s .. max end, as
--   window.sql's default bounds), token counts, outcome, TTFT, TPOT, E2E, the whole-request
--   output rate, and meets_slo: succeeded and within every stated SLO, window.sql's rule (a
--   TPOT SLO passes a request whose TPOT is NULL, a TTFT/E2E SLO fails one without that
--   figure). Per-request formulas: view request_metrics (docs/metrics.md).
-- param: $perspective VARCHAR default 'client' -- client, server or engine
-- param: $slo_ttft_ms DOUBLE default NULL -- TTFT SLO (ms, <=); NULL = not applied
-- param: $slo_tpot_ms DOUBLE default NULL -- TPOT SLO (ms, <=); NULL = not applied
-- param: $slo_e2e_ms DOUBLE default NULL -- E2E SLO (ms, <=); NULL = not applied
-- units: *_ns nanoseconds since the Unix epoch on the perspective's clock; *_ms milliseconds;
--   whole_request_output_tokens_per_second output tokens per second; *_tokens tokens.
SELECT
    trace_id,
    request_span_id,
    s_ns,
    end_ns,
    input_tokens,
    output_tokens,
    outcome,
    ttft_ms,
    tpot_ms,
    e2e_ms,
    whole_request_output_tokens_per_second,
    outcome = 'succeeded'
      AND ($slo_ttft_ms IS NULL OR coalesce(ttft_ms <= $slo_ttft_ms, false))
      AND ($slo_tpot_ms IS NULL OR tpot_ms IS NULL OR tpot_ms <= $slo_tpot_ms)
      AND ($slo_e2e_ms IS NULL OR coalesce(e2e_ms <= $slo_e2e_ms, false)) AS meets_slo
FROM request_metrics
WHERE perspective = $perspective
ORDER BY s_ns, trace_id, request_span_id;
