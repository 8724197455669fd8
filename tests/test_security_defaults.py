"""Safe defaults: API keys off loopback, no prompt/completion text in spans unless opted in,
span limits, SQL values bound and identifiers validated, output paths that stay in their folder.

Gaps found here were fixed by their owners; the tests that showed them are regression tests now
(docs/reliability.md)."""

from __future__ import annotations

import json
from pathlib import Path

import duckdb
import httpx
import pytest
from click.testing import CliRunner

from analyzer.cli import cli
from analyzer.collect import Receiver
from analyzer.db.store import connect
from analyzer.formats.load import load_paths
from analyzer.formats.parquet_export import export_parquet

PROMPT = "my secret prompt: card 4111-1111-1111-1111"


def test_serve_refuses_a_non_loopback_host_without_an_api_key(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("TOKENTRACE_API_KEYS", raising=False)
    for host in ("0.0.0.0", "192.0.2.10", "::"):
        r = CliRunner().invoke(cli, ["serve", "--model", "tiny", "--host", host, "--port", "0"])
        assert r.exit_code != 0 and "api-key" in r.output and "Traceback" not in r.output, (host, r.output)
    from instrument.gateway.server import is_loopback

    assert is_loopback("127.0.0.1") and is_loopback("::1") and is_loopback("localhost")
    assert not is_loopback("0.0.0.0") and not is_loopback("::") and not is_loopback("example.com")


@pytest.fixture(scope="module")
def tiny():
    pytest.importorskip("torch")
    from instrument import load_tiny_model

    return load_tiny_model()


def _spans_text(spans) -> str:
    parts = []
    for s in spans:
        parts += [s.name, *map(str, s.attributes.values())]
        for e in s.events:
            parts += [e.name, *map(str, e.attributes.values())]
    return "\n".join(parts)


@pytest.mark.parametrize("opt_in", [False, True], ids=["default", "opted-in"])
def test_no_prompt_or_completion_text_in_spans_unless_opted_in(tiny, monkeypatch, opt_in: bool) -> None:
    from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

    from instrument import setup_tracing, traced_generate
    from instrument.hf.generate import CAPTURE_CONTENT_ENV

    monkeypatch.delenv(CAPTURE_CONTENT_ENV, raising=False)
    if opt_in:
        monkeypatch.setenv(CAPTURE_CONTENT_ENV, "true")
    memory = InMemorySpanExporter()
    provider = setup_tracing(exporter="none", span_exporters=[memory], batch=False)
    model, tok = tiny
    result = traced_generate(model, tok, PROMPT, tracer_provider=provider, max_new_tokens=6, do_sample=False)
    completion = tok.decode(result.output[0][-6:], skip_special_tokens=True).strip()
    text = _spans_text(memory.get_finished_spans())
    assert ("4111-1111" in text) is opt_in
    if completion and not opt_in:
        assert completion not in text
    keys = {k for s in memory.get_finished_spans() for k in s.attributes}
    assert ("gen_ai.input.messages" in keys) is opt_in


def test_gateway_spans_carry_no_prompt_text(tiny) -> None:
    pytest.importorskip("fastapi")
    from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

    from instrument import setup_tracing
    from instrument.client import chat_body
    from instrument.gateway.app import create_app
    from instrument.gateway.server import ServerThread
    from instrument.hf.model_handle import load_model_handle

    memory = InMemorySpanExporter()
    provider = setup_tracing("gw", exporter="none", span_exporters=[memory], batch=False)
    with ServerThread(create_app(load_model_handle("tiny"), provider)) as server:
        for stream in (False, True):
            r = httpx.post(server.url + "/v1/chat/completions", json=chat_body("tiny", PROMPT, max_tokens=4, stream=stream),
                           timeout=30)
            assert r.status_code == 200
        bad = httpx.post(server.url + "/v1/chat/completions", content=b'{"messages": "' + PROMPT.encode() + b'"', timeout=30)
        assert bad.status_code == 400
    text = _spans_text(memory.get_finished_spans())
    assert "4111-1111" not in text, "prompt text leaked into a span (an error message echoing the body?)"


def test_span_event_limit_is_above_max_tokens_and_enforced(tiny) -> None:
    from opentelemetry.sdk.trace import SpanLimits, TracerProvider

    from instrument import setup_tracing, traced_generate
    from instrument.otel.tracing import DEFAULT_SPAN_EVENT_LIMIT, get_tracer, span_event_limit_of

    assert span_event_limit_of(get_tracer(setup_tracing(exporter="none"))) == DEFAULT_SPAN_EVENT_LIMIT >= 1024 + 4
    low = TracerProvider(span_limits=SpanLimits(max_events=8))
    model, tok = tiny
    with pytest.raises(ValueError, match="event"):
        traced_generate(model, tok, PROMPT, tracer_provider=low, max_new_tokens=16)
    pytest.importorskip("fastapi")
    from instrument.gateway.app import GatewaySettings, create_app
    from instrument.hf.model_handle import load_model_handle

    with pytest.raises(ValueError, match="span event limit"):
        create_app(load_model_handle("tiny"), low, GatewaySettings(max_tokens_limit=64))


def test_span_attribute_value_length_is_limited() -> None:
    from instrument import setup_tracing
    from instrument.otel.tracing import get_tracer

    limits = get_tracer(setup_tracing(exporter="none"))._span_limits
    assert limits.max_attribute_length is not None and limits.max_span_attribute_length is not None


def test_user_paths_with_quotes_are_escaped_in_sql(tmp_path: Path) -> None:
    """File and folder names reach COPY/read_parquet as SQL string literals: a quote in them
    must neither break nor inject (analyzer/formats/parquet_export.py and formats/parquet_dump.py escape them)."""
    src = tmp_path / "t.jsonl"
    span = {"traceId": "0" * 31 + "1", "spanId": "0" * 15 + "1", "name": "s", "startTimeUnixNano": "1",
            "endTimeUnixNano": "2"}
    src.write_text(json.dumps({"resourceSpans": [{"scopeSpans": [{"spans": [span]}]}]}) + "\n")
    con = connect()
    load_paths(con, [str(src)])
    evil = tmp_path / "x'); COPY spans TO '/tmp/pwned.csv'; --"
    export_parquet(con, evil)
    assert not Path("/tmp/pwned.csv").exists()
    con2 = connect()
    assert load_paths(con2, [str(evil)]).files[0].spans_loaded == 1


def test_export_partitions_stay_inside_the_folder_whatever_the_service_name(tmp_path: Path) -> None:
    src = tmp_path / "t.jsonl"
    span = {"traceId": "0" * 31 + "1", "spanId": "0" * 15 + "1", "name": "s", "startTimeUnixNano": "1",
            "endTimeUnixNano": "2"}
    resource = {"attributes": [{"key": "service.name", "value": {"stringValue": "../../escaped"}}]}
    src.write_text(json.dumps({"resourceSpans": [{"resource": resource, "scopeSpans": [{"spans": [span]}]}]}) + "\n")
    con = connect()
    load_paths(con, [str(src)])
    out = tmp_path / "deep" / "dump"
    export_parquet(con, out)
    written = [p.resolve() for p in tmp_path.rglob("*.parquet")]
    assert written and all(out.resolve() in p.parents for p in written), written


def test_collect_writes_only_generated_names_inside_its_folder(tmp_path: Path) -> None:
    """Nothing a sender controls (service names, span names, body) reaches a file name."""
    out = tmp_path / "a" / ".." / "rx"
    doc = {"resourceSpans": [{"resource": {"attributes": [{"key": "service.name", "value": {"stringValue": "../../x"}}]},
                              "scopeSpans": [{"spans": [{"traceId": "0" * 31 + "1", "spanId": "0" * 15 + "1",
                                                         "name": "../../../etc/passwd", "startTimeUnixNano": "1",
                                                         "endTimeUnixNano": "2"}]}]}]}  # fmt: skip
    with Receiver(out, grpc_addr=None, http_addr="127.0.0.1:0", rotate_bytes=64) as rx:
        for _ in range(3):
            r = httpx.post(f"http://127.0.0.1:{rx.http_port}/v1/traces", json=doc, timeout=10)
            assert r.status_code == 200
        files = rx.files
    everything = [p for p in tmp_path.rglob("*") if p.is_file()]
    assert len(files) == 3 and sorted(everything) == sorted(files)
    assert all(p.parent == (tmp_path / "rx").resolve() and p.name.startswith("otlp-traces-") for p in files)


def test_collect_warns_when_binding_beyond_loopback(tmp_path: Path) -> None:
    """The receiver has no authentication: binding beyond loopback is said out loud."""
    r = CliRunner().invoke(cli, ["collect", "--out", str(tmp_path / "o"), "--grpc", "off", "--http", "0.0.0.0:0",
                                 "--max-seconds", "0.2"])
    assert r.exit_code == 0, r.output
    assert "unauthenticated" in r.output


def test_audit_copies_tables_with_odd_names_safely(tmp_path: Path) -> None:
    from analyzer.audit.traces import check_claims_against_traces

    db = tmp_path / "user.duckdb"
    con = duckdb.connect(str(db))
    con.execute("CREATE TABLE spans (x INT)")
    con.execute('CREATE TABLE "odd""name" (x INT)')
    con.close()
    # analyzer/audit/traces.py once formatted the name into "..." unescaped: a parser error (or
    # worse, more SQL). Past the copy, this fake database fails the metric queries: not this test.
    try:
        check_claims_against_traces(None, db, 0.05)  # type: ignore[arg-type]  # no claims: only the copy of the database is tested
    except duckdb.ParserException:
        raise
    except Exception:  # noqa: BLE001 - past the copy the fake database fails the queries: not this test
        pass
