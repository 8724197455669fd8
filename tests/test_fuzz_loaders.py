"""Fuzzed loaders: structured corruption of every input format gives a LoadError (one readable
line) or counted rejects - never another exception, never a hang, never an unaccounted span.

tests/test_load_properties.py (helper-2) already covers exact round trips for every format and
byte edits of OTLP/JSON lines; this file adds what it does not: wrong types, huge values,
deep nesting, NaN/Infinity, invalid UTF-8, empty / wrong-length / non-hex ids, in OTLP/JSON
lines and documents and Jaeger JSON; truncation, bit flips and absurd length prefixes in
OTLP/protobuf; damaged files and wrong column types in Parquet dumps; and the same file
loaded twice (every span counted as an identical duplicate).

Example counts: ``TOKENTRACE_FUZZ_EXAMPLES`` (default 30 per property; benchmarks/reliability.py
--fuzz documents a longer run). Each load runs under a timeout (a hang fails the test).
"""

from __future__ import annotations

import concurrent.futures
import copy
import json
import os
import random
import struct
from pathlib import Path
from typing import Any

import duckdb
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from analyzer.db.store import connect
from analyzer.errors import LoadError
from analyzer.formats.load import load_paths
from analyzer.formats.otlp_proto import write_length_prefixed
from analyzer.formats.parquet_export import export_parquet
from analyzer.formats.writers import to_jaeger_trace, to_otlp_json, to_otlp_proto
from test_load_properties import spans  # helper-2's generator of valid traces

EXAMPLES = int(os.environ.get("TOKENTRACE_FUZZ_EXAMPLES", "30"))
FUZZ = settings(max_examples=EXAMPLES, deadline=None,
                suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow, HealthCheck.data_too_large])
LOAD_TIMEOUT_S = 30.0
_POOL = concurrent.futures.ThreadPoolExecutor(max_workers=1, thread_name_prefix="fuzz-load")
TRIED: dict[str, int] = {}  # cases per property, read by benchmarks/reliability.py

DEEP = 5_000  # nesting depth of the "deep" corruption (past Python's recursion limit of 1,000)
_SENTINEL = "\u2063fuzz-raw-{}\u2063"


def _count(name: str) -> None:
    TRIED[name] = TRIED.get(name, 0) + 1


def load_accounted(paths: list[Path], *, lenient: bool = True) -> str:
    """Load under a timeout; 'error' for a LoadError, else 'loaded' after checking that every
    span read is loaded, an identical duplicate or a reject, and the tables agree."""
    con = connect()
    future = _POOL.submit(load_paths, con, [str(p) for p in paths], lenient=lenient)
    try:
        report = future.result(timeout=LOAD_TIMEOUT_S)
    except concurrent.futures.TimeoutError:
        raise AssertionError(f"load of {paths} did not finish within {LOAD_TIMEOUT_S} s (a hang)") from None
    except LoadError as e:
        message = str(e)
        assert message and "\n" not in message.strip() and "Traceback" not in message, message
        return "error"
    # A record-level reject (a whole line/document/message) counted no span; a span-level one
    # counted its span. A reject without ids can be either (a span that is not an object, or a
    # record whose resource is bad; the rejects table keeps no detail): it may fall on either side.
    record_level, ambiguous = con.execute(
        "SELECT count(*) FILTER (WHERE reason IN ('invalid_json', 'incomplete_last_line', 'not_traces', 'invalid_protobuf')),"
        " count(*) FILTER (WHERE span_id IS NULL AND trace_id IS NULL) FROM rejects").fetchone()  # fmt: skip
    outcomes = report.total("spans_loaded") + report.total("duplicates_identical") + report.total("rejected")
    ambiguous -= record_level
    assert record_level <= outcomes - report.total("spans_read") <= record_level + ambiguous, report
    assert con.execute("SELECT count(*) FROM rejects").fetchone()[0] == report.total("rejected")
    assert con.execute("SELECT count(*) FROM spans").fetchone()[0] == report.total("spans_loaded")
    row = con.execute("SELECT sum(records_read), sum(spans_read), sum(spans_loaded), sum(rejected) FROM loads").fetchone()
    assert tuple(v or 0 for v in row) == (report.total("records_read"), report.total("spans_read"),
                                          report.total("spans_loaded"), report.total("rejected"))  # fmt: skip
    return "loaded"


# --- structured corruption of a JSON tree ------------------------------------------------
BAD_IDS = ["", "abc", "0" * 32, "0" * 16, "g" * 16, "00" * 20, "AAAA", "é" * 8, " " * 16]
REPLACEMENTS = st.sampled_from([
    "x", 1, -1, 1.5, True, False, None, [], {}, [1, 2], {"a": 1},  # wrong types
    10**30, -(10**30), 2**64, 2**63, -(2**63) - 1, 1e308, -1e308, "9" * 400, "a" * 20_000,  # huge
    float("nan"), float("inf"), float("-inf"),  # NaN/Infinity (emitted as JSON tokens)
    "raw:deep", "raw:utf8", "raw:surrogate", "raw:nul",
] + BAD_IDS)  # fmt: skip
_RAW = {
    "deep": b"[" * DEEP + b"]" * DEEP,
    "utf8": b'"\xff\xfe\xc3("',  # invalid UTF-8 inside a string
    "surrogate": b'"\\ud800"',  # a lone surrogate escape
    "nul": b'"a\\u0000b"',
}


def _paths(node: Any, prefix: tuple = ()) -> list[tuple]:
    out = [prefix]
    if isinstance(node, dict):
        for k, v in node.items():
            out += _paths(v, prefix + (k,))
    elif isinstance(node, list):
        for i, v in enumerate(node):
            out += _paths(v, prefix + (i,))
    return out


def _set(node: Any, path: tuple, value: Any) -> Any:
    if not path:
        return value
    node[path[0]] = _set(node[path[0]], path[1:], value)
    return node


def corrupt_json(doc: Any, edits: list[tuple[int, Any, bool]], *, indent: int | None = None) -> bytes:
    """Apply (path choice, replacement, prefer an id field) edits; returns the serialized bytes."""
    raws: dict[str, bytes] = {}
    for choice, value, prefer_id in edits:
        paths = _paths(doc)
        ids = [p for p in paths if p and isinstance(p[-1], str) and p[-1].lower().endswith("id")]
        pool = ids if prefer_id and ids else paths
        path = pool[choice % len(pool)]
        if isinstance(value, str) and value.startswith("raw:"):
            token = _SENTINEL.format(len(raws))
            raws[json.dumps(token)] = _RAW[value[4:]]
            value = token
        doc = _set(doc, path, copy.deepcopy(value))  # sampled [] / {} are shared objects: never alias them
    data = json.dumps(doc, indent=indent, allow_nan=True).encode()
    for token, raw in raws.items():
        data = data.replace(token.encode(), raw)
    return data


EDITS = st.lists(st.tuples(st.integers(0, 10**6), REPLACEMENTS, st.booleans()), min_size=1, max_size=3)


@FUZZ
@given(spans(), EDITS)
def test_otlp_json_lines_structured_corruption(tmp_path_factory, generated, edits):
    _count("otlp_json_lines")
    lines = [json.dumps(to_otlp_json([s])).encode() for s in generated]
    i = edits[0][0] % len(lines)
    lines[i] = corrupt_json(json.loads(lines[i]), edits)
    p = tmp_path_factory.mktemp("fz") / "t.jsonl"
    p.write_bytes(b"\n".join(lines) + b"\n")
    load_accounted([p])


@FUZZ
@given(spans(), EDITS)
def test_otlp_json_document_structured_corruption(tmp_path_factory, generated, edits):
    _count("otlp_json_document")
    p = tmp_path_factory.mktemp("fz") / "t.json"
    p.write_bytes(corrupt_json(to_otlp_json(generated), edits, indent=2))
    load_accounted([p])


@FUZZ
@given(spans(jaeger=True), EDITS)
def test_jaeger_json_structured_corruption(tmp_path_factory, generated, edits):
    _count("jaeger_json")
    p = tmp_path_factory.mktemp("fz") / "t.json"
    p.write_bytes(corrupt_json(to_jaeger_trace(generated), edits))
    load_accounted([p])


PROTO_EDITS = st.lists(st.tuples(st.sampled_from(["truncate", "flip", "insert", "prefix"]), st.integers(0, 10**6),
                                 st.integers(0, 255)), min_size=1, max_size=3)  # fmt: skip


@FUZZ
@given(spans(), PROTO_EDITS)
def test_otlp_protobuf_byte_corruption(tmp_path_factory, generated, edits):
    _count("otlp_protobuf")
    data = bytearray(write_length_prefixed([to_otlp_proto([s]) for s in generated]))
    for op, pos, byte in edits:
        i = pos % max(1, len(data))
        if op == "truncate":
            del data[i:]
        elif op == "flip" and data:
            data[i] ^= 1 << (byte % 8)
        elif op == "insert":
            data[i:i] = bytes([byte])
        else:  # an absurd length prefix on the first message (up to 4 GiB)
            data[0:4] = struct.pack(">I", 0xFFFFFFFF - byte)
    if not data:
        data = bytearray(b"\x00")
    p = tmp_path_factory.mktemp("fz") / "t.pb"
    p.write_bytes(bytes(data))
    load_accounted([p])


@FUZZ
@given(spans(), st.sampled_from(["truncate", "flip", "garbage"]), st.integers(0, 10**6))
def test_parquet_dump_damaged_file(tmp_path_factory, generated, how, pos):
    _count("parquet_damaged")
    d = tmp_path_factory.mktemp("pq")
    p = d / "t.json"
    p.write_text(json.dumps(to_otlp_json(generated)))
    con = connect()
    load_paths(con, [str(p)])
    export_parquet(con, d / "dump")
    files = sorted((d / "dump").rglob("*.parquet"))
    target = files[pos % len(files)]
    data = bytearray(target.read_bytes())
    i = pos % len(data)
    if how == "truncate":
        del data[i:]
    elif how == "flip":
        data[i] ^= 0xFF
    else:
        data[i:i] = random.Random(pos).randbytes(64)
    target.write_bytes(bytes(data))
    load_accounted([d / "dump"])


WRONG_COLUMNS = st.sampled_from([
    ("span_id", "''"), ("span_id", "'abc'"), ("trace_id", "repeat('0', 32)"), ("trace_id", "NULL"),
    ("start_ns", "'not a time'"), ("start_ns", "1e300"), ("end_ns", "-1"), ("start_ns", "NULL"),
    ("name", "NULL"), ("name", "42"), ("kind", "'NOT_A_KIND'"), ("status_code", "3.5"),
    ("attr_double", "MAP {'x': 'nan'::DOUBLE}"), ("attr_int", "MAP {'x': 'a'}"), ("attr_str", "'not a map'"),
])  # fmt: skip


@FUZZ
@given(spans(), WRONG_COLUMNS)
def test_parquet_single_file_wrong_types_and_values(tmp_path_factory, generated, column_value):
    _count("parquet_wrong_types")
    column, value = column_value
    d = tmp_path_factory.mktemp("pq")
    p = d / "t.json"
    p.write_text(json.dumps(to_otlp_json(generated)))
    con = connect()
    load_paths(con, [str(p)])
    out = d / "spans.parquet"
    try:
        con.execute(f"COPY (SELECT * EXCLUDE ({column}), {value} AS {column} FROM spans) TO '{out}' (FORMAT parquet)")
    except duckdb.Error:
        return  # DuckDB itself cannot build such a file
    load_accounted([out])


@FUZZ
@given(spans(), st.sampled_from(["jsonl", "json", "pb"]))
def test_same_file_twice_every_span_is_an_identical_duplicate(tmp_path_factory, generated, fmt):
    _count("duplicate_delivery")
    d = tmp_path_factory.mktemp("dup")
    body = {"jsonl": lambda: (json.dumps(to_otlp_json(generated)) + "\n").encode(),
            "json": lambda: json.dumps(to_otlp_json(generated), indent=1).encode(),
            "pb": lambda: write_length_prefixed([to_otlp_proto(generated)])}[fmt]()
    (d / f"a.{fmt}").write_bytes(body)
    (d / f"b.{fmt}").write_bytes(body)
    con = connect()
    report = load_paths(con, [str(d / f"a.{fmt}"), str(d / f"b.{fmt}")])
    a, b = report.files
    assert a.spans_loaded == len(generated) and a.duplicates_identical == 0
    assert b.spans_loaded == 0 and b.duplicates_identical == len(generated) and b.rejected == 0
    assert con.execute("SELECT sum(duplicates_identical) FROM loads").fetchone()[0] == len(generated)


# --- regressions: bugs the fuzzers found (fixed in analyzer/formats/, see docs/reliability.md) ----
def _otlp_span(i: int, **over: Any) -> dict:
    return {"traceId": "0" * 31 + "1", "spanId": f"{i:016x}", "name": f"s{i}", "kind": 1,
            "startTimeUnixNano": "1000", "endTimeUnixNano": "2000", **over}


def _otlp_doc(*spans: dict) -> dict:
    return {"resourceSpans": [{"resource": {"attributes": []}, "scopeSpans": [{"scope": {}, "spans": list(spans)}]}]}


def test_regression_non_string_span_name_is_a_reject_not_a_crash(tmp_path: Path) -> None:
    p = tmp_path / "t.jsonl"
    p.write_text(json.dumps(_otlp_doc(_otlp_span(1), _otlp_span(2, name=5))) + "\n")
    report = load_paths(connect(), [str(p)], lenient=True)
    assert report.files[0].spans_loaded == 1 and report.files[0].rejected == 1


def test_regression_one_malformed_span_does_not_swallow_the_rest_of_its_record(tmp_path: Path) -> None:
    p = tmp_path / "t.jsonl"
    p.write_text(json.dumps(_otlp_doc(_otlp_span(1), _otlp_span(2, status="x"), _otlp_span(3))) + "\n")
    con = connect()
    f = load_paths(con, [str(p)], lenient=True).files[0]
    assert (f.spans_read, f.spans_loaded, f.rejected) == (3, 2, 1)
    assert con.execute("SELECT span_id FROM rejects").fetchall() == [("0000000000000002",)]


@pytest.mark.parametrize("over", [{"references": "x"}, {"tags": 1}])
def test_regression_jaeger_span_fields_of_the_wrong_type_are_rejects(tmp_path: Path, over: dict) -> None:
    span = {"traceID": "0" * 31 + "1", "spanID": "0" * 15 + "1", "operationName": "op", "startTime": 1, "duration": 1,
            "processID": "p1", "references": [], "tags": [], "logs": []}
    doc = {"data": [{"traceID": "0" * 31 + "1", "spans": [{**span, **over}], "processes": {"p1": {"serviceName": "s"}}}]}
    p = tmp_path / "t.json"
    p.write_text(json.dumps(doc))
    assert load_paths(connect(), [str(p)], lenient=True).files[0].rejected == 1


@pytest.mark.parametrize("damage", ["flipped_page", "wrong_type"])
def test_regression_damaged_parquet_is_a_load_error(tmp_path: Path, damage: str) -> None:
    src = tmp_path / "t.jsonl"
    src.write_text(json.dumps(_otlp_doc(_otlp_span(1), _otlp_span(2))) + "\n")
    con = connect()
    load_paths(con, [str(src)])
    out = tmp_path / "spans.parquet"
    if damage == "flipped_page":  # footer intact, a data page damaged (DuckDB: TProtocolException)
        con.execute(f"COPY spans TO '{out}' (FORMAT parquet)")
        data = bytearray(out.read_bytes())
        data[len(data) // 10] ^= 0xFF
        out.write_bytes(bytes(data))
    else:
        con.execute(f"COPY (SELECT * EXCLUDE (attr_str), 'not a map' AS attr_str FROM spans) TO '{out}' (FORMAT parquet)")
    with pytest.raises(LoadError):
        load_paths(connect(), [str(out)], lenient=True)


@pytest.mark.parametrize("where", ["operationName", "serviceName"])
def test_regression_jaeger_non_string_operation_name_or_service_name_is_a_reject(tmp_path: Path, where: str) -> None:
    span = {"traceID": "0" * 31 + "1", "spanID": "0" * 15 + "1", "operationName": "op", "startTime": 1, "duration": 1,
            "processID": "p1", "references": [], "tags": [], "logs": []}
    process = {"serviceName": "s"}
    if where == "operationName":
        span["operationName"] = 1
    else:
        process["serviceName"] = 1
    doc = {"data": [{"traceID": "0" * 31 + "1", "spans": [span], "processes": {"p1": process}}]}
    p = tmp_path / "t.json"
    p.write_text(json.dumps(doc))
    assert load_paths(connect(), [str(p)], lenient=True).files[0].rejected == 1


@pytest.mark.parametrize("where", ["scope.name", "scope.version", "traceState", "status.message", "link.traceState"])
def test_regression_otlp_json_non_string_text_fields_are_rejects(tmp_path: Path, where: str) -> None:
    span = _otlp_span(1, traceState="a=b", status={"code": 1, "message": "m"},
                      links=[{"traceId": "0" * 31 + "2", "spanId": "0" * 15 + "2", "traceState": "x=y"}])
    doc = _otlp_doc(span)
    scope = doc["resourceSpans"][0]["scopeSpans"][0]["scope"]
    scope.update(name="sc", version="1")
    if where.startswith("scope."):
        scope[where[6:]] = 1
    elif where == "traceState":
        span["traceState"] = 1
    elif where == "status.message":
        span["status"]["message"] = 1
    else:
        span["links"][0]["traceState"] = 1
    p = tmp_path / "t.jsonl"
    p.write_text(json.dumps(doc) + "\n")
    assert load_paths(connect(), [str(p)], lenient=True).files[0].rejected == 1


@pytest.mark.parametrize("key", ["otel.scope.name", "otel.scope.version", "w3c.tracestate", "otel.status_description",
                                 "otel.status_code", "span.kind"])
@pytest.mark.parametrize("typ, value", [("bool", False), ("int64", 5), ("float64", 1.5)])
def test_jaeger_mistyped_special_tags_stay_plain_attributes(tmp_path: Path, key: str, typ: str, value: object) -> None:
    """A fuzz find: a special Jaeger tag (mapped to an OTLP field) with a non-string type crashed
    the staging; it now stays an ordinary attribute of its own type and the span loads."""
    span = {"traceID": "0" * 31 + "1", "spanID": "0" * 15 + "1", "operationName": "op", "startTime": 1, "duration": 1,
            "processID": "p1", "references": [], "tags": [{"key": key, "type": typ, "value": value}], "logs": []}
    doc = {"data": [{"traceID": "0" * 31 + "1", "spans": [span], "processes": {"p1": {"serviceName": "s"}}}]}
    p = tmp_path / "t.json"
    p.write_text(json.dumps(doc))
    con = connect()
    report = load_paths(con, [str(p)], lenient=True).files[0]
    assert (report.spans_loaded, report.rejected) == (1, 0)
    column = {"bool": "attr_bool", "int64": "attr_int", "float64": "attr_double"}[typ]
    assert con.execute(f"SELECT {column}[$k] FROM spans", {"k": key}).fetchone()[0] == value


@pytest.mark.parametrize("span_id", [False, 0, []])
def test_jaeger_child_of_reference_with_a_non_string_span_id(tmp_path: Path, span_id: object) -> None:
    """A fuzz find (clean-clone CI run): a CHILD_OF reference whose spanID is falsy but not a
    string reached the stage as the parent id and crashed it; it is now a counted reject."""
    tid = "0" * 31 + "1"
    span = {"traceID": tid, "spanID": "0" * 15 + "2", "operationName": "op", "startTime": 1, "duration": 1,
            "processID": "p1", "references": [{"refType": "CHILD_OF", "traceID": tid, "spanID": span_id}],
            "tags": [], "logs": []}
    ok = dict(span, spanID="0" * 15 + "3", references=[])
    doc = {"data": [{"traceID": tid, "spans": [ok, span], "processes": {"p1": {"serviceName": "s"}}}]}
    p = tmp_path / "t.json"
    p.write_text(json.dumps(doc))
    report = load_paths(connect(), [str(p)], lenient=True).files[0]
    assert (report.spans_read, report.spans_loaded, report.rejected) == (2, 1, 1)
