"""Every real sample that holds traces loads with exact, hand-counted figures."""

from __future__ import annotations

import pytest

from analyzer.db.store import connect
from analyzer.errors import LoadError
from analyzer.formats.load import load_paths
from data_paths import SAMPLES


def _load(name: str, lenient: bool = True):
    con = connect()
    report = load_paths(con, [str(SAMPLES / name)], lenient=lenient)
    return con, report.files[0]


# file, format, records_read, spans_read, spans_loaded, identical duplicates, rejected_by_reason
EXPECTED = [
    ("otlp_proto_examples_trace.json", "otlp_json", 1, 1, 1, 0, {}),
    ("otel_spec_file_exporter_traces.jsonl", "otlp_json_lines", 4, 8, 0, 0, {"empty_trace_id": 8}),
    ("collector_contrib_countconnector_traces_1.json", "otlp_json", 1, 3, 0, 0, {"empty_trace_id": 3}),
    ("jaegerui_otlp_multi_line.jsonl", "otlp_json_lines", 4, 4, 4, 0, {}),
    ("jaeger_otlp2jaeger_in.otlp.json", "otlp_json", 1, 2, 1, 1, {}),
    ("jaeger_otlp2jaeger_out.api_traces.json", "jaeger_api_traces", 1, 2, 1, 1, {}),
    ("jaeger_ui_model_ui_01.json", "jaeger_trace", 1, 5, 4, 0, {"conflicting_duplicate": 1}),
    ("jaeger_apiv3_GetTrace.json", "otlp_json_apiv3", 1, 1, 0, 0, {"missing_start_time": 1}),
    ("jaeger_fixture_span_tags_trace.otlp.json", "otlp_json", 1, 1, 1, 0, {}),
    ("jaeger_fixture_link_attributes_trace.otlp.json", "otlp_json", 1, 1, 1, 0, {}),
    ("jaeger_fixture_log_tags_trace.otlp.json", "otlp_json", 1, 1, 1, 0, {}),
    ("jaeger_anonymizer_uiconv_trace_success.json", "jaeger_spans", 1, 2, 2, 0, {}),
    ("python_sdk_otlp_json_file_exporter.jsonl", "otlp_json_lines", 1, 3, 3, 0, {}),
]


@pytest.mark.parametrize("name,fmt,records,spans,loaded,dups,reasons", EXPECTED, ids=[e[0] for e in EXPECTED])
def test_sample_counts(name, fmt, records, spans, loaded, dups, reasons):
    con, f = _load(name)
    assert (f.format, f.records_read, f.spans_read, f.spans_loaded, f.duplicates_identical) == (fmt, records, spans, loaded, dups)
    assert f.rejected_by_reason == reasons
    # nothing unaccounted: every span read is loaded, a duplicate, or a reject
    assert f.spans_read == f.spans_loaded + f.duplicates_identical + f.rejected
    assert con.execute("SELECT count(*) FROM spans").fetchone()[0] == loaded
    row = con.execute("SELECT records_read, spans_read, spans_loaded, duplicates_identical, rejected FROM loads").fetchone()
    assert row == (records, spans, loaded, dups, sum(reasons.values()))
    assert con.execute("SELECT count(*) FROM rejects").fetchone()[0] == sum(reasons.values())


@pytest.mark.parametrize("name,line,reason", [
    ("otel_spec_file_exporter_traces.jsonl", 1, "empty_trace_id"),
    ("jaeger_apiv3_GetTrace.json", 1, "missing_start_time"),
    ("jaeger_ui_model_ui_01.json", 1, "conflicting_duplicate"),
])  # fmt: skip
def test_strict_fails_on_first_bad_record_and_writes_nothing(name, line, reason):
    con = connect()
    with pytest.raises(LoadError) as err:
        load_paths(con, [str(SAMPLES / name)])
    assert (err.value.line, err.value.reason) == (line, reason)
    assert str(err.value).startswith(f"{SAMPLES / name}:{line}: {reason}")
    assert "--lenient" in err.value.hint
    assert con.execute("SELECT (SELECT count(*) FROM spans) + (SELECT count(*) FROM loads)").fetchone()[0] == 0


def test_otlp_example_values():
    con, _ = _load("otlp_proto_examples_trace.json", lenient=False)
    row = con.execute("""SELECT trace_id, span_id, parent_span_id, kind, start_ns, end_ns, status_code,
        attr_str, service_name, scope_name, scope_version, scope_attributes_json FROM spans""").fetchone()
    assert row == (
        "5b8efff798038103d269b633813fc60c", "eee19b7ec3c1b174", "eee19b7ec3c1b173", "SERVER",
        1544712660000000000, 1544712661000000000, "UNSET", {"my.span.attr": "some value"}, "my.service",
        "my.library", "1.0.0", '{"my.scope.attribute":"some scope attribute"}',
    )  # fmt: skip


def test_typed_attribute_maps():
    con, _ = _load("jaeger_fixture_span_tags_trace.otlp.json", lenient=False)
    row = con.execute("SELECT attr_str, attr_int, attr_double, attr_bool, attr_json FROM spans").fetchone()
    assert row == ({"sameplacetag1": "sameplacevalue"}, {"sameplacetag2": 123}, {"sameplacetag3": 72.5},
                   {"sameplacetag4": True}, {"blob": '{"bytes_base64":"AAAwOQ=="}'})  # fmt: skip


def test_links_and_events():
    con, _ = _load("jaeger_fixture_link_attributes_trace.otlp.json", lenient=False)
    links = con.execute("SELECT link_index, linked_trace_id, linked_span_id, attr_str['opentracing.ref_type'], attr_int"
                        " FROM span_links ORDER BY link_index").fetchall()  # fmt: skip
    assert links == [
        (0, "000000000000000000000000000000ff", "00000000000000ff", "child_of", {"sameplacelinkattribute2": 123}),
        (1, "00000000000000000000000000000001", "0000000000000002", "child_of", {}),
        (2, "00000000000000000000000000000001", "0000000000000002", "follows_from", {}),
    ]
    con, _ = _load("jaeger_fixture_log_tags_trace.otlp.json", lenient=False)
    events = con.execute("SELECT event_index, time_ns, name, attr_int, attr_bool FROM span_events ORDER BY 1").fetchall()
    assert events == [(0, 1485449191639875000, "", {"sameplacetag2": 123}, {"sameplacetag4": True}),
                      (1, 1485449191639875000, "", {}, {})]  # fmt: skip


def test_python_sdk_sample_values():
    con, _ = _load("python_sdk_otlp_json_file_exporter.jsonl", lenient=False)
    rows = con.execute("""SELECT span_id, flags, kind, status_code, status_message, service_instance_id,
        attr_json, attr_int FROM spans ORDER BY start_ns""").fetchall()
    assert rows[0] == ("50f0372519137a5e", 256, "SERVER", "OK", None, "d4c52d51-57ae-4ce6-be81-def5ae332d25",
                       {"tags": '["a","b"]', "ids": "[1,2,3]"}, {"http.response.status_code": 500})  # fmt: skip
    assert rows[1][:5] == ("b71f57bcd7674639", 256, "CLIENT", "ERROR", "query failed")
    assert con.execute("SELECT flags, attr_str FROM span_links").fetchall() == [(256, {"link.kind": "follows"})]
    assert con.execute("SELECT count(*) FROM span_events").fetchone()[0] == 2


def test_jaeger_spans_with_embedded_process():
    con, _ = _load("jaeger_anonymizer_uiconv_trace_success.json", lenient=False)
    rows = con.execute("SELECT trace_id, kind, status_code, attr_bool, service_name, flags, parent_span_id"
                       " FROM spans ORDER BY start_ns").fetchall()  # fmt: skip
    assert rows == [
        ("00000000000000002be38093ead7a083", "SERVER", "UNSET", {}, "16af988c443cff37", 1, "492770a15935810f"),
        ("00000000000000002be38093ead7a083", "CLIENT", "ERROR", {}, "3c220036602f839e", 1, "7606ddfe69932d34"),
    ]


def test_jaeger_ui_trace_object():
    con, _ = _load("jaeger_ui_model_ui_01.json")
    row = con.execute("SELECT attr_int, start_ns, end_ns FROM spans WHERE span_id = '0000000000000002'").fetchone()
    assert row == ({}, 1485467191639875000, 1485467191639880000)  # the first of the conflicting pair is kept
    ev = con.execute("SELECT name, attr_str FROM span_events ORDER BY event_index").fetchall()
    assert ev == [("some-event", {}), ("", {"x": "y"})]
    raw = con.execute("SELECT raw FROM rejects").fetchone()[0]
    assert '"javascript_limit":9223372036854775222' in raw
    # first CHILD_OF within the trace is the parent; the other references become links
    assert con.execute("SELECT parent_span_id FROM spans WHERE span_id = '0000000000000004'").fetchone()[0] == "0000000000000002"
    assert con.execute("SELECT count(*) FROM span_links").fetchone()[0] == 2


_SPAN_COLUMNS = "* EXCLUDE (load_id)"


def test_jaeger_and_otlp_versions_of_one_trace_give_the_same_spans():
    con_otlp, _ = _load("jaeger_otlp2jaeger_in.otlp.json", lenient=False)
    con_jaeger, _ = _load("jaeger_otlp2jaeger_out.api_traces.json", lenient=False)
    a = con_otlp.execute(f"SELECT {_SPAN_COLUMNS} FROM spans").fetchall()
    b = con_jaeger.execute(f"SELECT {_SPAN_COLUMNS} FROM spans").fetchall()
    assert a == b and len(a) == 1
    assert a[0][6] == "SERVER" and a[0][15] == "telemetrygen"


def test_same_trace_twice_is_deduplicated_across_files_and_loads():
    con = connect()
    r = load_paths(con, [str(SAMPLES / "jaeger_otlp2jaeger_in.otlp.json"), str(SAMPLES / "jaeger_otlp2jaeger_out.api_traces.json")])
    assert [(f.spans_loaded, f.duplicates_identical) for f in r.files] == [(1, 1), (0, 2)]
    r2 = load_paths(con, [str(SAMPLES / "jaegerui_otlp_multi_line.jsonl")])
    r3 = load_paths(con, [str(SAMPLES / "jaegerui_otlp_multi_line.jsonl")])
    assert (r2.files[0].spans_loaded, r3.files[0].spans_loaded, r3.files[0].duplicates_identical) == (4, 0, 4)
    assert r3.load_id == r.load_id + 2
    assert con.execute("SELECT count(*) FROM spans").fetchone()[0] == 5


def test_console_exporter_text_is_not_otlp():
    with pytest.raises(LoadError, match="ConsoleSpanExporter.*not OTLP"):
        load_paths(connect(), [str(SAMPLES / "python_sdk_console_span_exporter.txt")], lenient=True)


@pytest.mark.parametrize("name", [
    "otlp_proto_examples_logs_anyvalue_shapes.json", "vllm_benchmark_serving_sharegpt_qps04_llm-k8s.json",
    "aiperf_2025-10_examples_run1_profile_export_first_records.jsonl", "llmperf_meta-llama-Llama-2-7b-chat-hf_550_150_summary.json",
    "vllm_nightly_benchmark_results_llm-k8s.json",
])  # fmt: skip
def test_files_without_traces_are_a_clear_error(name):
    with pytest.raises(LoadError) as err:
        load_paths(connect(), [str(SAMPLES / name)], lenient=True)
    assert err.value.reason == "not_traces"
