-- returns: one row per violation of a named clock-skew rule, over every span (rules never
--   edit timestamps; correction is a separate, stated step: --assume-offset):
--   child_starts_before_parent  child.start < parent.start - tolerance
--   child_ends_after_parent     child.end > parent.end + tolerance; under an HTTP client span
--                               (httpx, aiohttp: it ends when the response headers arrive)
--                               a SERVER child only when it started after that end
--   negative_duration           end < start
--   event_outside_span          an event's time outside [start - tolerance, end + tolerance]
--   decode_steps_overlap        a decode step starts before the previous step (same parent,
--                               by tokentrace.step) ended, beyond the tolerance
--   chunks_out_of_order         a tokentrace.chunk event earlier than the chunk before it
--                               (by chunk index) on the same span
--   Each row names the trace, the span, the related span (parent / previous step), both
--   clock domains, whether they differ, the magnitude of the violation and the finding:
--   context_handoff when a child_ends_after_parent child STARTED after its parent had ended
--   (the parent handed its context to another process or task and finished first: not a
--   clock fault; no clock reading can be checked against the other), else skew_suspect (a
--   clock difference, or an instrumentation fault, explains the violation).
-- param: $tolerance_ms DOUBLE default 0.0 -- violations up to this size are not reported
-- param: $trace_id VARCHAR default NULL -- only this trace (32 lowercase hex); NULL = all
-- units: magnitude_ms milliseconds (always > 0: how far the rule is broken).
-- How it scales (docs/metrics.md, Performance): no rule reads all of `spans` joined to itself
-- or carries trace/span ids through a window. Each rule scans the columns it needs, with
-- the $trace_id filter in the scan; joins build on small sets (the spans that are someone's
-- parent, the spans that carry events) and stream the large side; windows partition by an
-- integer key (dense_rank over the small set of parents / event-carrying spans) and carry
-- integers only. Rows (and duplicates, if a span id repeats) are those of the plain joins.
WITH
-- (trace_id, span_id) of the spans that some span names as its parent: a few per trace
parent_keys AS (
    SELECT DISTINCT trace_id, parent_span_id AS span_id
    FROM spans
    WHERE parent_span_id IS NOT NULL AND ($trace_id IS NULL OR trace_id = $trace_id)
),
-- http_client: an HTTP CLIENT span of an HTTP library's instrumentation (http.request.method
-- or the older http.method, no gen_ai operation): httpx / httpx2 / aiohttp end it when the
-- response HEADERS arrive, while a streamed body goes on for seconds. It is no witness for
-- the end of the server span below it; the server must still have started before the client
-- had its headers (a SERVER child that starts after such a parent ended is reported).
parents AS (
    SELECT p.trace_id, p.span_id, p.start_ns, p.end_ns, p.clock_domain,
           p.kind = 'CLIENT'
             AND (p.attr_str['http.request.method'] IS NOT NULL OR p.attr_str['http.method'] IS NOT NULL)
             AND p.attr_str['gen_ai.operation.name'] IS NULL AS http_client
    FROM spans p
    JOIN parent_keys k ON k.trace_id = p.trace_id AND k.span_id = p.span_id
    WHERE $trace_id IS NULL OR p.trace_id = $trace_id
),
child_parent AS (
    SELECT c.trace_id, c.span_id, c.name, c.start_ns, c.end_ns, c.clock_domain,
           p.span_id AS parent_span_id, p.start_ns AS parent_start_ns, p.end_ns AS parent_end_ns,
           p.clock_domain AS parent_clock_domain,
           p.http_client AND c.kind = 'SERVER' AS header_time_parent
    FROM spans c
    JOIN parents p ON p.trace_id = c.trace_id AND p.span_id = c.parent_span_id
    WHERE c.parent_span_id IS NOT NULL AND ($trace_id IS NULL OR c.trace_id = $trace_id)
      AND (c.start_ns < p.start_ns - $tolerance_ms * 1e6 OR c.end_ns > p.end_ns + $tolerance_ms * 1e6)
),
-- decode steps, numbered per (trace, parent) by an integer key; the window carries no trace id
decode_parents AS (
    SELECT trace_id, parent_span_id, dense_rank() OVER (ORDER BY trace_id, parent_span_id) AS parent_key
    FROM (
        SELECT DISTINCT trace_id, parent_span_id
        FROM spans
        WHERE scope_name = 'tokentrace' AND name = 'decode' AND ($trace_id IS NULL OR trace_id = $trace_id)
    ) d
),
decode_steps AS (
    SELECT k.parent_key, d.span_id, d.start_ns, d.clock_domain,
           lag(d.span_id) OVER w AS prev_span_id,
           lag(d.end_ns) OVER w AS prev_end_ns
    FROM (
        -- the step projected before the window (its dedicated column, docs/tables.md)
        SELECT trace_id, span_id, parent_span_id, start_ns, end_ns, clock_domain,
               attr_tokentrace_step AS step
        FROM spans
        WHERE scope_name = 'tokentrace' AND name = 'decode' AND ($trace_id IS NULL OR trace_id = $trace_id)
    ) d
    JOIN decode_parents k ON k.trace_id = d.trace_id AND k.parent_span_id IS NOT DISTINCT FROM d.parent_span_id
    WINDOW w AS (PARTITION BY k.parent_key ORDER BY d.step, d.start_ns)
),
overlapping_steps AS (
    SELECT k.trace_id, s.span_id, s.start_ns, s.clock_domain, s.prev_span_id, s.prev_end_ns
    FROM decode_steps s
    JOIN decode_parents k ON k.parent_key = s.parent_key
    WHERE s.prev_end_ns IS NOT NULL AND s.start_ns < s.prev_end_ns - $tolerance_ms * 1e6
),
-- the spans that carry events: their first and last event time and an integer key
event_spans AS (
    SELECT trace_id, span_id, min(time_ns) AS first_event_ns, max(time_ns) AS last_event_ns,
           dense_rank() OVER (ORDER BY trace_id, span_id) AS event_span_key
    FROM span_events
    WHERE $trace_id IS NULL OR trace_id = $trace_id
    GROUP BY trace_id, span_id
    -- always true; a filter lowers DuckDB's row estimate for this CTE below that of `spans`,
    -- so the join below builds on these few rows and streams `spans` (without it, it built a
    -- hash table of every span)
    HAVING count(*) > 0
),
-- span rows with an event outside [start - tolerance, end + tolerance] (usually none): only
-- their events are read again
outside_spans AS (
    SELECT s.trace_id, s.span_id, s.name, s.start_ns, s.end_ns, s.clock_domain
    FROM spans s
    JOIN event_spans k ON k.trace_id = s.trace_id AND k.span_id = s.span_id
    WHERE ($trace_id IS NULL OR s.trace_id = $trace_id)
      AND (k.first_event_ns < s.start_ns - $tolerance_ms * 1e6 OR k.last_event_ns > s.end_ns + $tolerance_ms * 1e6)
),
chunks AS (
    SELECT k.event_span_key, e.chunk_index, e.time_ns,
           lag(e.time_ns) OVER w AS prev_time_ns,
           lag(e.chunk_index) OVER w AS prev_chunk_index
    FROM tt_chunk_events e
    JOIN event_spans k ON k.trace_id = e.trace_id AND k.span_id = e.span_id
    WINDOW w AS (PARTITION BY k.event_span_key ORDER BY e.chunk_index, e.event_index)
),
late_chunks AS (
    SELECT k.trace_id, k.span_id, c.chunk_index, c.time_ns, c.prev_time_ns, c.prev_chunk_index
    FROM chunks c
    JOIN event_spans k ON k.event_span_key = c.event_span_key
    WHERE c.time_ns < c.prev_time_ns
),
violations AS (
    SELECT 'child_starts_before_parent' AS rule, trace_id, span_id, name AS span_name,
           parent_span_id AS related_span_id, clock_domain AS domain, parent_clock_domain AS related_domain,
           (parent_start_ns - start_ns) / 1e6 AS magnitude_ms,
           'starts before its parent' AS detail
    FROM child_parent
    WHERE start_ns < parent_start_ns - $tolerance_ms * 1e6
    UNION ALL
    SELECT 'child_ends_after_parent', trace_id, span_id, name, parent_span_id, clock_domain, parent_clock_domain,
           CASE WHEN header_time_parent THEN (start_ns - parent_end_ns) / 1e6 ELSE (end_ns - parent_end_ns) / 1e6 END,
           CASE WHEN header_time_parent
                THEN 'started ' || CAST(round((start_ns - parent_end_ns) / 1e6, 3) AS VARCHAR)
                     || ' ms after its HTTP client parent had its response headers: the server answered '
                     || 'before it started'
                WHEN start_ns >= parent_end_ns
                THEN 'started ' || CAST(round((start_ns - parent_end_ns) / 1e6, 3) AS VARCHAR)
                     || ' ms after its parent had ended: the parent''s context was handed off (to another '
                     || 'process or task, as vLLM hands its workers a context through the environment), '
                     || 'not a clock fault'
                ELSE 'ends after its parent' END
    FROM child_parent
    WHERE end_ns > parent_end_ns + $tolerance_ms * 1e6
      -- below an HTTP client span (ended at the response headers) only a server span that
      -- started after those headers arrived is a violation
      AND (NOT header_time_parent OR start_ns > parent_end_ns + $tolerance_ms * 1e6)
    UNION ALL
    SELECT 'negative_duration', trace_id, span_id, name, NULL, clock_domain, clock_domain,
           (start_ns - end_ns) / 1e6, 'ends before it starts'
    FROM spans
    WHERE end_ns < start_ns AND ($trace_id IS NULL OR trace_id = $trace_id)
    UNION ALL
    SELECT 'event_outside_span', e.trace_id, e.span_id, s.name, NULL, s.clock_domain, s.clock_domain,
           CASE WHEN e.time_ns < s.start_ns THEN (s.start_ns - e.time_ns) / 1e6
                ELSE (e.time_ns - s.end_ns) / 1e6 END,
           'event ' || e.name || ' #' || CAST(e.event_index AS VARCHAR)
           || CASE WHEN e.time_ns < s.start_ns THEN ' before span start' ELSE ' after span end' END
    FROM span_events e
    JOIN outside_spans s ON s.trace_id = e.trace_id AND s.span_id = e.span_id
    WHERE e.time_ns < s.start_ns - $tolerance_ms * 1e6 OR e.time_ns > s.end_ns + $tolerance_ms * 1e6
    UNION ALL
    SELECT 'decode_steps_overlap', trace_id, span_id, 'decode', prev_span_id, clock_domain, clock_domain,
           (prev_end_ns - start_ns) / 1e6, 'starts before the previous decode step ended'
    FROM overlapping_steps
    UNION ALL
    SELECT 'chunks_out_of_order', c.trace_id, c.span_id, s.name, NULL, s.clock_domain, s.clock_domain,
           (c.prev_time_ns - c.time_ns) / 1e6,
           'chunk ' || CAST(c.chunk_index AS VARCHAR) || ' earlier than chunk ' || CAST(c.prev_chunk_index AS VARCHAR)
    FROM late_chunks c
    JOIN spans s ON s.trace_id = c.trace_id AND s.span_id = c.span_id
    WHERE $trace_id IS NULL OR s.trace_id = $trace_id
)
SELECT
    rule,
    trace_id,
    span_id,
    span_name,
    related_span_id,
    domain,
    related_domain,
    coalesce(domain <> related_domain, false) AS cross_domain,
    magnitude_ms,
    detail,
    CASE WHEN rule = 'child_ends_after_parent' AND detail LIKE 'started % ms after its parent had ended%'
         THEN 'context_handoff'
         ELSE 'skew_suspect' END AS finding
FROM violations
ORDER BY rule, trace_id, span_id, related_span_id;
