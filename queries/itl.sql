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
--   response_id: the id the client got (gen_ai.response.id, chatcmpl-...), the request's in
--   every perspective (as in requests.sql); NULL when no span of the request carries one.
--   sampling_reason: a keep policy's decision on the request (head: the random sample; a rule
--   that kept it whole: slow by selection, leave it out of a distribution), as in requests.sql.
-- units: *_ns nanoseconds since the Unix epoch on the perspective's clock; itl_ms and
--   itl_per_token_ms milliseconds; chunk_tokens tokens.
WITH response_ids AS (
    -- one row per request perspective of this range, by its integer key: the gaps take their
    -- response_id by request_key, so the per-gap join and sort stay on integers
    SELECT k.request_key, max(m.response_id) AS response_id, max(m.sampling_reason) AS sampling_reason
    FROM request_keys k
    JOIN request_metrics m ON m.trace_id = k.trace_id AND m.request_span_id = k.request_span_id
    WHERE ($request_key_from IS NULL OR k.request_key >= $request_key_from)
      AND ($request_key_to IS NULL OR k.request_key <= $request_key_to)
    GROUP BY k.request_key
)
SELECT
    g.source,
    g.perspective,
    g.trace_id,
    g.request_span_id,
    r.response_id,
    g.gap_index,
    g.chunk_index,
    g.prev_time_ns,
    g.time_ns,
    g.chunk_tokens,
    g.itl_ms,
    g.itl_per_token_ms,
    r.sampling_reason,
    g.null_reason
FROM request_gaps g
LEFT JOIN response_ids r ON r.request_key = g.request_key
WHERE ($perspective IS NULL OR g.perspective = $perspective)
  AND ($trace_id IS NULL OR g.trace_id = $trace_id)
  AND ($request_span_id IS NULL OR g.request_span_id = $request_span_id)
  AND ($request_key_from IS NULL OR g.request_key >= $request_key_from)
  AND ($request_key_to IS NULL OR g.request_key <= $request_key_to)
-- request_key numbers (trace_id, request_span_id, perspective) in that order (view request_keys):
-- the same row order as sorting on the three strings, at the cost of one integer.
ORDER BY g.request_key, g.gap_index;
