-- returns: one row per violation of a named clock-skew rule, over every span (rules never
--   edit timestamps; correction is a separate, stated step: --assume-offset):
--   child_starts_before_parent  child.start < parent.start - tolerance
--   child_ends_after_parent     child.end > parent.end + tolerance
--   negative_duration           end < start
--   event_outside_span          an event's time outside [start - tolerance, end + tolerance]
--   decode_steps_overlap        a decode step starts before the previous step (same parent,
--                               by tokentrace.step) ended, beyond the tolerance
--   chunks_out_of_order         a tokentrace.chunk event earlier than the chunk before it
--                               (by chunk index) on the same span
--   Each row names the trace, the span, the related span (parent / previous step), both
--   clock domains, whether they differ, and the magnitude of the violation.
-- param: $tolerance_ms DOUBLE default 0.0 -- violations up to this size are not reported
-- param: $trace_id VARCHAR default NULL -- only this trace (32 lowercase hex); NULL = all
-- units: magnitude_ms milliseconds (always > 0: how far the rule is broken).
WITH sp AS (
    SELECT trace_id, span_id, parent_span_id, name, start_ns, end_ns, clock_domain, scope_name,
           attr_int['tokentrace.step'] AS step
    FROM spans
    WHERE $trace_id IS NULL OR trace_id = $trace_id
),
child_parent AS (
    SELECT c.trace_id, c.span_id, c.name, c.start_ns, c.end_ns, c.clock_domain,
           p.span_id AS parent_span_id, p.start_ns AS parent_start_ns, p.end_ns AS parent_end_ns,
           p.clock_domain AS parent_clock_domain
    FROM sp c
    JOIN sp p ON p.trace_id = c.trace_id AND p.span_id = c.parent_span_id
),
decode_steps AS (
    SELECT trace_id, span_id, name, start_ns, clock_domain,
           lag(span_id) OVER w AS prev_span_id,
           lag(end_ns) OVER w AS prev_end_ns
    FROM sp
    WHERE scope_name = 'tokentrace' AND name = 'decode'
    WINDOW w AS (PARTITION BY trace_id, parent_span_id ORDER BY step, start_ns)
),
chunks AS (
    SELECT e.trace_id, e.span_id, e.chunk_index, e.time_ns,
           lag(e.time_ns) OVER w AS prev_time_ns,
           lag(e.chunk_index) OVER w AS prev_chunk_index
    FROM tt_chunk_events e
    WINDOW w AS (PARTITION BY e.trace_id, e.span_id ORDER BY e.chunk_index, e.event_index)
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
           (end_ns - parent_end_ns) / 1e6, 'ends after its parent'
    FROM child_parent
    WHERE end_ns > parent_end_ns + $tolerance_ms * 1e6
    UNION ALL
    SELECT 'negative_duration', trace_id, span_id, name, NULL, clock_domain, clock_domain,
           (start_ns - end_ns) / 1e6, 'ends before it starts'
    FROM sp
    WHERE end_ns < start_ns
    UNION ALL
    SELECT 'event_outside_span', e.trace_id, e.span_id, s.name, NULL, s.clock_domain, s.clock_domain,
           CASE WHEN e.time_ns < s.start_ns THEN (s.start_ns - e.time_ns) / 1e6
                ELSE (e.time_ns - s.end_ns) / 1e6 END,
           'event ' || e.name || ' #' || CAST(e.event_index AS VARCHAR)
           || CASE WHEN e.time_ns < s.start_ns THEN ' before span start' ELSE ' after span end' END
    FROM span_events e
    JOIN sp s ON s.trace_id = e.trace_id AND s.span_id = e.span_id
    WHERE e.time_ns < s.start_ns - $tolerance_ms * 1e6 OR e.time_ns > s.end_ns + $tolerance_ms * 1e6
    UNION ALL
    SELECT 'decode_steps_overlap', trace_id, span_id, name, prev_span_id, clock_domain, clock_domain,
           (prev_end_ns - start_ns) / 1e6, 'starts before the previous decode step ended'
    FROM decode_steps
    WHERE prev_end_ns IS NOT NULL AND start_ns < prev_end_ns - $tolerance_ms * 1e6
    UNION ALL
    SELECT 'chunks_out_of_order', c.trace_id, c.span_id, s.name, NULL, s.clock_domain, s.clock_domain,
           (c.prev_time_ns - c.time_ns) / 1e6,
           'chunk ' || CAST(c.chunk_index AS VARCHAR) || ' earlier than chunk ' || CAST(c.prev_chunk_index AS VARCHAR)
    FROM chunks c
    JOIN sp s ON s.trace_id = c.trace_id AND s.span_id = c.span_id
    WHERE c.time_ns < c.prev_time_ns
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
    detail
FROM violations
ORDER BY rule, trace_id, span_id, related_span_id;
