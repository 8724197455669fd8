"""What each public view means (queries/views/*.sql; formulas in docs/metrics.md): one line
per view and per column, units named. Part of :mod:`analyzer.db.catalog` (the tables, and
``CATALOG`` over both), kept apart for its length. Plain ASCII text.

s, f, e: a request's start, first and last visible output chunk on one clock; O: output
tokens (docs/metrics.md).
"""

from __future__ import annotations

__all__ = ["VIEWS"]

_NS = "ns since epoch"

#: The columns that name a request perspective, in every per-request view.
_REQUEST = {
    "source": "adapter that claimed the request: tokentrace, vllm, tgi, sglang, openllmetry, openai-v2, genai",
    "perspective": "client (the CLIENT span's clock), server (the server span's) or engine (the engine span's)",
    "trace_id": "the request's trace (the server span's in every perspective, when there is one)",
    "request_span_id": "with trace_id, the request: the server span's id, else the perspective's span",
}

_FACTS = {
    **_REQUEST,
    "perspective_span_id": "the span this row's times come from",
    "server_span_id": "the request's server span (gateway, llm_request, ...); NULL when not traced",
    "client_span_id": "the request's CLIENT span; NULL when not traced",
    "clock_domain": "clock domain of the perspective's span (service.name|instance.id|host.name)",
    "server_clock_domain": "clock domain of the server span",
    "client_clock_domain": "clock domain of the client span",
    "s_ns": f"s: the request's start on the perspective's clock (its span's start), {_NS}",
    "f_ns": f"f: the first visible output chunk, {_NS}; NULL when unknown (null_reason)",
    "e_ns": f"e: the last visible output chunk, {_NS}; NULL when unknown (null_reason)",
    "end_ns": f"the perspective span's end (after trailing finish metadata), {_NS}",
    "input_tokens": "I: prompt tokens (gen_ai.usage.input_tokens or prompt_tokens)",
    "cached_tokens": "prompt tokens served from a prefix cache; NULL: the source reports none",
    "output_tokens": "O: output tokens (gen_ai.usage.output_tokens, else visible chunk tokens)",
    "generated_tokens": "G: tokens the engine generated, a final stop token included",
    "visible_chunks": "visible output chunks on the perspective's span",
    "visible_chunk_tokens": "tokens in the visible output chunks",
    "finish_reason": "first finish reason (stop, length, cancelled, error, ...); NULL when not reported",
    "status_code": "the perspective span's status: UNSET, OK or ERROR",
    "server_status_code": "the server span's status: UNSET, OK or ERROR",
    "error_type": "error.type of a failed request; NULL otherwise",
    "server_start_ns": f"server span start (arrival), {_NS}, server clock",
    "server_end_ns": f"server span end, {_NS}, server clock",
    "client_start_ns": f"client span start (send), {_NS}, client clock",
    "client_end_ns": f"client span end, {_NS}, client clock",
    "server_first_chunk_ns": f"first visible chunk on the server span, {_NS}, server clock",
    "client_first_chunk_ns": f"first visible chunk on the client span, {_NS}, client clock",
    "tokenize_start_ns": f"tokenize span start, {_NS}, server clock",
    "tokenize_end_ns": f"tokenize span end, {_NS}, server clock",
    "queue_start_ns": f"queue span start, {_NS}, server clock",
    "queue_end_ns": f"queue span end, {_NS}, server clock",
    "prefill_start_ns": f"start of the first prefill span, {_NS}, server clock",
    "prefill_end_ns": f"end of the last prompt prefill span, {_NS}, server clock",
    "kv_bytes_per_token": "KV cache bytes per token (tokentrace.kv.bytes_per_token), bytes",
    "prompt_kv_bytes": "KV cache after the prompt (prefill's tokentrace.kv.bytes), bytes",
    "stop_kv_bytes": "KV cache after the last decode step, bytes; NULL when that step has no span",
    "physical_kv_bytes": "paged KV blocks held at the request's end x bytes per block, bytes",
    "kv_layout": "attention layout of the KV figures: mha, gqa, mqa or unsupported:<reason>",
    "decode_spans": "decode spans traced for the request",
    "synthetic": "true for a synthetic trace (tokentrace.synthetic), not a measured one",
    "response_id": "id the server returned (gen_ai.response.id; vLLM, SGLang: gen_ai.request.id)",
    "client_request_id": "id the client sent (X-Request-ID: tokentrace.client_request_id)",
    "request_id_note": "where response_id and client_request_id came from, or why they are NULL",
    "sampling_reason": "a keep policy's decision: head (random sample), the rule that kept it, or summary; "
                       "NULL: no policy",
    "output_tokens_basis": "the attribute or rule output_tokens was read from",
    "null_reason": "why a figure of the row is NULL (every reason, joined by '; '); NULL when none is",
}

_METRICS = {
    **{name: _FACTS[name] for name in (
        "source", "perspective", "trace_id", "request_span_id", "perspective_span_id", "server_span_id",
        "client_span_id", "clock_domain", "server_clock_domain", "client_clock_domain", "s_ns", "f_ns", "e_ns",
        "end_ns", "input_tokens", "cached_tokens")},
    "cache_reporting": "cached_tokens reported and input_tokens > 0: counted in prefix-cache figures",
    **{name: _FACTS[name] for name in (
        "output_tokens", "generated_tokens", "visible_chunks", "finish_reason", "status_code", "error_type")},
    "outcome": "succeeded, failed (error finish reason or ERROR status) or cancelled",
    "ttft_ms": "time to first token: (f - s) / 1e6, ms; NULL when unknown or skew_suspect",
    "e2e_ms": "end to end: (e - s) / 1e6, ms (to the last visible chunk)",
    "tpot_ms": "time per output token: (e2e - ttft) / (O - 1), ms; NULL when O <= 1 or e <= f",
    "decode_output_tokens_per_second": "decode-only rate: (O - 1) / (e - f), tokens/s; NULL when O <= 1 or e <= f",
    "whole_request_output_tokens_per_second": "whole-request rate: O / (e - s), tokens/s; NULL when e <= s",
    "kv_bytes_per_token": _FACTS["kv_bytes_per_token"],
    "prompt_kv_bytes": _FACTS["prompt_kv_bytes"],
    "prompt_kv_mib": "prompt_kv_bytes / 2^20, MiB",
    "stop_kv_bytes": "KV cache after the last decode step (the prompt's with one generated token), bytes",
    "stop_kv_mib": "stop_kv_bytes / 2^20, MiB",
    "physical_kv_bytes": _FACTS["physical_kv_bytes"],
    "physical_kv_mib": "physical_kv_bytes / 2^20, MiB",
    "kv_null_reason": "why a KV figure of the row is NULL (every reason, joined by '; ')",
    **{name: _FACTS[name] for name in (
        "synthetic", "response_id", "client_request_id", "request_id_note", "sampling_reason",
        "output_tokens_basis")},
    "null_reason": "why each NULL metric of the row is NULL (every reason, joined by '; '); NULL: none",
}

_CHUNKS = {
    "trace_id": _REQUEST["trace_id"],
    "request_span_id": _REQUEST["request_span_id"],
    "perspective": _REQUEST["perspective"],
    "source": _REQUEST["source"],
    "chunk_index": "the chunk's position (tokentrace.chunk.index, else its event index)",
    "time_ns": f"when the chunk was written or received, {_NS}, the perspective's clock",
    "chunk_tokens": "tokens in the chunk",
    "events_dropped": "events the carrying span dropped; > 0: the gaps around lost chunks are unknown",
}

_GAPS = {
    **_REQUEST,
    "gap_index": "1-based gap number within the request perspective",
    "chunk_index": "the later chunk's index",
    "prev_time_ns": f"the previous visible chunk's time, {_NS}",
    "time_ns": f"this visible chunk's time, {_NS}",
    "chunk_tokens": "tokens in the later chunk",
    "itl_ms": "inter-token latency: (time_ns - prev_time_ns) / 1e6, ms per chunk gap",
    "itl_per_token_ms": "itl_ms / chunk_tokens, ms per token (differs from itl_ms when chunks carry several)",
    "null_reason": "why itl_ms or itl_per_token_ms is NULL (events dropped, a chunk without tokens)",
    "request_key": "integer key of the request perspective (view request_keys): orders the gaps",
}

_CLOCK_OFFSETS = {
    "trace_id": _REQUEST["trace_id"],
    "request_span_id": _REQUEST["request_span_id"],
    "client_domain": "the client span's clock domain",
    "server_domain": "the server span's clock domain",
    "offset_lower_ms": "theta >= server end - client end, ms; NULL for a cancelled request",
    "offset_upper_ms": "theta <= server start - client start, ms",
}

_PAIR_OFFSETS = {
    "client_domain": "the client clock domain",
    "server_domain": "the server clock domain",
    "requests": "requests of the pair with both a client and a server span",
    "offset_min_ms": "the largest lower bound on theta (server clock - client clock), ms",
    "offset_max_ms": "the smallest upper bound on theta, ms (below offset_min_ms: a contradiction)",
}

_STEP_ID = {
    "clock_domain": "the engine process's clock domain; with step it names the step",
    "step": "engine step id (tokentrace.engine.step), increasing within one engine process",
}

_ENGINE_STEPS = {
    **_STEP_ID,
    "start_ns": f"scheduler start of the step, {_NS}, engine clock",
    "end_ns": f"the step's tokens handed over (their emission time), {_NS}, engine clock",
    "step_ms": "(end_ns - start_ns) / 1e6, ms",
    "schedule_ms": "scheduling inside the step (tokentrace.engine.schedule_ns / 1e6), ms",
    "execute_ms": "step_ms - schedule_ms: forward, sampling and hand-over, ms",
    "device_ms": "CUDA time of the step's forward and sampling, ms; NULL where not measured (CPU)",
    "batch_size": "sequences in the step",
    "scheduled_tokens": "tokens computed in the step: prefill chunk tokens + 1 per decoding sequence",
    "prefill_tokens": "prompt tokens computed in the step",
    "decode_tokens": "scheduled_tokens - prefill_tokens",
    "prefill_tokens_bucket": "prefill_tokens bucket: 0, 1-128, 129-1024, >1024 (view prefill_token_buckets)",
    "prefill_bucket_order": "the prefill bucket's order, 1..4",
    "scheduled_tokens_bucket": "scheduled_tokens bucket: 1-16, 17-128, 129-1024, >1024",
    "scheduled_bucket_order": "the scheduled bucket's order, 1..4",
    "waiting": "sequences the scheduler left waiting",
    "kv_blocks_used": "paged KV cache blocks in use at scheduling, blocks",
    "kv_blocks_total": "paged KV cache blocks in the cache, blocks",
    "kv_block_tokens": "tokens per KV block",
    "kv_used_fraction": "kv_blocks_used / kv_blocks_total, fraction",
    "spec_draft_tokens": "speculative draft tokens verified in the step (0 when none)",
    "spec_accepted_tokens": "speculative draft tokens accepted in the step (0 when none)",
    "step_spans": "engine_step spans with this (clock_domain, step): 1 unless two engines share an id",
    "trace_id": "trace of the engine_step span",
    "span_id": "the engine_step span",
    "engine_span_id": "the engine root span above it",
}

_STEP_REQUESTS = {
    **_STEP_ID,
    "trace_id": "trace of the request span",
    "request_span_id": "the request: the span's parent (the gateway span, or a root generate)",
    "span_id": "the prefill chunk span or decode span",
    "phase": "prefill or decode",
    "tokens": "tokens it computed in the step: the prefill chunk's prompt tokens; decode: 1 + drafts",
    "prefill_chunk": "0-based prefill chunk number (tokentrace.prefill.chunk); NULL for decode",
    "decode_step": "the request's decode step k (tokentrace.step); NULL for prefill",
    "start_ns": f"span start, {_NS}, engine clock",
    "end_ns": f"span end, {_NS}, engine clock",
}

_STEP_GAPS = {
    "trace_id": "the request's trace",
    "request_span_id": "the request (parent of its prefill and decode spans)",
    "clock_domain": "the decode span's clock domain (the engine's)",
    "token_index": "n: the generated token (2..G) the gap ends at",
    "decode_step": "the decode step k that emitted token n (n = k + 1; speculative: k + 2 ..)",
    "prev_emit_ns": f"emission of token n - 1 (its span's end), {_NS}, engine clock",
    "emit_ns": f"emission of token n (its span's end), {_NS}, engine clock",
    "itl_ms": "(emit_ns - prev_emit_ns) / 1e6, ms; NULL when token n - 1's span is missing",
    "step": "the engine step that produced token n",
    "prev_step": "the engine step that produced token n - 1",
    "steps_in_gap": "step - prev_step (1: consecutive steps; 0: the same step, speculative decoding)",
    "between_steps_ms": "step start - prev_emit_ns, ms: loop time before the step (itl = this + step_ms)",
    "step_ms": "the producing step's duration, ms",
    "batch_size": "the producing step's batch size, sequences",
    "scheduled_tokens": "tokens the producing step computed",
    "prefill_tokens": "prompt tokens the producing step computed (other sequences' prompts)",
    "prefill_tokens_bucket": "the producing step's prefill bucket: 0, 1-128, 129-1024, >1024",
    "prefill_bucket_order": "the prefill bucket's order, 1..4",
    "waiting": "sequences left waiting at the producing step",
    "kv_blocks_used": "KV blocks in use at the producing step, blocks",
    "kv_blocks_total": "KV blocks in the cache at the producing step, blocks",
    "step_null_reason": "why the step columns are NULL (no step data, ambiguous or missing step)",
    "itl_null_reason": "why itl_ms is NULL (no prefill span, the previous token's span missing)",
    "null_reason": "every reason of the row, joined by '; '; NULL when none",
}

_SOURCES = {
    **{name: _FACTS[name] for name in ("trace_id", "request_span_id", "perspective", "perspective_span_id", "source")},
    "signature": "the adapter's rule for which spans it claims",
    "f_e_basis": "how f and e were obtained (chunk events, derived from latencies, slice ends, ...)",
    "clock_note": "which clocks the row's times are on",
}

_BUCKETS = {
    "bucket_order": "the bucket's order, 1..4",
    "bucket": "the bucket's label",
    "min_tokens": "lower bound, tokens (inclusive)",
    "max_tokens": "upper bound, tokens (inclusive); NULL: no upper bound",
}

#: Public views, in the order `tokentrace tables` lists them: name -> (meaning, columns).
VIEWS: dict[str, tuple[str, dict[str, str]]] = {
    "request_metrics": ("one row per request and perspective: TTFT, E2E, TPOT, token rates, KV, outcome",
                        _METRICS),
    "request_gaps": ("one row per gap between consecutive visible chunks of a request perspective: ITL",
                     _GAPS),
    "request_facts": ("one row per request and perspective from every adapter: s, f, e, tokens, phases, ids",
                      _FACTS),
    "request_chunks": ("one row per visible output chunk of a request perspective (every adapter)", _CHUNKS),
    "request_sources": ("one row per request and perspective: which adapter claimed it, how f/e were read",
                        _SOURCES),
    "request_clock_offsets": ("per request with client and server spans: bounds on server clock - client clock",
                              _CLOCK_OFFSETS),
    "clock_pair_offsets": ("per (client, server) clock-domain pair: offset bounds over all its requests",
                           _PAIR_OFFSETS),
    "engine_steps": ("one row per engine_step span: one batched forward, what it held and took", _ENGINE_STEPS),
    "engine_step_requests": ("one row per prefill chunk or decode span that names an engine step",
                             _STEP_REQUESTS),
    "request_step_gaps": ("one row per generated token after the first, joined to the step that emitted it",
                          _STEP_GAPS),
    "prefill_token_buckets": ("the buckets of a step's prefill tokens: 0, 1-128, 129-1024, >1024", _BUCKETS),
    "scheduled_token_buckets": ("the buckets of a step's scheduled tokens: 1-16, 17-128, 129-1024, >1024",
                                _BUCKETS),
}
