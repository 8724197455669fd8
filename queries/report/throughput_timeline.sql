-- returns: output tokens per time bucket over the whole run (visible chunk tokens of every
--   request, each counted once from its best perspective: client > server > engine), and
--   requests completed per bucket, for a throughput-over-time plot.
-- param: $bucket_s DOUBLE default 1.0 -- bucket width in seconds
-- units: bucket_start_s seconds after the earliest chunk; output_tokens_per_s tokens per
--   second within the bucket (tokens / bucket_s); completed_rps requests per second. The
--   last bucket is usually partial (the run ends inside it), so its rates understate the
--   real rate; a bucket width of 0 or less gives NULL rates.
WITH best AS (
    SELECT trace_id, request_span_id, perspective, end_ns
    FROM (
        SELECT trace_id, request_span_id, perspective, end_ns,
               row_number() OVER (
                   PARTITION BY trace_id, request_span_id
                   ORDER BY CASE perspective WHEN 'client' THEN 0 WHEN 'server' THEN 1 ELSE 2 END
               ) AS rank_in_request
        FROM request_facts
    ) ranked
    WHERE rank_in_request = 1
),
chunks AS (
    SELECT c.time_ns, c.chunk_tokens
    FROM request_chunks c
    JOIN best b ON b.trace_id = c.trace_id AND b.request_span_id = c.request_span_id
               AND b.perspective = c.perspective
),
origin AS (SELECT min(time_ns) AS t0 FROM chunks),
token_buckets AS (
    SELECT floor((time_ns - o.t0) / 1e9 / nullif($bucket_s, 0)) AS bucket, sum(chunk_tokens) AS tokens
    FROM chunks, origin o
    GROUP BY 1
),
completion_buckets AS (
    SELECT floor((b.end_ns - o.t0) / 1e9 / nullif($bucket_s, 0)) AS bucket, count(*) AS completed
    FROM best b, origin o
    GROUP BY 1
)
SELECT
    coalesce(t.bucket, c.bucket) * $bucket_s AS bucket_start_s,
    CASE WHEN $bucket_s > 0 THEN coalesce(t.tokens, 0) / $bucket_s END AS output_tokens_per_s,
    CASE WHEN $bucket_s > 0 THEN coalesce(c.completed, 0) / $bucket_s END AS completed_rps
FROM token_buckets t
FULL OUTER JOIN completion_buckets c ON c.bucket = t.bucket
ORDER BY bucket_start_s;
