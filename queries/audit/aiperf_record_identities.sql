-- returns: one row per successful AIPerf profile_export.jsonl record, loaded as
--   aiperf_records(record_index, error_code, ttft_ms, request_latency_ms,
--   output_sequence_length, output_token_count, reasoning_token_count, inter_token_latency_ms,
--   output_token_throughput_per_user, ttst_ms, chunk_gaps, chunk_gap_sum_ms, first_chunk_gap_ms,
--   request_start_ns, response_end_ns, request_end_ns): the record's figures beside what
--   AIPerf's definitions give from its other fields: ITL = (latency - TTFT) / (OSL - 1) over
--   ALL output tokens (reasoning included); per-user rate = 1000 / ITL; latency = TTFT + sum
--   of inter-chunk gaps = (last response - request start) (response_end_ns: the 2025-10
--   layout's max_response_timestamp; 0.13 writes none); OSL = visible + reasoning tokens;
--   TTST = the first inter-chunk gap. 0.13's metadata.request_end_ns is when the request
--   ended (the last response read, the connection done): request_span_ms = request_end_ns -
--   request_start_ns, never shorter than the latency (the request ends at or after its last
--   response); request_tail_ms = request_span_ms - latency.
-- units: *_ms milliseconds; *_per_user tokens per second; token counts tokens.
SELECT
    record_index,
    inter_token_latency_ms,
    CASE WHEN output_sequence_length > 1
         THEN (request_latency_ms - ttft_ms) / (output_sequence_length - 1) END AS itl_ms_expected,
    output_token_throughput_per_user,
    CASE WHEN inter_token_latency_ms > 0 THEN 1000 / inter_token_latency_ms END AS per_user_expected,
    request_latency_ms,
    ttft_ms + chunk_gap_sum_ms AS latency_ms_from_chunks,
    (response_end_ns - request_start_ns) / 1e6 AS latency_ms_from_timestamps,
    (request_end_ns - request_start_ns) / 1e6 AS request_span_ms,
    (request_end_ns - request_start_ns) / 1e6 - request_latency_ms AS request_tail_ms,
    output_sequence_length,
    coalesce(output_token_count, 0) + coalesce(reasoning_token_count, 0) AS osl_expected,
    ttst_ms,
    first_chunk_gap_ms,
    reasoning_token_count
FROM aiperf_records
WHERE error_code IS NULL
ORDER BY record_index;
