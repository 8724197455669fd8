-- returns: one row of window metrics: attempted / succeeded / failed / cancelled requests,
--   requests meeting every stated SLO, request throughput, observed goodput, error rate and
--   output token throughput, with the counting rules stated in columns. Two modes, never
--   interchangeable (docs/metrics.md): closed_cohort = requests whose s falls in the window,
--   all expected to finish inside it (not_finished_in_window counts those that did not; they
--   are kept, not dropped); steady_state = requests completing in the window (succeeded:
--   e, the last visible chunk; failed, cancelled or without visible output: the span end),
--   and output tokens from chunk events whose time falls in it (requests_crossing_boundary
--   counts the requests that overlap the window without lying inside it: they contribute
--   only their in-window events).
--   A request is counted once, from one perspective: $perspective, or when NULL the best one
--   it has (client, else server, else engine; a vLLM request that tokentrace's vLLM plugin
--   traced is counted from the plugin's engine_request, before vLLM's own llm_request: its
--   chunk events, finish reason and prefix-cache figures, and the aborted requests vLLM
--   writes no llm_request for). Cancelled requests (finish reason
--   'cancelled') are neither succeeded nor failed unless $cancelled_as_failed. Failed:
--   status ERROR (request or gateway span) or finish reason 'error'. Per-request figures come from
--   view request_metrics. A TPOT SLO passes a request whose TPOT is NULL
--   (one output token); a TTFT/E2E SLO fails a request without that figure.
--   token_counting_rule names the attributes the counted output tokens were read from
--   (output_tokens_basis: gen_ai.usage.output_tokens, gen_ai.usage.completion_tokens, chunk
--   events, ...); request_counting_rule says what attempted counts and which requests a
--   source cannot show (vLLM's own llm_request: none for an aborted or rejected request;
--   said only of the data loaded: with the plugin's spans the aborted ones are counted).
--   Prefix cache: prefix_cache_hit_share = cached prompt tokens / input tokens over the
--   counted requests that report both (request_metrics' cache_reporting, the rule summary.sql
--   uses too; gen_ai.usage.cache_read.input_tokens, e.g. tokentrace's continuous engine),
--   prefix_cache_hit_requests those of them with cached_tokens > 0;
--   prefix_cache_note says why the share is NULL.
-- param: $window_start_ns BIGINT default NULL -- window start (inclusive); NULL = earliest s
-- param: $window_end_ns BIGINT default NULL -- window end (inclusive); NULL = latest request end
-- param: $mode VARCHAR default 'closed_cohort' -- closed_cohort or steady_state
-- param: $perspective VARCHAR default NULL -- client, server or engine; NULL = best per request
-- param: $slo_ttft_ms DOUBLE default NULL -- TTFT SLO (ms, <=); NULL = not applied
-- param: $slo_tpot_ms DOUBLE default NULL -- TPOT SLO (ms, <=); NULL = not applied
-- param: $slo_e2e_ms DOUBLE default NULL -- E2E SLO (ms, <=); NULL = not applied
-- param: $count_failed_tokens BOOLEAN default false -- count failed requests' output tokens
-- param: $cancelled_as_failed BOOLEAN default false -- count cancelled requests as failed
-- units: *_ns nanoseconds since the Unix epoch on the chosen perspective's clock; window_s
--   seconds; *_rps requests per second; output_tokens_per_s tokens per second; error_rate a
--   fraction (0.02 = 2 %); prefix_cache_hit_share a fraction of input tokens.
-- request_metrics is read once (a second read would compute the per-request view twice): the
-- rank puts the rows of $perspective first, and req keeps only those
WITH ranked AS (
    SELECT
        *,
        row_number() OVER (
            PARTITION BY trace_id, request_span_id
            ORDER BY CASE WHEN $perspective IS NULL OR perspective = $perspective THEN 0 ELSE 1 END,
                     CASE WHEN perspective = 'client' THEN 0
                          -- tokentrace's vLLM plugin (engine_request) before vLLM's llm_request
                          WHEN source = 'vllm' AND perspective = 'engine' THEN 1
                          WHEN perspective = 'server' THEN 2 ELSE 3 END
        ) AS perspective_rank,
        -- a vLLM request with both the plugin's row and vLLM's own (perspective's note)
        sum(CASE WHEN source = 'vllm' AND perspective = 'server' THEN 1 ELSE 0 END)
            OVER (PARTITION BY trace_id, request_span_id) > 0 AS has_vllm_server,
        -- whether the data holds spans of tokentrace's vLLM plugin at all (request_counting_rule)
        count(*) FILTER (WHERE source = 'vllm' AND perspective = 'engine') OVER () AS plugin_requests
    FROM request_metrics
),
plugin AS (
    SELECT coalesce(max(plugin_requests), 0) AS plugin_requests FROM ranked
),
req AS (
    SELECT
        trace_id,
        request_span_id,
        perspective,
        s_ns,
        end_ns,
        -- steady_state: a request completes at e (its last visible chunk); without e (no
        -- visible output, lost events, failure) at the end of its span
        CASE WHEN outcome = 'succeeded' THEN coalesce(e_ns, end_ns) ELSE end_ns END AS completion_ns,
        output_tokens,
        output_tokens_basis,
        input_tokens,
        cached_tokens,
        cache_reporting,
        source,
        has_vllm_server,
        visible_chunks,
        sampling_reason,
        ttft_ms,
        e2e_ms,
        tpot_ms,
        outcome AS outcome_seen,
        CASE WHEN outcome = 'cancelled' AND $cancelled_as_failed THEN 'failed' ELSE outcome END AS outcome
    FROM ranked
    WHERE perspective_rank = 1 AND ($perspective IS NULL OR perspective = $perspective)
),
bounds AS (
    SELECT
        coalesce($window_start_ns, (SELECT min(s_ns) FROM req)) AS start_ns,
        coalesce($window_end_ns, (SELECT max(end_ns) FROM req)) AS end_ns
),
scored AS (
    SELECT
        req.*,
        outcome = 'succeeded'
          AND ($slo_ttft_ms IS NULL OR coalesce(ttft_ms <= $slo_ttft_ms, false))
          AND ($slo_tpot_ms IS NULL OR tpot_ms IS NULL OR tpot_ms <= $slo_tpot_ms)
          AND ($slo_e2e_ms IS NULL OR coalesce(e2e_ms <= $slo_e2e_ms, false)) AS meets_slo,
        outcome = 'succeeded' OR (outcome <> 'succeeded' AND $count_failed_tokens) AS tokens_count,
        req.s_ns >= b.start_ns AND req.s_ns <= b.end_ns AS starts_in_window,
        req.end_ns >= b.start_ns AND req.end_ns <= b.end_ns AS ends_in_window,
        req.completion_ns >= b.start_ns AND req.completion_ns <= b.end_ns AS completes_in_window,
        req.s_ns <= b.end_ns AND req.end_ns >= b.start_ns AS overlaps_window
    FROM req, bounds b
),
counted AS (
    SELECT * FROM scored
    WHERE CASE $mode WHEN 'closed_cohort' THEN starts_in_window
                     WHEN 'steady_state' THEN completes_in_window END
),
-- every chunk event of the window's requests: read only in steady_state ($mode is bound before
-- DuckDB optimizes, so in closed_cohort the filter is constant false and the join over every
-- chunk is never run: a closed-cohort window reads no chunk at all)
steady_tokens AS (
    SELECT coalesce(sum(c.chunk_tokens), 0) AS tokens
    FROM request_chunks c
    JOIN scored s ON s.trace_id = c.trace_id AND s.request_span_id = c.request_span_id
                 AND s.perspective = c.perspective
    CROSS JOIN bounds b
    WHERE $mode = 'steady_state' AND s.tokens_count AND c.time_ns >= b.start_ns AND c.time_ns <= b.end_ns
),
totals AS (
    SELECT
        count(*) AS attempted,
        count(*) FILTER (WHERE outcome = 'succeeded') AS succeeded,
        count(*) FILTER (WHERE outcome = 'failed') AS failed,
        count(*) FILTER (WHERE outcome = 'cancelled') AS cancelled,
        count(*) FILTER (WHERE meets_slo) AS slo_passing,
        count(*) FILTER (WHERE NOT ends_in_window) AS not_finished_in_window,
        coalesce(sum(output_tokens) FILTER (WHERE tokens_count), 0) AS cohort_output_tokens,
        -- the attributes (or rules) the counted requests' output_tokens were read from
        -- (a sorted distinct list, not string_agg(DISTINCT ... ORDER BY): Spark's LISTAGG
        -- with DISTINCT, an order and a FILTER fails to plan)
        nullif(array_to_string(list_sort(list_distinct(list(output_tokens_basis) FILTER (WHERE tokens_count))), ', '), '')
            AS output_tokens_bases,
        count(*) FILTER (WHERE tokens_count AND visible_chunks = 0 AND output_tokens > 0) AS requests_without_chunks,
        count(*) FILTER (WHERE sampling_reason = 'summary') AS summarized_requests,
        count(*) FILTER (WHERE source = 'vllm' AND perspective = 'server') AS vllm_own_requests,
        count(*) FILTER (WHERE source = 'vllm' AND perspective = 'engine') AS vllm_plugin_requests,
        count(*) FILTER (WHERE source = 'vllm' AND perspective = 'engine' AND has_vllm_server) AS vllm_plugin_over_own,
        count(*) FILTER (WHERE source = 'vllm' AND perspective = 'engine' AND outcome_seen = 'cancelled')
            AS vllm_plugin_cancelled,
        count(*) FILTER (WHERE cache_reporting) AS cache_reporting_requests,
        count(*) FILTER (WHERE cache_reporting AND cached_tokens > 0) AS cache_hit_requests,
        sum(cached_tokens) FILTER (WHERE cache_reporting) AS cached_prompt_tokens,
        sum(input_tokens) FILTER (WHERE cache_reporting) AS cache_reporting_input_tokens
    FROM counted
)
SELECT
    $mode AS mode,
    coalesce($perspective, 'best per request (client > server > engine'
             || CASE WHEN t.vllm_plugin_over_own > 0
                     THEN '; vLLM: tokentrace''s vLLM plugin (engine) before vLLM''s own llm_request (server)'
                     ELSE '' END || ')') AS perspective,
    b.start_ns AS window_start_ns,
    b.end_ns AS window_end_ns,
    (b.end_ns - b.start_ns) / 1e9 AS window_s,
    t.attempted,
    t.succeeded,
    t.failed,
    t.cancelled,
    t.slo_passing,
    CASE WHEN $mode = 'closed_cohort' THEN t.not_finished_in_window END AS not_finished_in_window,
    CASE WHEN $mode = 'steady_state'
         THEN (SELECT count(*) FROM scored
               WHERE overlaps_window AND NOT (starts_in_window AND ends_in_window)) END
        AS requests_crossing_boundary,
    CASE WHEN b.end_ns > b.start_ns THEN t.succeeded / ((b.end_ns - b.start_ns) / 1e9) END
        AS request_throughput_rps,
    CASE WHEN b.end_ns > b.start_ns THEN t.slo_passing / ((b.end_ns - b.start_ns) / 1e9) END
        AS observed_goodput_rps,
    CASE WHEN t.attempted > 0 THEN t.failed / CAST(t.attempted AS DOUBLE) END AS error_rate,
    CASE WHEN $mode = 'closed_cohort' THEN t.cohort_output_tokens
         ELSE (SELECT tokens FROM steady_tokens) END AS output_tokens,
    CASE WHEN b.end_ns > b.start_ns
         THEN (CASE WHEN $mode = 'closed_cohort' THEN t.cohort_output_tokens
                    ELSE (SELECT tokens FROM steady_tokens) END) / ((b.end_ns - b.start_ns) / 1e9)
    END AS output_tokens_per_s,
    CASE WHEN $mode = 'closed_cohort'
         THEN 'output tokens (' || coalesce(t.output_tokens_bases, 'none counted') || ') of cohort requests that '
              || CASE WHEN $count_failed_tokens THEN 'succeeded, failed or were cancelled'
                      ELSE 'succeeded' END
         ELSE 'visible chunk tokens whose event time is inside the window, from requests that '
              || CASE WHEN $count_failed_tokens THEN 'succeeded, failed or were cancelled'
                      ELSE 'succeeded' END
              || CASE WHEN t.requests_without_chunks > 0
                      THEN '; ' || CAST(t.requests_without_chunks AS VARCHAR)
                           || ' counted request(s) with output tokens have no chunk events (vLLM, openai-v2, or '
                           || 'summarized by a keep policy): their tokens are not in this count'
                      ELSE '' END
    END AS token_counting_rule,
    CASE WHEN $mode = 'closed_cohort' THEN 'attempted = requests whose start s (s_ns: the arrival, on the clock of its perspective) is in the window'
         ELSE 'attempted = requests completing in the window' END
    || '; succeeded / failed / cancelled by outcome'
    -- vLLM: what its own llm_request cannot show, said only of the data loaded: without the
    -- plugin's spans, aborted and rejected requests are invisible; with them, the plugin's
    -- engine_request shows the aborted ones
    || CASE WHEN t.vllm_own_requests > 0 AND p.plugin_requests = 0
            THEN '; ' || CAST(t.vllm_own_requests AS VARCHAR) || ' vLLM request(s): vLLM writes a span only for a '
                 || 'finished request (0.32: none for one the client aborted or one rejected with 400), so '
                 || 'cancelled and rejected requests are invisible in its traces and not counted'
            WHEN t.vllm_own_requests > 0 AND $perspective = 'server'
            THEN '; ' || CAST(t.vllm_own_requests AS VARCHAR) || ' vLLM request(s) counted from vLLM''s own '
                 || 'llm_request, which it writes only for a finished request (0.32: none for one the client '
                 || 'aborted or one rejected with 400), so cancelled requests are not among them; the spans of '
                 || 'tokentrace''s vLLM plugin show them (--perspective engine)'
            WHEN t.vllm_own_requests > 0
            THEN '; ' || CAST(t.vllm_own_requests AS VARCHAR) || ' vLLM request(s) counted from vLLM''s own '
                 || 'llm_request, with no span of tokentrace''s vLLM plugin merged with it: vLLM writes one only '
                 || 'for a finished request (0.32: none for one the client aborted or one rejected with 400), so '
                 || 'such requests, when aborted or rejected, are invisible and not counted'
            ELSE '' END
    || CASE WHEN t.vllm_plugin_requests > 0
            THEN '; ' || CAST(t.vllm_plugin_requests AS VARCHAR) || ' vLLM request(s) counted from the spans of '
                 || 'tokentrace''s vLLM plugin (engine_request), which it writes for aborted requests too ('
                 || CAST(t.vllm_plugin_cancelled AS VARCHAR) || ' cancelled here); a request vLLM rejects in '
                 || 'its frontend (a 400) reaches neither its engine nor the plugin'
            ELSE '' END
    || CASE WHEN t.summarized_requests > 0
            THEN '; ' || CAST(t.summarized_requests AS VARCHAR) || ' request(s) summarized by a keep policy '
                 || '(sampling_reason summary): counted, with their TTFT and E2E from their spans'' attributes'
            ELSE '' END AS request_counting_rule,
    $slo_ttft_ms AS slo_ttft_ms,
    $slo_tpot_ms AS slo_tpot_ms,
    $slo_e2e_ms AS slo_e2e_ms,
    CASE WHEN t.cache_reporting_requests > 0
         THEN t.cached_prompt_tokens / CAST(t.cache_reporting_input_tokens AS DOUBLE) END AS prefix_cache_hit_share,
    t.cache_hit_requests AS prefix_cache_hit_requests,
    CASE WHEN t.cache_reporting_requests = 0
         THEN 'no counted request reports prefix-cache tokens (gen_ai.usage.cache_read.input_tokens)' END
        AS prefix_cache_note
FROM totals t, bounds b, plugin p
WHERE $mode IN ('closed_cohort', 'steady_state');
