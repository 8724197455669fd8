"""Helpers of the vLLM plugin tests: run vLLM + the plugin, drive a small load, read the spans,
and the invariants every such run must satisfy (tests/test_vllm_plugin*.py, docs/spans.md "vLLM").

A run is three files in one folder: ``tokentrace.jsonl`` (the plugin's OTLP/JSON lines),
``vllm/`` (vLLM's own spans as ``tokentrace collect`` wrote them) and ``client.json`` (what the
client sent and the usage vLLM answered). When the plugin sends over OTLP to the same collector
as vLLM (``transport`` ``grpc`` / ``http``), ``vllm/`` holds both, and ``tokentrace.jsonl`` is
written afterwards from what reached the collector under the plugin's scope (``split_plugin_spans``).
"""

from __future__ import annotations

import gzip
import json
import os
import secrets
import signal
import subprocess
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
VLLM_PYTHON = REPO / ".venv-vllm" / "bin" / "python"
MAX_TOKENS = 12
# a prompt longer than one KV block (128 tokens on vLLM's CPU backend): the second identical
# request finds its first block in the prefix cache
LONG_PROMPT = " ".join(f"Item {i}: the sea, the sky and the mountains." for i in range(30)) + " Summarise."


@dataclass
class Span:
    name: str
    trace_id: str
    span_id: str
    parent_id: str
    start_ns: int
    end_ns: int
    scope: str
    attrs: dict[str, Any]
    events: list[tuple[str, int, dict[str, Any]]] = field(default_factory=list)


def _value(v: dict[str, Any]) -> Any:
    if "arrayValue" in v:
        return [_value(x) for x in v["arrayValue"].get("values", [])]
    (kind, raw), = v.items()
    return int(raw) if kind == "intValue" else raw


def read_spans(paths: list[Path]) -> list[Span]:
    """Every span of the OTLP/JSON lines files ``paths``. A last line with no newline yet is
    one the exporter is still writing (a line longer than its write buffer reaches the file in
    pieces): it is left for the next read. A ``.gz`` file is read through gzip."""
    spans: list[Span] = []
    for path in paths:
        text = gzip.decompress(path.read_bytes()).decode() if path.suffix == ".gz" else path.read_text()
        for line in text.splitlines(keepends=True):
            if not line.endswith("\n") or not line.strip():
                continue
            for rs in json.loads(line).get("resourceSpans", []):
                for ss in rs.get("scopeSpans", []):
                    scope = ss.get("scope", {}).get("name", "")
                    for s in ss.get("spans", []):
                        attrs = {a["key"]: _value(a["value"]) for a in s.get("attributes", [])}
                        events = [(e["name"], int(e["timeUnixNano"]),
                                   {a["key"]: _value(a["value"]) for a in e.get("attributes", [])})
                                  for e in s.get("events", [])]
                        spans.append(Span(s["name"], s["traceId"], s["spanId"], s.get("parentSpanId", ""),
                                          int(s["startTimeUnixNano"]), int(s["endTimeUnixNano"]), scope, attrs, events))
    return spans


PLUGIN_SCOPE = "tokentrace"  # the instrumentation scope of every span the plugin writes


def plugin_and_vllm_spans(folder: Path) -> tuple[list[Span], list[Span]]:
    """(the plugin's spans, vLLM's own) of a run so far: the plugin's from ``tokentrace.jsonl``
    when it wrote that file, else from the collector's files under its scope."""
    collected = read_spans(sorted((folder / "vllm").glob("*.jsonl")))
    theirs = [s for s in collected if s.scope != PLUGIN_SCOPE]
    if (folder / "tokentrace.jsonl").exists():
        return read_spans([folder / "tokentrace.jsonl"]), theirs
    return [s for s in collected if s.scope == PLUGIN_SCOPE], theirs


def split_plugin_spans(folder: Path) -> int:
    """Write ``tokentrace.jsonl`` from the collector's files: each line's scopes of the plugin
    only (what reached the collector over OTLP, as it arrived). Returns the spans written."""
    written = 0
    with open(folder / "tokentrace.jsonl", "w") as out:
        for path in sorted((folder / "vllm").glob("*.jsonl")):
            for line in path.read_text().splitlines():
                if not line.strip():
                    continue
                kept = []
                for rs in json.loads(line).get("resourceSpans", []):
                    scopes = [ss for ss in rs.get("scopeSpans", []) if ss.get("scope", {}).get("name") == PLUGIN_SCOPE]
                    if scopes:
                        kept.append({**rs, "scopeSpans": scopes})
                        written += sum(len(ss.get("spans", [])) for ss in scopes)
                if kept:
                    out.write(json.dumps({"resourceSpans": kept}) + "\n")
    return written


def run_spans(folder: Path) -> tuple[list[Span], list[Span], dict[str, Any]]:
    """(plugin spans, vLLM's own spans, client record) of a saved run."""
    ours, theirs = plugin_and_vllm_spans(folder)
    return ours, theirs, json.loads((folder / "client.json").read_text())


def check_run(ours: list[Span], theirs: list[Span], client: dict[str, Any], *, repeated_prompt: bool = True,
              ) -> dict[str, int]:
    """Assert the invariants of docs/spans.md "vLLM" on a run; returns counts for the caller.
    ``repeated_prompt``: the run sent one prompt twice (the load run; the preemption run does not),
    whose second request must report cached tokens."""
    by_id = {s.span_id: s for s in ours}
    requests = {s.attrs["gen_ai.request.id"]: s for s in ours if s.name == "engine_request"}
    children: dict[str, list[Span]] = {}
    for s in ours:
        if s.name in ("queue", "prefill", "decode"):
            children.setdefault(s.parent_id, []).append(s)
    sent = client["requests"]
    assert sent and set(r["vllm_id"] for r in sent) <= set(requests), "a request the client sent has no engine_request"
    for r in sent:
        req = requests[r["vllm_id"]]
        kids = children.get(req.span_id, [])
        decodes = [k for k in kids if k.name == "decode"]
        prefills = [k for k in kids if k.name == "prefill"]
        assert [k.name for k in kids].count("queue") == 1, r["vllm_id"]
        if r["kind"] == "disconnect":
            assert req.attrs["gen_ai.response.finish_reasons"] == ["cancelled"], req.attrs
            assert all(d.end_ns <= req.end_ns for d in decodes), "a decode span after the abort"
            assert req.attrs["tokentrace.generated_tokens"] < r["max_tokens"]
            continue
        usage = r["usage"]
        assert req.attrs["tokentrace.generated_tokens"] == usage["completion_tokens"], r["vllm_id"]
        # a preempted request's recomputed prefill (one chunk here) emits a token, not a decode step
        recomputes = [p for p in prefills if p.attrs["tokentrace.prefill.recompute"]]
        preempted = [e for e in req.events if e[0] == "tokentrace.preempted"]
        assert len(recomputes) == len(preempted) == req.attrs["tokentrace.preemptions"], r["vllm_id"]
        # one decode span per step: one token, or under speculative decoding the accepted drafts
        # and its own (tokentrace.decode.tokens)
        assert sum(_emitted(d) for d in decodes) == usage["completion_tokens"] - 1 - len(recomputes), \
            (r["vllm_id"], len(decodes))
        assert sum(p.attrs["tokentrace.prefill.tokens"] for p in prefills if p not in recomputes) \
            + req.attrs["tokentrace.cached_tokens"] == usage["prompt_tokens"], r["vllm_id"]
        chunks = [e for e in req.events if e[0] == "tokentrace.chunk"]
        assert sum(e[2]["tokentrace.chunk.tokens"] for e in chunks) == usage["completion_tokens"]
        assert req.attrs["tokentrace.cached_tokens"] == usage["prompt_tokens_details"]["cached_tokens"], r["vllm_id"]
        # decode step k feeds token k; the tokens recomputed prefills emitted have no decode step
        if not recomputes:
            ordered = sorted(decodes, key=lambda d: d.attrs["tokentrace.step"])
            assert [d.attrs["tokentrace.step"] for d in ordered] == \
                [1 + sum(_emitted(d) for d in ordered[:j]) for j in range(len(ordered))], r["vllm_id"]
        drafts = [d for d in decodes if "tokentrace.spec.draft_tokens" in d.attrs]
        # a step emits its accepted drafts and one token of its own; it cannot accept more than it drafted
        assert all(d.attrs["tokentrace.spec.accepted_tokens"] <= d.attrs["tokentrace.spec.draft_tokens"]
                   and d.attrs["tokentrace.decode.tokens"] == d.attrs["tokentrace.spec.accepted_tokens"] + 1
                   for d in drafts), r["vllm_id"]
        assert req.attrs.get("tokentrace.spec.draft_tokens", 0) == sum(d.attrs["tokentrace.spec.draft_tokens"]
                                                                       for d in drafts)
        assert req.attrs.get("tokentrace.spec.accepted_tokens", 0) == sum(d.attrs["tokentrace.spec.accepted_tokens"]
                                                                          for d in drafts)
        # joins vLLM's own llm_request: same trace when the client sent a traceparent, by id otherwise
        llm = [s for s in theirs if s.name == "llm_request" and s.attrs.get("gen_ai.request.id") == r["vllm_id"]]
        assert len(llm) == 1, f"{r['vllm_id']}: {len(llm)} llm_request spans"
        if r.get("traceparent"):
            assert llm[0].trace_id == req.trace_id == r["traceparent"].split("-")[1]
            assert llm[0].parent_id == req.parent_id, "engine_request and llm_request are siblings"
        assert llm[0].attrs["gen_ai.usage.completion_tokens"] == usage["completion_tokens"]
    repeated = [r for r in sent if r["kind"] == "repeat"]
    if repeated_prompt:
        assert len(repeated) == 2 and repeated[1]["usage"]["prompt_tokens_details"]["cached_tokens"] > 0, repeated
    else:
        assert not repeated, repeated
    # per engine step, the request spans naming it add up to its scheduled tokens and batch size
    steps = {s.attrs["tokentrace.engine.step"]: s for s in ours if s.name == "engine_step"}
    tokens: dict[int, int] = {}
    count: dict[int, int] = {}
    for s in ours:
        if s.name in ("prefill", "decode"):
            step = s.attrs["tokentrace.engine.step"]
            tokens[step] = tokens.get(step, 0) + (s.attrs["tokentrace.prefill.tokens"] if s.name == "prefill"
                                                  else 1 + s.attrs.get("tokentrace.spec.draft_tokens", 0))
            count[step] = count.get(step, 0) + 1
            assert by_id[s.parent_id].name == "engine_request"
            # KV blocks held (followed from vLLM's block lists) cover the context, full attention:
            # prefix-cache hits included, one block per block_tokens begun
            block_tokens = steps[step].attrs["tokentrace.kv.block_tokens"]
            context, drafts = s.attrs["tokentrace.context_tokens"], s.attrs.get("tokentrace.spec.draft_tokens", 0)
            # (a step with drafts got blocks for them all; the rejected ones' KV is not kept)
            computed = context - _emitted(s) + 1 + drafts if drafts else context
            assert -(-context // block_tokens) <= s.attrs["tokentrace.kv.blocks"] <= -(-computed // block_tokens), \
                (s.name, step, s.attrs)
    assert steps and set(tokens) <= set(steps)
    discarded = 0
    for step, span in steps.items():
        # tokens scheduled for a request that had already ended (an abort, vLLM's async
        # scheduling) have no request span: the step says how many
        assert tokens.get(step, 0) + span.attrs["tokentrace.batch.discarded_tokens"] == span.attrs["tokentrace.batch.tokens"], step
        assert count.get(step, 0) + span.attrs["tokentrace.batch.discarded_sequences"] == span.attrs["tokentrace.batch.size"], step
        discarded += span.attrs["tokentrace.batch.discarded_sequences"]
    for step, span in steps.items():  # a step's drafts are its decode spans' drafts
        spans = [s for s in ours if s.name == "decode" and s.attrs["tokentrace.engine.step"] == step]
        for key in ("tokentrace.spec.draft_tokens", "tokentrace.spec.accepted_tokens"):
            assert span.attrs.get(key, 0) == sum(s.attrs.get(key, 0) for s in spans), (step, key)
    return {"requests": len(sent), "steps": len(steps), "discarded_sequences": discarded,
            "draft_tokens": sum(s.attrs.get("tokentrace.spec.draft_tokens", 0) for s in ours if s.name == "decode"),
            "accepted_tokens": sum(s.attrs.get("tokentrace.spec.accepted_tokens", 0) for s in ours
                                   if s.name == "decode"),
            "decode_spans": sum(1 for s in ours if s.name == "decode"),
            "preemptions": sum(1 for s in ours if s.name == "prefill" and s.attrs["tokentrace.prefill.recompute"])}


def check_spec_run(folder: Path) -> dict[str, int]:
    """The invariants of a speculative-decoding run (drive_spec_load) on top of check_run's:
    draft tokens = vLLM's own counter (its /metrics, over the load); accepted tokens at most
    vLLM's, short by no more than the drafts a request's last step verified and did not deliver
    (vLLM counts drafts accepted past a stop token or max_tokens); the analyzer gives every
    engine gap (G - 1 per request), 0 ms for each accepted draft token, and the steps' drafts."""
    from analyzer.db.store import connect
    from analyzer.formats.load import load_paths
    from analyzer.query.runner import run_query

    ours, theirs, client = run_spans(folder)
    counts = check_run(ours, theirs, client, repeated_prompt=False)
    vllm = client["vllm_spec_counters"]
    assert counts["draft_tokens"] == vllm["draft_tokens"] > 0, (counts, vllm)
    requests = [s for s in ours if s.name == "engine_request"]
    undelivered = 0
    for req in requests:
        last = max((s for s in ours if s.parent_id == req.span_id and s.name == "decode"),
                   key=lambda s: s.attrs["tokentrace.step"])
        undelivered += last.attrs.get("tokentrace.spec.draft_tokens", 0) - last.attrs.get("tokentrace.spec.accepted_tokens", 0)
    assert 0 < counts["accepted_tokens"] <= vllm["accepted_tokens"] <= counts["accepted_tokens"] + undelivered, \
        (counts, vllm, undelivered)
    con = connect()
    try:
        load_paths(con, [str(folder / "tokentrace.jsonl")])
        gaps = run_query(con, "stalls").dicts()
        steps = run_query(con, "steps").dicts()
    finally:
        con.close()
    generated = sum(r.attrs["tokentrace.generated_tokens"] for r in requests)
    assert len(gaps) == generated - len(requests) and all(g["itl_ms"] is not None for g in gaps)
    same = [g for g in gaps if g["steps_in_gap"] == 0]
    assert len(same) == counts["accepted_tokens"], (len(same), counts)
    assert all(g["itl_ms"] == 0 and g["between_steps_ms"] is None and "speculative decoding" in g["null_reason"]
               for g in same)
    assert all(g["null_reason"] is None for g in gaps if g["steps_in_gap"] != 0)
    assert sum(s["spec_draft_tokens"] for s in steps) == counts["draft_tokens"]
    assert sum(s["spec_accepted_tokens"] for s in steps) == counts["accepted_tokens"]
    return counts


def _emitted(span: Span) -> int:
    """Tokens a decode span's step emitted for its request (1 without speculative decoding)."""
    return span.attrs.get("tokentrace.decode.tokens", 1)


# -- running vLLM (only with .venv-vllm) -------------------------------------------------------

def _stream(base: str, body: dict[str, Any], headers: dict[str, str], disconnect: bool) -> dict[str, Any] | None:
    import httpx

    usage = None
    with httpx.Client(timeout=300) as client, client.stream("POST", f"{base}/v1/chat/completions", json=body,
                                                            headers=headers) as resp:
        resp.raise_for_status()
        for line in resp.iter_lines():
            if not line.startswith("data: {"):
                continue
            if disconnect:
                return None  # leaves the with-blocks: the connection is closed mid-stream
            chunk = json.loads(line[6:])
            usage = chunk.get("usage") or usage
    return usage


def drive_load(base: str) -> dict[str, Any]:
    """8 concurrent streams with a traceparent (one of them disconnects after its first chunk),
    then one long prompt sent twice without a traceparent. Returns the client record."""
    records: list[dict[str, Any]] = []
    lock = threading.Lock()

    def one(i: int) -> None:
        kind = "disconnect" if i == 7 else "stream"
        trace_id = secrets.token_hex(16)
        traceparent = f"00-{trace_id}-{secrets.token_hex(8)}-01"
        rid = f"tt-plugin-{i}"
        body = {"model": "smollm2", "messages": [{"role": "user", "content": f"Count from 1 to {i + 5}."}],
                "max_tokens": MAX_TOKENS, "stream": True, "stream_options": {"include_usage": True},
                **({"ignore_eos": True} if kind == "disconnect" else {})}
        usage = _stream(base, body, {"traceparent": traceparent, "X-Request-Id": rid}, kind == "disconnect")
        with lock:
            records.append({"kind": kind, "vllm_id": f"chatcmpl-{rid}", "traceparent": traceparent,
                            "max_tokens": MAX_TOKENS, "usage": usage})

    with ThreadPoolExecutor(8) as pool:
        list(pool.map(one, range(8)))
    for j in range(2):
        rid = f"tt-plugin-repeat-{j}"
        body = {"model": "smollm2", "messages": [{"role": "user", "content": LONG_PROMPT}], "max_tokens": MAX_TOKENS,
                "stream": True, "stream_options": {"include_usage": True}}
        usage = _stream(base, body, {"X-Request-Id": rid}, False)
        records.append({"kind": "repeat", "vllm_id": f"chatcmpl-{rid}", "traceparent": None,
                        "max_tokens": MAX_TOKENS, "usage": usage})
    records.sort(key=lambda r: r["vllm_id"])
    return {"requests": records}


# KV cache of 7 blocks of 128 tokens, prompts of 376 tokens (3 blocks): two run, the third
# waits; at token 9 each needs a 4th block, and vLLM preempts one (its blocks freed, its
# prefix recomputed later, partly from the prefix cache)
PREEMPTION_ARGS = ("--num-gpu-blocks-override", "7", "--max-model-len", "512")
PREEMPTION_MAX_TOKENS = 16


def drive_preemption_load(base: str) -> dict[str, Any]:
    """3 concurrent streams that do not fit the KV cache together (PREEMPTION_ARGS)."""
    def one(i: int) -> dict[str, Any]:
        prompt = f"Request {i}. " + " ".join(f"Line {j}: stars {i} and rivers." for j in range(32))
        body = {"model": "smollm2", "messages": [{"role": "user", "content": prompt}], "ignore_eos": True,
                "max_tokens": PREEMPTION_MAX_TOKENS, "stream": True, "stream_options": {"include_usage": True}}
        rid = f"tt-preempt-{i}"
        usage = _stream(base, body, {"X-Request-Id": rid}, False)
        return {"kind": "stream", "vllm_id": f"chatcmpl-{rid}", "traceparent": None,
                "max_tokens": PREEMPTION_MAX_TOKENS, "usage": usage}

    with ThreadPoolExecutor(3) as pool:
        records = list(pool.map(one, range(3)))
    return {"requests": records}


class VllmRun:
    """``tokentrace collect`` (vLLM's own spans) + vLLM with the plugin, both on 127.0.0.1."""

    def __init__(self, out: Path, port: int = 18765) -> None:
        self.out, self.port = out, port
        self.base = f"http://127.0.0.1:{port}"
        self.procs: list[subprocess.Popen[str]] = []

    def start(self, model_dir: Path, timeout_s: float = 420.0, extra_args: tuple[str, ...] = (),
              transport: str = "file", extra_env: dict[str, str] | None = None) -> None:
        """``transport``: where the plugin's spans go. ``file``: ``TOKENTRACE_OTLP_JSON`` (the
        README's line); ``grpc``: nothing set for the plugin, vLLM given ``--otlp-traces-endpoint
        grpc://...`` (the plugin follows vLLM's endpoint); ``http``: vLLM given ``http://.../v1/traces``
        with ``OTEL_EXPORTER_OTLP_TRACES_PROTOCOL=http/protobuf``. vLLM's own spans go to the
        collector in each. ``extra_env``: more environment for vLLM (and the plugin)."""
        (self.out / "vllm").mkdir(parents=True, exist_ok=True)
        http = transport == "http"
        collect = subprocess.Popen([str(REPO / ".venv" / "bin" / "tokentrace"), "collect",
                                    "--grpc", "off" if http else "127.0.0.1:0", "--http", "127.0.0.1:0" if http else "off",
                                    "--out", str(self.out / "vllm")],
                                   stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, start_new_session=True)
        self.procs.append(collect)
        line = collect.stdout.readline() if collect.stdout else ""
        endpoint = (f"http://{line.split('http=')[1].split()[0]}/v1/traces" if http
                    else f"grpc://{line.split('grpc=')[1].split()[0]}")
        env = {k: v for k, v in os.environ.items() if not k.startswith(("OTEL_", "TOKENTRACE_KEEP_"))}
        env.update({"TOKENTRACE_VLLM_TRACING": "1", "VLLM_CPU_KVCACHE_SPACE": "2", "HF_HUB_OFFLINE": "1",
                    "OTEL_BSP_SCHEDULE_DELAY": "200"})
        env.update(extra_env or {})
        if transport == "file":
            env["TOKENTRACE_OTLP_JSON"] = str(self.out / "tokentrace.jsonl")
        elif http:
            env["OTEL_EXPORTER_OTLP_TRACES_PROTOCOL"] = "http/protobuf"
        self.log = open(self.out / "vllm-server.log", "w")
        server = subprocess.Popen(
            [str(VLLM_PYTHON), "-m", "vllm.entrypoints.openai.api_server", "--model", str(model_dir),
             "--served-model-name", "smollm2", "--host", "127.0.0.1", "--port", str(self.port),
             "--max-model-len", "2048", "--dtype", "bfloat16", "--enforce-eager", "--enable-prefix-caching",
             "--enable-prompt-tokens-details", "--otlp-traces-endpoint", endpoint, *extra_args],
            stdout=self.log, stderr=subprocess.STDOUT, env=env, start_new_session=True, text=True)
        self.procs.append(server)
        import httpx

        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if server.poll() is not None:
                raise RuntimeError(f"vLLM exited ({server.returncode}); see {self.out / 'vllm-server.log'}")
            try:
                if httpx.get(f"{self.base}/health", timeout=2).status_code == 200:
                    return
            except httpx.HTTPError:
                pass
            time.sleep(2)
        raise RuntimeError(f"vLLM not ready after {timeout_s:.0f} s")

    def stop(self) -> None:
        """SIGTERM vLLM's server process (it stops its engine core), then SIGINT the collector;
        what is left of a process group after 60 s is killed."""
        for proc in reversed(self.procs):
            if proc.poll() is None:
                proc.send_signal(signal.SIGINT if proc is self.procs[0] else signal.SIGTERM)
                try:
                    proc.wait(60)
                except subprocess.TimeoutExpired:
                    pass
            try:
                os.killpg(proc.pid, signal.SIGKILL)  # leftovers of the group, if any
            except ProcessLookupError:
                pass
            proc.wait(10)
        if hasattr(self, "log"):
            self.log.close()


# speculative decoding, vLLM's n-gram proposer (drafts looked up in the prompt and output so
# far; on the CPU too). vLLM turns async scheduling off with it
SPEC_ARGS = ("--speculative-config",
             '{"method": "ngram", "num_speculative_tokens": 3, "prompt_lookup_max": 4, "prompt_lookup_min": 2}')
SPEC_MAX_TOKENS = 48
SPEC_TEXT = "one two three four five six seven eight nine ten " * 6


def spec_counters(base: str) -> dict[str, float]:
    """vLLM's own speculative-decoding counters from its /metrics (Prometheus text): draft
    tokens proposed and accepted since the server started."""
    import httpx

    wanted = {"vllm:spec_decode_num_draft_tokens_total": "draft_tokens",
              "vllm:spec_decode_num_accepted_tokens_total": "accepted_tokens"}
    found = {v: 0.0 for v in wanted.values()}
    for line in httpx.get(f"{base}/metrics", timeout=30).text.splitlines():
        name = line.split("{")[0].split(" ")[0]
        if name in wanted:
            found[wanted[name]] += float(line.rsplit(" ", 1)[1])
    return found


def drive_spec_load(base: str) -> dict[str, Any]:
    """4 concurrent streams with a traceparent under n-gram speculative decoding (SPEC_ARGS):
    three ask for a repetitive text to be copied (the proposer finds drafts in the prompt),
    one for free text. Returns the client record, with vLLM's counters before and after."""
    before = spec_counters(base)

    def one(i: int) -> dict[str, Any]:
        content = f"Copy this text exactly, {i}: {SPEC_TEXT}" if i < 3 else "Write a short poem about the sea."
        trace_id = secrets.token_hex(16)
        traceparent = f"00-{trace_id}-{secrets.token_hex(8)}-01"
        rid = f"tt-spec-{i}"
        body = {"model": "smollm2", "messages": [{"role": "user", "content": content}], "temperature": 0,
                "max_tokens": SPEC_MAX_TOKENS, "stream": True, "stream_options": {"include_usage": True}}
        usage = _stream(base, body, {"traceparent": traceparent, "X-Request-Id": rid}, False)
        return {"kind": "stream", "vllm_id": f"chatcmpl-{rid}", "traceparent": traceparent,
                "max_tokens": SPEC_MAX_TOKENS, "usage": usage}

    with ThreadPoolExecutor(4) as pool:
        records = sorted(pool.map(one, range(4)), key=lambda r: r["vllm_id"])
    after = spec_counters(base)
    return {"requests": records, "vllm_spec_counters": {k: after[k] - before[k] for k in after}}


# chunked prefill (a 443-token prompt in chunks of at most 128 tokens), vLLM's priority
# policy with 2 running at most (the others wait), and a request with n = 2 choices
PROBE_ARGS = ("--max-num-batched-tokens", "128", "--scheduling-policy", "priority", "--max-num-seqs", "2")


def drive_probe_load(base: str) -> dict[str, Any]:
    """4 concurrent streams (the first with LONG_PROMPT, priorities 0, 5, -5, 0), then one
    non-streaming request with n = 2 (vLLM runs each choice as a request of its own)."""
    import httpx

    def one(i: int, priority: int) -> dict[str, Any]:
        content = LONG_PROMPT if i == 0 else f"Count to {i + 3}."
        body = {"model": "smollm2", "messages": [{"role": "user", "content": content}], "max_tokens": 10,
                "stream": True, "stream_options": {"include_usage": True}, "priority": priority}
        rid = f"tt-probe-{i}"
        return {"kind": "stream", "vllm_id": f"chatcmpl-{rid}", "priority": priority, "max_tokens": 10,
                "usage": _stream(base, body, {"X-Request-Id": rid}, False)}

    with ThreadPoolExecutor(4) as pool:
        records = list(pool.map(one, range(4), (0, 5, -5, 0)))
    body = {"model": "smollm2", "messages": [{"role": "user", "content": "Say hi."}], "max_tokens": 8, "n": 2}
    answer = httpx.post(f"{base}/v1/chat/completions", json=body, headers={"X-Request-Id": "tt-probe-n2"},
                        timeout=300).json()
    records.append({"kind": "n2", "vllm_id": "chatcmpl-tt-probe-n2", "max_tokens": 8, "n": 2,
                    "usage": answer["usage"], "finish_reasons": [c["finish_reason"] for c in answer["choices"]]})
    return {"requests": records}


# the SIGTERM run: long streams (ignore_eos) still running when vLLM is stopped
SIGTERM_STREAMS = 4
SIGTERM_MAX_TOKENS = 400


def drive_until_sigterm(run: VllmRun, sent: Any) -> dict[str, Any]:
    """SIGTERM_STREAMS streams of SIGTERM_MAX_TOKENS tokens; once ``sent()`` is true (polled
    every 0.5 s, at most 120 s), SIGTERM the server (vLLM's default ``--shutdown-timeout 0``:
    its engine core and every descendant are killed at once). A client gives up 10 s after its
    last chunk (the server then has no engine left), so the server's HTTP side can close.
    Returns the client record (chunks read per request)."""
    import httpx

    started = threading.Barrier(SIGTERM_STREAMS + 1)
    read: dict[str, int] = {}

    def one(i: int) -> None:
        rid = f"tt-sigterm-{i}"
        body = {"model": "smollm2", "messages": [{"role": "user", "content": f"Tell story number {i}."}],
                "max_tokens": SIGTERM_MAX_TOKENS, "ignore_eos": True, "stream": True}
        started.wait()
        try:
            with httpx.Client(timeout=httpx.Timeout(300, read=10)) as client, \
                    client.stream("POST", f"{run.base}/v1/chat/completions", json=body,
                                  headers={"X-Request-Id": rid}) as resp:
                for line in resp.iter_lines():
                    if line.startswith("data: {"):
                        read[f"chatcmpl-{rid}"] = read.get(f"chatcmpl-{rid}", 0) + 1
        except httpx.HTTPError:
            pass  # the stream cut: what the test is about

    threads = [threading.Thread(target=one, args=(i,), daemon=True) for i in range(SIGTERM_STREAMS)]
    for t in threads:
        t.start()
    started.wait()
    deadline = time.monotonic() + 120
    while not sent() and time.monotonic() < deadline:
        time.sleep(0.5)
    run.procs[-1].send_signal(signal.SIGTERM)
    for t in threads:
        t.join(60)
    return {"chunks": read}
