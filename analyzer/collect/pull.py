"""Pull traces of one service out of Jaeger's query service into a file ``tokentrace load`` reads.

Two APIs:

- ``v3`` (Jaeger v2, and v1 >= 1.35): ``GET /api/v3/traces?query.service_name=S&
  query.start_time_min=T0&query.start_time_max=T1&query.search_depth=N`` (RFC 3339 times;
  ``query.num_traces`` is sent too, the older name of ``search_depth``). The answer is OTLP
  JSON inside ``{"result": ...}``; "no traces" is a 404 with an ``{"error": ...}`` body.
  Written as OTLP/JSON lines: one line per page, the ``result`` object as Jaeger sent it,
  less the spans of traces an earlier page already gave.
- ``v1`` (the UI's ``/api/traces?service=S&start=T0&end=T1&limit=N&lookback=...``, times in
  microseconds). Written as one Jaeger JSON document ``{"data": [...], ...}`` holding every
  page's traces, as Jaeger sent them.

Neither API pages by offset, so pages walk back in time: the next page ends where the
earliest trace of this one starts, and traces already seen are skipped. The walk stops at
``limit`` traces, at a page with nothing new, or after ``MAX_PAGES`` pages.
"""

from __future__ import annotations

import datetime as dt
import json
import os
import re
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from analyzer.errors import PullError

__all__ = ["APIS", "PullReport", "parse_since", "pull_traces", "rfc3339_nano"]

APIS = ("auto", "v3", "v1")
MAX_PAGES = 1000
DEFAULT_PAGE_SIZE = 100
_SINCE = re.compile(r"(\d+(?:\.\d+)?)(ms|s|m|h|d|w)")
_UNIT_S = {"ms": 0.001, "s": 1.0, "m": 60.0, "h": 3600.0, "d": 86400.0, "w": 604800.0}


@dataclass
class PullReport:
    """What one pull fetched: traces and spans written, pages (HTTP requests) made."""

    api: str
    out: Path
    traces: int = 0
    spans: int = 0
    pages: int = 0
    warnings: list[str] = field(default_factory=list)


def parse_since(text: str) -> float:
    """``90s``, ``15m``, ``1h``, ``2d``, ``1h30m`` (or plain seconds) to seconds (> 0)."""
    raw = text.strip().lower()
    if re.fullmatch(r"\d+(\.\d+)?", raw):
        seconds = float(raw)
    else:
        pos, seconds = 0, 0.0
        for m in _SINCE.finditer(raw):
            if m.start() != pos:
                break
            seconds += float(m.group(1)) * _UNIT_S[m.group(2)]
            pos = m.end()
        if pos != len(raw) or not raw:
            raise ValueError(f"--since {text!r}: expected a duration like 90s, 15m, 1h, 2d or 1h30m")
    if seconds <= 0:
        raise ValueError(f"--since {text!r}: must be > 0")
    return seconds


def rfc3339_nano(unix_ns: int) -> str:
    """Unix nanoseconds to RFC 3339 UTC with nanoseconds (``2024-01-31T05:28:29.209712000Z``)."""
    seconds, nanos = divmod(unix_ns, 1_000_000_000)
    stamp = dt.datetime.fromtimestamp(seconds, tz=dt.timezone.utc).strftime("%Y-%m-%dT%H:%M:%S")
    return f"{stamp}.{nanos:09d}Z"


def _base_url(url: str) -> str:
    parts = urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.netloc:
        raise PullError(f"--jaeger {url!r}: expected http(s)://HOST:PORT[/base-path], e.g. http://localhost:16686")
    return url.rstrip("/")


def _get(client: Any, url: str, params: dict[str, Any]) -> Any:
    import httpx

    try:
        return client.get(url, params=params)
    except httpx.HTTPError as exc:
        raise PullError(f"GET {url}: {exc.__class__.__name__}: {exc}") from None


def _json(response: Any) -> Any:
    try:
        return response.json()
    except ValueError:
        raise PullError(f"GET {response.url}: answer is not JSON (HTTP {response.status_code})") from None


def _v3_pages(client: Any, base: str, service: str, t0_ns: int, t1_ns: int, page_size: int) -> Iterator[dict]:
    """Yield the ``result`` object of each page (newest first); raise LookupError when the
    server has no api_v3 route at all (so ``auto`` can fall back to v1)."""
    url = f"{base}/api/v3/traces"
    end_ns = t1_ns
    for _ in range(MAX_PAGES):
        params = {
            "query.service_name": service,
            "query.start_time_min": rfc3339_nano(t0_ns),
            "query.start_time_max": rfc3339_nano(end_ns),
            "query.search_depth": page_size,
            "query.num_traces": page_size,
        }
        r = _get(client, url, params)
        if r.status_code == 404:
            try:
                body = r.json()
            except ValueError:
                raise LookupError(f"{url}: not found (no api_v3 here)") from None
            if isinstance(body, dict) and "error" in body:
                return  # Jaeger's "No traces found"
            raise LookupError(f"{url}: not found (no api_v3 here)")
        if r.status_code != 200:
            raise PullError(f"GET {url}: HTTP {r.status_code}: {r.text[:200].strip()}")
        doc = _json(r)
        if not isinstance(doc, dict) or not isinstance(doc.get("result"), dict):
            raise PullError(f"GET {url}: expected {{\"result\": {{\"resourceSpans\": ...}}}}, got {str(doc)[:120]}")
        starts = [int(sp["startTimeUnixNano"]) for sp in _otlp_spans(doc["result"]) if str(sp.get("startTimeUnixNano", "")).isdigit()]
        yield doc["result"]
        if starts:
            end_ns = min(end_ns, min(starts))


def _otlp_spans(result: dict) -> Iterator[dict]:
    for rs in result.get("resourceSpans") or []:
        for ss in rs.get("scopeSpans") or []:
            yield from ss.get("spans") or []


def _keep_traces(result: dict, keep: set[str]) -> dict:
    """``result`` with only the spans whose traceId is in ``keep`` (empty scopes/resources dropped)."""
    resource_spans = []
    for rs in result.get("resourceSpans") or []:
        scopes = []
        for ss in rs.get("scopeSpans") or []:
            spans = [sp for sp in ss.get("spans") or [] if str(sp.get("traceId", "")).lower() in keep]
            if spans:
                scopes.append({**ss, "spans": spans})
        if scopes:
            resource_spans.append({**rs, "scopeSpans": scopes})
    return {**result, "resourceSpans": resource_spans}


def _pull_v3(client: Any, base: str, service: str, t0_ns: int, t1_ns: int, limit: int, page_size: int, report: PullReport) -> list[str]:
    lines: list[str] = []
    seen: set[str] = set()
    pages = _v3_pages(client, base, service, t0_ns, t1_ns, page_size)
    for result in pages:
        report.pages += 1
        trace_ids: list[str] = []
        for sp in _otlp_spans(result):
            tid = str(sp.get("traceId", "")).lower()
            if tid not in seen and tid not in trace_ids:
                trace_ids.append(tid)
        new = trace_ids[: limit - len(seen)]
        if new:
            kept = _keep_traces(result, set(new))
            lines.append(json.dumps(kept, separators=(",", ":"), ensure_ascii=False))
            report.spans += sum(1 for _ in _otlp_spans(kept))
            seen.update(new)
        if not new or len(seen) >= limit or len(trace_ids) < page_size:
            break
    report.traces = len(seen)
    return lines


def _pull_v1(client: Any, base: str, service: str, t0_ns: int, t1_ns: int, limit: int, page_size: int, report: PullReport) -> list[str]:
    url = f"{base}/api/traces"
    traces: list[dict] = []
    seen: set[str] = set()
    end_us = t1_ns // 1000
    lookback = f"{max(1, (t1_ns - t0_ns) // 1_000_000_000)}s"
    for _ in range(MAX_PAGES):
        params = {"service": service, "start": t0_ns // 1000, "end": end_us, "limit": page_size, "lookback": lookback}
        r = _get(client, url, params)
        report.pages += 1
        if r.status_code != 200:
            raise PullError(f"GET {url}: HTTP {r.status_code}: {r.text[:200].strip()}")
        doc = _json(r)
        if not isinstance(doc, dict) or not isinstance(doc.get("data"), list):
            raise PullError(f"GET {url}: expected {{\"data\": [...]}}, got {str(doc)[:120]}")
        for err in doc.get("errors") or []:
            report.warnings.append(f"jaeger: {err.get('msg', err) if isinstance(err, dict) else err}")
        page = [t for t in doc["data"] if isinstance(t, dict) and str(t.get("traceID", "")).lower() not in seen]
        page = page[: limit - len(traces)]
        for t in page:
            seen.add(str(t.get("traceID", "")).lower())
        traces.extend(page)
        starts = [int(s["startTime"]) for t in page for s in t.get("spans") or [] if isinstance(s.get("startTime"), int)]
        if not page or len(traces) >= limit or len(doc["data"]) < page_size:
            break
        if starts:
            end_us = min(end_us, min(starts))
    report.traces = len(traces)
    report.spans = sum(len(t.get("spans") or []) for t in traces)
    if not traces:
        return []
    # indented: a one-line file would be sniffed as JSON lines (OTLP), not as one Jaeger document
    return [json.dumps({"data": traces, "total": len(traces), "limit": 0, "offset": 0, "errors": None}, indent=2, ensure_ascii=False)]


def _write_atomically(out: Path, lines: list[str]) -> None:
    out.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{out.name}.", suffix=".part", dir=out.parent)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            for line in lines:
                f.write(line + "\n")
        os.replace(tmp, out)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def pull_traces(
    jaeger_url: str,
    service: str,
    out: str | Path,
    *,
    since_s: float = 3600.0,
    limit: int = 1000,
    page_size: int = DEFAULT_PAGE_SIZE,
    api: str = "auto",
    timeout_s: float = 30.0,
    now_ns: int | None = None,
) -> PullReport:
    """Fetch up to ``limit`` traces of ``service`` that started in the last ``since_s`` seconds
    and write them to ``out`` (replaced atomically; nothing is written when none are found).

    ``api``: ``v3``, ``v1`` or ``auto`` (v3, falling back to v1 when the server has no api_v3).
    ``page_size``: traces asked per request. ``timeout_s``: per HTTP request (seconds).
    Raises PullError (unreachable, unexpected answer) or ValueError (bad argument).
    """
    import httpx

    if api not in APIS:
        raise ValueError(f"api must be one of {APIS}, got {api!r}")
    if limit < 1 or page_size < 1:
        raise ValueError("limit and page_size must be >= 1")
    out_path = Path(out)
    if out_path.is_dir():
        raise ValueError(f"--out {str(out_path)!r} is a directory; give a file name")
    base = _base_url(jaeger_url)
    t1_ns = now_ns if now_ns is not None else time.time_ns()
    t0_ns = t1_ns - int(since_s * 1e9)
    page_size = min(page_size, limit)
    with httpx.Client(timeout=timeout_s, follow_redirects=True, trust_env=False) as client:
        report = PullReport(api="v1" if api == "v1" else "v3", out=out_path)
        if api == "v1":
            lines = _pull_v1(client, base, service, t0_ns, t1_ns, limit, page_size, report)
        else:
            try:
                lines = _pull_v3(client, base, service, t0_ns, t1_ns, limit, page_size, report)
            except LookupError as exc:
                if api == "v3":
                    raise PullError(f"{exc}; try --api v1") from None
                report = PullReport(api="v1", out=out_path, warnings=[f"{exc}; used /api/traces"])
                lines = _pull_v1(client, base, service, t0_ns, t1_ns, limit, page_size, report)
    if lines:
        _write_atomically(out_path, lines)
    return report
