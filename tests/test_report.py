"""``tokentrace report``: every section present with real numbers; opens in headless Chromium."""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path

import pytest

from analyzer.cli import cli
from analyzer.report import ReportInputs, build_report, choose_request
from analyzer.query.runner import run_query
from trace_fixtures import mixed_db, seed_db

ARTIFACTS = Path(__file__).resolve().parents[1] / "test-artifacts"
SECTIONS = ["Run summary", "Distributions", "Request waterfall", "ITL per gap and KV per decode step",
            "Latency distributions (CDF)", "Throughput over time", "Engine steps", "TTFT phase breakdown", "Clock skew"]
CONTINUOUS_CAPTURE = Path(__file__).resolve().parent / "fixtures" / "continuous_engine"


def _db_file(tmp_path, con) -> Path:
    path = tmp_path / "traces.duckdb"
    con.execute(f"ATTACH '{path}' AS out")
    con.execute("COPY FROM DATABASE memory TO out")
    con.execute("DETACH out")
    return path


def test_seed_request_report_has_every_section_with_the_seed_numbers() -> None:
    con = seed_db()
    page = build_report(con, ReportInputs(window_params={"slo_ttft_ms": 200.0}))
    for section in SECTIONS:
        assert f">{section}<" in page, section
    assert "3,915" in page and ">190<" in page  # E2E and TTFT of the seed request
    assert page.count("<svg") >= 6
    # Offline: nothing to fetch (XML namespace URIs in the SVGs are names, not requests).
    assert not re.search(r"""(src|href)\s*=\s*["']?(https?:)?//""", page)
    assert "<link" not in page and "<script" not in page and "@import" not in page
    # 149 gaps of 25 ms reach the ITL plot
    assert "149 gaps from queries/itl.sql" in page
    assert "149 decode spans" in page


def test_engine_steps_section_plots_batch_kv_and_itl_against_prefill() -> None:
    from analyzer.formats.load import load_paths
    from analyzer.db.store import connect

    con = connect()
    load_paths(con, [str(CONTINUOUS_CAPTURE / "server.otlp.jsonl"), str(CONTINUOUS_CAPTURE / "client.otlp.jsonl")])
    page = build_report(con, ReportInputs())
    section = page[page.index(">Engine steps<"):page.index(">TTFT phase breakdown<")]
    assert "20 engine steps from queries/steps.sql (all 20 plotted)" in section
    assert "all 55 gaps with step data plotted" in section
    assert section.count("<svg") == 2
    assert "Batch size and KV blocks used per engine step" in section
    assert "ITL against co-scheduled prefill tokens" in section
    assert "417.7229" in section and "&gt;1024" in section  # the >1024 bucket's ITL (stalls_groups.sql)
    assert "No engine step data" not in section


def test_engine_steps_section_says_why_it_is_empty() -> None:
    page = build_report(seed_db(), ReportInputs())
    section = page[page.index(">Engine steps<"):page.index(">TTFT phase breakdown<")]
    assert "No engine step data in these traces" in section and "<svg" not in section
    assert "1 prefill span(s) in this clock domain carry no tokentrace.engine.step" in section


def test_typical_request_is_the_median_e2e() -> None:
    con = mixed_db()
    requests = run_query(con, "requests").dicts()
    chosen = choose_request(requests, None)
    e2es = sorted(r["e2e_ms"] for r in requests if r["e2e_ms"] is not None)
    assert chosen is not None and e2es[0] <= chosen["e2e_ms"] <= e2es[-1]
    with pytest.raises(ValueError, match="no request with span id"):
        choose_request(requests, "ffffffffffffffff")


def test_cli_report_with_audit_findings(runner, tmp_path) -> None:
    db = _db_file(tmp_path, mixed_db())
    audit = tmp_path / "audit.json"
    audit.write_text('[{"check": "e2e_o_gaps_for_o_tokens", "verdict": "fail", "detail": "150 gaps for 150 tokens"}]')
    out = tmp_path / "report.html"
    result = runner.invoke(cli, ["report", "--db", str(db), "--html", str(out), "--audit", str(audit),
                                 "--slo-e2e-ms", "1000"], catch_exceptions=False)
    assert result.exit_code == 0, result.output
    page = out.read_text()
    assert ">Audit findings<" in page and "150 gaps for 150 tokens" in page
    assert re.search(r"slo_e2e_ms</th><td class=\"l\">1,000<", page)


def test_cli_report_errors(runner, tmp_path) -> None:
    missing = runner.invoke(cli, ["report", "--db", str(tmp_path / "none.duckdb"), "--html", str(tmp_path / "r.html")],
                            catch_exceptions=False)
    assert missing.exit_code == 1 and "no such database" in missing.output
    db = _db_file(tmp_path, mixed_db())
    bad = runner.invoke(cli, ["report", "--db", str(db), "--html", str(tmp_path / "r.html"), "--request", "ffffffffffffffff"],
                        catch_exceptions=False)
    assert bad.exit_code == 1 and "no request with span id" in bad.output


def _chromium() -> str | None:
    return shutil.which("chromium") or shutil.which("chromium-browser") or shutil.which("google-chrome")


@pytest.mark.skipif(_chromium() is None, reason="no Chromium installed (.ci/run installs the Debian package)")
def test_report_renders_in_headless_chromium_without_console_errors(tmp_path) -> None:
    page = build_report(seed_db(), ReportInputs())
    html_path = tmp_path / "report.html"
    html_path.write_text(page)
    ARTIFACTS.mkdir(exist_ok=True)
    shot = ARTIFACTS / "report.png"
    shot.unlink(missing_ok=True)
    proc = subprocess.run(
        [_chromium(), "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
         "--disable-background-networking", "--disable-component-update", "--disable-sync",
         f"--user-data-dir={tmp_path / 'profile'}", "--enable-logging=stderr", "--v=0", "--window-size=1200,3000",
         f"--screenshot={shot}", html_path.as_uri()],
        capture_output=True, text=True, timeout=120,
    )
    assert shot.is_file() and shot.stat().st_size > 10_000, proc.stderr[-2000:]
    console = [line for line in proc.stderr.splitlines() if "CONSOLE" in line]
    assert not console, console
