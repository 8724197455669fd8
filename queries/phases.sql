-- returns: one row per request with a gateway span: its client TTFT decomposed into
--   network_in (gateway.start - s), gateway_overhead (tokenize.start - gateway.start),
--   tokenize, queue, prefill, first_emit (f_server - prefill.end) and network_out
--   (f_client - f_server). The parts plus residual_ms sum to the client TTFT; residual_ms
--   (the server-side time no phase span covers) and network_round_trip_ms (network_in +
--   network_out = client TTFT - server TTFT) are differences on one clock each, so they
--   never depend on clock skew. network_in_ms / network_out_ms subtract a server time from a
--   client time: they are NULL with cross_clock_reason unless the (client domain, server
--   domain) pair's offset bounds (view clock_pair_offsets) are consistent with 0 within
--   $tolerance_ms, or an offset was assumed ($offset_domains / $offset_ms, the CLI's
--   --assume-offset DOMAIN=MS: DOMAIN's clock runs MS ahead of the client's, its timestamps
--   are shifted by -MS). assumed_offset_ms echoes the offset used (server minus client).
--   The client span is tokentrace's own CLIENT span, else the request's client perspective
--   from another instrumentation (openai-v2, OpenLLMetry: in the trace, or paired across
--   traces by response id / X-Request-ID, docs/adapters.md): each part it supports is given
--   (openai-v2 writes no chunk events: network_in only; client TTFT and network_out NULL
--   with the reason; a non-streamed response's f is the client span's end).
-- param: $trace_id VARCHAR default NULL -- only requests of this trace (32 lowercase hex); NULL = all
-- param: $tolerance_ms DOUBLE default 1.0 -- how far offset bounds may exclude 0 and still be consistent
-- param: $offset_domains VARCHAR[] default NULL -- domains with an assumed offset (clock_domain or service.name)
-- param: $offset_ms DOUBLE[] default NULL -- their offsets, ms ahead of the client clock (same order)
--   response_id / client_request_id: the ids that name the request outside the traces (as
--   in requests: the id the server returned, the X-Request-ID the client sent).
-- units: *_ms milliseconds; offsets in ms (server clock minus client clock).
WITH assumed AS (
    SELECT unnest(CAST($offset_domains AS VARCHAR[])) AS domain,
           unnest(CAST($offset_ms AS DOUBLE[])) AS offset_ms
),
-- the client perspective of each request whose server row names no client span of its own:
-- another instrumentation's client span (openai-v2, OpenLLMetry, ...: 23_genai_client.sql),
-- joined by trace or paired across traces; one per request
other_client AS (
    SELECT trace_id, request_span_id, client_span_id, client_clock_domain, client_start_ns,
           client_first_chunk_ns, null_reason,
           row_number() OVER (PARTITION BY trace_id, request_span_id ORDER BY client_span_id) AS pick
    FROM request_facts
    WHERE perspective = 'client' AND source <> 'tokentrace' AND ($trace_id IS NULL OR trace_id = $trace_id)
),
joined AS (
    SELECT
        f.trace_id, f.request_span_id, f.response_id, f.client_request_id,
        f.server_clock_domain, f.server_start_ns, f.server_first_chunk_ns,
        f.tokenize_start_ns, f.tokenize_end_ns, f.queue_start_ns, f.queue_end_ns,
        f.prefill_start_ns, f.prefill_end_ns,
        coalesce(f.client_span_id, c.client_span_id) AS client_span_id,
        CASE WHEN f.client_span_id IS NOT NULL THEN f.client_clock_domain ELSE c.client_clock_domain END
            AS client_clock_domain,
        CASE WHEN f.client_span_id IS NOT NULL THEN f.client_start_ns ELSE c.client_start_ns END AS client_start_ns,
        CASE WHEN f.client_span_id IS NOT NULL THEN f.client_first_chunk_ns ELSE c.client_first_chunk_ns END
            AS client_first_chunk_ns,
        f.null_reason,
        CASE WHEN f.client_span_id IS NULL THEN c.null_reason END AS client_null_reason
    FROM request_facts f
    LEFT JOIN other_client c
      ON c.trace_id = f.trace_id AND c.request_span_id = f.request_span_id AND c.pick = 1
    WHERE f.perspective = 'server' AND ($trace_id IS NULL OR f.trace_id = $trace_id)
),
req AS (
    SELECT
        f.*,
        (SELECT max(a.offset_ms) FROM assumed a
         WHERE a.domain = f.server_clock_domain OR a.domain = split_part(f.server_clock_domain, '|', 1)) AS server_assumed_ms,
        (SELECT max(a.offset_ms) FROM assumed a
         WHERE a.domain = f.client_clock_domain OR a.domain = split_part(f.client_clock_domain, '|', 1)) AS client_assumed_ms
    FROM joined f
),
checked AS (
    SELECT
        r.*,
        o.offset_min_ms,
        o.offset_max_ms,
        CASE
            WHEN r.client_span_id IS NULL THEN NULL
            WHEN o.offset_min_ms > o.offset_max_ms + $tolerance_ms THEN 'contradiction'
            WHEN o.offset_min_ms > $tolerance_ms OR o.offset_max_ms < -$tolerance_ms THEN 'skew_detected'
            ELSE 'consistent'
        END AS clock_pair_verdict,
        CASE
            WHEN r.client_span_id IS NOT NULL
                 AND (r.server_assumed_ms IS NOT NULL OR r.client_assumed_ms IS NOT NULL)
            THEN coalesce(r.server_assumed_ms, 0) - coalesce(r.client_assumed_ms, 0)
        END AS assumed_offset_ms
    FROM req r
    LEFT JOIN clock_pair_offsets o
      ON o.client_domain = r.client_clock_domain AND o.server_domain = r.server_clock_domain
),
cross_ok AS (
    SELECT
        c.*,
        CASE
            WHEN c.client_span_id IS NULL THEN NULL
            WHEN c.assumed_offset_ms IS NOT NULL THEN c.assumed_offset_ms
            WHEN c.clock_pair_verdict = 'consistent' THEN 0.0
        END AS offset_used_ms,
        CASE
            WHEN c.client_span_id IS NULL THEN 'no client span: network parts and client TTFT unknown'
            WHEN c.assumed_offset_ms IS NOT NULL THEN NULL
            WHEN c.clock_pair_verdict <> 'consistent' THEN
                'clock pair ' || c.clock_pair_verdict || ' (offset bounds '
                || CAST(round(c.offset_min_ms, 3) AS VARCHAR) || ' .. '
                || CAST(round(c.offset_max_ms, 3) AS VARCHAR)
                || ' ms): cross-clock parts need --assume-offset'
        END AS cross_clock_reason
    FROM checked c
),
parts AS (
    SELECT
        x.*,
        (x.client_first_chunk_ns - x.client_start_ns) / 1e6 AS ttft_ms,
        (x.server_start_ns - x.client_start_ns) / 1e6 - x.offset_used_ms AS network_in_ms,
        (x.tokenize_start_ns - x.server_start_ns) / 1e6 AS gateway_overhead_ms,
        (x.tokenize_end_ns - x.tokenize_start_ns) / 1e6 AS tokenize_ms,
        (x.queue_end_ns - x.queue_start_ns) / 1e6 AS queue_ms,
        (x.prefill_end_ns - x.prefill_start_ns) / 1e6 AS prefill_ms,
        (x.server_first_chunk_ns - x.prefill_end_ns) / 1e6 AS first_emit_ms,
        (x.client_first_chunk_ns - x.server_first_chunk_ns) / 1e6 + x.offset_used_ms AS network_out_ms,
        (x.server_first_chunk_ns - x.server_start_ns) / 1e6 AS server_ttft_ms
    FROM cross_ok x
)
SELECT
    trace_id,
    request_span_id,
    response_id,
    client_request_id,
    client_clock_domain AS client_domain,
    server_clock_domain AS server_domain,
    ttft_ms,
    network_in_ms,
    gateway_overhead_ms,
    tokenize_ms,
    queue_ms,
    prefill_ms,
    first_emit_ms,
    network_out_ms,
    ttft_ms - server_ttft_ms AS network_round_trip_ms,
    server_ttft_ms - (gateway_overhead_ms + tokenize_ms + queue_ms + prefill_ms + first_emit_ms) AS residual_ms,
    clock_pair_verdict,
    assumed_offset_ms,
    cross_clock_reason,
    CASE
        WHEN server_first_chunk_ns IS NULL THEN coalesce(null_reason, 'first visible chunk unknown')
        WHEN client_span_id IS NOT NULL AND client_first_chunk_ns IS NULL AND client_null_reason IS NOT NULL
            THEN 'client TTFT and network_out unknown (network_in is from the client span''s start): '
                 || client_null_reason
        WHEN client_span_id IS NOT NULL AND client_first_chunk_ns IS NULL
            THEN coalesce(null_reason, 'first visible chunk unknown')
        WHEN tokenize_start_ns IS NULL OR queue_start_ns IS NULL OR prefill_start_ns IS NULL
            THEN 'a phase span (tokenize, queue or prefill) is missing'
    END AS null_reason
FROM parts
ORDER BY server_start_ns, trace_id, request_span_id;
