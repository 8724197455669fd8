-- returns: one row per AIPerf request that has both AIPerf's output sequence length OSL (the
--   output tokens AIPerf counts by re-tokenizing the streamed text, reasoning included) and
--   the server's count of its output tokens O (the usage the server returned, or the traced
--   request's count), loaded as aiperf_osl_server(record_index, request_id, ttft_ms,
--   request_latency_ms, inter_token_latency_ms, osl, server_tokens); for summary totals,
--   one row of total_osl and the server's total, timings NULL. Beside each: how far the
--   figures AIPerf builds on OSL are from the same definitions with O, as AIPerf 0.13 defines
--   them (aiperf/metrics/types): ITL = (request_latency - TTFT) / (OSL - 1), so
--   itl_bias = ITL(OSL) / ITL(O) - 1 = (O - 1) / (OSL - 1) - 1; the per-user rate = 1 / ITL,
--   so per_user_rate_bias = (OSL - 1) / (O - 1) - 1; output_token_throughput = total_osl /
--   window, so output_throughput_bias = sum(OSL) / sum(O) - 1 over the rows. A bias is
--   NULL where OSL or O is 1 or less (no ITL). mean_itl_ms_aiperf is the mean of AIPerf's
--   ITLs (the record's own figure, else its definition) over the rows where both ITLs
--   exist, mean_itl_ms_server the mean of (latency - TTFT) / (O - 1) over the same rows,
--   mean_itl_bias = their ratio - 1 (the bias of AIPerf's published mean ITL).
-- units: *_ms milliseconds; token counts tokens; *_bias a signed fraction (0.016 = 1.6 % too high).
WITH r AS (
    SELECT
        record_index,
        request_id,
        osl,
        server_tokens,
        CASE WHEN osl > 1 THEN coalesce(inter_token_latency_ms, (request_latency_ms - ttft_ms) / (osl - 1)) END
            AS itl_ms_aiperf,
        CASE WHEN server_tokens > 1 THEN (request_latency_ms - ttft_ms) / (server_tokens - 1) END AS itl_ms_server
    FROM aiperf_osl_server
    WHERE osl IS NOT NULL AND server_tokens IS NOT NULL
)
SELECT
    record_index,
    request_id,
    osl,
    server_tokens,
    osl - server_tokens AS osl_minus_server,
    CASE WHEN osl > 1 AND server_tokens > 1 THEN (server_tokens - 1) / (osl - 1) - 1 END AS itl_bias,
    CASE WHEN osl > 1 AND server_tokens > 1 THEN (osl - 1) / (server_tokens - 1) - 1 END AS per_user_rate_bias,
    itl_ms_aiperf,
    itl_ms_server,
    sum(osl) OVER () AS total_osl,
    sum(server_tokens) OVER () AS total_server_tokens,
    CASE WHEN sum(server_tokens) OVER () > 0 THEN sum(osl) OVER () / sum(server_tokens) OVER () - 1 END
        AS output_throughput_bias,
    avg(CASE WHEN itl_ms_server IS NOT NULL THEN itl_ms_aiperf END) OVER () AS mean_itl_ms_aiperf,
    avg(CASE WHEN itl_ms_aiperf IS NOT NULL THEN itl_ms_server END) OVER () AS mean_itl_ms_server,
    avg(CASE WHEN itl_ms_server IS NOT NULL THEN itl_ms_aiperf END) OVER ()
        / avg(CASE WHEN itl_ms_aiperf IS NOT NULL THEN itl_ms_server END) OVER () - 1 AS mean_itl_bias
FROM r
ORDER BY record_index;
