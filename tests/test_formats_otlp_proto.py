"""OTLP/protobuf as the Collector's file exporter writes it: length-prefixed, zstd per message."""

from __future__ import annotations

import pytest

from analyzer.db.store import connect
from analyzer.errors import LoadError
from analyzer.formats.load import load_paths
from analyzer.formats.otlp_proto import write_length_prefixed
from analyzer.formats.writers import to_otlp_proto
from data_paths import SAMPLES

COLS = "* EXCLUDE (load_id)"


def _sample_rows():
    con = connect()
    load_paths(con, [str(SAMPLES / "python_sdk_otlp_json_file_exporter.jsonl"), str(SAMPLES / "jaeger_fixture_link_attributes_trace.otlp.json")])
    return con, _with_children(con)


def _with_children(con):
    cur = con.execute(f"SELECT {COLS} FROM spans ORDER BY span_id")
    cols = [d[0] for d in cur.description]
    spans = [dict(zip(cols, r)) for r in cur.fetchall()]
    for table, key in (("span_events", "events"), ("span_links", "links")):
        cur = con.execute(f"SELECT * FROM {table} ORDER BY 3")
        cc = [d[0] for d in cur.description]
        rows = [dict(zip(cc, r)) for r in cur.fetchall()]
        for s in spans:
            s[key] = [r for r in rows if (r["trace_id"], r["span_id"]) == (s["trace_id"], s["span_id"])]
    return spans


@pytest.mark.parametrize("zstd", [None, 3])
def test_proto_round_trip(tmp_path, zstd):
    if zstd:
        pytest.importorskip("zstandard")
    con, spans = _sample_rows()
    p = tmp_path / "traces.binpb"
    p.write_bytes(write_length_prefixed([to_otlp_proto(spans[:2]), to_otlp_proto(spans[2:])], zstd_level=zstd))
    con2 = connect()
    f = load_paths(con2, [str(p)]).files[0]
    assert (f.format, f.records_read, f.spans_loaded) == ("otlp_proto_zstd" if zstd else "otlp_proto", 2, 4)
    assert _with_children(con2) == spans


def test_truncated_last_message_and_garbage(tmp_path):
    _, spans = _sample_rows()
    body = write_length_prefixed([to_otlp_proto(spans[:1]), b"\x0a\xff\xff", to_otlp_proto(spans[1:])])
    p = tmp_path / "t.pb"
    p.write_bytes(body[:-5])
    f = load_paths(connect(), [str(p)], lenient=True).files[0]
    assert f.rejected_by_reason == {"invalid_protobuf": 1, "incomplete_last_line": 1}
    assert (f.spans_loaded, f.incomplete_last_line) == (1, True)
    with pytest.raises(LoadError, match=r"t.pb:2: invalid_protobuf"):
        load_paths(connect(), [str(p)])
