-- returns: one row per request perspective of one request_key range, in request_key order
--   with no key left out (request_keys numbers them 1, 2, ...): the per-request columns of
--   queries/itl.sql that queries/keep/itl_gaps.sql leaves out (names, response_id, sampling_reason), looked up by request_key
--   (row request_key - $request_key_from) and attached to each of its gaps after the sort
--   (analyzer/query/attach.py).
-- param: $request_key_from BIGINT default NULL -- first request_key of the range
-- param: $request_key_to BIGINT default NULL -- last request_key of the range
-- units: none (names).
WITH ids AS (
    -- the response id and the keep policy's decision, as queries/itl.sql takes them
    SELECT k.request_key, max(m.response_id) AS response_id, max(m.sampling_reason) AS sampling_reason
    FROM request_keys k
    JOIN request_metrics m ON m.trace_id = k.trace_id AND m.request_span_id = k.request_span_id
    WHERE k.request_key BETWEEN $request_key_from AND $request_key_to
    GROUP BY k.request_key
)
SELECT k.request_key, k.source, k.perspective, k.trace_id, k.request_span_id, i.response_id, i.sampling_reason
FROM request_keys k
LEFT JOIN ids i ON i.request_key = k.request_key
WHERE k.request_key BETWEEN $request_key_from AND $request_key_to
ORDER BY k.request_key;
