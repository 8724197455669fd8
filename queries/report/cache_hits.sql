-- returns: prompt-cache hits, one row: over the prefill spans that record
--   tokentrace.cached_tokens (tokentrace's engines: on each request's first prefill span, the
--   prompt tokens reused from a cache; later chunks of a chunked prefill record 0),
--   requests_recorded = first prefill spans carrying it (one per request), cache_hit_requests
--   = those with cached_tokens > 0, cached_prompt_tokens, and cached_token_fraction =
--   cached / (cached + the prompt tokens the prefill computed, tokentrace.input_tokens of every
--   prefill span carrying it). No such span: counts 0, figures NULL and null_reason says why.
-- units: requests and tokens counts; cached_token_fraction a fraction (0..1).
WITH prefill AS (
    SELECT attr_int['tokentrace.cached_tokens'] AS cached_tokens,
           attr_int['tokentrace.input_tokens'] AS computed_tokens,
           coalesce(attr_int['tokentrace.prefill.chunk'], 0) AS chunk
    FROM spans
    WHERE name = 'prefill' AND attr_int['tokentrace.cached_tokens'] IS NOT NULL
)
SELECT
    count(*) FILTER (WHERE chunk = 0) AS requests_recorded,
    count(*) FILTER (WHERE chunk = 0 AND cached_tokens > 0) AS cache_hit_requests,
    sum(cached_tokens) AS cached_prompt_tokens,
    sum(cached_tokens) / nullif(sum(cached_tokens) + sum(computed_tokens), 0) AS cached_token_fraction,
    CASE WHEN count(*) = 0 THEN
        'no prefill span carries tokentrace.cached_tokens: this producer does not record prompt-cache hits'
    END AS null_reason
FROM prefill;
