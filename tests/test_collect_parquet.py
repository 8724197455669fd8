"""``tokentrace collect --format parquet``: the SDK's real OTLP exporters in, a Parquet dump out
that ``tokentrace load`` and ``--parquet DIR`` read; what the jsonl path stores, row for row.
Crash leftovers are laid out on disk exactly as a kill leaves them, then loaded and recovered.
Loopback and ephemeral ports only; every wait is bounded."""

from __future__ import annotations

import json
import re
import shutil
from pathlib import Path

import duckdb
import grpc
import httpx
import pytest
from click.testing import CliRunner
from opentelemetry.exporter.otlp.proto.grpc.trace_exporter import OTLPSpanExporter as GrpcSpanExporter
from opentelemetry.exporter.otlp.proto.http import Compression
from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter as HttpSpanExporter
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
    ExportTraceServiceRequest,
    ExportTraceServiceResponse,
)
from opentelemetry.proto.common.v1.common_pb2 import AnyValue, KeyValue
from opentelemetry.proto.resource.v1.resource_pb2 import Resource as ProtoResource
from opentelemetry.proto.trace.v1.trace_pb2 import ResourceSpans, ScopeSpans, Span
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor, SpanExportResult
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import Link, SpanKind, Status, StatusCode

from analyzer.cli import cli
from analyzer.collect import Receiver
from analyzer.collect.parquet_layout import PART_NAME, SEGMENT_NAME, WORKSPACE
from analyzer.db.store import connect
from analyzer.formats.load import load_paths
from analyzer.formats.parquet_export import export_parquet
from trace_fixtures import mixed_world

TIMEOUT_S = 10.0
BATCH = 40  # spans per exporter call
TABLE_ORDER = {"spans": "trace_id, span_id", "span_events": "trace_id, span_id, event_index",
               "span_links": "trace_id, span_id, link_index"}


def _rows(con: duckdb.DuckDBPyConnection, table: str) -> list[tuple]:
    exclude = " EXCLUDE (load_id)" if table == "spans" else ""
    return con.execute(f"SELECT *{exclude} FROM {table} ORDER BY {TABLE_ORDER[table]}").fetchall()


def _load(path: Path, lenient: bool = False) -> tuple[duckdb.DuckDBPyConnection, object]:
    con = connect(":memory:")
    report = load_paths(con, [str(path)], lenient=lenient)
    assert len(report.files) == 1, [f.file for f in report.files]
    return con, report.files[0]


def _send(exporter, spans: list) -> None:
    for i in range(0, len(spans), BATCH):
        assert exporter.export(spans[i : i + BATCH]) == SpanExportResult.SUCCESS
    exporter.shutdown()


def _post(port: int, request: ExportTraceServiceRequest) -> ExportTraceServiceResponse:
    r = httpx.post(f"http://127.0.0.1:{port}/v1/traces", content=request.SerializeToString(),
                   headers={"Content-Type": "application/x-protobuf"}, timeout=TIMEOUT_S)
    assert r.status_code == 200, r.text
    return ExportTraceServiceResponse.FromString(r.content)


def _request(*spans: Span, service: str | None = "svc") -> ExportTraceServiceRequest:
    attrs = [KeyValue(key="service.name", value=AnyValue(string_value=service))] if service else []
    return ExportTraceServiceRequest(resource_spans=[ResourceSpans(
        resource=ProtoResource(attributes=attrs), scope_spans=[ScopeSpans(spans=list(spans))])])


def _span(i: int, name: str = "s", *, events: int = 1, end_offset: int = 1000) -> Span:
    start = 1_700_000_000_000_000_000 + i
    return Span(trace_id=(i + 1).to_bytes(16, "big"), span_id=(i + 1).to_bytes(8, "big"), name=name, kind=2,
                start_time_unix_nano=start, end_time_unix_nano=start + end_offset,
                attributes=[KeyValue(key="i", value=AnyValue(int_value=i))],
                events=[Span.Event(time_unix_nano=start + k, name=f"e{k}") for k in range(events)])


def _linked_spans() -> list:
    """SDK spans with links (attributes on them), arrays, doubles, booleans, an error status."""
    provider = TracerProvider(resource=Resource.create({"service.name": "linker", "host.name": "h", "replica": 3}))
    memory = InMemorySpanExporter()
    provider.add_span_processor(SimpleSpanProcessor(memory))
    tracer = provider.get_tracer("linker-scope", "2.1")
    with tracer.start_as_current_span("batch", kind=SpanKind.CONSUMER) as batch:
        batch.set_attributes({"sizes": [1, 2, 3], "tags": ["a", "b"], "ratio": 0.25, "ok": True})
        batch.add_event("picked", {"weights": [0.5, 1.5]})
    with tracer.start_as_current_span("follower", links=[Link(batch.get_span_context(), {"why": "batched"})]) as f:
        f.set_status(Status(StatusCode.ERROR, "upstream timed out"))
    provider.shutdown()
    return list(memory.get_finished_spans())


def _dataset_files(out: Path) -> list[Path]:
    return sorted(p for p in out.rglob("*") if p.is_file() and WORKSPACE not in p.parts)


@pytest.mark.parametrize("parquet_via", ["grpc", "http"])
def test_sdk_exporters_parquet_loads_exactly_what_jsonl_loads(tmp_path: Path, runner: CliRunner, parquet_via: str) -> None:
    """The same SDK spans (LLM-shaped: 150-chunk event lists, links, typed attributes, errors,
    one planted negative-duration span) go to a parquet receiver over one protocol and a jsonl
    receiver over the other."""
    spans = list(mixed_world().exporter.get_finished_spans()) + _linked_spans()
    backwards = sum(s.end_time < s.start_time for s in spans)
    assert backwards == 1
    pq_out, jl_out = tmp_path / "pq", tmp_path / "jl"
    with Receiver(pq_out, grpc_addr="127.0.0.1:0", http_addr="127.0.0.1:0", out_format="parquet") as pq, \
         Receiver(jl_out, grpc_addr="127.0.0.1:0", http_addr="127.0.0.1:0") as jl:  # fmt: skip
        def grpc_to(rx: Receiver) -> GrpcSpanExporter:
            return GrpcSpanExporter(endpoint=f"127.0.0.1:{rx.grpc_port}", insecure=True, timeout=TIMEOUT_S,
                                    compression=grpc.Compression.Gzip)

        def http_to(rx: Receiver) -> HttpSpanExporter:
            return HttpSpanExporter(endpoint=f"http://127.0.0.1:{rx.http_port}/v1/traces",
                                    compression=Compression.Gzip, timeout=TIMEOUT_S)

        _send(grpc_to(pq) if parquet_via == "grpc" else http_to(pq), spans)
        _send(http_to(jl) if parquet_via == "grpc" else grpc_to(jl), spans)
    # jsonl stores every span with valid ids and the loader rejects the backwards one later;
    # parquet can only store rows, so it rejects that span at once, in the partial success
    assert jl.stats.spans_written == len(spans) and jl.stats.spans_rejected == 0
    assert (pq.stats.spans_written, pq.stats.spans_rejected) == (len(spans) - backwards, backwards)

    pq_con, pq_report = _load(pq_out)
    jl_con, jl_report = _load(jl_out, lenient=True)
    assert jl_report.rejected_by_reason == {"end_before_start": backwards}
    assert pq_report.format == "parquet" and pq_report.spans_loaded == len(spans) - backwards
    assert pq_report.duplicates_identical == 0 and pq_report.rejected == 0
    for table in TABLE_ORDER:
        assert _rows(pq_con, table) == _rows(jl_con, table), table
    assert pq_con.execute("SELECT count(*) FROM span_events").fetchone()[0] > len(spans)  # chunk events came through
    assert pq_con.execute("SELECT count(*) FROM span_links").fetchone()[0] > 0

    # the layout `tokentrace export` writes; every file a compacted segment after the clean stop
    files = _dataset_files(pq_out)
    assert files and all(SEGMENT_NAME.match(f.name) for f in files)
    assert {f.relative_to(pq_out).parts[0] for f in files} == {"spans", "span_events", "span_links"}
    assert all(re.fullmatch(r"service_name=[^/]+/date=\d{4}-\d{2}-\d{2}", "/".join(f.relative_to(pq_out).parts[1:3]))
               for f in files)

    # query verbs read the folder in place, with the figures the jsonl load gives
    db = tmp_path / "jl.duckdb"
    assert runner.invoke(cli, ["load", str(jl_out), "--db", str(db), "-q", "--lenient"], catch_exceptions=False).exit_code == 0
    in_place = runner.invoke(cli, ["requests", "--parquet", str(pq_out), "--format", "json"], catch_exceptions=False)
    loaded = runner.invoke(cli, ["requests", "--db", str(db), "--format", "json"], catch_exceptions=False)
    assert in_place.exit_code == 0 and loaded.exit_code == 0, in_place.output + loaded.output
    assert json.loads(in_place.output) == json.loads(loaded.output) and json.loads(in_place.output)


def test_parquet_partial_success_names_each_rejected_span(tmp_path: Path) -> None:
    bad_id = Span(trace_id=b"\x01\x02\x03", span_id=bytes(range(1, 9)), name="bad-id", start_time_unix_nano=1, end_time_unix_nano=2)
    backwards = _span(7, "backwards", end_offset=-5)  # valid ids; the mapping rejects it (end before start)
    with Receiver(tmp_path, grpc_addr="off", http_addr="127.0.0.1:0", out_format="parquet") as rx:
        answer = _post(rx.http_port, _request(_span(1, "good"), bad_id, backwards))
        assert answer.partial_success.rejected_spans == 2
        message = answer.partial_success.error_message
        assert "traceId is 3 bytes" in message and "'backwards'" in message and "end_before_start" in message
        everything_bad = _post(rx.http_port, _request(backwards))
        assert everything_bad.partial_success.rejected_spans == 1
    assert (rx.stats.spans_written, rx.stats.spans_rejected) == (1, 3)
    con, report = _load(tmp_path)
    assert report.spans_loaded == 1 and con.execute("SELECT name FROM spans").fetchall() == [("good",)]


def test_parquet_repeated_span_in_one_request_stored_once_or_rejected(tmp_path: Path) -> None:
    with Receiver(tmp_path, grpc_addr="off", http_addr="127.0.0.1:0", out_format="parquet") as rx:
        same = _post(rx.http_port, _request(_span(1, "a"), _span(1, "a"), _span(2, "b")))
        assert not same.HasField("partial_success")
        different = _post(rx.http_port, _request(_span(3, "c"), _span(3, "changed")))
        assert different.partial_success.rejected_spans == 1
        assert "conflicting_duplicate" in different.partial_success.error_message
    # spans_written counts accepted spans; the writer counts the identical copy it stored once
    assert (rx.stats.spans_written, rx.stats.spans_rejected, rx.writer.spans_repeated_identical) == (4, 1, 1)
    con, report = _load(tmp_path)
    assert report.spans_loaded == 3 and report.duplicates_identical == 0
    assert sorted(r[0] for r in con.execute("SELECT name FROM spans").fetchall()) == ["a", "b", "c"]
    assert con.execute("SELECT count(*) FROM span_events").fetchone()[0] == 3


def test_parquet_null_service_and_two_days_partition_like_export(tmp_path: Path) -> None:
    day = 86_400 * 10**9
    late = Span(trace_id=(9).to_bytes(16, "big"), span_id=(9).to_bytes(8, "big"), name="next-day",
                start_time_unix_nano=1_700_000_000_000_000_000 + day, end_time_unix_nano=1_700_000_000_000_000_001 + day)
    with Receiver(tmp_path / "pq", grpc_addr="off", http_addr="127.0.0.1:0", out_format="parquet") as rx:
        _post(rx.http_port, _request(_span(1), late, service=None))
    con, report = _load(tmp_path / "pq")
    assert report.spans_loaded == 2 and con.execute("SELECT count(*) FROM spans WHERE service_name IS NULL").fetchone()[0] == 2
    export_parquet(con, tmp_path / "exported")
    folders = {p.parent.relative_to(tmp_path / "pq") for p in _dataset_files(tmp_path / "pq")}
    assert folders == {p.parent.relative_to(tmp_path / "exported") for p in _dataset_files(tmp_path / "exported")}
    assert len(folders) == 3  # spans on two days, events on one


def test_rotation_compacts_segments_into_several_files_that_load_together(tmp_path: Path) -> None:
    n_requests, per_request = 12, 5
    with Receiver(tmp_path, grpc_addr="off", http_addr="127.0.0.1:0", out_format="parquet", rotate_bytes=12_000,
                  fsync=True) as rx:
        for i in range(n_requests):
            _post(rx.http_port, _request(*[_span(i * per_request + k) for k in range(per_request)]))
            if i == 0:
                part = next((tmp_path / "spans").rglob("part-*.parquet"))
                assert PART_NAME.match(part.name)  # a request is in place, as a part, before its ack
    span_files = sorted((tmp_path / "spans").rglob("*.parquet"))
    assert len(span_files) >= 2 and all(SEGMENT_NAME.match(f.name) for f in span_files)
    assert not list(tmp_path.rglob("*.tmp")) and not list((tmp_path / WORKSPACE / "incoming").iterdir())
    with duckdb.connect() as con:
        per_file = [con.execute(f"SELECT count(*) FROM read_parquet('{f}')").fetchone()[0] for f in span_files]
        columns = con.execute(f"DESCRIBE SELECT * FROM read_parquet('{span_files[0]}', hive_partitioning = false)").fetchall()
    assert sum(per_file) == n_requests * per_request and max(per_file) > per_request  # parts were merged
    assert "service_name" not in {c[0] for c in columns}  # partition keys stay in the path, as export writes them
    assert rx.writer.segments_compacted == len(span_files)
    _con, report = _load(tmp_path)
    assert report.spans_loaded == n_requests * per_request and report.duplicates_identical == 0


def _written_with_parts(out: Path, n: int) -> tuple[dict[Path, bytes], int]:
    """Receive ``n`` one-span requests (two events each) into ``out``, stop cleanly; returns the
    part files as they were just before the stop compacted them, and the span count."""
    with Receiver(out, grpc_addr="off", http_addr="127.0.0.1:0", out_format="parquet") as rx:
        for i in range(n):
            _post(rx.http_port, _request(_span(i, events=2)))
        parts = {p: p.read_bytes() for p in out.rglob("part-*.parquet")}
    assert parts and not list(out.rglob("part-*.parquet"))
    return parts, n


def test_killed_between_compaction_rename_and_deletes_loads_and_restart_cleans_up(tmp_path: Path) -> None:
    out = tmp_path / "pq"
    parts, n = _written_with_parts(out, 6)
    for path, data in parts.items():  # what a kill right after the renames leaves: seg- files and their parts
        path.write_bytes(data)
    con, report = _load(out)
    assert report.spans_loaded == n and report.duplicates_identical == n and report.rejected == 0
    with Receiver(out, grpc_addr="off", http_addr="127.0.0.1:0", out_format="parquet") as rx:
        assert rx.writer.recovery.duplicate_parts_removed == len(parts)
    assert not list(out.rglob("part-*.parquet"))
    con, report = _load(out)
    assert report.spans_loaded == n and report.duplicates_identical == 0
    assert con.execute("SELECT count(*) FROM span_events").fetchone()[0] == 2 * n


def test_killed_between_compaction_rename_and_deletes_keeps_events_single(tmp_path: Path) -> None:
    out = tmp_path / "pq"
    parts, n = _written_with_parts(out, 3)
    for path, data in parts.items():
        path.write_bytes(data)
    con, _report = _load(out)
    assert con.execute("SELECT count(*) FROM span_events").fetchone()[0] == 2 * n


def test_killed_mid_compaction_and_mid_request_nothing_acknowledged_is_lost(tmp_path: Path) -> None:
    out = tmp_path / "pq"
    parts, n = _written_with_parts(out, 4)
    for path in out.rglob("seg-*.parquet"):  # killed while writing the compacted temporaries
        (path.parent / f".{path.name}.tmp").write_bytes(path.read_bytes()[:100])
        path.unlink()
    for path, data in parts.items():
        path.write_bytes(data)
    # a fifth request written completely, killed after its events moved in but before its span did
    source = connect(":memory:")
    load_paths(source, [str(_write_jsonl(tmp_path / "one.jsonl", _request(_span(99, "moving", events=2))))])
    incoming = out / WORKSPACE / "incoming"
    ready = incoming / "20250101T000000Z-abcdef-000001-00000001.ready"
    export_parquet(source, ready)
    for event_file in (ready / "span_events").rglob("*.parquet"):
        target = out / event_file.parent.relative_to(ready) / f"part-20250101T000000Z-abcdef-000001-00000001-{event_file.stem}.parquet"
        target.parent.mkdir(parents=True, exist_ok=True)
        event_file.rename(target)
    # and a sixth one cut short while being written (never acknowledged)
    writing = incoming / "20250101T000000Z-abcdef-000001-00000002.writing" / "spans"
    writing.mkdir(parents=True)
    (writing / "data_0.parquet").write_bytes(b"PAR1 cut short")

    con, report = _load(out)  # before any restart: the temporaries and the half-moved request are not read
    assert report.spans_loaded == n and report.rejected == 0
    assert con.execute("SELECT count(*) FROM span_events").fetchone()[0] == 2 * n  # orphan events ignored

    with Receiver(out, grpc_addr="off", http_addr="127.0.0.1:0", out_format="parquet") as rx:
        recovery = rx.writer.recovery
        assert (recovery.requests_completed, recovery.requests_discarded) == (1, 1)
        assert recovery.temporaries_removed == len({p.parent for p in parts})
    assert not [p for p in out.rglob("*") if p.is_file() and (p.suffix == ".tmp" or PART_NAME.match(p.name))]
    assert not list(incoming.iterdir())
    con, report = _load(out)
    assert report.spans_loaded == n + 1 and report.duplicates_identical == 0
    assert con.execute("SELECT count(*) FROM span_events").fetchone()[0] == 2 * (n + 1)


def _write_jsonl(path: Path, request: ExportTraceServiceRequest) -> Path:
    from analyzer.collect import request_to_otlp_json

    path.write_text(json.dumps(request_to_otlp_json(request)) + "\n", encoding="utf-8")
    return path


def test_second_receiver_on_the_same_folder_is_refused(tmp_path: Path, runner: CliRunner) -> None:
    with Receiver(tmp_path, grpc_addr="off", http_addr="127.0.0.1:0", out_format="parquet"):
        result = runner.invoke(cli, ["collect", "--out", str(tmp_path), "--format", "parquet", "--grpc", "off",
                                     "--http", ":0"], catch_exceptions=False)
        assert result.exit_code == 1 and "in use by another tokentrace collect" in result.output
        assert "Traceback" not in result.output


@pytest.mark.parametrize(("existing", "fmt", "message"), [
    ("otlp-traces-20250101T000000Z-000001.jsonl", "parquet", "holds OTLP/JSON lines files"),
    ("spans/x.parquet", "jsonl", "holds a Parquet dump"),
])
def test_one_format_per_folder(tmp_path: Path, runner: CliRunner, existing: str, fmt: str, message: str) -> None:
    (tmp_path / existing).parent.mkdir(parents=True, exist_ok=True)
    (tmp_path / existing).write_text("")
    result = runner.invoke(cli, ["collect", "--out", str(tmp_path), "--format", fmt, "--grpc", "off", "--http", ":0"],
                           catch_exceptions=False)
    assert result.exit_code == 1 and message in result.output and "Traceback" not in result.output


def test_cli_collect_parquet_runs_and_reports_compaction(tmp_path: Path, runner: CliRunner) -> None:
    result = runner.invoke(cli, ["collect", "--out", str(tmp_path), "--format", "parquet", "--grpc", ":0",
                                 "--http", ":0", "--max-seconds", "0.5"], catch_exceptions=False)
    assert result.exit_code == 0, result.output
    assert "0 segment(s) compacted" in result.output
    shutil.rmtree(tmp_path / WORKSPACE)
    assert not list(tmp_path.iterdir())  # nothing received, nothing written


def test_parquet_file_names_stay_inside_the_folder_whatever_the_sender_says(tmp_path: Path) -> None:
    """Service names become partition folders (percent-encoded by DuckDB, as in export); nothing
    a sender controls leaves ``--out`` or reaches a file name."""
    out = tmp_path / "a" / ".." / "rx"
    names = ["../../x", "a/b", "svc=1", "..", "%2e%2e"]
    with Receiver(out, grpc_addr="off", http_addr="127.0.0.1:0", out_format="parquet", rotate_bytes=1) as rx:
        for i, service in enumerate(names):
            _post(rx.http_port, _request(_span(i, "../../../etc/passwd"), service=service))
    root = (tmp_path / "rx").resolve()
    everything = [p.resolve() for p in tmp_path.rglob("*") if p.is_file()]
    assert all(p.is_relative_to(root) for p in everything)
    data = [p for p in everything if WORKSPACE not in p.parts]
    assert data and all(SEGMENT_NAME.match(p.name) for p in data)
    assert {p.relative_to(root).parts[0] for p in data} == {"spans", "span_events"}
    assert all(len(p.relative_to(root).parts) == 4 for p in data)  # table / service_name= / date= / file
    con, report = _load(root)
    assert report.spans_loaded == len(names)
    assert sorted(r[0] for r in con.execute("SELECT service_name FROM spans").fetchall()) == sorted(names)


def test_write_failure_is_retryable_and_a_restart_moves_the_written_request_in(tmp_path: Path) -> None:
    (tmp_path / "span_events").write_text("a file where the events folder goes")  # every move of events fails
    with Receiver(tmp_path, grpc_addr="off", http_addr="127.0.0.1:0", out_format="parquet") as rx:
        url = f"http://127.0.0.1:{rx.http_port}/v1/traces"
        failed = httpx.post(url, content=_request(_span(1, "with-events")).SerializeToString(),
                            headers={"Content-Type": "application/x-protobuf"}, timeout=TIMEOUT_S)
        assert failed.status_code == 503 and "could not write the spans" in failed.text  # OTLP: retry later
        assert not _post(rx.http_port, _request(_span(2, "no-events", events=0))).HasField("partial_success")
    assert (rx.stats.requests_failed, rx.stats.spans_written) == (1, 1)
    (tmp_path / "span_events").unlink()
    with Receiver(tmp_path, grpc_addr="off", http_addr="127.0.0.1:0", out_format="parquet") as rx:
        assert rx.writer.recovery.requests_completed == 1  # written completely before the failed move
    con, report = _load(tmp_path)
    assert sorted(r[0] for r in con.execute("SELECT name FROM spans").fetchall()) == ["no-events", "with-events"]
    assert con.execute("SELECT count(*) FROM span_events").fetchone()[0] == 1


def test_compaction_failure_keeps_the_parts_loadable(tmp_path: Path) -> None:
    warnings: list[str] = []
    with Receiver(tmp_path, grpc_addr="off", http_addr="127.0.0.1:0", out_format="parquet") as rx:
        rx.writer.log = warnings.append
        for i in range(3):
            _post(rx.http_port, _request(_span(i)))
        part = next((tmp_path / "spans").rglob("part-*.parquet"))
        blocker = part.parent / f".seg-{PART_NAME.match(part.name).group('segment')}.parquet.tmp"
        blocker.mkdir()  # the compacted temporary cannot be written
    assert len(warnings) == 1 and "could not compact segment" in warnings[0] and "stay and load" in warnings[0]
    assert rx.writer.compaction_errors == 1 and rx.writer.segments_compacted == 0
    assert len(list((tmp_path / "spans").rglob("part-*.parquet"))) == 3
    assert not list((tmp_path / "span_events").rglob("part-*.parquet"))  # the other folder compacted
    _con, report = _load(tmp_path)
    assert report.spans_loaded == 3
