"""One request id everywhere: the id every verb shows for a request, and the request a user
names with any id they have.

A request has three ids (docs/loading.md "Which id names a request"):

- ``response_id``: what the server answered with (``gen_ai.response.id``: ``chatcmpl-...``;
  vLLM and SGLang: ``gen_ai.request.id``), what the client got back;
- ``client_request_id``: the X-Request-ID the caller sent (``tokentrace.client_request_id``;
  AIPerf, vLLM's bench and tokentrace bench send one);
- ``request_span_id``: the server span's id (16 hex digits), else the perspective's span;
  each perspective's own span id names the request too (``span_ids``: a vLLM request's
  plugin ``engine_request`` beside vLLM's ``llm_request``, whose id is its request_span_id).

Shown: the response id, else the X-Request-ID, else the span id; the span id where the
first two are shared by several requests (a fixed response id, a reused X-Request-ID).
Accepted: any of the three, or the last 8 or more hex digits of the span id (the short
``request`` column :func:`analyzer.verbs.demo.with_short_request_id` adds).
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from typing import Any

from analyzer.errors import TokentraceError

__all__ = ["RequestIdError", "id_matches", "request_id_rows", "resolve_request", "shown_request_ids"]

#: Every request's ids, one row per (trace_id, request_span_id).
REQUEST_IDS_SQL = """
SELECT trace_id, request_span_id, max(response_id) AS response_id, max(client_request_id) AS client_request_id,
       list_sort(list_distinct(list(perspective_span_id) || [request_span_id])) AS span_ids
FROM request_metrics
GROUP BY trace_id, request_span_id
"""

_SHORT_HEX = re.compile(r"[0-9a-f]{8,16}")


class RequestIdError(TokentraceError, ValueError):
    """An id that names no request, or several: one line naming them."""


def request_id_rows(con: Any) -> list[dict[str, Any]]:
    """Every request's ids (``con``: a DuckDB connection with the views installed)."""
    cur = con.execute(REQUEST_IDS_SQL)
    columns = [d[0] for d in cur.description]
    return [dict(zip(columns, row)) for row in cur.fetchall()]


def shown_request_ids(rows: Iterable[Mapping[str, Any]]) -> dict[tuple[Any, Any], str]:
    """(trace_id, request_span_id) -> the id shown for it (module docstring); also
    (None, span id) -> the same, for each of its perspectives' span ids."""
    rows = list(rows)
    owners: dict[Any, set[tuple[Any, Any]]] = {}
    for r in rows:
        owners.setdefault(r.get("response_id") or r.get("client_request_id"), set()).add(
            (r.get("trace_id"), r.get("request_span_id")))
    shown = {}
    for r in rows:
        key = (r.get("trace_id"), r.get("request_span_id"))
        best = r.get("response_id") or r.get("client_request_id")
        shown[key] = str(best) if best and len(owners[best]) == 1 else str(r.get("request_span_id"))
        for span in r.get("span_ids") or ():
            shown.setdefault((None, span), shown[key])
    return shown


def id_matches(row: Mapping[str, Any], wanted: str) -> bool:
    """Whether ``wanted`` names the request of ``row`` (a dict with ``response_id``,
    ``client_request_id``, ``request_span_id``): one of its ids, or the last 8+ hex digits of
    its span id."""
    spans = [row.get("request_span_id"), *(row.get("span_ids") or ())]
    if wanted in (row.get("response_id"), row.get("client_request_id"), *spans):
        return True
    return bool(_SHORT_HEX.fullmatch(wanted)) and any(span and span.endswith(wanted) for span in spans)


def resolve_request(rows: Iterable[Mapping[str, Any]], wanted: str) -> Mapping[str, Any]:
    """The one request ``wanted`` names among ``rows``; RequestIdError when none or several."""
    found = {(r.get("trace_id"), r.get("request_span_id")): r for r in rows if id_matches(r, wanted)}
    if not found:
        raise RequestIdError(f"no request with id {wanted!r} (a response id, an X-Request-ID, or a span id or its "
                             "last 8+ hex digits; tokentrace requests lists them)")
    if len(found) > 1:
        spans = ", ".join(sorted(str(k[1]) for k in found)[:5])
        raise RequestIdError(f"{wanted!r} names {len(found)} requests (span ids {spans}): give one span id")
    return next(iter(found.values()))
