"""The floor: one hand-written DuckDB query per verb that computes the verb's columns directly
from the canonical tables (spans, span_events), for tokentrace's own span contract only
(docs/spans.md: a gateway SERVER span, its CLIENT parent, a root generate span; chunk events
``tokentrace.chunk``) -- no adapter views, no unions, no kept tables, no request keys; the
chunk and decode attributes from their dedicated columns (docs/tables.md: a format-2 dump or a
database). Each is the query a DuckDB user who knows the contract would write; benchmarks/verbs.py times every
verb against it (what the layering costs) and checks both give the same rows.

Same columns, row order and NULL rules as queries/requests.sql, itl.sql, summary.sql,
window.sql (closed_cohort, default parameters), phases.sql (default tolerance, no assumed
offset) and skew (skew_rules.sql, which already reads the canonical tables: its floor is the
same text with its one view inlined, and skew_offsets.sql).
"""

from __future__ import annotations

from pathlib import Path

__all__ = ["FLOORS"]

_CANDIDATES = """
cand AS (
    SELECT trace_id, span_id, parent_span_id, name, kind, start_ns, end_ns, status_code, clock_domain,
           attr_int, attr_bool, attr_str, attr_json, dropped_events_count
    FROM spans WHERE scope_name = 'tokentrace' AND name = 'gateway' AND kind = 'SERVER'
    UNION ALL
    SELECT trace_id, span_id, parent_span_id, name, kind, start_ns, end_ns, status_code, clock_domain,
           attr_int, attr_bool, attr_str, attr_json, dropped_events_count
    FROM spans WHERE scope_name = 'tokentrace' AND kind = 'CLIENT'
    UNION ALL
    SELECT trace_id, span_id, parent_span_id, name, kind, start_ns, end_ns, status_code, clock_domain,
           attr_int, attr_bool, attr_str, attr_json, dropped_events_count
    FROM spans WHERE scope_name = 'tokentrace' AND name = 'generate' AND parent_span_id IS NULL AND kind <> 'CLIENT'
),
persp AS (
    SELECT 'server' AS perspective, g.trace_id, g.span_id AS request_span_id, g.span_id AS p_id,
           g.span_id AS sv_id, c.span_id AS cl_id
    FROM cand g LEFT JOIN cand c ON c.kind = 'CLIENT' AND c.trace_id = g.trace_id AND c.span_id = g.parent_span_id
    WHERE g.name = 'gateway' AND g.kind = 'SERVER'
    UNION ALL
    SELECT 'client', c.trace_id, coalesce(g.span_id, c.span_id), c.span_id, g.span_id, c.span_id
    FROM cand c LEFT JOIN cand g ON g.name = 'gateway' AND g.kind = 'SERVER' AND g.trace_id = c.trace_id
                                AND g.parent_span_id = c.span_id
    WHERE c.kind = 'CLIENT'
    UNION ALL
    SELECT 'engine', e.trace_id, e.span_id, e.span_id, e.span_id, NULL
    FROM cand e WHERE e.name = 'generate' AND e.parent_span_id IS NULL AND e.kind <> 'CLIENT'
),
chunk_events AS (
    SELECT trace_id, span_id, event_index, time_ns,
           coalesce(attr_tokentrace_chunk_index, event_index) AS chunk_index,
           coalesce(attr_tokentrace_chunk_tokens, 1) AS chunk_tokens
    FROM span_events
    WHERE name = 'tokentrace.chunk' AND coalesce(attr_tokentrace_chunk_visible, true)
)"""

_CHUNK_AGG = """
chunk_agg AS (
    SELECT e.trace_id, e.span_id, min(e.time_ns) AS first_ns, max(e.time_ns) AS last_ns, count(*) AS chunks,
           sum(e.chunk_tokens) AS tokens
    FROM chunk_events e SEMI JOIN cand c ON c.trace_id = e.trace_id AND c.span_id = e.span_id
    GROUP BY e.trace_id, e.span_id
)"""

# per request perspective: what requests.sql (view request_metrics) computes
_METRICS = """
facts AS (
    SELECT r.perspective, r.trace_id, r.request_span_id, r.sv_id, r.cl_id, p.clock_domain, p.start_ns AS s_ns,
           p.end_ns, p.dropped_events_count AS dropped, p.status_code, sv.status_code AS server_status_code,
           sv.clock_domain AS server_clock_domain, cl.clock_domain AS client_clock_domain,
           sv.start_ns AS server_start_ns, sv.end_ns AS server_end_ns, cl.start_ns AS client_start_ns,
           cl.end_ns AS client_end_ns,
           CASE WHEN sv.dropped_events_count = 0 THEN sca.first_ns END AS server_first_chunk_ns,
           CASE WHEN cl.dropped_events_count = 0 THEN cca.first_ns END AS client_first_chunk_ns,
           CASE WHEN p.dropped_events_count = 0 THEN ca.first_ns END AS f_ns,
           CASE WHEN p.dropped_events_count = 0 THEN ca.last_ns END AS e_ns,
           ca.first_ns AS any_first_ns,
           coalesce(p.attr_int['gen_ai.usage.input_tokens'], p.attr_int['gen_ai.usage.prompt_tokens'],
                    sv.attr_int['gen_ai.usage.input_tokens'], sv.attr_int['gen_ai.usage.prompt_tokens']) AS input_tokens,
           coalesce(p.attr_int['gen_ai.usage.output_tokens'], p.attr_int['gen_ai.usage.completion_tokens'],
                    sv.attr_int['gen_ai.usage.output_tokens'], sv.attr_int['gen_ai.usage.completion_tokens'],
                    CASE WHEN p.dropped_events_count = 0 THEN coalesce(ca.tokens, 0) END) AS output_tokens,
           coalesce(sv.attr_int['tokentrace.generated_tokens'], p.attr_int['tokentrace.generated_tokens'])
               AS generated_tokens,
           coalesce(json_extract_string(p.attr_json['gen_ai.response.finish_reasons'], '$[0]'),
                    json_extract_string(sv.attr_json['gen_ai.response.finish_reasons'], '$[0]')) AS finish_reason,
           coalesce(p.attr_bool['tokentrace.synthetic'], false) AS synthetic,
           coalesce(p.attr_int['gen_ai.usage.cache_read.input_tokens'],
                    sv.attr_int['gen_ai.usage.cache_read.input_tokens']) AS cached_tokens
    FROM persp r
    JOIN cand p ON p.trace_id = r.trace_id AND p.span_id = r.p_id
    LEFT JOIN cand sv ON sv.trace_id = r.trace_id AND sv.span_id = r.sv_id
    LEFT JOIN cand cl ON cl.trace_id = r.trace_id AND cl.span_id = r.cl_id
    LEFT JOIN chunk_agg ca ON ca.trace_id = r.trace_id AND ca.span_id = r.p_id
    LEFT JOIN chunk_agg sca ON sca.trace_id = r.trace_id AND sca.span_id = r.sv_id
    LEFT JOIN chunk_agg cca ON cca.trace_id = r.trace_id AND cca.span_id = r.cl_id
),
metrics AS (
    SELECT *,
           CASE WHEN finish_reason = 'cancelled' THEN 'cancelled'
                WHEN finish_reason = 'error' OR status_code = 'ERROR' OR server_status_code = 'ERROR' THEN 'failed'
                ELSE 'succeeded' END AS outcome,
           (f_ns - s_ns) / 1e6 AS ttft_ms,
           (e_ns - s_ns) / 1e6 AS e2e_ms,
           CASE WHEN output_tokens > 1 AND e_ns > f_ns THEN ((e_ns - s_ns) - (f_ns - s_ns)) / 1e6 / (output_tokens - 1) END
               AS tpot_ms,
           CASE WHEN output_tokens > 1 AND e_ns > f_ns THEN (output_tokens - 1) / ((e_ns - f_ns) / 1e9) END
               AS decode_output_tokens_per_second,
           CASE WHEN e_ns > s_ns THEN output_tokens / ((e_ns - s_ns) / 1e9) END AS whole_request_output_tokens_per_second
    FROM facts
)"""

_KV = """
phase AS (
    SELECT trace_id, parent_span_id,
           max(attr_int['tokentrace.kv.bytes_per_token']) AS kv_bytes_per_token,
           max(attr_int['tokentrace.kv.bytes']) AS prompt_kv_bytes
    FROM spans WHERE scope_name = 'tokentrace' AND name = 'prefill'
    GROUP BY trace_id, parent_span_id
),
decode AS (
    SELECT trace_id, parent_span_id, count(*) AS decode_spans, max(attr_tokentrace_step) AS last_step,
           max(attr_tokentrace_kv_bytes) AS stop_kv_bytes
    FROM spans WHERE scope_name = 'tokentrace' AND name = 'decode'
    GROUP BY trace_id, parent_span_id
)"""

REQUESTS = f"""
WITH {_CANDIDATES}, {_CHUNK_AGG}, {_METRICS}, {_KV},
kv AS (
    SELECT m.*, ph.kv_bytes_per_token, ph.prompt_kv_bytes,
           coalesce(CASE WHEN dc.last_step = m.generated_tokens - 1
                              OR (dc.decode_spans > 1 AND dc.decode_spans = dc.last_step) THEN dc.stop_kv_bytes END,
                    CASE WHEN coalesce(dc.decode_spans, 0) = 0 AND m.generated_tokens = 1 THEN ph.prompt_kv_bytes END)
               AS stop_kv_bytes
    FROM metrics m
    LEFT JOIN phase ph ON ph.trace_id = m.trace_id AND ph.parent_span_id = m.sv_id
    LEFT JOIN decode dc ON dc.trace_id = m.trace_id AND dc.parent_span_id = m.sv_id
)
SELECT 'tokentrace' AS source, perspective, trace_id, request_span_id, clock_domain, s_ns, f_ns, e_ns, input_tokens,
       output_tokens, generated_tokens, finish_reason, status_code, ttft_ms, e2e_ms, tpot_ms,
       decode_output_tokens_per_second, whole_request_output_tokens_per_second, kv_bytes_per_token, prompt_kv_bytes,
       prompt_kv_bytes / 1048576.0 AS prompt_kv_mib, stop_kv_bytes, stop_kv_bytes / 1048576.0 AS stop_kv_mib,
       synthetic, outcome,
       nullif(concat_ws('; ',
           CASE WHEN dropped > 0 THEN 'f/e unknown: ' || CAST(dropped AS VARCHAR) || ' events dropped by the span event limit'
                WHEN any_first_ns IS NULL THEN 'no visible chunk events' END,
           CASE WHEN output_tokens IS NULL THEN 'output token count unknown' END,
           CASE WHEN output_tokens <= 1 THEN 'tpot_ms and decode rate need more than one output token' END,
           CASE WHEN output_tokens > 1 AND e_ns <= f_ns
                THEN 'tpot_ms and decode rate need e > f (the output arrived in one write: no per-token timing)' END,
           CASE WHEN e_ns <= s_ns THEN 'whole-request rate needs e > s' END), '') AS null_reason
FROM kv
ORDER BY s_ns, trace_id, request_span_id, perspective
"""

_GAPS = """
gaps AS (
    SELECT r.perspective, r.trace_id, r.request_span_id, e.chunk_index, e.time_ns, e.chunk_tokens,
           p.dropped_events_count AS dropped,
           lag(e.time_ns) OVER w AS prev_time_ns, row_number() OVER w - 1 AS gap_index
    FROM persp r
    JOIN cand p ON p.trace_id = r.trace_id AND p.span_id = r.p_id
    JOIN chunk_events e ON e.trace_id = r.trace_id AND e.span_id = r.p_id
    WINDOW w AS (PARTITION BY r.trace_id, r.request_span_id, r.perspective ORDER BY e.chunk_index, e.time_ns)
),
gap_figures AS (
    SELECT *, CASE WHEN dropped = 0 THEN (time_ns - prev_time_ns) / 1e6 END AS itl_ms,
           CASE WHEN dropped = 0 AND chunk_tokens > 0 THEN (time_ns - prev_time_ns) / 1e6 / chunk_tokens END
               AS itl_per_token_ms
    FROM gaps WHERE gap_index > 0
)"""

ITL = f"""
WITH {_CANDIDATES}, {_GAPS}
SELECT 'tokentrace' AS source, perspective, trace_id, request_span_id, gap_index, chunk_index, prev_time_ns, time_ns,
       chunk_tokens, itl_ms, itl_per_token_ms,
       CASE WHEN dropped > 0 THEN 'gap unknown: ' || CAST(dropped AS VARCHAR)
                                  || ' events dropped by the span event limit, chunks are missing'
            WHEN chunk_tokens = 0 THEN 'itl_per_token_ms needs a chunk with tokens' END AS null_reason
FROM gap_figures
ORDER BY trace_id, request_span_id, perspective, gap_index
"""

SUMMARY = f"""
WITH {_CANDIDATES}, {_CHUNK_AGG}, {_METRICS}, {_GAPS},
ok AS (SELECT * FROM metrics WHERE outcome = 'succeeded'),
vals AS (
    SELECT perspective, 1 AS metric_order, ttft_ms AS value FROM ok
    UNION ALL SELECT perspective, 2, tpot_ms FROM ok
    UNION ALL SELECT perspective, 3, e2e_ms FROM ok
    UNION ALL
    SELECT g.perspective, m.k, CASE m.k WHEN 4 THEN g.itl_ms ELSE g.itl_per_token_ms END
    FROM gap_figures g
    SEMI JOIN ok o ON o.trace_id = g.trace_id AND o.request_span_id = g.request_span_id AND o.perspective = g.perspective
    CROSS JOIN (VALUES (4), (5)) m (k)
    UNION ALL SELECT perspective, 6, decode_output_tokens_per_second FROM ok
    UNION ALL SELECT perspective, 7, whole_request_output_tokens_per_second FROM ok
    UNION ALL SELECT perspective, 8, ttft_ms FROM ok WHERE cached_tokens > 0
    UNION ALL SELECT perspective, 9, ttft_ms FROM ok WHERE cached_tokens = 0
),
names (metric_order, metric, unit) AS (
    VALUES (1, 'ttft_ms', 'ms'), (2, 'tpot_ms', 'ms/token'), (3, 'e2e_ms', 'ms'), (4, 'itl_ms', 'ms per chunk gap'),
           (5, 'itl_per_token_ms', 'ms per token'), (6, 'decode_output_tokens_per_second', 'tokens/s'),
           (7, 'whole_request_output_tokens_per_second', 'tokens/s'), (8, 'ttft_ms_prefix_cache_hit', 'ms'),
           (9, 'ttft_ms_prefix_cache_miss', 'ms'), (10, 'prefix_cache_hit_share', 'fraction of input tokens')
),
d AS (
    SELECT metric_order, perspective, count(value) AS count, count(*) - count(value) AS null_count, avg(value) AS mean,
           stddev_pop(value) AS std_pop, min(value) AS min, quantile_cont(value, [0.5, 0.9, 0.95, 0.99]) AS q,
           max(value) AS max
    FROM vals GROUP BY metric_order, perspective
    UNION ALL
    SELECT 10, perspective, count(*) FILTER (WHERE cached_tokens IS NOT NULL AND input_tokens > 0),
           count(*) FILTER (WHERE NOT (cached_tokens IS NOT NULL AND input_tokens > 0)),
           sum(cached_tokens) FILTER (WHERE input_tokens > 0)
               / sum(input_tokens) FILTER (WHERE cached_tokens IS NOT NULL AND input_tokens > 0),
           NULL, NULL, NULL, NULL
    FROM ok GROUP BY perspective
)
SELECT metric, perspective, unit, count, null_count, mean, std_pop, min, q[1] AS p50, q[2] AS p90, q[3] AS p95,
       q[4] AS p99, max, 'linear' AS interpolation,
       CASE WHEN count = 0 AND metric_order = 10
            THEN 'no request reports prefix-cache tokens (gen_ai.usage.cache_read.input_tokens)'
            WHEN count = 0 THEN 'no known value of ' || metric END AS null_reason
FROM d JOIN names USING (metric_order)
ORDER BY metric_order, perspective
"""

WINDOW = f"""
WITH {_CANDIDATES}, {_CHUNK_AGG}, {_METRICS},
best AS (
    SELECT * FROM metrics
    QUALIFY row_number() OVER (PARTITION BY trace_id, request_span_id
                               ORDER BY CASE perspective WHEN 'client' THEN 0 WHEN 'server' THEN 1 ELSE 2 END) = 1
),
b AS (SELECT min(s_ns) AS start_ns, max(end_ns) AS end_ns FROM best),
t AS (
    SELECT count(*) AS attempted,
           count(*) FILTER (WHERE outcome = 'succeeded') AS succeeded,
           count(*) FILTER (WHERE outcome = 'failed') AS failed,
           count(*) FILTER (WHERE outcome = 'cancelled') AS cancelled,
           count(*) FILTER (WHERE NOT (r.end_ns >= b.start_ns AND r.end_ns <= b.end_ns)) AS not_finished,
           coalesce(sum(output_tokens) FILTER (WHERE outcome = 'succeeded'), 0) AS tokens
    FROM best r, b WHERE r.s_ns >= b.start_ns AND r.s_ns <= b.end_ns
)
SELECT 'closed_cohort' AS mode, 'best per request (client > server > engine)' AS perspective,
       b.start_ns AS window_start_ns, b.end_ns AS window_end_ns, (b.end_ns - b.start_ns) / 1e9 AS window_s,
       t.attempted, t.succeeded, t.failed, t.cancelled, t.succeeded AS slo_passing,
       t.not_finished AS not_finished_in_window, CAST(NULL AS BIGINT) AS requests_crossing_boundary,
       CASE WHEN b.end_ns > b.start_ns THEN t.succeeded / ((b.end_ns - b.start_ns) / 1e9) END AS request_throughput_rps,
       CASE WHEN b.end_ns > b.start_ns THEN t.succeeded / ((b.end_ns - b.start_ns) / 1e9) END AS observed_goodput_rps,
       CASE WHEN t.attempted > 0 THEN t.failed / CAST(t.attempted AS DOUBLE) END AS error_rate,
       t.tokens AS output_tokens,
       CASE WHEN b.end_ns > b.start_ns THEN t.tokens / ((b.end_ns - b.start_ns) / 1e9) END AS output_tokens_per_s,
       'output tokens (gen_ai.usage.output_tokens) of cohort requests that succeeded' AS token_counting_rule,
       CAST(NULL AS DOUBLE) AS slo_ttft_ms, CAST(NULL AS DOUBLE) AS slo_tpot_ms, CAST(NULL AS DOUBLE) AS slo_e2e_ms
FROM t, b
"""

_PAIRS = """
pair_bounds AS (
    SELECT cl.clock_domain AS client_domain, g.clock_domain AS server_domain, count(*) AS requests,
           max((g.end_ns - cl.end_ns) / 1e6) AS offset_min_ms, min((g.start_ns - cl.start_ns) / 1e6) AS offset_max_ms
    FROM cand cl JOIN cand g ON g.name = 'gateway' AND g.kind = 'SERVER' AND g.trace_id = cl.trace_id
                            AND g.parent_span_id = cl.span_id
    WHERE cl.kind = 'CLIENT'
    GROUP BY ALL
)"""

PHASES = f"""
WITH {_CANDIDATES}, {_CHUNK_AGG}, {_METRICS}, {_PAIRS},
ph AS (
    SELECT trace_id, parent_span_id,
           min(CASE WHEN name = 'tokenize' THEN start_ns END) AS tokenize_start_ns,
           max(CASE WHEN name = 'tokenize' THEN end_ns END) AS tokenize_end_ns,
           min(CASE WHEN name = 'queue' THEN start_ns END) AS queue_start_ns,
           max(CASE WHEN name = 'queue' THEN end_ns END) AS queue_end_ns,
           min(CASE WHEN name = 'prefill' THEN start_ns END) AS prefill_start_ns,
           max(CASE WHEN name = 'prefill' THEN end_ns END) AS prefill_end_ns
    FROM (SELECT trace_id, parent_span_id, name, start_ns, end_ns FROM spans WHERE scope_name = 'tokentrace' AND name = 'tokenize'
          UNION ALL SELECT trace_id, parent_span_id, name, start_ns, end_ns FROM spans WHERE scope_name = 'tokentrace' AND name = 'queue'
          UNION ALL SELECT trace_id, parent_span_id, name, start_ns, end_ns FROM spans WHERE scope_name = 'tokentrace' AND name = 'prefill')
    GROUP BY trace_id, parent_span_id
),
x AS (
    SELECT m.*, ph.* EXCLUDE (trace_id, parent_span_id), o.offset_min_ms, o.offset_max_ms,
           CASE WHEN m.cl_id IS NULL THEN NULL
                WHEN o.offset_min_ms > o.offset_max_ms + 1.0 THEN 'contradiction'
                WHEN o.offset_min_ms > 1.0 OR o.offset_max_ms < -1.0 THEN 'skew_detected'
                ELSE 'consistent' END AS verdict
    FROM metrics m
    LEFT JOIN ph ON ph.trace_id = m.trace_id AND ph.parent_span_id = m.sv_id
    LEFT JOIN pair_bounds o ON o.client_domain = m.client_clock_domain AND o.server_domain = m.server_clock_domain
    WHERE m.perspective = 'server'
),
y AS (
    SELECT *, CASE WHEN cl_id IS NOT NULL AND verdict = 'consistent' THEN 0.0 END AS used,
           (client_first_chunk_ns - client_start_ns) / 1e6 AS ttft,
           (server_first_chunk_ns - server_start_ns) / 1e6 AS server_ttft,
           (tokenize_start_ns - server_start_ns) / 1e6 AS overhead, (tokenize_end_ns - tokenize_start_ns) / 1e6 AS tok,
           (queue_end_ns - queue_start_ns) / 1e6 AS q, (prefill_end_ns - prefill_start_ns) / 1e6 AS pre,
           (server_first_chunk_ns - prefill_end_ns) / 1e6 AS emit
    FROM x
)
SELECT trace_id, request_span_id, client_clock_domain AS client_domain, server_clock_domain AS server_domain,
       ttft AS ttft_ms, (server_start_ns - client_start_ns) / 1e6 - used AS network_in_ms, overhead AS gateway_overhead_ms,
       tok AS tokenize_ms, q AS queue_ms, pre AS prefill_ms, emit AS first_emit_ms,
       (client_first_chunk_ns - server_first_chunk_ns) / 1e6 + used AS network_out_ms,
       ttft - server_ttft AS network_round_trip_ms, server_ttft - (overhead + tok + q + pre + emit) AS residual_ms,
       verdict AS clock_pair_verdict, CAST(NULL AS DOUBLE) AS assumed_offset_ms,
       CASE WHEN cl_id IS NULL THEN 'no client span: network parts and client TTFT unknown'
            WHEN verdict <> 'consistent' THEN 'clock pair ' || verdict || ' (offset bounds '
                 || CAST(round(offset_min_ms, 3) AS VARCHAR) || ' .. ' || CAST(round(offset_max_ms, 3) AS VARCHAR)
                 || ' ms): cross-clock parts need --assume-offset' END AS cross_clock_reason,
       CASE WHEN server_first_chunk_ns IS NULL OR (cl_id IS NOT NULL AND client_first_chunk_ns IS NULL)
                 THEN coalesce(CASE WHEN dropped > 0 THEN 'f/e unknown: ' || CAST(dropped AS VARCHAR)
                                         || ' events dropped by the span event limit'
                                    WHEN any_first_ns IS NULL THEN 'no visible chunk events' END,
                               'first visible chunk unknown')
            WHEN tokenize_start_ns IS NULL OR queue_start_ns IS NULL OR prefill_start_ns IS NULL
                 THEN 'a phase span (tokenize, queue or prefill) is missing' END AS null_reason
FROM y
ORDER BY server_start_ns, trace_id, request_span_id
"""

SKEW_OFFSETS = f"""
WITH {_CANDIDATES}, {_PAIRS}
SELECT client_domain, server_domain, requests, offset_min_ms, offset_max_ms,
       CASE WHEN offset_min_ms > offset_max_ms + 1.0 THEN 'contradiction'
            WHEN offset_min_ms > 1.0 OR offset_max_ms < -1.0 THEN 'skew_detected' ELSE 'consistent' END AS verdict,
       CAST(1.0 AS DOUBLE) AS tolerance_ms, CAST(NULL AS DOUBLE) AS assumed_offset_ms, CAST(NULL AS BOOLEAN) AS assumed_offset_within_bounds
FROM pair_bounds
ORDER BY client_domain, server_domain
"""


def _skew_rules() -> str:
    """queries/skew_rules.sql (written against the canonical tables already) with its one view,
    tt_chunk_events, inlined, and its two parameters at their defaults."""
    root = Path(__file__).resolve().parents[1] / "queries"
    text = "\n".join(line.split("--", 1)[0] for line in (root / "skew_rules.sql").read_text().splitlines())
    chunk_events = ("(SELECT trace_id, span_id, event_index, time_ns, "
                    "coalesce(attr_tokentrace_chunk_index, event_index) AS chunk_index "
                    "FROM span_events WHERE name = 'tokentrace.chunk')")
    text = text.replace("FROM tt_chunk_events e", f"FROM {chunk_events} e")
    return text.replace("$tolerance_ms", "0.0").replace("$trace_id IS NULL", "true").replace(
        "OR trace_id = $trace_id", "").replace("OR s.trace_id = $trace_id", "").replace(
        "OR p.trace_id = $trace_id", "").replace("OR c.trace_id = $trace_id", "")


#: verb -> the floor queries it is compared with (skew runs two, as the verb does).
FLOORS: dict[str, list[str]] = {
    "requests": [REQUESTS],
    "itl": [ITL],
    "summary": [SUMMARY],
    "window": [WINDOW],
    "phases": [PHASES],
    "skew": [_skew_rules(), SKEW_OFFSETS],
}
