-- returns: one row per (client clock domain, server clock domain) pair: how many requests
--   bound the offset theta = server clock - client clock, and the bounds. Each request gives
--   theta <= server_arrival - client_send and theta >= server_last_send - client_last_receive
--   (view request_clock_offsets: gateway start - client start, gateway end - client end);
--   the intersection over the pair's requests is [offset_min_ms, offset_max_ms] (view
--   clock_pair_offsets). verdict: 'contradiction' when the interval is empty by more than
--   $tolerance_ms (no single offset explains the spans), 'skew_detected' when it excludes 0
--   by more than $tolerance_ms, else 'consistent'. With an assumed offset
--   ($offset_domains / $offset_ms, the CLI's --assume-offset DOMAIN=MS, MS ahead of the
--   client clock), assumed_offset_ms echoes it (server minus client) and
--   assumed_offset_within_bounds says whether the bounds allow it.
-- param: $tolerance_ms DOUBLE default 1.0 -- how far the bounds may exclude 0 (or cross) and still be consistent
-- param: $offset_domains VARCHAR[] default NULL -- domains with an assumed offset (clock_domain or service.name)
-- param: $offset_ms DOUBLE[] default NULL -- their offsets, ms ahead of the client clock (same order)
-- units: *_ms milliseconds (server clock minus client clock); requests a count.
WITH assumed AS (
    SELECT unnest(CAST($offset_domains AS VARCHAR[])) AS domain,
           unnest(CAST($offset_ms AS DOUBLE[])) AS offset_ms
),
pairs AS (
    SELECT
        o.*,
        (SELECT max(a.offset_ms) FROM assumed a
         WHERE a.domain = o.server_domain OR a.domain = split_part(o.server_domain, '|', 1)) AS server_assumed_ms,
        (SELECT max(a.offset_ms) FROM assumed a
         WHERE a.domain = o.client_domain OR a.domain = split_part(o.client_domain, '|', 1)) AS client_assumed_ms
    FROM clock_pair_offsets o
),
judged AS (
    SELECT
        p.*,
        CASE
            WHEN p.offset_min_ms > p.offset_max_ms + $tolerance_ms THEN 'contradiction'
            WHEN p.offset_min_ms > $tolerance_ms OR p.offset_max_ms < -$tolerance_ms THEN 'skew_detected'
            ELSE 'consistent'
        END AS verdict,
        CASE WHEN p.server_assumed_ms IS NOT NULL OR p.client_assumed_ms IS NOT NULL
             THEN coalesce(p.server_assumed_ms, 0) - coalesce(p.client_assumed_ms, 0) END AS assumed_offset_ms
    FROM pairs p
)
SELECT
    client_domain,
    server_domain,
    requests,
    offset_min_ms,
    offset_max_ms,
    verdict,
    $tolerance_ms AS tolerance_ms,
    assumed_offset_ms,
    CASE WHEN assumed_offset_ms IS NOT NULL
         THEN assumed_offset_ms >= offset_min_ms - $tolerance_ms AND assumed_offset_ms <= offset_max_ms + $tolerance_ms
    END AS assumed_offset_within_bounds
FROM judged
ORDER BY client_domain, server_domain;
