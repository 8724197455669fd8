-- install: after request_facts
-- Derived views over request_facts / request_chunks (every adapter): each per-request and
-- per-gap formula of docs/metrics.md is written here once, and the metric queries
-- (requests, itl, summary, window, phases, skew_offsets) select from these views.

-- One row per request and perspective: the formulas of docs/metrics.md, on the perspective's own clock.
-- TTFT = f - s; E2E = e - s; TPOT = (E2E - TTFT) / (O - 1), NULL when O <= 1;
-- decode-only rate = (O - 1) / (E2E - TTFT); whole-request rate = O / E2E.
-- TPOT and the decode rate are NULL when e <= f: the output arrived in one write (a
-- non-streamed body, f = e), which carries no per-token timing; 0 ms would enter summary.
-- A client TTFT below the server TTFT of the same request (both durations, each on its own
-- clock: the client's span encloses the server's, so no clock offset explains it) means the
-- client's s or f is not what it should be (f read at a role-only chunk, a span started late,
-- a clock ran at another rate): ttft_ms is NULL with that finding in null_reason, never a figure.
-- When the client span still lasts at least as long as the server span, its s is not late:
-- f is early, and TPOT / the decode rate (which use e - f) are NULL too, with that reason;
-- otherwise (a late s) they stand, e - f being untouched by s.
CREATE OR REPLACE VIEW request_metrics AS
SELECT
    source,
    perspective,
    trace_id,
    request_span_id,
    perspective_span_id,
    server_span_id,
    client_span_id,
    clock_domain,
    server_clock_domain,
    client_clock_domain,
    s_ns,
    f_ns,
    e_ns,
    end_ns,
    input_tokens,
    cached_tokens,  -- prompt tokens served from a prefix cache; NULL: the source reports none
    -- the one rule for prefix-cache figures (summary, window): the request reports cached
    -- tokens and has input tokens to share them with
    cached_tokens IS NOT NULL AND coalesce(input_tokens, 0) > 0 AS cache_reporting,
    output_tokens,
    generated_tokens,
    visible_chunks,
    finish_reason,
    status_code,
    error_type,
    CASE
        WHEN finish_reason = 'cancelled' THEN 'cancelled'
        WHEN finish_reason = 'error' OR status_code = 'ERROR' OR server_status_code = 'ERROR' THEN 'failed'
        ELSE 'succeeded'
    END AS outcome,
    CASE WHEN NOT f_below_server THEN (f_ns - s_ns) / 1e6 END AS ttft_ms,
    (e_ns - s_ns) / 1e6 AS e2e_ms,
    CASE WHEN output_tokens > 1 AND e_ns > f_ns AND NOT f_early
         THEN ((e_ns - s_ns) - (f_ns - s_ns)) / 1e6 / (output_tokens - 1) END AS tpot_ms,
    CASE WHEN output_tokens > 1 AND e_ns > f_ns AND NOT f_early
         THEN (output_tokens - 1) / ((e_ns - f_ns) / 1e9) END AS decode_output_tokens_per_second,
    CASE WHEN e_ns > s_ns
         THEN output_tokens / ((e_ns - s_ns) / 1e9) END AS whole_request_output_tokens_per_second,
    kv_bytes_per_token,
    prompt_kv_bytes,
    prompt_kv_bytes / 1048576.0 AS prompt_kv_mib,
    -- KV after the last decode step; with one generated token there is no decode step and
    -- the cache holds the prompt only (I + O - 1 = I).
    coalesce(stop_kv_bytes, CASE WHEN decode_spans = 0 AND generated_tokens = 1 THEN prompt_kv_bytes END)
        AS stop_kv_bytes,
    coalesce(stop_kv_bytes, CASE WHEN decode_spans = 0 AND generated_tokens = 1 THEN prompt_kv_bytes END)
        / 1048576.0 AS stop_kv_mib,
    physical_kv_bytes,
    physical_kv_bytes / 1048576.0 AS physical_kv_mib,
    -- why a KV figure above is NULL (every reason that applies, joined by '; '); NULL: none is
    nullif(concat_ws('; ',
        CASE WHEN kv_bytes_per_token IS NULL
             THEN 'prompt and stop KV unknown: the spans carry no KV bytes per token (' || source
                  || ' writes no KV layout)'
             WHEN input_tokens IS NULL THEN 'prompt and stop KV unknown: input token count unknown' END,
        CASE WHEN kv_bytes_per_token IS NOT NULL AND input_tokens IS NOT NULL
                  AND stop_kv_bytes IS NULL AND NOT (decode_spans = 0 AND generated_tokens = 1) THEN
            CASE WHEN coalesce(generated_tokens, 0) < 1 THEN 'stop KV unknown: no generated token'
                 ELSE 'stop KV unknown: the last decode step has no span (decode_spans every:N, or spans lost)' END
        END,
        CASE WHEN physical_kv_bytes IS NULL
             THEN 'physical KV unknown: no tokentrace.kv.physical_bytes on the spans (written by paged engines: '
                  || 'tokentrace''s continuous engine and its vLLM plugin)' END
    ), '') AS kv_null_reason,
    synthetic,
    response_id,
    client_request_id,
    request_id_note,
    sampling_reason,
    output_tokens_basis,
    -- every reason that applies, joined by '; ' (the adapter's first): a row's NULL metrics
    -- each have theirs here, none hidden behind another; NULL when there is none.
    nullif(concat_ws('; ',
        null_reason,
        CASE WHEN f_below_server THEN
            'skew_suspect: client TTFT ' || CAST(round((f_ns - s_ns) / 1e6, 3) AS VARCHAR)
            || ' ms below the server TTFT ' || CAST(round((server_first_chunk_ns - server_start_ns) / 1e6, 3) AS VARCHAR)
            || ' ms of the same request (impossible: the client span encloses the server span): the client''s '
            || 's is not the send or its f not the first visible output; ttft_ms NULL' END,
        CASE WHEN f_early THEN
            'tpot_ms and decode rate NULL too: the client span lasts at least as long as the server span, so its s '
            || 'is not late and it is f (which they use) that comes too early' END,
        CASE WHEN output_tokens IS NULL THEN 'output token count unknown' END,
        CASE WHEN output_tokens <= 1 THEN 'tpot_ms and decode rate need more than one output token' END,
        CASE WHEN output_tokens > 1 AND e_ns <= f_ns
             THEN 'tpot_ms and decode rate need e > f (the output arrived in one write: no per-token timing)' END,
        CASE WHEN e_ns <= s_ns THEN 'whole-request rate needs e > s' END
    ), '') AS null_reason
FROM (
    SELECT *,
           coalesce(perspective = 'client' AND (f_ns - s_ns) < (server_first_chunk_ns - server_start_ns), false)
               AS f_below_server,
           -- ... and the client span is as long as the server's (it encloses it, as it must): s is
           -- not late, so f is early, and TPOT / the decode rate (e - f) would be too long
           coalesce(perspective = 'client' AND (f_ns - s_ns) < (server_first_chunk_ns - server_start_ns)
                    AND (end_ns - s_ns) >= (server_end_ns - server_start_ns), false) AS f_early
    FROM request_facts
) facts;

-- The ids a person reads, by every span id that names a request: its request_span_id and each
-- perspective's span (the span that holds the decode spans: the plugin's engine_request where
-- vLLM's llm_request is the request's), as analyzer/query/request_ids.py resolves --request.
-- response_id = what the client got; sampling_reason = a keep policy's decision (NULL: none).
-- By span id alone: the plugin's engine_request may sit in a trace of its own, merged with
-- vLLM's by request id. The stalls queries label their rows with it.
CREATE OR REPLACE VIEW request_ids_by_span AS
SELECT span_id, max(response_id) AS response_id, max(sampling_reason) AS sampling_reason
FROM (
    SELECT unnest(span_ids) AS span_id, response_id, sampling_reason
    FROM (SELECT max(response_id) AS response_id, max(sampling_reason) AS sampling_reason,
                 list_distinct(list(perspective_span_id) || [request_span_id]) AS span_ids
          FROM request_metrics
          GROUP BY trace_id, request_span_id)
)
GROUP BY span_id;

-- One integer key per request perspective: request_key numbers the (trace_id,
-- request_span_id, perspective, source) rows of request_facts in that order (1, 2, ...).
-- The per-chunk work (the gap window, itl's ORDER BY, summary's filter) partitions, sorts
-- and joins on this one BIGINT instead of three strings (docs/metrics.md, "Performance").
-- Every adapter's chunk rows belong to a request_facts row (docs/adapters.md).
CREATE OR REPLACE VIEW request_keys AS
SELECT source, perspective, trace_id, request_span_id,
       row_number() OVER (ORDER BY trace_id, request_span_id, perspective, source) AS request_key
FROM (SELECT DISTINCT source, perspective, trace_id, request_span_id FROM request_facts) k;

-- tokentrace's request perspectives by integer: the candidate span that carries each one's
-- chunks (perspective_key, view tt_request_spans), its request_key and how many events that
-- span dropped. One row per request perspective.
CREATE OR REPLACE VIEW tt_request_keys AS
SELECT k.request_key, r.perspective_key, p.dropped_events_count AS events_dropped
FROM tt_request_spans r
JOIN tt_request_candidates p ON p.candidate_key = r.perspective_key
JOIN request_keys k
  ON k.trace_id = r.trace_id AND k.request_span_id = r.request_span_id
 AND k.perspective = r.perspective AND k.source = 'tokentrace';

-- tokentrace's gaps (view tt_candidate_gaps) under their request_key: joined on integers,
-- never on the id strings of every chunk.
CREATE OR REPLACE VIEW tt_request_gap_rows AS
SELECT k.request_key, g.gap_index, g.chunk_index, g.prev_time_ns, g.time_ns, g.chunk_tokens, k.events_dropped
FROM tt_candidate_gaps g
JOIN tt_request_keys k ON k.perspective_key = g.candidate_key;

-- Every other adapter's gaps, by the same rule: each visible chunk after the first of a
-- request perspective, ordered by chunk index (then time), with the previous chunk's time.
CREATE OR REPLACE VIEW adapter_request_gap_rows AS
WITH ordered AS (
    SELECT
        k.request_key, c.chunk_index, c.time_ns, c.chunk_tokens, c.events_dropped,
        lag(c.time_ns) OVER w AS prev_time_ns,
        row_number() OVER w - 1 AS gap_index
    FROM request_chunks c
    JOIN request_keys k
      ON k.trace_id = c.trace_id AND k.request_span_id = c.request_span_id
     AND k.perspective = c.perspective AND k.source = c.source
    WHERE c.source <> 'tokentrace'
    WINDOW w AS (PARTITION BY k.request_key ORDER BY c.chunk_index, c.time_ns)
)
SELECT request_key, gap_index, chunk_index, prev_time_ns, time_ns, chunk_tokens, events_dropped
FROM ordered
WHERE gap_index > 0;

-- Every gap on integers only: each visible chunk after the first of a request perspective,
-- ordered by chunk index (then time), with the previous chunk's time; gap_index counts from
-- 1. These are the rows DuckDB keeps per gap (seven BIGINTs, 56 bytes: docs/metrics.md,
-- "Performance"); the figures are computed from them in request_gap_times.
CREATE OR REPLACE VIEW request_gap_rows AS
SELECT * FROM tt_request_gap_rows
UNION ALL
SELECT * FROM adapter_request_gap_rows;

-- Every gap with its figures: itl_ms = (time - previous time) / 1e6 per chunk;
-- itl_per_token_ms = itl_ms / tokens of the later chunk; both NULL when the span dropped
-- events (chunks are missing).
CREATE OR REPLACE VIEW request_gap_times AS
SELECT
    request_key,
    gap_index,
    chunk_index,
    prev_time_ns,
    time_ns,
    chunk_tokens,
    events_dropped,
    CASE WHEN events_dropped = 0 THEN (time_ns - prev_time_ns) / 1e6 END AS itl_ms,
    CASE WHEN events_dropped = 0 AND chunk_tokens > 0
         THEN (time_ns - prev_time_ns) / 1e6 / chunk_tokens END AS itl_per_token_ms
FROM request_gap_rows;

-- One row per gap between consecutive visible chunks of a request perspective (ordered by
-- chunk index): request_gap_times with the request's names and why a figure is NULL.
-- request_key (view request_keys) orders the gaps as (trace_id, request_span_id, perspective).
CREATE OR REPLACE VIEW request_gaps AS
SELECT
    k.source,
    k.perspective,
    k.trace_id,
    k.request_span_id,
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
    END AS null_reason,
    g.request_key
FROM request_gap_times g
JOIN request_keys k ON k.request_key = g.request_key;

-- Clock offset bounds per request that has both a client and a server span.
-- theta = server clock - client clock. A message cannot arrive before it was sent:
--   theta <= server_arrival - client_send          (gateway start - client span start)
--   theta >= server_last_send - client_last_receive (gateway end   - client span end)
-- The lower bound holds only when the client read to the end: a cancelled request (the client
-- went away; the server ended after it, 112 ms after on the real openai-v2 capture) gives
-- only the upper bound (offset_lower_ms NULL).
CREATE OR REPLACE VIEW request_clock_offsets AS
SELECT
    trace_id,
    request_span_id,
    client_clock_domain AS client_domain,
    server_clock_domain AS server_domain,
    CASE WHEN coalesce(finish_reason, '') <> 'cancelled' THEN (server_end_ns - client_end_ns) / 1e6 END
        AS offset_lower_ms,
    (server_start_ns - client_start_ns) / 1e6 AS offset_upper_ms
FROM request_facts
WHERE perspective = 'client' AND server_span_id IS NOT NULL AND client_span_id IS NOT NULL;

-- The intersection over all requests of a (client domain, server domain) pair bounds theta.
CREATE OR REPLACE VIEW clock_pair_offsets AS
SELECT
    client_domain,
    server_domain,
    count(*) AS requests,
    max(offset_lower_ms) AS offset_min_ms,
    min(offset_upper_ms) AS offset_max_ms
FROM request_clock_offsets
GROUP BY client_domain, server_domain;
