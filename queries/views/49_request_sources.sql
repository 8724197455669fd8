-- install: after request_facts
-- request_sources: which adapter claimed each request, by which signature, and how its
-- f/e were obtained. One row per request and perspective of request_facts. See
-- docs/adapters.md; `tokentrace sql "SELECT * FROM request_sources"` lists it.
CREATE OR REPLACE VIEW request_sources AS
WITH adapters (source, signature, f_e_basis, clock_note) AS (
    VALUES
    ('tokentrace', 'scope_name = ''tokentrace'' AND (gateway SERVER | root generate | CLIENT span)',
     'tokentrace.chunk events', 'one clock per perspective'),
    ('vllm', 'name = ''llm_request'' AND attr gen_ai.latency.e2e',
     'derived: s + gen_ai.latency.time_to_first_token / e2e (no chunk events)',
     'mixed: ttft/e2e frontend wall clock, queue/prefill engine monotonic clock'),
    ('tgi', 'name IN (generate, generate_stream, chat_completions, completions) AND attr inference_time or parameters',
     'send_generation span starts (else e = s + total_time)',
     'span times wall clock; *_time fields monotonic durations'),
    ('sglang', 'scope_name = ''sglang server'' AND attr rid',
     'prefill_forward / decode_loop slice ends (scheduler)',
     'root on tokenizer clock, slices on scheduler clock (both wall)'),
    ('openllmetry', 'kind = CLIENT AND (attr gen_ai.operation.name | llm.request.type), OpenLLMetry scope or llm.request.type',
     'chunk events (gen_ai.content.completion.chunk | gen_ai.completion.chunk | llm.content.completion.chunk) matched by index to the server span''s tokentrace.chunk events (the visible ones); without them a streamed chat''s first event is the role-only chunk, skipped; non-streamed: f = e = span end',
     'one clock (client); server span below in the trace, else paired across traces by gen_ai.response.id / X-Request-ID'),
    ('openai-v2', 'kind = CLIENT AND attr gen_ai.operation.name, scope opentelemetry.util.genai.handler | opentelemetry.instrumentation.openai_v2',
     'none: openai-v2 writes no chunk events (f/e NULL)',
     'one clock (client); server span below in the trace, else paired across traces by gen_ai.response.id / X-Request-ID'),
    ('genai', 'kind = CLIENT AND attr gen_ai.operation.name, any other scope',
     'chunk events when written (gen_ai.content.completion.chunk | gen_ai.completion.chunk | llm.content.completion.chunk), read as openllmetry''s',
     'one clock (client); server span below in the trace, else paired across traces by gen_ai.response.id / X-Request-ID')
)
SELECT f.trace_id, f.request_span_id, f.perspective, f.perspective_span_id, f.source,
       a.signature, a.f_e_basis, a.clock_note
FROM request_facts f
LEFT JOIN adapters a ON a.source = f.source;
