-- returns: the rows of queries/itl.sql for one request_key range without the request's names:
--   request_key, then itl's per-gap columns, sorted on the two integers (request_key,
--   gap_index) so the sort carries no string. analyzer/query/attach.py puts the names of
--   queries/keep/itl_names.sql back per Arrow batch (a column lookup by request_key, in
--   order): sorting the four name columns was most of itl's time (benchmarks/RESULTS.md).
--   null_reason is computed after the sort (a projection keeps the sorted order).
-- param: $perspective VARCHAR default NULL -- client, server or engine; NULL = every perspective
-- param: $request_key_from BIGINT default NULL -- first request_key of the range
-- param: $request_key_to BIGINT default NULL -- last request_key of the range
-- units: as queries/itl.sql.
SELECT
    g.request_key,
    g.gap_index,
    g.chunk_index,
    g.prev_time_ns,
    g.time_ns,
    g.chunk_tokens,
    g.itl_ms,
    g.itl_per_token_ms,
    CASE
        WHEN g.events_dropped > 0 THEN
            'gap unknown: ' || CAST(g.events_dropped AS VARCHAR)
            || ' events dropped by the span event limit, chunks are missing'
        WHEN g.chunk_tokens = 0 THEN 'itl_per_token_ms needs a chunk with tokens'
    END AS null_reason
FROM (
    SELECT *
    FROM request_gap_times
    WHERE request_key BETWEEN $request_key_from AND $request_key_to
      AND ($perspective IS NULL OR request_key IN (
          SELECT request_key FROM request_keys
          WHERE perspective = $perspective AND request_key BETWEEN $request_key_from AND $request_key_to))
    ORDER BY request_key, gap_index
) g;
