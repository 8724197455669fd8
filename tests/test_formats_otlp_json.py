"""OTLP/JSON reader: tolerance (what the Collector accepts), rejects with reasons, strict errors."""

from __future__ import annotations

import base64
import json

import pytest

from analyzer.db.store import connect
from analyzer.errors import LoadError
from analyzer.formats.load import load_paths

TRACE = "5b8efff798038103d269b633813fc60c"


def span(span_id: str = "eee19b7ec3c1b174", **over) -> dict:
    s = {"traceId": TRACE, "spanId": span_id, "name": "op", "kind": 2,
         "startTimeUnixNano": "1544712660000000000", "endTimeUnixNano": "1544712661000000000"}  # fmt: skip
    s.update(over)
    return {k: v for k, v in s.items() if v is not None}


def doc(*spans: dict, resource: dict | None = None) -> dict:
    return {"resourceSpans": [{"resource": resource or {}, "scopeSpans": [{"scope": {"name": "s"}, "spans": list(spans)}]}]}


def write_lines(tmp_path, *docs, raw_tail: str = "", name: str = "t.jsonl"):
    p = tmp_path / name
    p.write_text("".join(json.dumps(d) + "\n" for d in docs) + raw_tail)
    return p


def load(path, lenient=True):
    con = connect()
    return con, load_paths(con, [str(path)], lenient=lenient).files[0]


def test_snake_case_numbers_enum_names_and_uppercase_ids(tmp_path):
    snake = {"trace_id": TRACE.upper(), "span_id": "EEE19B7EC3C1B174", "parent_span_id": "", "name": "op",
             "kind": "SPAN_KIND_CLIENT", "start_time_unix_nano": 1544712660000000000, "end_time_unix_nano": 1544712661000000000,
             "status": {"code": "STATUS_CODE_ERROR", "message": "m"}, "unknownField": {"x": 1},
             "attributes": [{"key": "n", "value": {"int_value": 7}}, {"key": "d", "value": {"double_value": "NaN"}}]}  # fmt: skip
    p = write_lines(tmp_path, {"resource_spans": [{"scope_spans": [{"spans": [snake]}]}]})
    con, f = load(p, lenient=False)
    assert f.spans_loaded == 1
    row = con.execute("SELECT trace_id, span_id, parent_span_id, kind, status_code, status_message, attr_int, start_ns FROM spans").fetchone()
    assert row == (TRACE, "eee19b7ec3c1b174", None, "CLIENT", "ERROR", "m", {"n": 7}, 1544712660000000000)


def test_base64_ids_that_decode_to_16_and_8_bytes(tmp_path):
    tid, sid = base64.b64encode(bytes.fromhex(TRACE)).decode(), base64.b64encode(bytes.fromhex("eee19b7ec3c1b174")).decode()
    con, f = load(write_lines(tmp_path, doc(span(traceId=tid, spanId=sid))), lenient=False)
    assert con.execute("SELECT trace_id, span_id FROM spans").fetchone() == (TRACE, "eee19b7ec3c1b174")


@pytest.mark.parametrize("over,reason", [
    ({"traceId": "abc"}, "invalid_trace_id"),
    ({"traceId": "zz" * 16}, "invalid_trace_id"),
    ({"spanId": ""}, "empty_span_id"),
    ({"spanId": "0" * 16}, "empty_span_id"),
    ({"parentSpanId": "xyz"}, "invalid_parent_span_id"),
    ({"startTimeUnixNano": None}, "missing_start_time"),
    ({"endTimeUnixNano": "soon"}, "invalid_time"),
    ({"endTimeUnixNano": "1544712659000000000"}, "end_before_start"),
    ({"kind": 9}, "invalid_field"),
    ({"attributes": [{"key": "x", "value": {"intValue": "1.5"}}]}, "invalid_attribute"),
    ({"events": [{"name": "e"}]}, "invalid_event_time"),
    ({"links": [{"traceId": TRACE, "spanId": "12"}]}, "invalid_link_id"),
])  # fmt: skip
def test_bad_spans_are_rejected_with_a_reason(tmp_path, over, reason):
    p = write_lines(tmp_path, doc(span("0000000000000001"), span(**over)))
    con, f = load(p)
    assert (f.spans_read, f.spans_loaded, f.rejected_by_reason) == (2, 1, {reason: 1})
    line, rec, why, raw = con.execute("SELECT line, record_index, reason, raw FROM rejects").fetchone()
    assert (line, rec, why) == (1, 1, reason) and json.loads(raw)["name"] == "op"
    with pytest.raises(LoadError, match=rf"t.jsonl:1: {reason}"):
        load(p, lenient=False)


def test_invalid_json_line_and_incomplete_last_line(tmp_path):
    p = write_lines(tmp_path, doc(span("0000000000000001")), raw_tail='{"resourceSpans": [\n' + json.dumps(doc(span("0000000000000002")))[:-9])
    con, f = load(p)
    assert (f.records_read, f.spans_loaded, f.incomplete_last_line) == (3, 1, True)
    assert f.rejected_by_reason == {"invalid_json": 1, "incomplete_last_line": 1}
    assert con.execute("SELECT line, reason FROM rejects ORDER BY line").fetchall() == [(2, "invalid_json"), (3, "incomplete_last_line")]
    with pytest.raises(LoadError, match=r"t.jsonl:2: invalid_json"):
        load(p, lenient=False)


def test_incomplete_last_line_alone_is_not_fatal_in_strict_mode(tmp_path):
    p = write_lines(tmp_path, doc(span("0000000000000001")), raw_tail=json.dumps(doc(span("0000000000000002")))[:-3])
    con, f = load(p, lenient=False)
    assert (f.spans_loaded, f.incomplete_last_line, f.rejected_by_reason) == (1, True, {"incomplete_last_line": 1})
    assert con.execute("SELECT incomplete_last_line FROM loads").fetchone() == (True,)


def test_duplicates_identical_and_conflicting(tmp_path):
    a, b = span("0000000000000001"), span("0000000000000001", name="other")
    p = write_lines(tmp_path, doc(a, a), doc(a, b))
    con, f = load(p)
    assert (f.spans_read, f.spans_loaded, f.duplicates_identical, f.duplicates_conflicting) == (4, 1, 2, 1)
    assert con.execute("SELECT line, reason FROM rejects").fetchall() == [(2, "conflicting_duplicate")]
    assert con.execute("SELECT name FROM spans").fetchall() == [("op",)]


def test_events_links_and_typed_values(tmp_path):
    s = span(events=[{"timeUnixNano": "1544712660500000000", "name": "tokentrace.chunk",
                      "attributes": [{"key": "tokentrace.chunk.index", "value": {"intValue": "0"}}]}],
             links=[{"traceId": TRACE, "spanId": "0000000000000009", "traceState": "k=v", "flags": 1}],
             attributes=[{"key": "gen_ai.response.finish_reasons", "value": {"arrayValue": {"values": [{"stringValue": "stop"}]}}},
                         {"key": "kv", "value": {"kvlistValue": {"values": [{"key": "a", "value": {"boolValue": True}}]}}},
                         {"key": "b", "value": {"bytesValue": "AAAwOQ=="}}, {"key": "empty", "value": {}}])  # fmt: skip
    con, f = load(write_lines(tmp_path, doc(s, resource={"attributes": [{"key": "service.name", "value": {"stringValue": "gw"}}]})), lenient=False)
    assert con.execute("SELECT attr_json, service_name, clock_domain FROM spans").fetchone() == (
        {"gen_ai.response.finish_reasons": '["stop"]', "kv": '{"a":true}', "b": '{"bytes_base64":"AAAwOQ=="}', "empty": "null"}, "gw", "gw||")
    assert con.execute("SELECT event_index, time_ns, attr_int FROM span_events").fetchall() == [(0, 1544712660500000000, {"tokentrace.chunk.index": 0})]
    assert con.execute("SELECT linked_span_id, trace_state, flags FROM span_links").fetchall() == [("0000000000000009", "k=v", 1)]


def test_logs_line_among_traces_is_rejected_as_not_traces(tmp_path):
    p = write_lines(tmp_path, doc(span()), {"resourceLogs": []})
    _, f = load(p)
    assert f.rejected_by_reason == {"not_traces": 1} and f.spans_loaded == 1


def test_api_v3_wrapped_lines(tmp_path):
    _, f = load(write_lines(tmp_path, {"result": doc(span("0000000000000001"))}, {"result": doc(span("0000000000000002"))}), lenient=False)
    assert (f.format, f.records_read, f.spans_loaded) == ("otlp_json_lines", 2, 2)
