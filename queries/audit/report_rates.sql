-- returns: one row: the throughputs a report's totals imply over its own window, and the
--   window its first-send / last-response timestamps imply. request_throughput = requests /
--   duration_s; output_token_throughput = output_tokens / duration_s (the tokens the report
--   counts: AIPerf's total_osl includes reasoning tokens); visible_output_token_throughput =
--   visible_output_tokens / duration_s; total_token_throughput = (input + output tokens) /
--   duration_s; reasoning_share = reasoning_tokens / output_tokens (NULL unless output_tokens
--   > 0); duration_from_timestamps_s = (last_response_ns - first_request_ns) / 1e9.
-- param: $duration_s DOUBLE default NULL -- the report's benchmark duration (s)
-- param: $requests DOUBLE default NULL -- successful requests counted
-- param: $output_tokens DOUBLE default NULL -- output tokens counted (visible + reasoning)
-- param: $visible_output_tokens DOUBLE default NULL -- visible output tokens only
-- param: $input_tokens DOUBLE default NULL -- input tokens counted
-- param: $reasoning_tokens DOUBLE default NULL -- reasoning tokens among output_tokens
-- param: $first_request_ns DOUBLE default NULL -- first request send time (ns since epoch)
-- param: $last_response_ns DOUBLE default NULL -- last response time (ns since epoch)
-- units: *_throughput per second (requests/s or tokens/s); *_s seconds; reasoning_share a fraction.
SELECT
    CASE WHEN $duration_s > 0 THEN $requests / $duration_s END AS request_throughput,
    CASE WHEN $duration_s > 0 THEN $output_tokens / $duration_s END AS output_token_throughput,
    CASE WHEN $duration_s > 0 THEN $visible_output_tokens / $duration_s END AS visible_output_token_throughput,
    CASE WHEN $duration_s > 0 THEN ($input_tokens + $output_tokens) / $duration_s END AS total_token_throughput,
    CASE WHEN $output_tokens > 0 THEN $reasoning_tokens / $output_tokens END AS reasoning_share,
    ($last_response_ns - $first_request_ns) / 1e9 AS duration_from_timestamps_s;
