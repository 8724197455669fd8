-- over: tt_candidate_chunks ORDER BY candidate_key, chunk_index, time_ns
-- returns: the rows of view tt_request_gap_rows whose request_key is in $request_key_from ..
--   $request_key_to, in one ordered pass over the kept chunk table instead of the window of
--   view tt_candidate_gaps (analyzer/db/views/keep.py runs it while keeping request_gap_rows).
--   Valid only over the table kept in the order of the line above, read with DuckDB's
--   preserve_insertion_order on: a single table's scan, its WHERE and a window with an empty
--   OVER () keep that order (duckdb.org/docs/stable/sql/dialect/order_preservation), so
--   row_number() numbers each candidate's chunks consecutively and lag() is the previous chunk.
--   A candidate's first chunk is its row number first_rn (a prefix sum of the chunk counts);
--   gap_index = rn - first_rn. The chunk range $candidate_from .. $candidate_to must hold every
--   candidate of the request range (each candidate's chunks are then all read).
-- param: $request_key_from BIGINT -- first request_key of the range
-- param: $request_key_to BIGINT -- last request_key of the range
-- param: $candidate_from BIGINT -- lowest perspective_key of the range's requests
-- param: $candidate_to BIGINT -- highest perspective_key of the range's requests
-- units: *_ns nanoseconds since the Unix epoch; chunk_tokens tokens.
WITH chunks AS (
    SELECT candidate_key, chunk_index, time_ns, chunk_tokens,
           row_number() OVER () AS rn,
           lag(time_ns) OVER () AS prev_time_ns
    FROM tt_cached_tt_candidate_chunks
    WHERE candidate_key BETWEEN $candidate_from AND $candidate_to
),
firsts AS (
    SELECT c.candidate_key, sum(c.n) OVER (ORDER BY c.candidate_key) - c.n + 1 AS first_rn
    FROM (SELECT candidate_key, count(*) AS n
          FROM tt_cached_tt_candidate_chunks
          WHERE candidate_key BETWEEN $candidate_from AND $candidate_to
          GROUP BY candidate_key) c
),
requests AS (
    SELECT k.request_key, k.perspective_key, k.events_dropped, f.first_rn
    FROM tt_request_keys k
    JOIN firsts f ON f.candidate_key = k.perspective_key
    WHERE k.request_key BETWEEN $request_key_from AND $request_key_to
)
SELECT r.request_key, c.rn - r.first_rn AS gap_index, c.chunk_index, c.prev_time_ns, c.time_ns,
       c.chunk_tokens, r.events_dropped
FROM chunks c
JOIN requests r ON r.perspective_key = c.candidate_key
WHERE c.rn > r.first_rn
