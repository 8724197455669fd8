"""Parquet export: Hive partitions, BIGINT ns times, and a lossless load back."""

from __future__ import annotations

from pathlib import Path

import duckdb
import pytest

from analyzer.db.store import connect
from analyzer.errors import ExportError
from analyzer.formats.load import load_paths
from analyzer.formats.parquet_export import export_parquet
from data_paths import SAMPLES

FILES = ["python_sdk_otlp_json_file_exporter.jsonl", "jaeger_ui_model_ui_01.json", "jaeger_fixture_link_attributes_trace.otlp.json",
         "jaeger_fixture_log_tags_trace.otlp.json", "otlp_proto_examples_trace.json"]  # fmt: skip
TABLES = {"spans": "* EXCLUDE (load_id)", "span_events": "*", "span_links": "*"}


def _tables(con):
    return {t: sorted(map(repr, con.execute(f"SELECT {c} FROM {t}").fetchall())) for t, c in TABLES.items()}


def test_round_trip_is_lossless(tmp_path):
    con = connect()
    load_paths(con, [str(SAMPLES / f) for f in FILES], lenient=True)
    report = export_parquet(con, tmp_path / "dump")
    assert (report.spans, report.span_events, report.span_links) == (10, 6, 6)
    parts = sorted(str(p.relative_to(tmp_path / "dump").parent) for p in (tmp_path / "dump").rglob("*.parquet"))
    assert "spans/service_name=sample-svc/date=2026-11-30" in parts
    assert "spans/service_name=query25-service/date=2017-01-26" in parts
    assert duckdb.connect().execute(f"SELECT typeof(start_ns) FROM read_parquet('{tmp_path}/dump/spans/**/*.parquet') LIMIT 1").fetchall() == [("BIGINT",)]
    con2 = connect()
    f = load_paths(con2, [str(tmp_path / "dump")]).files[0]
    assert (f.format, f.spans_read, f.spans_loaded) == ("parquet", 10, 10)
    assert _tables(con2) == _tables(con)
    again = load_paths(con2, [str(tmp_path / "dump")]).files[0]
    assert (again.spans_loaded, again.duplicates_identical) == (0, 10)


def test_export_refuses_a_non_empty_directory(tmp_path):
    (tmp_path / "x").write_text("keep me")
    with pytest.raises(ExportError, match="not empty"):
        export_parquet(connect(), tmp_path)


def test_parquet_rows_are_checked_like_any_input(tmp_path):
    con = connect()
    load_paths(con, [str(SAMPLES / "python_sdk_otlp_json_file_exporter.jsonl")])
    con.execute("UPDATE spans SET end_ns = start_ns - 1 WHERE name = 'background-job'")
    export_parquet(con, tmp_path / "d")
    f = load_paths(connect(), [str(tmp_path / "d")], lenient=True).files[0]
    assert (f.spans_loaded, f.rejected_by_reason) == (2, {"end_before_start": 1})


def _dump_with_a_second_copy(tmp_path, change_event_name: bool) -> Path:
    """A dump whose every span and event file is there twice (as a sender's retry or a
    receiver crash between compaction and cleanup leaves it), optionally with one event renamed."""
    con = connect()
    load_paths(con, [str(SAMPLES / "jaeger_fixture_log_tags_trace.otlp.json")], lenient=True)
    dump = tmp_path / "dump"
    export_parquet(con, dump)
    for table in ("spans", "span_events"):
        for part in list((dump / table).rglob("*.parquet")):
            copy = part.with_name("copy-" + part.name)
            if table == "span_events" and change_event_name:
                duckdb.connect().execute(
                    f"COPY (SELECT * REPLACE (name || '-changed' AS name) FROM read_parquet('{part}')) TO '{copy}' (FORMAT parquet)")
            else:
                copy.write_bytes(part.read_bytes())
    return dump


def test_a_span_twice_in_a_dump_keeps_its_events_once(tmp_path):
    con = connect()
    load_paths(con, [str(SAMPLES / "jaeger_fixture_log_tags_trace.otlp.json")], lenient=True)
    expected = _tables(con)
    assert expected["span_events"], "the sample must carry events for this test to mean anything"
    con2 = connect()
    f = load_paths(con2, [str(_dump_with_a_second_copy(tmp_path, change_event_name=False))]).files[0]
    assert f.spans_read == 2 * f.spans_loaded and f.duplicates_identical == f.spans_loaded
    assert _tables(con2) == expected


def test_a_span_twice_in_a_dump_with_different_events_is_refused(tmp_path):
    from analyzer.errors import LoadError

    with pytest.raises(LoadError, match="conflicting_duplicate: span_events: span .* two different rows with event_index"):
        load_paths(connect(), [str(_dump_with_a_second_copy(tmp_path, change_event_name=True))])
