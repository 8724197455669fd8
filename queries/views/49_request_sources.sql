-- install: after request_facts
-- request_sources: which adapter claimed each request, by which signature, and how its
-- f/e were obtained. One row per request and perspective of request_facts. See
-- docs/adapters.md; `tokentrace sql "SELECT * FROM request_sources"` lists it.
CREATE OR REPLACE VIEW request_sources AS
WITH adapters (source, perspective, signature, f_e_basis, clock_note) AS (
    VALUES
    ('tokentrace', NULL, 'scope_name = ''tokentrace'' AND (gateway SERVER | root generate | CLIENT span)',
     'tokentrace.chunk events', 'one clock per perspective'),
    ('vllm', 'server', 'name = ''llm_request'' AND attr gen_ai.latency.e2e',
     'derived: s + gen_ai.latency.time_to_first_token / e2e (no chunk events)',
     'mixed: ttft/e2e frontend wall clock, queue/prefill engine monotonic clock'),
    ('vllm', 'engine', 'scope_name = ''tokentrace'' AND name = ''engine_request'' (tokentrace''s vLLM plugin)',
     'tokentrace.chunk events: one per generated token, at the end of the engine step that produced it',
     'engine-core process clock; s = arrival on the frontend''s wall clock (same host)'),
    ('tgi', NULL, 'name IN (generate, generate_stream, chat_completions, completions) AND attr inference_time or parameters',
     'send_generation span starts (else e = s + total_time)',
     'span times wall clock; *_time fields monotonic durations'),
    ('sglang', NULL, 'scope_name = ''sglang server'' AND attr rid',
     'prefill_forward / decode_loop slice ends (scheduler)',
     'root on tokenizer clock, slices on scheduler clock (both wall)'),
    ('openllmetry', NULL, 'kind = CLIENT AND (attr gen_ai.operation.name | llm.request.type), OpenLLMetry scope or llm.request.type',
     'chunk events (gen_ai.content.completion.chunk | gen_ai.completion.chunk | llm.content.completion.chunk) matched by index to the server span''s tokentrace.chunk events (the visible ones); without them a streamed chat''s first event is the role-only chunk, skipped; non-streamed: f = e = span end',
     'one clock (client); server span below in the trace, else paired across traces by gen_ai.response.id / X-Request-ID'),
    ('openai-v2', NULL, 'kind = CLIENT AND attr gen_ai.operation.name, scope opentelemetry.util.genai.handler | opentelemetry.instrumentation.openai_v2',
     'none: openai-v2 writes no chunk events (f/e NULL)',
     'one clock (client); server span below in the trace, else paired across traces by gen_ai.response.id / X-Request-ID'),
    ('genai', NULL, 'kind = CLIENT AND attr gen_ai.operation.name, any other scope',
     'chunk events when written (gen_ai.content.completion.chunk | gen_ai.completion.chunk | llm.content.completion.chunk), read as openllmetry''s',
     'one clock (client); server span below in the trace, else paired across traces by gen_ai.response.id / X-Request-ID')
)
SELECT f.trace_id, f.request_span_id, f.perspective, f.perspective_span_id, f.source,
       a.signature, a.f_e_basis, a.clock_note
FROM request_facts f
LEFT JOIN adapters a ON a.source = f.source AND (a.perspective IS NULL OR a.perspective = f.perspective);
