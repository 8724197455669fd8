-- returns: one row per gap between consecutive visible chunks of each request perspective
--   (client | server | engine), ordered by chunk index: the later chunk's index, time and
--   token count, the gap per chunk (itl_ms) and per token (itl_per_token_ms = gap / tokens
--   of the later chunk; differs from itl_ms under speculative decoding or per-word flushes).
--   A request with O visible one-token chunks has O - 1 gaps. Gaps of a span that dropped
--   events are NULL with null_reason. Formula: view request_gaps.
-- param: $perspective VARCHAR default NULL -- client, server or engine; NULL = every perspective
-- param: $trace_id VARCHAR default NULL -- only requests of this trace (32 lowercase hex); NULL = all
-- param: $request_span_id VARCHAR default NULL -- only this request (its request_span_id, 16 lowercase hex: --request resolves any id to it); NULL = all
-- param: $request_key_from BIGINT default NULL -- only request_key >= this (view request_keys); NULL = no bound
-- param: $request_key_to BIGINT default NULL -- only request_key <= this; NULL = no bound. The library
--   streams a large result range by range with these two (analyzer.query.runner.stream_query).
-- units: *_ns nanoseconds since the Unix epoch on the perspective's clock; itl_ms and
--   itl_per_token_ms milliseconds; chunk_tokens tokens.
SELECT
    source,
    perspective,
    trace_id,
    request_span_id,
    gap_index,
    chunk_index,
    prev_time_ns,
    time_ns,
    chunk_tokens,
    itl_ms,
    itl_per_token_ms,
    null_reason
FROM request_gaps
WHERE ($perspective IS NULL OR perspective = $perspective)
  AND ($trace_id IS NULL OR trace_id = $trace_id)
  AND ($request_span_id IS NULL OR request_span_id = $request_span_id)
  AND ($request_key_from IS NULL OR request_key >= $request_key_from)
  AND ($request_key_to IS NULL OR request_key <= $request_key_to)
-- request_key numbers (trace_id, request_span_id, perspective) in that order (view request_keys):
-- the same row order as sorting on the three strings, at the cost of one integer.
ORDER BY request_key, gap_index;
