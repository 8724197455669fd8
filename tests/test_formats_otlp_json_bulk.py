"""The SQL bulk path for OTLP/JSON lines gives exactly the Python reader's rows, and hands
anything unusual back to the Python reader (which then names line and reason)."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

import analyzer.load as load_module
from analyzer.formats import otlp_json_duckdb
from analyzer.load import LoadError, load_paths
from analyzer.store import connect

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))
from ingest import generate  # noqa: E402

SAMPLES = Path(__file__).resolve().parents[2] / "shared" / "samples"
TABLES = {"spans": "* EXCLUDE (load_id)", "span_events": "*", "span_links": "*"}


def _load(paths, bulk: bool, monkeypatch, lenient=False):
    used = []
    real = otlp_json_duckdb.stage_json_lines

    def spy(*a):
        r = real(*a)
        used.append(r is not None)
        return r

    monkeypatch.setattr(load_module.otlp_json_duckdb, "stage_json_lines", spy)
    monkeypatch.setattr(load_module, "BULK_MIN_BYTES", 0 if bulk else 1 << 60)
    con = connect()
    report = load_paths(con, [str(p) for p in paths], lenient=lenient)
    return con, report, used


def _rows(con):
    return {t: sorted(map(repr, con.execute(f"SELECT {cols} FROM {t}").fetchall())) for t, cols in TABLES.items()}


@pytest.fixture(scope="module")
def generated(tmp_path_factory):
    p = tmp_path_factory.mktemp("gen") / "gen.jsonl"
    generate(p, 1500)
    return p


def test_bulk_and_python_paths_give_identical_rows(generated, monkeypatch):
    paths = [generated, SAMPLES / "python_sdk_otlp_json_file_exporter.jsonl", SAMPLES / "jaegerui_otlp_multi_line.jsonl"]
    con_b, rep_b, used = _load(paths, True, monkeypatch)
    assert used == [True, True, True]
    con_p, rep_p, used_p = _load(paths, False, monkeypatch)
    assert used_p == []
    assert [(f.records_read, f.spans_read, f.spans_loaded) for f in rep_b.files] == [
        (f.records_read, f.spans_read, f.spans_loaded) for f in rep_p.files]
    assert rep_b.files[1].spans_loaded == 3 and rep_b.files[0].spans_loaded == rep_b.files[0].spans_read > 1400
    assert _rows(con_b) == _rows(con_p)


def test_bulk_path_counts_identical_duplicates(tmp_path, monkeypatch):
    line = (SAMPLES / "python_sdk_otlp_json_file_exporter.jsonl").read_text()
    p = tmp_path / "twice.jsonl"
    p.write_text(line + line)
    con, rep, used = _load([p], True, monkeypatch)
    assert used == [True]
    assert (rep.files[0].records_read, rep.files[0].spans_read, rep.files[0].spans_loaded, rep.files[0].duplicates_identical) == (2, 6, 3, 3)


@pytest.mark.parametrize("tail,reason", [
    ('{"resourceSpans": [\n', "invalid_json"),
    ('{"resourceSpans":[{"scopeSpans":[{"spans":[{"traceId":"","spanId":"","name":"x"}]}]}]}\n', "empty_trace_id"),
    ('{"resourceLogs": []}\n', "not_traces"),
    ('{"resourceSpans":[{"scopeSpans":[{"spans":[{"traceId":"41aa2dcd551ff9f28f3695a19daca0f4","spanId":"b71f57bcd7674639",'
     '"name":"changed","startTimeUnixNano":"1","endTimeUnixNano":"2"}]}]}]}\n', "conflicting_duplicate"),
])  # fmt: skip
def test_bulk_path_falls_back_and_the_python_reader_names_the_line(tmp_path, monkeypatch, tail, reason):
    p = tmp_path / "bad.jsonl"
    p.write_text((SAMPLES / "python_sdk_otlp_json_file_exporter.jsonl").read_text() + tail)
    with pytest.raises(LoadError) as err:
        _load([p], True, monkeypatch)
    assert (err.value.line, err.value.reason) == (2, reason)
    con, rep, used = _load([p], True, monkeypatch, lenient=True)
    assert rep.files[0].rejected_by_reason == {reason: 1} and rep.files[0].spans_loaded == 3
    assert con.execute("SELECT line, reason FROM rejects").fetchall() == [(2, reason)]


def test_snake_case_file_goes_to_the_python_reader(tmp_path, monkeypatch):
    d = {"resource_spans": [{"scope_spans": [{"spans": [{"trace_id": "41aa2dcd551ff9f28f3695a19daca0f4", "span_id": "b71f57bcd7674639",
          "name": "x", "start_time_unix_nano": "1", "end_time_unix_nano": "2"}]}]}]}  # fmt: skip
    p = tmp_path / "snake.jsonl"
    p.write_text(json.dumps(d) + "\n")
    _, rep, used = _load([p], True, monkeypatch)
    assert used == [False] and rep.files[0].spans_loaded == 1
