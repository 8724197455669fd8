-- returns: one row per request perspective of one request_key range, in request_key order
--   with no key left out (request_keys numbers them 1, 2, ...): the per-request columns of
--   queries/itl.sql that queries/keep/itl_gaps.sql leaves out, looked up by request_key
--   (row request_key - $request_key_from) and attached to each of its gaps after the sort
--   (analyzer/query/attach.py).
-- param: $request_key_from BIGINT default NULL -- first request_key of the range
-- param: $request_key_to BIGINT default NULL -- last request_key of the range
-- units: none (names).
SELECT request_key, source, perspective, trace_id, request_span_id
FROM request_keys
WHERE request_key BETWEEN $request_key_from AND $request_key_to
ORDER BY request_key;
