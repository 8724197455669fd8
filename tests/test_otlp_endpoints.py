"""Where OTLP spans go for each endpoint form (instrument/otel/tracing.py ``otlp_target``): the
standard variables in the standard order, and vLLM's ``--otlp-traces-endpoint`` forms
(``grpc://``, ``http://``, ``https://``, a bare host:port), chosen as vLLM's own exporter
chooses for the same value; checked against a real receiver (``tokentrace collect``'s)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from analyzer.collect.receiver import Receiver
from instrument.otel.tracing import get_tracer, otlp_destination, otlp_target, setup_tracing

VARIABLES = ("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", "OTEL_EXPORTER_OTLP_ENDPOINT", "OTEL_EXPORTER_OTLP_TRACES_PROTOCOL",
             "OTEL_EXPORTER_OTLP_PROTOCOL", "OTEL_EXPORTER_OTLP_INSECURE", "OTEL_EXPORTER_OTLP_TRACES_INSECURE")


@pytest.fixture(autouse=True)
def _clean(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in VARIABLES:
        monkeypatch.delenv(name, raising=False)


@pytest.mark.parametrize("protocol, endpoint, env, want", [
    # vLLM's --otlp-traces-endpoint grpc://...: gRPC, plaintext, whatever the protocol default
    ("http/protobuf", "grpc://127.0.0.1:4317", {}, ("grpc", "grpc://127.0.0.1:4317", True)),
    ("grpc", "http://127.0.0.1:4317", {}, ("grpc", "http://127.0.0.1:4317", True)),
    ("grpc", "127.0.0.1:4317", {}, ("grpc", "127.0.0.1:4317", True)),
    ("grpc", "https://collector:4317", {}, ("grpc", "https://collector:4317", None)),  # TLS
    ("grpc", "127.0.0.1:4317", {"OTEL_EXPORTER_OTLP_INSECURE": "false"}, ("grpc", "127.0.0.1:4317", None)),
    # signal-specific over generic; the signal-specific endpoint as it is
    ("http/protobuf", None, {"OTEL_EXPORTER_OTLP_TRACES_ENDPOINT": "http://a:4318/custom",
                             "OTEL_EXPORTER_OTLP_ENDPOINT": "http://b:4318"}, ("http/protobuf", "http://a:4318/custom", None)),
    ("http/protobuf", None, {"OTEL_EXPORTER_OTLP_ENDPOINT": "http://b:4318/"},
     ("http/protobuf", "http://b:4318/v1/traces", None)),
    ("http/protobuf", None, {"OTEL_EXPORTER_OTLP_TRACES_ENDPOINT": "grpc://v:4317",
                             "OTEL_EXPORTER_OTLP_ENDPOINT": "http://b:4318"}, ("grpc", "grpc://v:4317", True)),
    ("http/protobuf", None, {}, ("http/protobuf", None, None)),
])
def test_otlp_target(protocol: str, endpoint: str | None, env: dict[str, str], want: tuple[object, ...],
                     monkeypatch: pytest.MonkeyPatch) -> None:
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    assert otlp_target(protocol, endpoint) == want


def test_the_destination_line() -> None:
    assert otlp_destination("grpc", "grpc://127.0.0.1:4317") == "grpc grpc://127.0.0.1:4317 (plaintext)"
    assert otlp_destination(None, None) == "http/protobuf http://localhost:4318/v1/traces (default)"


def _received(folder: Path) -> list[str]:
    names = []
    for path in sorted(folder.glob("*.jsonl")):
        for line in path.read_text().splitlines():
            for rs in json.loads(line).get("resourceSpans", []):
                for ss in rs.get("scopeSpans", []):
                    names += [s["name"] for s in ss.get("spans", [])]
    return names


@pytest.mark.parametrize("form", ["grpc://{grpc}", "http://{grpc}", "{grpc}", "http://{http}/v1/traces"])
def test_spans_reach_a_real_receiver_in_every_form_vllm_takes(form: str, tmp_path: Path,
                                                              monkeypatch: pytest.MonkeyPatch) -> None:
    """The endpoint as vLLM writes it into OTEL_EXPORTER_OTLP_TRACES_ENDPOINT (the plugin's
    exporter process inherits it), with the protocol vLLM itself takes for it: gRPC unless
    OTEL_EXPORTER_OTLP_TRACES_PROTOCOL says http/protobuf (the vLLM plugin's _protocol)."""
    from instrument.vllm import _protocol

    with Receiver(tmp_path, grpc_addr="127.0.0.1:0", http_addr="127.0.0.1:0") as rx:
        endpoint = form.format(grpc=f"127.0.0.1:{rx.grpc_port}", http=f"127.0.0.1:{rx.http_port}")
        monkeypatch.setenv("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", endpoint)
        if "/v1/traces" in form:
            monkeypatch.setenv("OTEL_EXPORTER_OTLP_TRACES_PROTOCOL", "http/protobuf")
        provider = setup_tracing("endpoint-test", exporter="otlp", protocol=_protocol(), batch=False)
        with get_tracer(provider).start_as_current_span("reached"):
            pass
        provider.shutdown()
    assert _received(tmp_path) == ["reached"]
