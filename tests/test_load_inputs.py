"""Inputs: directories, globs, stdin, gzip and zstd (by magic bytes), empty files."""

from __future__ import annotations

import gzip
import io
import shutil
import sys
from pathlib import Path

import pytest

from analyzer.db.store import connect
from analyzer.errors import LoadError
from analyzer.formats.load import load_paths
from data_paths import SAMPLES

SDK = SAMPLES / "python_sdk_otlp_json_file_exporter.jsonl"
MULTI = SAMPLES / "jaegerui_otlp_multi_line.jsonl"


def test_gzip_and_zstd_by_magic_bytes(tmp_path):
    zstandard = pytest.importorskip("zstandard")
    (tmp_path / "a.jsonl.gz").write_bytes(gzip.compress(SDK.read_bytes()))
    (tmp_path / "b.data").write_bytes(zstandard.ZstdCompressor().compress(MULTI.read_bytes()))
    con = connect()
    r = load_paths(con, [str(tmp_path / "a.jsonl.gz"), str(tmp_path / "b.data")])
    assert [(f.format, f.spans_loaded) for f in r.files] == [("otlp_json_lines", 3), ("otlp_json_lines", 4)]


def test_directory_and_glob(tmp_path):
    for name in ("x.jsonl", "sub/y.json"):
        (tmp_path / name).parent.mkdir(exist_ok=True)
    shutil.copy(SDK, tmp_path / "x.jsonl")
    shutil.copy(SAMPLES / "otlp_proto_examples_trace.json", tmp_path / "sub" / "y.json")
    (tmp_path / ".hidden").write_text("not traces")
    r = load_paths(connect(), [str(tmp_path)])
    assert [(Path(f.file).name, f.spans_loaded) for f in r.files] == [("y.json", 1), ("x.jsonl", 3)]
    r = load_paths(connect(), [str(tmp_path / "**" / "*.json")])
    assert [Path(f.file).name for f in r.files] == ["y.json"]
    with pytest.raises(LoadError, match="no file matches"):
        load_paths(connect(), [str(tmp_path / "*.nothing")])
    with pytest.raises(LoadError, match="no such file"):
        load_paths(connect(), [str(tmp_path / "missing.jsonl")])


def test_stdin(monkeypatch):
    monkeypatch.setattr(sys, "stdin", io.TextIOWrapper(io.BytesIO(gzip.compress(MULTI.read_bytes()))))
    r = load_paths(connect(), ["-"])
    assert (r.files[0].file, r.files[0].spans_loaded) == ("<stdin>", 4)


def test_empty_file_is_recorded_with_zero_counts(tmp_path):
    (tmp_path / "e.jsonl").write_text("")
    con = connect()
    r = load_paths(con, [str(tmp_path / "e.jsonl")])
    assert (r.files[0].format, r.files[0].records_read) == ("empty", 0)
    assert con.execute("SELECT format, spans_read FROM loads").fetchall() == [("empty", 0)]


def test_forced_input_format_mismatch_is_an_error():
    with pytest.raises(LoadError, match="Jaeger JSON, not OTLP"):
        load_paths(connect(), [str(SAMPLES / "jaeger_ui_model_ui_01.json")], input_format="otlp-json")
    with pytest.raises(LoadError, match="invalid_option"):
        load_paths(connect(), [str(SDK)], input_format="csv")


def test_failing_file_leaves_nothing_of_itself_but_earlier_files_stay(tmp_path):
    con = connect()
    with pytest.raises(LoadError):
        load_paths(con, [str(SDK), str(SAMPLES / "otel_spec_file_exporter_traces.jsonl")])
    assert con.execute("SELECT count(*) FROM spans").fetchone()[0] == 3
    assert con.execute("SELECT count(*) FROM loads").fetchone()[0] == 1
