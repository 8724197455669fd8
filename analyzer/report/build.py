"""Assemble the self-contained HTML report from the analyzer's SQL outputs.

Every number in the report comes from a ``queries/`` file (run here by name); this module
only picks rows, plots them and lays them out. The HTML has no external reference: plots
are inline SVG, the style sheet is inline.
"""

from __future__ import annotations

import html
import json
import math
import re
import statistics
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import duckdb

from analyzer.query.runner import QueryResult, run_query
from analyzer.query.utc_columns import utc_ms_text
from analyzer.report import plots
from analyzer.report.headline import headline_html
from analyzer.report.labels import label, metric_label
from analyzer.report.timeline import DEFAULT_TIMELINE_REQUESTS

__all__ = ["ReportInputs", "build_report", "choose_request"]

#: The inline style sheet. Tables and plots each sit in a box that scrolls sideways
#: (``.tbl``, ``.plot``; a shadow at a table box's edge says more is there), so the page
#: itself never does; a plot keeps ``plots.MIN_SCALE`` of its size at least. At 600 px or
#: less (a phone) the margins narrow, text cells keep a readable width, and a data table's
#: first column stays put while the rest scrolls (its row lines drawn by a shadow: Chromium
#: loses a sticky cell's border under the next row).
_STYLE = """
body{font-family:system-ui,-apple-system,Segoe UI,Roboto,sans-serif;margin:1.5em auto;max-width:1100px;
padding:0 1.5em;color:#222;line-height:1.4;overflow-wrap:break-word}
h1{font-size:1.6em;margin-bottom:.2em} h2{border-bottom:1px solid #ddd;padding-bottom:.2em;margin-top:2em}
.tbl,.plot{max-width:100%;overflow-x:auto;-webkit-overflow-scrolling:touch}
.tbl{background:linear-gradient(to right,#fff 30%,#fff0) left/2em 100% no-repeat local,
linear-gradient(to left,#fff 30%,#fff0) right/2em 100% no-repeat local,
radial-gradient(farthest-side at 0 50%,#0003,#0000) left/.8em 100% no-repeat scroll,
radial-gradient(farthest-side at 100% 50%,#0003,#0000) right/.8em 100% no-repeat scroll}
table{border-collapse:separate;border-spacing:0;font-size:.85em;margin:.5em 0;max-width:100%}
td,th{border:0 solid #ddd;border-width:0 1px 1px 0;padding:3px 6px;text-align:right;vertical-align:top}
tr>:first-child{border-left-width:1px} tr:first-child>*{border-top-width:1px}
td{white-space:nowrap} td.l{white-space:normal;overflow-wrap:break-word}
th{background:#f4f4f4;font-weight:600;min-width:3.5em} td.l,th.l{text-align:left}
table.kv{width:100%;max-width:48em} table.kv th{width:45%;white-space:normal}
.note{color:#555;font-size:.9em} .fail{color:#b00;font-weight:bold}
.pass{color:#070} .cannot_check{color:#a60} .grid{display:flex;flex-wrap:wrap;gap:1em}
.grid>.plot{flex:1 1 340px;min-width:0} .plot{margin:.5em 0} .plot>svg{display:block;max-width:100%;height:auto}
.cards{display:grid;grid-template-columns:repeat(auto-fit,minmax(240px,1fr));gap:.8em;margin:1em 0}
.card{border:1px solid #ddd;border-radius:6px;padding:.6em .8em;background:#fafafa}
.card .k{font-size:.85em;color:#555} .card .v{font-size:1.45em;font-weight:600;margin:.15em 0}
.card .s{font-size:.8em;color:#555}
@media (max-width:600px){body{padding:0 .75em;margin-top:.75em} h1{font-size:1.4em} h2{font-size:1.3em}
table.kv th{width:40%} td.l{min-width:5em} td.t{min-width:14em}
table:not(.kv) tr>:first-child{position:sticky;left:0;background:#fff;background-clip:padding-box;min-width:6em;
max-width:11em;box-shadow:0 -1px #ddd} table:not(.kv) th:first-child{background:#f4f4f4}
table:not(.kv) tr:first-child>:first-child{box-shadow:none}}
"""


@dataclass
class ReportInputs:
    """What the report is about: the request to detail, window parameters, audit findings."""

    request_span_id: str | None = None
    window_params: dict[str, Any] = field(default_factory=dict)
    bucket_s: float = 1.0
    audit_findings: list[dict[str, Any]] | None = None
    title: str = "tokentrace report"
    #: the comparison with a baseline (analyzer/report/comparison.py), placed after the summary
    comparison_html: str | None = None
    #: the slowest requests the Timeline draws, each with its neighbours in time
    timeline_requests: int = DEFAULT_TIMELINE_REQUESTS


def _number(value: float) -> str:
    """A float rounded for reading: 4 significant digits (at least the units), thousands
    separated, trailing zeros dropped: 216.14805 -> 216.1, 3915.0 -> 3,915, 0.091464 -> 0.09146."""
    if value == 0:
        return "0"
    magnitude = abs(value)
    if magnitude >= 1e4:
        return f"{value:,.0f}"
    if magnitude < 1e-4:
        return f"{value:.2e}"
    decimals = max(0, 3 - math.floor(math.log10(magnitude)))
    text = f"{value:,.{decimals}f}"
    return text.rstrip("0").rstrip(".") if "." in text else text


def _fmt(value: Any, key: str = "") -> str:
    """One value as the report prints it: floats rounded for reading, epoch ``*_ns`` as UTC
    ISO to the millisecond (the exact ns in the cell's tooltip), NULL as an em dash."""
    if value is None:
        return "—"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, float):
        if math.isnan(value) or math.isinf(value):
            return "—"
        return _number(value)
    if isinstance(value, int):
        if key.endswith("_ns") and value >= 10**18:
            return f'<span title="{value} ns since the epoch">{utc_ms_text(value)}</span>'
        return f"{value:,}"
    return _breakable(html.escape(str(value)))


_HEX_RUN = re.compile(r"[0-9a-f]{17,}")


def _breakable(text: str) -> str:
    """Escaped text with line-break opportunities after ``_`` and ``|`` and every 16 digits of
    a long hex id, so a narrow table column wraps an id or a clock domain there (not mid-word)."""
    text = text.replace("_", "_<wbr>").replace("|", "|<wbr>")
    return _HEX_RUN.sub(lambda m: "<wbr>".join(m.group(0)[i:i + 16] for i in range(0, len(m.group(0)), 16)), text)


def _head(name: str) -> str:
    """A column's header cell: its human label with the unit (labels.py); the SQL name, as
    csv and json print it, in the tooltip."""
    return f'<th class="l" title="{html.escape(name)}">{html.escape(label(name))}</th>'


def _table(rows: Sequence[Mapping[str, Any]], columns: Sequence[str], cls_col: str | None = None) -> str:
    """Rows as an HTML table under labelled headers. A ``response_id`` cell (the request by what
    the client got) carries the row's ``request_span_id`` in its tooltip: the span id beside
    it, without a column of its own in a table that must fit a desktop window."""
    if not rows:
        return '<p class="note">no rows</p>'
    head = "".join(_head(c) for c in columns)
    body = []
    for r in rows:
        cells = []
        for c in columns:
            v = r.get(c)
            klass = "l" if isinstance(v, str) or v is None or c.endswith("_ns") else ""
            if isinstance(v, str) and c.endswith(("reason", "detail", "note")):
                klass += " t"  # free text: wide enough to read as lines, not a column of words
            if cls_col and c == cls_col and isinstance(v, str):
                klass += f" {html.escape(v)}"
            span = r.get("request_span_id") if c == "response_id" else None
            title = f' title="request_span_id {html.escape(str(span))}"' if span else ""
            cells.append(f'<td class="{klass.strip()}"{title}>{_fmt(v, c)}</td>')
        body.append("<tr>" + "".join(cells) + "</tr>")
    return f'<div class="tbl"><table><tr>{head}</tr>{"".join(body)}</table></div>'


def _kv_table(row: Mapping[str, Any]) -> str:
    """One row as label / value lines; the values wrap, so the table fits a phone's width."""
    return '<div class="tbl"><table class="kv">' + "".join(
        f'<tr>{_head(k)}<td class="l">{_fmt(v, k)}</td></tr>' for k, v in row.items()
    ) + "</table></div>"


def choose_request(requests: Sequence[Mapping[str, Any]], request_span_id: str | None) -> Mapping[str, Any] | None:
    """The request to detail: the one asked for (``request_span_id``: any id of it, as
    analyzer/query/request_ids.py reads one: response id, X-Request-ID, span id) seen from its
    best perspective, else the typical one (E2E closest to the median E2E among requests seen
    from their best perspective)."""
    rank = {"client": 0, "server": 1, "engine": 2}
    if request_span_id is not None:
        from analyzer.query.request_ids import resolve_request

        found = resolve_request(requests, request_span_id)
        rows = [r for r in requests if (r["trace_id"], r["request_span_id"]) == (found["trace_id"], found["request_span_id"])]
        return min(rows, key=lambda r: rank.get(r["perspective"], 9))
    best: dict[tuple[str, str], Mapping[str, Any]] = {}
    for r in requests:
        key = (r["trace_id"], r["request_span_id"])
        if key not in best or rank.get(r["perspective"], 9) < rank.get(best[key]["perspective"], 9):
            best[key] = r
    candidates = [r for r in best.values() if r.get("e2e_ms") is not None]
    if not candidates:
        return next(iter(best.values()), None)
    median = statistics.median(r["e2e_ms"] for r in candidates)
    return min(candidates, key=lambda r: (abs(r["e2e_ms"] - median), r["s_ns"]))


def _optional(con: duckdb.DuckDBPyConnection, name: str, params: Mapping[str, Any] | None = None) -> QueryResult | None:
    try:
        return run_query(con, name, params, views=False)
    except ValueError as exc:  # a query this installation lacks: the section says so
        if "no query named" in str(exc):
            return None
        raise


def build_report(con: duckdb.DuckDBPyConnection, inputs: ReportInputs) -> str:
    """The report as one HTML string. Raises ValueError when the database holds no request."""
    from analyzer.db.views import install_views
    from analyzer.report.engine_steps import engine_steps_section
    from analyzer.report.timeline import timeline_section

    install_views(con)
    requests = run_query(con, "requests", views=False).dicts()
    if not requests:
        raise ValueError("the database holds no request (load traces first: tokentrace load FILE --db DB)")
    window = run_query(con, "window", inputs.window_params, views=False).dicts()[0]
    sections = _summary_sections(con, window)
    if inputs.comparison_html is not None:
        sections.append(inputs.comparison_html)
    chosen = choose_request(requests, inputs.request_span_id)
    if chosen is not None:
        sections.append(_waterfall_section(con, chosen, chosen_by_id=bool(inputs.request_span_id)))
    sections.append(_cdf_section(requests))
    sections.append(_throughput_section(con, requests, window, inputs.bucket_s))
    sections.append(engine_steps_section(con, _table))
    sections.append(timeline_section(con, _table, inputs.timeline_requests))
    sections.extend(_phases_section(con))
    sections.extend(_skew_section(con))
    if inputs.audit_findings is not None:
        cols = ["check", "verdict", "detail"]
        sections.append("<h2>Audit findings</h2>" + _table(inputs.audit_findings, cols, cls_col="verdict"))
    return _page(inputs.title, requests, sections)


def _summary_sections(con: duckdb.DuckDBPyConnection, window: Mapping[str, Any]) -> list[str]:
    """The headline cards, the run summary (window.sql, with the rules it counted by and the
    SLOs it applied) and, when summary.sql is installed, the distributions table."""
    summary = _optional(con, "summary")
    summary_rows = summary.dicts() if summary is not None else []
    shown_window = {k: v for k, v in window.items()
                    if k not in ("window_start_utc", "window_end_utc", "token_counting_rule", "request_counting_rule")}
    sections = [
        headline_html(window, summary_rows, _fmt),
        "<h2>Run summary</h2>"
        f'<p class="note">Window mode <b>{_fmt(window["mode"])}</b>, perspective {_fmt(window["perspective"])}. '
        f"Tokens counted: {_fmt(window['token_counting_rule'])}. Requests counted: "
        f"{_fmt(window['request_counting_rule'])}. SLOs: TTFT ≤ {_fmt(window['slo_ttft_ms'])} ms, "
        f"TPOT ≤ {_fmt(window['slo_tpot_ms'])} ms, E2E ≤ {_fmt(window['slo_e2e_ms'])} ms (— = not applied). "
        "Times in UTC (hover for the nanoseconds). Definitions: docs/metrics.md.</p>" + _kv_table(shown_window),
    ]
    if summary is not None:
        cols = [c for c in summary.columns if c not in ("source", "unit", "interpolation", "request_set")]
        rows = [{**r, "metric": metric_label(r["metric"], r.get("unit"))} for r in summary_rows]
        sampled = sorted({(r["perspective"], r["request_set"]) for r in summary_rows
                          if r.get("request_set") not in (None, "every request")})
        sets = "".join(f" ITL rows, {_fmt(who)}: the {_fmt(what)} (a keep policy: requests kept for a rule are "
                       "slow by selection)." for who, what in sampled)
        sections.append("<h3>Distributions</h3><p class=\"note\">queries/summary.sql: succeeded requests; "
                        f"percentiles by linear interpolation (numpy's default); the unit after each metric.{sets}</p>"
                        + _table(rows, cols))
    return sections


#: the facts of the detailed request shown above its waterfall, in this order
_REQUEST_FACTS = ("perspective", "response_id", "client_request_id", "trace_id", "request_span_id", "input_tokens",
                  "output_tokens", "finish_reason", "status_code", "ttft_ms", "e2e_ms", "tpot_ms",
                  "decode_output_tokens_per_second", "whole_request_output_tokens_per_second", "prompt_kv_mib",
                  "stop_kv_mib", "null_reason")


def _waterfall_section(con: duckdb.DuckDBPyConnection, chosen: Mapping[str, Any], chosen_by_id: bool) -> str:
    """One request in detail: its facts, the waterfall of its spans with chunk ticks, and its ITL
    per gap (ms, itl.sql, its own perspective) beside the KV of each decode step."""
    params = {"trace_id": chosen["trace_id"], "request_span_id": chosen["request_span_id"]}
    spans = run_query(con, "report/waterfall", params, views=False).dicts()
    chunks = run_query(con, "report/chunk_times", params, views=False).dicts()
    steps = run_query(con, "report/decode_steps", params, views=False).dicts()
    itl = _optional(con, "itl", {"trace_id": chosen["trace_id"]})
    itl_rows = [r for r in (itl.dicts() if itl else [])
                if r["request_span_id"] == chosen["request_span_id"] and r["perspective"] == chosen["perspective"]
                and r["itl_ms"] is not None]
    facts = {k: chosen.get(k) for k in _REQUEST_FACTS}
    how = "chosen with --request" if chosen_by_id else "typical: E2E closest to the median"
    return (
        f"<h2>Request waterfall</h2><p class=\"note\">Request {_fmt(chosen.get('response_id') or chosen['request_span_id'])} "
        f"(span {_fmt(chosen['request_span_id'])}; {how}). "
        "Client-side bars are on the client's clock, server-side bars on the server's: the lane labels "
        "name each clock. Chunk ticks mark when visible output moved.</p>"
        + _kv_table(facts) + plots.waterfall_svg(spans, chunks)
        + "<h3>ITL per gap and KV per decode step</h3>"
        + f'<p class="note">{len(itl_rows)} gaps from queries/itl.sql ({_fmt(chosen["perspective"])} perspective); '
        f"{len(steps)} decode spans from queries/report/decode_steps.sql.</p>"
        + plots.decode_steps_svg(itl_rows, steps)
    )


def _cdf_section(requests: Sequence[Mapping[str, Any]]) -> str:
    """The CDFs of TTFT, TPOT and E2E (ms), one line per perspective."""
    by_perspective: dict[str, dict[str, list[float]]] = {}
    for r in requests:
        for metric in ("ttft_ms", "tpot_ms", "e2e_ms"):
            by_perspective.setdefault(metric, {}).setdefault(r["perspective"], []).append(r[metric])
    return (
        "<h2>Latency distributions (CDF)</h2><div class=\"grid\">"
        + plots.cdf_svg(by_perspective["ttft_ms"], "TTFT (ms)", "TTFT")
        + plots.cdf_svg(by_perspective["tpot_ms"], "TPOT (ms per output token after the first)", "TPOT")
        + plots.cdf_svg(by_perspective["e2e_ms"], "E2E (ms)", "E2E")
        + "</div>"
    )


def _throughput_section(con: duckdb.DuckDBPyConnection, requests: Sequence[Mapping[str, Any]],
                        window: Mapping[str, Any], bucket_s: float) -> str:
    """Output throughput per ``bucket_s``-second bucket, the measurement window shaded (its
    bounds in s after the first request's start)."""
    tput = run_query(con, "report/throughput_timeline", {"bucket_s": bucket_s}, views=False).dicts()
    t0 = min((r["f_ns"] for r in requests if r.get("f_ns") is not None), default=None)
    shade = None
    if t0 is not None and window.get("window_start_ns") is not None:
        shade = ((window["window_start_ns"] - t0) / 1e9, (window["window_end_ns"] - t0) / 1e9)
    return "<h2>Throughput over time</h2>" + plots.throughput_svg(tput, shade, bucket_s)


def _phases_section(con: duckdb.DuckDBPyConnection) -> list[str]:
    """The TTFT phase breakdown (phases.sql), its empty columns left out and named; no section
    when the query is not installed."""
    phases = _optional(con, "phases")
    if phases is None:
        return []
    rows = phases.dicts()
    # the request by what the client got (its span id in the cell's tooltip: _table)
    wanted = [c for c in phases.columns if c == "response_id" or c.endswith("_ms") or c == "cross_clock_reason"]
    # a phase no row has (vLLM's own figures beside a gateway's, a gateway's network parts
    # beside vLLM's) is left out, and named: the table stays within a desktop window
    cols = [c for c in wanted if c == "response_id" or any(r.get(c) is not None for r in rows)]
    empty = [c for c in wanted if c not in cols]
    left_out = (f" Empty in every row, so not shown: {', '.join(html.escape(label(c)) for c in empty)} "
                "(<code>tokentrace phases --format csv</code> has every column)." if rows and empty else "")
    return [
        "<h2>TTFT phase breakdown</h2><p class=\"note\">From queries/phases.sql. Cross-clock parts "
        "(network in/out) are — when the clock pair is not skew-checked; the reason column says why."
        f"{left_out}</p>"
        + (plots.phases_svg(rows) if rows else "") + _table(rows, cols)
    ]


def _skew_section(con: duckdb.DuckDBPyConnection) -> list[str]:
    """The clock skew section: offset bounds per clock-domain pair (skew_offsets.sql) and the
    first 200 rule violations (skew_rules.sql); no section when neither query is installed."""
    skew_offsets = _optional(con, "skew_offsets")
    skew_rules = _optional(con, "skew_rules")
    if skew_offsets is None and skew_rules is None:
        return []
    body = "<h2>Clock skew</h2>"
    if skew_offsets is not None:
        body += "<h3>Offset bounds per clock-domain pair (θ = server − client)</h3>" + _table(
            skew_offsets.dicts(), skew_offsets.columns, cls_col="verdict")
    if skew_rules is not None:
        rows = skew_rules.dicts()
        shown = [c for c in skew_rules.columns if c not in ("related_span_id", "cross_domain")]
        body += (f"<h3>Rule violations ({len(rows)})</h3>"
                 '<p class="note">related_span_id and cross_domain: <code>tokentrace skew --format csv</code>.</p>'
                 + _table(rows[:200], shown))
        if len(rows) > 200:
            body += f'<p class="note">first 200 of {len(rows)} shown</p>'
    return [body]


def _page(title: str, requests: Sequence[Mapping[str, Any]], sections: Sequence[str]) -> str:
    """The whole HTML document: head with the inline style sheet, title, a line on what the
    report was built from, then the sections."""
    return (
        "<!DOCTYPE html><html lang=\"en\"><head><meta charset=\"utf-8\">"
        '<meta name="viewport" content="width=device-width,initial-scale=1">'
        f"<title>{html.escape(title)}</title><style>{_STYLE}</style></head><body>"
        f"<h1>{html.escape(title)}</h1>"
        f'<p class="note">{len(requests)} request rows (request × perspective), first request sent '
        f"{_first_sent(requests)}. Built from the analyzer\'s SQL (queries/*.sql); self-contained, opens offline.</p>"
        + "".join(sections) + "</body></html>"
    )


def _first_sent(requests: Sequence[Mapping[str, Any]]) -> str:
    starts = [r["s_ns"] for r in requests if r.get("s_ns") is not None]
    return f"{utc_ms_text(min(starts))} UTC" if starts else "at an unknown time"


def load_audit_findings(path: str | Path) -> list[dict[str, Any]]:
    """Findings saved by ``tokentrace audit --format json`` (a list of rows with check/verdict)."""
    path = Path(path)
    try:
        data = json.loads(path.read_text())
    except FileNotFoundError:
        raise ValueError(f"{path}: no such file") from None
    except json.JSONDecodeError as exc:
        raise ValueError(f"{path}:{exc.lineno}: not valid JSON ({exc.msg})") from None
    except UnicodeDecodeError as exc:
        raise ValueError(f"{path}: not UTF-8 text ({exc.reason}), not the JSON of tokentrace audit") from None
    except IsADirectoryError:
        raise ValueError(f"{path}: a folder, not the JSON file of tokentrace audit --format json") from None
    if isinstance(data, dict) and isinstance(data.get("findings"), list):
        data = data["findings"]
    if not isinstance(data, list) or not all(isinstance(r, dict) and "check" in r and "verdict" in r for r in data):
        raise ValueError(f"{path}: expected the JSON list `tokentrace audit --format json` writes (check, verdict, detail)")
    return data
