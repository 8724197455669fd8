-- returns: one row: what a request's published figures imply for each other under the
--   definitions of docs/metrics.md, and under the wrong definitions real reports use,
--   so a claim can be matched to the formula that produced it. Correct: e2e_ms = ttft +
--   tpot x (O - 1); tpot_ms = (e2e - ttft) / (O - 1); decode rate = (O - 1) / (e2e - ttft);
--   whole-request rate = O / e2e. Wrong: e2e with O gaps (ttft + tpot x O, "150 gaps");
--   tpot including the first token (e2e / O, LLMPerf's and guidellm's per-token latency);
--   tpot dividing decode time by O; decode rate crediting the first token to decode time
--   (O / (e2e - ttft)). A figure that needs a NULL input is NULL; O <= 1 gives NULL TPOT.
-- param: $ttft_ms DOUBLE default NULL -- claimed TTFT (ms)
-- param: $tpot_ms DOUBLE default NULL -- claimed TPOT (ms per token after the first)
-- param: $e2e_ms DOUBLE default NULL -- claimed E2E (ms)
-- param: $output_tokens BIGINT default NULL -- claimed visible output tokens O
-- units: *_ms milliseconds; *_per_second output tokens per second.
SELECT
    $ttft_ms + $tpot_ms * ($output_tokens - 1) AS e2e_ms,
    $ttft_ms + $tpot_ms * $output_tokens AS e2e_ms_with_o_gaps,
    CASE WHEN $output_tokens > 1 THEN ($e2e_ms - $ttft_ms) / ($output_tokens - 1) END AS tpot_ms,
    CASE WHEN $output_tokens > 0 THEN $e2e_ms / $output_tokens END AS tpot_ms_including_first_token,
    CASE WHEN $output_tokens > 0 THEN ($e2e_ms - $ttft_ms) / $output_tokens END AS tpot_ms_divided_by_o,
    CASE WHEN $output_tokens > 1 AND $e2e_ms > $ttft_ms
         THEN ($output_tokens - 1) / (($e2e_ms - $ttft_ms) / 1000) END AS decode_output_tokens_per_second,
    CASE WHEN $output_tokens > 0 AND $e2e_ms > $ttft_ms
         THEN $output_tokens / (($e2e_ms - $ttft_ms) / 1000) END AS decode_rate_counting_first_token,
    CASE WHEN $e2e_ms > 0 THEN $output_tokens / ($e2e_ms / 1000) END AS whole_request_output_tokens_per_second,
    CASE WHEN $tpot_ms > 0 THEN 1000 / $tpot_ms END AS decode_output_tokens_per_second_from_tpot;
