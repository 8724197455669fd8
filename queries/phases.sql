-- returns: one row per request with a server span (a gateway; vLLM's llm_request, TGI, SGLang;
--   a vLLM request only tokentrace's vLLM plugin traced: its engine_request): its client TTFT decomposed into
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
--   vLLM: where tokentrace's vLLM plugin traced the request (its engine_request, 24_vllm_engine.sql),
--   queue_ms, prefill_ms and decode_ms are the plugin's (its queue span: vLLM's arrival to the
--   first step that scheduled the request; its prompt prefill spans; decode_ms = the last
--   generated token's emission - the first's), server_ttft_ms is vLLM's own TTFT
--   (gen_ai.latency.time_to_first_token of its llm_request, the frontend), first_emit_ms =
--   that TTFT's end - the plugin's prefill end (two processes of one host; both spans start at
--   vLLM's arrival time) and residual_ms = server_ttft - (queue + prefill + first_emit): vLLM
--   has no gateway or tokenize span. A request the plugin traced with no llm_request merged
--   with it (vLLM 0.32 writes none for an aborted one) is a row of its own, on the plugin's
--   figures.
--   Without the plugin's spans queue_ms / prefill_ms / decode_ms are vLLM's own figures.
--   vLLM's own figures are always beside them: vllm_queue_ms, vllm_prefill_ms,
--   vllm_decode_ms (gen_ai.latency.time_in_queue / time_in_model_prefill / time_in_model_decode;
--   NULL for other sources). phases_basis names where each row's phases come from.
--   server_ttft_ms: the server's TTFT (gateway: first visible chunk write - arrival; vLLM:
--   its own TTFT; a plugin-only row: the engine's); decode_ms elsewhere: the server's last
--   visible chunk - its first (e - f): 0 for one output token, NULL with null_reason when
--   more arrived in one write (e = f: a non-streamed answer, no per-token timing).
--   null_reason: why a TTFT part is NULL (the first reason that applies), then decode_ms's.
-- param: $trace_id VARCHAR default NULL -- only requests of this trace (32 lowercase hex); NULL = all
-- param: $request_span_id VARCHAR default NULL -- only this request (its request_span_id, 16 lowercase hex: --request resolves any id to it); NULL = all
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
-- the plugin's engine row of each vLLM request (tokentrace's vLLM plugin: 24_vllm_engine.sql)
vllm_engine AS (
    SELECT trace_id, request_span_id, f_ns, e_ns,
           queue_start_ns, queue_end_ns, prefill_start_ns, prefill_end_ns
    FROM request_facts
    WHERE source = 'vllm' AND perspective = 'engine' AND ($trace_id IS NULL OR trace_id = $trace_id)
),
server_rows AS (
    SELECT * FROM request_facts
    WHERE perspective = 'server' AND ($trace_id IS NULL OR trace_id = $trace_id)
      AND ($request_span_id IS NULL OR request_span_id = $request_span_id)
),
-- one row per request: its server row; a vLLM request the plugin traced with no llm_request
-- merged with it (vLLM 0.32 writes none for an aborted request; vLLM's own tracing off; a
-- choice of a request with n > 1, 24_vllm_engine.sql): its engine row
base AS (
    SELECT s.*, false AS engine_only FROM server_rows s
    UNION ALL
    SELECT e.*, true AS engine_only
    FROM request_facts e
    LEFT JOIN server_rows s ON s.trace_id = e.trace_id AND s.request_span_id = e.request_span_id
    WHERE e.source = 'vllm' AND e.perspective = 'engine' AND s.trace_id IS NULL
      AND ($trace_id IS NULL OR e.trace_id = $trace_id)
      AND ($request_span_id IS NULL OR e.request_span_id = $request_span_id)
),
-- where each row's queue / prefill / decode come from; vLLM's own figures beside them
sourced AS (
    SELECT
        b.*,
        b.source = 'vllm' AND g.request_span_id IS NOT NULL AS plugin,
        g.f_ns AS plugin_f_ns, g.e_ns AS plugin_e_ns,
        g.queue_start_ns AS plugin_queue_start_ns, g.queue_end_ns AS plugin_queue_end_ns,
        g.prefill_start_ns AS plugin_prefill_start_ns, g.prefill_end_ns AS plugin_prefill_end_ns,
        v.queue_ns AS vllm_queue_ns, v.prefill_ns AS vllm_prefill_ns, v.decode_ns AS vllm_decode_ns
    FROM base b
    LEFT JOIN vllm_engine g
      ON b.source = 'vllm' AND g.trace_id = b.trace_id AND g.request_span_id = b.request_span_id
    LEFT JOIN vllm_request_spans v
      ON b.source = 'vllm' AND NOT b.engine_only AND v.trace_id = b.trace_id AND v.span_id = b.request_span_id
),
joined AS (
    SELECT
        f.trace_id, f.request_span_id, f.response_id, f.client_request_id, f.source, f.plugin, f.engine_only,
        CASE WHEN f.engine_only THEN f.clock_domain ELSE f.server_clock_domain END AS server_clock_domain,
        CASE WHEN f.engine_only THEN f.s_ns ELSE f.server_start_ns END AS server_start_ns,
        -- vLLM: its first token as its frontend saw it (llm_request start + vLLM's TTFT), or
        -- the plugin's first token for a request without llm_request; a first emit only
        -- where the plugin's prefill end is known (vLLM's own prefill is placed back from f)
        CASE WHEN f.source = 'vllm' AND f.plugin THEN f.f_ns
             WHEN f.source = 'vllm' THEN NULL
             ELSE f.server_first_chunk_ns END AS server_first_chunk_ns,
        CASE WHEN f.source = 'vllm' THEN f.f_ns ELSE f.server_first_chunk_ns END AS server_f_ns,
        f.tokenize_start_ns, f.tokenize_end_ns,
        CASE WHEN f.plugin THEN f.plugin_queue_start_ns ELSE f.queue_start_ns END AS queue_start_ns,
        CASE WHEN f.plugin THEN f.plugin_queue_end_ns ELSE f.queue_end_ns END AS queue_end_ns,
        CASE WHEN f.plugin THEN f.plugin_prefill_start_ns ELSE f.prefill_start_ns END AS prefill_start_ns,
        CASE WHEN f.plugin THEN f.plugin_prefill_end_ns ELSE f.prefill_end_ns END AS prefill_end_ns,
        -- decode: last token - first (e - f); NULL when the output of more than one token
        -- arrived in one write (e <= f: no per-token timing), 0 ms for a single token
        CASE WHEN f.plugin AND (f.plugin_e_ns > f.plugin_f_ns OR f.output_tokens = 1)
                 THEN (f.plugin_e_ns - f.plugin_f_ns) / 1e6
             WHEN f.plugin THEN NULL
             WHEN f.source = 'vllm' THEN f.vllm_decode_ns / 1e6
             WHEN f.e_ns > f.f_ns OR f.output_tokens = 1 THEN (f.e_ns - f.f_ns) / 1e6 END AS decode_ms,
        f.source <> 'vllm' AND f.output_tokens > 1 AND f.e_ns <= f.f_ns AS decode_one_write,
        f.vllm_queue_ns / 1e6 AS vllm_queue_ms,
        f.vllm_prefill_ns / 1e6 AS vllm_prefill_ms,
        f.vllm_decode_ns / 1e6 AS vllm_decode_ms,
        coalesce(f.client_span_id, c.client_span_id) AS client_span_id,
        CASE WHEN f.client_span_id IS NOT NULL THEN f.client_clock_domain ELSE c.client_clock_domain END
            AS client_clock_domain,
        CASE WHEN f.client_span_id IS NOT NULL THEN f.client_start_ns ELSE c.client_start_ns END AS client_start_ns,
        CASE WHEN f.client_span_id IS NOT NULL THEN f.client_first_chunk_ns ELSE c.client_first_chunk_ns END
            AS client_first_chunk_ns,
        f.null_reason,
        CASE WHEN f.client_span_id IS NULL THEN c.null_reason END AS client_null_reason
    FROM sourced f
    LEFT JOIN other_client c
      ON c.trace_id = f.trace_id AND c.request_span_id = f.request_span_id AND c.pick = 1
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
        (x.server_first_chunk_ns - x.server_start_ns) / 1e6 AS server_ttft_ms,
        (x.server_f_ns - x.server_start_ns) / 1e6 AS server_ttft_known_ms
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
    -- vLLM has no gateway or tokenize span: its TTFT is queue + prefill + first emit + residual
    -- (in integer ns: server TTFT - queue - prefill - first emit = the time between arrival and
    -- the queue's start plus the time between the queue's end and the prefill's start)
    CASE WHEN source = 'vllm'
         THEN ((server_first_chunk_ns - server_start_ns) - (queue_end_ns - queue_start_ns)
               - (prefill_end_ns - prefill_start_ns) - (server_first_chunk_ns - prefill_end_ns)) / 1e6
         ELSE server_ttft_ms - (gateway_overhead_ms + tokenize_ms + queue_ms + prefill_ms + first_emit_ms)
    END AS residual_ms,
    clock_pair_verdict,
    assumed_offset_ms,
    cross_clock_reason,
    nullif(concat_ws('; ', CASE
        WHEN source = 'vllm' AND plugin AND server_first_chunk_ns IS NULL
            THEN coalesce(null_reason, 'first token unknown')
        WHEN source = 'vllm' AND plugin
            THEN 'vllm: no gateway or tokenize span (vLLM writes none): gateway_overhead_ms and tokenize_ms NULL'
        WHEN server_first_chunk_ns IS NULL THEN coalesce(null_reason, 'first visible chunk unknown')
        WHEN client_span_id IS NOT NULL AND client_first_chunk_ns IS NULL AND client_null_reason IS NOT NULL
            THEN 'client TTFT and network_out unknown (network_in is from the client span''s start): '
                 || client_null_reason
        WHEN client_span_id IS NOT NULL AND client_first_chunk_ns IS NULL
            THEN coalesce(null_reason, 'first visible chunk unknown')
        WHEN tokenize_start_ns IS NULL OR queue_start_ns IS NULL OR prefill_start_ns IS NULL
            THEN 'a phase span (tokenize, queue or prefill) is missing'
    END, CASE WHEN decode_one_write
              THEN 'decode_ms needs e > f (the output arrived in one write: no per-token timing)' END), '')
        AS null_reason,
    server_ttft_known_ms AS server_ttft_ms,
    decode_ms,
    vllm_queue_ms,
    vllm_prefill_ms,
    vllm_decode_ms,
    CASE
        WHEN source = 'vllm' AND plugin AND engine_only THEN
            'tokentrace''s vLLM plugin: its queue and prefill spans, decode and TTFT from its chunk events '
            || '(vLLM''s engine core); no llm_request of vLLM''s merged with it (vLLM 0.32 writes none for an '
            || 'aborted request; request_id_note in requests says why)'
        WHEN source = 'vllm' AND plugin THEN
            'tokentrace''s vLLM plugin: its queue and prefill spans, decode from its chunk events (vLLM''s engine '
            || 'core); server TTFT: vLLM''s own (llm_request, its frontend); first_emit: that TTFT''s end - the '
            || 'plugin''s prefill end (two processes of one host); vLLM''s own figures in vllm_*_ms'
        WHEN source = 'vllm' THEN
            'vLLM''s own llm_request (no span of tokentrace''s vLLM plugin merged with it): queue, prefill '
            || 'and decode are its gen_ai.latency.time_in_queue, time_in_model_prefill and time_in_model_decode'
        WHEN source = 'tokentrace' THEN 'tokentrace: the gateway span, its tokenize, queue and prefill spans and chunk events'
        ELSE source || ' adapter (docs/adapters.md)'
    END AS phases_basis
FROM parts
ORDER BY server_start_ns, trace_id, request_span_id;
