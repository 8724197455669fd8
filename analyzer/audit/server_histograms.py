"""The percentiles a dashboard draws from a server's ``/metrics`` histograms, audited:
``tokentrace audit AFTER.prom --baseline BEFORE.prom [--db traces.duckdb] [--individual FILE]``.

The window is AFTER - BEFORE (two Prometheus text scrapes: lifetime counts and warm-up drop
out), summed over each family's series (``sum by (le)``); each quantile is estimated as
Prometheus' ``histogram_quantile`` does (queries/audit/histogram_quantile.sql), with the
bucket it was interpolated in and the error that bucket allows. With ``--db``, the exact
figures of the same window come from the traces (queries/audit/histogram_exact.sql,
analyzer/audit/histogram_figures.py maps each family to its traced figure): the
server-perspective requests that have the figure, in the order they ended, the first
``baseline count`` of them left out (the requests the baseline scrape had already counted),
then as many as the window counts; an inter-token family is checked against every traced gap
of the window's requests (one per token after the first). Judged per quantile: an estimate
above the slowest request or below the fastest fails; an exact nearest-rank quantile outside
the bucket the estimate was interpolated in fails (histogram and traces disagree); else pass,
with estimate, exact figure and error. A traced figure named alike but defined otherwise (the
plugin's queue against vLLM's queue time) is compared beside, with both definitions said.
With ``--individual`` (AIPerf's profile_export.jsonl), TTFT and E2E are checked against the
client's records, said as such: a client figure contains the server's (network and client
time added), so an estimate above the client's slowest request, or a client quantile below the
bucket the estimate was interpolated in, fails. Without exact figures: ``cannot_check`` with
the interval the bucket allows.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import duckdb

from analyzer.audit.compare import (
    CANNOT,
    FAIL,
    PASS,
    Finding,
    audit_query,
    create_table,
)
from analyzer.audit.histogram_figures import (
    FAMILY_FIGURES,
    GAPS,
    client_rows,
    definitions_note,
    traced_rows,
)
from analyzer.audit.prom_text import Histogram, read_histograms, window
from analyzer.errors import AuditInputError

__all__ = ["COUNT_SLACK", "audit_server_histograms"]

#: the quantiles a dashboard draws (histogram_quantile.sql estimates more)
DASHBOARD_QUANTILES = (0.5, 0.9, 0.95, 0.99)
#: a histogram whose count differs from the traced requests' by more than this share is not judged
COUNT_SLACK = 0.05


def _summed(hist: Histogram) -> list[tuple[str, float, float]]:
    """(family, le, cumulative) rows, summed over the family's series."""
    total: dict[float, float] = {}
    for buckets in hist.buckets.values():
        for le, count in buckets.items():
            total[le] = total.get(le, 0.0) + count
    return [(hist.name, le, count) for le, count in sorted(total.items())]


def audit_server_histograms(path: Path, baseline: Path | None, con: duckdb.DuckDBPyConnection,
                            db: str | Path | None = None, individual: str | Path | None = None) -> list[Finding]:
    """All checks of one scrape (less its baseline): against the traces with ``db``, against
    the client's records (AIPerf's profile_export.jsonl) with ``individual``, or both."""
    after = read_histograms(path)
    if not after:
        raise AuditInputError(f"{path}: no histogram in this scrape (no '# TYPE <name> histogram' family)")
    before = read_histograms(baseline) if baseline is not None else {}
    hists = window(after, before, path, baseline) if baseline is not None else after
    client = client_rows(Path(individual)) if individual is not None else None
    findings = [_window_finding(hists, before, baseline)]
    rows = [row for h in hists.values() for row in _summed(h)]
    create_table(con, "prom_buckets", {"family": "VARCHAR", "le": "DOUBLE", "cumulative": "DOUBLE"}, rows)
    estimates: dict[str, list[dict[str, Any]]] = {}
    for r in audit_query(con, "histogram_quantile"):
        if r["q"] in DASHBOARD_QUANTILES:
            estimates.setdefault(r["family"], []).append(r)
    exact = _exact(con, hists, before, traced_rows(db), client=False) if db is not None else {}
    for family in sorted(hists):
        findings.append(_family_finding(family, estimates.get(family, []), exact.get(family), db is not None))
    if client is not None:
        by_client = _exact(con, hists, {}, client, client=True)
        for family in sorted(hists):
            if family in FAMILY_FIGURES:
                findings.append(_client_finding(family, estimates.get(family, []), by_client.get(family),
                                                Path(individual or "")))
    return findings


def _count(hist: Histogram | None) -> float:
    if hist is None:
        return 0.0
    return sum(b.get(math.inf, 0.0) for b in hist.buckets.values())


def _window_finding(hists: dict[str, Histogram], before: dict[str, Histogram], baseline: Path | None) -> Finding:
    counts = {name: _count(h) for name, h in hists.items()}
    numbers: dict[str, Any] = {"families": len(hists), "window_counts": counts,
               "baseline_counts": {name: _count(h) for name, h in before.items()}}
    if baseline is None:
        return Finding("scrape_window", CANNOT, f"{len(hists)} histogram families, lifetime counts since the server "
                       "started (warm-up included): pass --baseline BEFORE.prom, a scrape from before the run, to audit "
                       "the run's window", numbers)
    left = sum(numbers["baseline_counts"].values())
    return Finding("scrape_window", PASS, f"{len(hists)} histogram families, the window = this scrape - "
                   f"{baseline.name} ({left:g} observations of the baseline left out)", numbers)


#: the families counting one observation per finished request, in the order tried: the
#: window's requests for an inter-token family
_REQUEST_COUNT_FAMILIES = ("vllm:e2e_request_latency_seconds", "gen_ai_server_request_duration_seconds")


def _exact(con: duckdb.DuckDBPyConnection, hists: dict[str, Histogram], before: dict[str, Histogram],
           rows: list[dict[str, Any]], *, client: bool) -> dict[str, dict[str, Any]]:
    """family -> {'rows': exact figures per q, 'other_rows': the otherwise-defined figure's,
    'traced': values in the window, 'counted': the histogram's count, 'skipped': the
    baseline's, 'available'} for the families FAMILY_FIGURES maps. ``rows``: traced requests
    (or the client's records, ``client``), ended first first."""
    request_family = next((f for f in _REQUEST_COUNT_FAMILIES if f in hists), None)
    request_skip = int(_count(before.get(request_family))) if request_family else 0
    request_count = int(_count(hists[request_family])) if request_family else len(rows)
    values: list[tuple[str, float]] = []
    out: dict[str, dict[str, Any]] = {}
    for family, hist in hists.items():
        figure = FAMILY_FIGURES.get(family)
        if figure is None:
            continue
        column = figure.column_for(client)
        if column is None:
            continue
        counted = int(_count(hist))
        if figure.per_token:
            chosen = rows[request_skip: request_skip + request_count]
            mine = [g for r in chosen for g in r[GAPS]]
            other: list[float] = []
            skip, available = request_skip, sum(len(r[GAPS]) for r in rows)
        else:
            having = [r for r in rows if r.get(column) is not None]
            skip, available = int(_count(before.get(family))), len(having)
            mine = [r[column] for r in having[skip: skip + counted]]
            other_column = None if client else figure.other_column
            with_other = [r for r in rows if other_column and r.get(other_column) is not None]
            other = [r[other_column] for r in with_other[skip: skip + counted]] if other_column else []
        values += [(family, v) for v in mine] + [(family + "|other", v) for v in other]
        out[family] = {"traced": len(mine), "counted": counted, "skipped": skip, "available": available,
                       "other_traced": len(other)}
    create_table(con, "histogram_exact_values", {"family": "VARCHAR", "value_ms": "DOUBLE"}, values)
    for r in audit_query(con, "histogram_exact"):
        family, _, variant = r["family"].partition("|")
        out[family].setdefault("other_rows" if variant else "rows", {})[r["q"]] = r
    return out


def _bucket(e: dict[str, Any]) -> str:
    upper = "+Inf" if e["bucket_upper"] is None else f"{e['bucket_upper']:g}"
    return f"({e['bucket_lower']:g}, {upper}]"


def _live(estimates: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The estimates of a window with observations, each with the error its bucket allows."""
    live = [e for e in estimates if e["estimate"] is not None]
    for e in live:
        e["allowed_error"] = (None if e["bucket_upper"] is None else
                              max(e["estimate"] - e["bucket_lower"], e["bucket_upper"] - e["estimate"]))
    return live


def _in_bucket(value: float, e: dict[str, Any]) -> bool:
    upper = math.inf if e["bucket_upper"] is None else e["bucket_upper"]
    return e["bucket_lower"] - 1e-12 <= value <= upper + 1e-12


def _other_note(family: str, live: list[dict[str, Any]], exact: dict[str, Any]) -> str:
    """The otherwise-defined traced figure against the estimates' buckets, both definitions
    said when it contradicts them ('' when the family has none traced)."""
    other = exact.get("other_rows")
    if not other:
        return ""
    outside = [f"p{e['q'] * 100:g} {other[e['q']]['exact_nearest_rank']:.4g} s outside {_bucket(e)}"
               for e in live if not _in_bucket(other[e["q"]]["exact_nearest_rank"], e)]
    return definitions_note(FAMILY_FIGURES[family], exact.get("rows"), other, outside)


def _family_finding(family: str, estimates: list[dict[str, Any]], exact: dict[str, Any] | None,
                    with_db: bool) -> Finding:
    check = f"histogram:{family}"
    figure = FAMILY_FIGURES.get(family)
    what = figure.what if figure else family
    unit = " s" if family.endswith("_seconds") else ""  # else the family's own unit
    numbers: dict[str, Any] = {"estimates": estimates}
    live = _live(estimates)
    if not live:
        return Finding(check, CANNOT, f"{family}: no observation in the window", numbers)
    n = live[0]["observations"]
    intervals = "; ".join(f"p{e['q'] * 100:g} {e['estimate']:.4g}{unit} in bucket {_bucket(e)}"
                          + ("" if e["allowed_error"] is None else f" (+/- {e['allowed_error']:.3g}{unit})")
                          for e in live)
    if exact is None or figure is None:
        why = ("no traced figure is mapped to this family" if with_db else
               "pass --db with the traces of the same window to compare with the exact figures")
        return Finding(check, CANNOT, f"{family} ({n:g} observations, histogram_quantile): {intervals}; {why}",
                       numbers)
    numbers.update({k: exact[k] for k in ("traced", "counted", "skipped", "available", "other_traced")})
    units = "gaps" if figure.per_token else "requests"
    note = _other_note(family, live, exact)
    if not exact["traced"] and exact["other_traced"]:
        return Finding(check, CANNOT, f"{family} ({n:g} observations): no traced {figure.column} (the histogram's "
                       f"definition: {figure.traced_definition}); {intervals}{note}", numbers)
    if exact["counted"] and abs(exact["traced"] - exact["counted"]) > COUNT_SLACK * exact["counted"]:
        return Finding(check, CANNOT, f"{family}: the window counts {exact['counted']} observations, the traces have "
                       f"{exact['traced']} {units} with a server {what} after the baseline's {exact['skipped']} "
                       f"({exact['available']} in all): not the same {units}; {intervals}", numbers)
    slowest, fastest = ("largest gap", "smallest gap") if figure.per_token else ("slowest request", "fastest request")
    problems, said = [], []
    for e in live:
        x = exact["rows"][e["q"]]
        e.update({"exact_nearest_rank": x["exact_nearest_rank"], "exact_linear": x["exact_linear"],
                  "fastest": x["min_value"], "slowest": x["max_value"]})
        name = f"p{e['q'] * 100:g}"
        est = e["estimate"]
        if est > x["max_value"] + 1e-12:
            problems.append(f"{name} {est:.4g} s is above the {slowest} ({x['max_value']:.4g} s)")
        elif est < x["min_value"] - 1e-12:
            problems.append(f"{name} {est:.4g} s is below the {fastest} ({x['min_value']:.4g} s)")
        if not _in_bucket(x["exact_nearest_rank"], e):
            problems.append(f"{name}: the exact {x['exact_nearest_rank']:.4g} s lies outside the bucket {_bucket(e)} "
                            "the estimate was interpolated in: histogram and traces disagree")
        said.append(f"{name} {est:.4g} s vs exact {x['exact_nearest_rank']:.4g} s (error "
                    f"{est - x['exact_nearest_rank']:+.3g} s, bucket {_bucket(e)})")
    head = (f"{family} vs the traced {what} ({figure.traced_definition}) of the same {exact['traced']} {units} "
            f"(histogram count {exact['counted']})")
    if problems:
        return Finding(check, FAIL, f"{head}: " + "; ".join(problems) + note, numbers)
    return Finding(check, PASS, f"{head}: " + "; ".join(said) + note, numbers)


def _client_finding(family: str, estimates: list[dict[str, Any]], exact: dict[str, Any] | None,
                    individual: Path) -> Finding:
    """One family against the client's records: a client TTFT / E2E contains the server's, so
    the server's quantiles cannot exceed the client's; gaps seen by a client are not bounded."""
    check = f"histogram:{family}:client"
    figure = FAMILY_FIGURES[family]
    live = _live(estimates)
    numbers: dict[str, Any] = {"estimates": estimates, "records": individual.name}
    if not live:
        return Finding(check, CANNOT, f"{family}: no observation in the window", numbers)
    if exact is None:
        return Finding(check, CANNOT, f"{family}: the client's records ({individual.name}) have no figure that bounds "
                       f"the server's {figure.what} (only TTFT and E2E contain the server's)", numbers)
    numbers.update({k: exact[k] for k in ("traced", "counted")})
    units = "gaps" if figure.per_token else "records"
    if exact["counted"] and abs(exact["traced"] - exact["counted"]) > COUNT_SLACK * exact["counted"]:
        return Finding(check, CANNOT, f"{family}: the window counts {exact['counted']} observations, the client's "
                       f"records ({individual.name}) hold {exact['traced']} successful {units}: not the same "
                       "requests (take the scrapes right before and after the run)", numbers)
    said = []
    problems = []
    for e in live:
        x = exact["rows"][e["q"]]
        name, est = f"p{e['q'] * 100:g}", e["estimate"]
        e.update({"client_nearest_rank": x["exact_nearest_rank"], "client_slowest": x["max_value"]})
        said.append(f"{name} {est:.4g} s vs client {x['exact_nearest_rank']:.4g} s (bucket {_bucket(e)})")
        if figure.per_token:
            continue
        if est > x["max_value"] + 1e-12:
            problems.append(f"{name} {est:.4g} s is above the client's slowest request ({x['max_value']:.4g} s): a "
                            "server figure cannot exceed the client's")
        if x["exact_nearest_rank"] < e["bucket_lower"] - 1e-12:
            problems.append(f"{name}: the client's {x['exact_nearest_rank']:.4g} s lies below the bucket "
                            f"{_bucket(e)} the estimate was interpolated in: the server's figure cannot exceed the "
                            "client's")
    head = f"{family} vs the client's {figure.what} ({individual.name}, {exact['traced']} {units})"
    if figure.per_token:
        return Finding(check, CANNOT, f"{head}: " + "; ".join(said) + "; gaps measured at the client add the "
                       "network's jitter and the client's reading: not bounded by the server's, shown only", numbers)
    if problems:
        return Finding(check, FAIL, f"{head}: " + "; ".join(problems), numbers)
    return Finding(check, PASS, f"{head}: " + "; ".join(said) + "; a client figure includes the network and the "
                   "client's time, so it may lie above the bucket, never below it", numbers)
