"""AIPerf's ``server_metrics_export.json`` (AIPerf >= 0.13 scrapes the server's ``/metrics``
during a run): each histogram's profiling-phase buckets and AIPerf's own percentile estimates
(``p1_estimate`` ... ``p99_estimate``: its polynomial-histogram method, not Prometheus'
interpolation), audited.

Per histogram family (series summed, as ``sum by (le)``), per estimate: the buckets that hold
the observations the quantile may be (nearest rank, or numpy's linear between two neighbours)
bound any estimate of it, so an estimate outside them fails; Prometheus' ``histogram_quantile`` estimate is given
beside it (queries/audit/histogram_quantile.sql). With ``--db``: the traced server figure of
the requests that ended inside the profiling phase (``summary.phase_time_ranges.profiling``);
an estimate above the slowest or below the fastest of them fails; a histogram count that
differs from theirs by more than 5 % is ``cannot_check`` with both counts (AIPerf's scrapes
do not fall on the phase's edges).
"""

from __future__ import annotations

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
from analyzer.audit.server_histograms import COUNT_SLACK
from analyzer.errors import AuditInputError

__all__ = ["audit_aiperf_server_metrics", "is_aiperf_server_metrics"]

_ESTIMATES = {0.01: "p1_estimate", 0.05: "p5_estimate", 0.10: "p10_estimate", 0.25: "p25_estimate",
              0.5: "p50_estimate", 0.75: "p75_estimate", 0.9: "p90_estimate", 0.95: "p95_estimate",
              0.99: "p99_estimate"}


def is_aiperf_server_metrics(data: Any) -> bool:
    """AIPerf's server-metrics export: ``metrics`` keyed by name, a ``summary`` naming the
    scraped endpoints."""
    return (isinstance(data, dict) and isinstance(data.get("metrics"), dict) and isinstance(data.get("summary"), dict)
            and "endpoints_configured" in data["summary"])


def _histograms(path: Path, data: dict[str, Any]) -> tuple[list[tuple[str, float, float]], dict[str, Any]]:
    """(family, le, cumulative) rows summed over series, and per family its series' stats."""
    rows: list[tuple[str, float, float]] = []
    stats: dict[str, Any] = {}
    for name, metric in data["metrics"].items():
        if not isinstance(metric, dict) or metric.get("type") != "histogram":
            continue
        total: dict[float, float] = {}
        series = metric.get("series")
        if not isinstance(series, list):
            raise AuditInputError(f"{path}: metrics.{name}.series is missing or not a list")
        for i, s in enumerate(series):
            buckets = s.get("buckets") if isinstance(s, dict) else None
            if not isinstance(buckets, dict):
                raise AuditInputError(f"{path}: metrics.{name}.series[{i}].buckets is missing (a truncated export?)")
            if "+Inf" not in buckets:
                raise AuditInputError(f"{path}: metrics.{name}.series[{i}].buckets has no '+Inf' bucket")
            for le, count in buckets.items():
                try:
                    bound = float(le)
                except ValueError:
                    raise AuditInputError(f"{path}: metrics.{name}.series[{i}].buckets: bound {le!r} is not a number") \
                        from None
                if isinstance(count, bool) or not isinstance(count, (int, float)):
                    raise AuditInputError(f"{path}: metrics.{name}.series[{i}].buckets[{le!r}] = {count!r} is not a "
                                          "count")
                total[bound] = total.get(bound, 0.0) + float(count)
        if len(series) == 1 and isinstance(series[0].get("stats"), dict):
            stats[name] = series[0]["stats"]
        elif series:
            stats[name] = None  # several series: AIPerf's estimates are per series, not of the sum
        rows += [(name, le, c) for le, c in sorted(total.items())]
    return rows, stats


def _exact(con: duckdb.DuckDBPyConnection, data: dict[str, Any], families: list[str],
           rows: list[dict[str, Any]], *, client: bool) -> dict[str, dict[str, Any]]:
    """family -> {'traced': values, 'min_value', 'max_value'} over the requests (``rows``:
    traced, or the client's records with ``client``) that ended inside the profiling phase."""
    phase = ((data["summary"].get("phase_time_ranges") or {}).get("profiling") or {})
    start, end = phase.get("start_ns"), phase.get("end_ns")
    if not isinstance(start, int) or not isinstance(end, int):
        return {}
    inside = [r for r in rows if r.get("e_ns") is not None and start <= r["e_ns"] <= end]
    values: list[tuple[str, float]] = []
    out: dict[str, dict[str, Any]] = {}
    for family in families:
        figure = FAMILY_FIGURES.get(family)
        if figure is None:
            continue
        column = figure.column_for(client)
        if column is None:
            continue
        other: list[float] = []
        if figure.per_token:
            chosen = [g for r in inside for g in r[GAPS]]
        else:
            chosen = [r[column] for r in inside if r.get(column) is not None]
            if figure.other_column and not client:
                other = [r[figure.other_column] for r in inside if r.get(figure.other_column) is not None]
        values += [(family, v) for v in chosen] + [(family + "|other", v) for v in other]
        out[family] = {"traced": len(chosen)}
    create_table(con, "histogram_exact_values", {"family": "VARCHAR", "value_ms": "DOUBLE"}, values)
    for r in audit_query(con, "histogram_exact"):
        family, _, variant = r["family"].partition("|")
        out[family].setdefault("other_rows" if variant else "rows", {})[r["q"]] = r
        if not variant:
            out[family]["min_value"], out[family]["max_value"] = r["min_value"], r["max_value"]
    return out


def audit_aiperf_server_metrics(path: Path, data: Any, con: duckdb.DuckDBPyConnection,
                                db: str | Path | None = None, individual: str | Path | None = None) -> list[Finding]:
    """All checks of one export: against the traces with ``db``, against the client's records
    (AIPerf's profile_export.jsonl of the same run) with ``individual``."""
    if not is_aiperf_server_metrics(data):
        raise AuditInputError(f"{path}: not AIPerf's server_metrics_export.json (needs 'metrics' and 'summary' with "
                              "'endpoints_configured')")
    rows, stats = _histograms(path, data)
    if not rows:
        raise AuditInputError(f"{path}: no histogram in metrics")
    client = client_rows(Path(individual)) if individual is not None else None
    create_table(con, "prom_buckets", {"family": "VARCHAR", "le": "DOUBLE", "cumulative": "DOUBLE"}, rows)
    estimates: dict[str, dict[float, dict[str, Any]]] = {}
    for r in audit_query(con, "histogram_quantile"):
        estimates.setdefault(r["family"], {})[r["q"]] = r
    exact = _exact(con, data, sorted(stats), traced_rows(db), client=False) if db is not None else {}
    endpoints = ", ".join(map(str, data["summary"].get("endpoints_successful") or []))
    out = [Finding("report_layout", PASS, f"AIPerf {data.get('aiperf_version')} server metrics export (schema "
                   f"{data.get('schema_version')}), {len(stats)} histograms scraped from {endpoints or '?'} over the "
                   f"{data.get('metrics_phase', 'profiling')} phase", {"histograms": sorted(stats)})]
    for family in sorted(stats):
        out.append(_family(family, stats[family], estimates.get(family, {}), exact.get(family), db is not None))
    if client is not None:
        by_client = _exact(con, data, sorted(stats), client, client=True)
        for family in sorted(stats):
            if family in FAMILY_FIGURES:
                out.append(_client_family(family, stats[family], by_client.get(family), Path(individual or "")))
    return out


def _client_family(family: str, stats: dict[str, Any] | None, exact: dict[str, Any] | None,
                   individual: Path) -> Finding:
    """AIPerf's estimates against its own client records: a client TTFT / E2E contains the
    server's, so no server estimate may exceed the client's slowest request."""
    check = f"histogram:{family}:client"
    figure = FAMILY_FIGURES[family]
    if stats is None or not stats.get("count"):
        return Finding(check, CANNOT, f"{family}: no single series with observations to compare", {})
    if exact is None or exact.get("max_value") is None:
        return Finding(check, CANNOT, f"{family}: the client's records ({individual.name}) have no figure that bounds "
                       f"the server's {figure.what} inside the profiling phase (only TTFT and E2E contain the "
                       "server's)", {})
    count = stats["count"]
    numbers = {"count": count, "client": exact}
    if abs(exact["traced"] - count) > COUNT_SLACK * count:
        return Finding(check, CANNOT, f"{family}: the profiling phase counts {count:g} observations, the client's "
                       f"records hold {exact['traced']} inside it: not the same requests", numbers)
    claims = {f"p{q * 100:g}": stats.get(key) for q, key in _ESTIMATES.items()
              if isinstance(stats.get(key), (int, float))}
    said = f"client {figure.what} {exact['min_value']:.4g}-{exact['max_value']:.4g} s over {exact['traced']}"
    if figure.per_token:
        return Finding(check, CANNOT, f"{family}: {said} gaps; gaps measured at the client add the network's jitter "
                       "and the client's reading: not bounded by the server's, shown only", numbers)
    above = [f"{n} {v:.4g} s" for n, v in claims.items() if v > exact["max_value"] + 1e-12]
    if above:
        return Finding(check, FAIL, f"{family}: {', '.join(above)} above the client's slowest request "
                       f"({exact['max_value']:.4g} s): a server figure cannot exceed the client's", numbers)
    return Finding(check, PASS, f"{family}: every AIPerf estimate lies at or below the client's slowest request "
                   f"({said} records; a client figure includes the network and the client's time)", numbers)


def _bounds(lo: float | None, hi: float | None) -> str:
    return f"({lo:g}, {'+Inf' if hi is None else f'{hi:g}'}]"


def _family(family: str, stats: dict[str, Any] | None, est: dict[float, dict[str, Any]],
            exact: dict[str, Any] | None, with_db: bool) -> Finding:
    check = f"histogram:{family}"
    if stats is None:
        return Finding(check, CANNOT, f"{family}: several series, AIPerf's estimates are per series: not judged", {})
    count = stats.get("count")
    if not count:
        return Finding(check, CANNOT, f"{family}: no observation in the profiling phase", {"stats": stats})
    figures: dict[str, Any] = {}
    problems: list[str] = []
    mismatch = (exact is not None and exact.get("traced") is not None
                and abs(exact["traced"] - count) > COUNT_SLACK * count)
    comparable = exact is not None and exact.get("max_value") is not None and not mismatch
    for q, key in _ESTIMATES.items():
        claimed = stats.get(key)
        row = est.get(q)
        if not isinstance(claimed, (int, float)) or row is None:
            continue
        lo, hi = row["rank_lower"], row["rank_upper"]
        name = f"p{q * 100:g}"
        figures[name] = {"aiperf_estimate": claimed, "prometheus_estimate": row["estimate"], "rank_bucket": [lo, hi]}
        if claimed < lo - 1e-12 or (hi is not None and claimed > hi + 1e-12):
            problems.append(f"{name} {claimed:.4g} outside {_bounds(lo, hi)}, the buckets that hold the {name} "
                            "observation(s)")
        if comparable and exact is not None:
            if claimed > exact["max_value"] + 1e-12:
                problems.append(f"{name} {claimed:.4g} s above the slowest traced request ({exact['max_value']:.4g} s)")
            elif claimed < exact["min_value"] - 1e-12:
                problems.append(f"{name} {claimed:.4g} s below the fastest traced request ({exact['min_value']:.4g} s)")
    note = ""
    if exact is not None and FAMILY_FIGURES[family].other_column and exact.get("other_rows"):
        outside = [f"{n} {exact['other_rows'][q]['exact_nearest_rank']:.4g} s outside "
                   f"{_bounds(*figures[n]['rank_bucket'])}"
                   for q, n in ((0.5, "p50"), (0.9, "p90"), (0.95, "p95"), (0.99, "p99")) if n in figures
                   and not (figures[n]["rank_bucket"][0] - 1e-12 <= exact["other_rows"][q]["exact_nearest_rank"]
                            <= (figures[n]["rank_bucket"][1] if figures[n]["rank_bucket"][1] is not None
                                else float("inf")) + 1e-12)]
        note = definitions_note(FAMILY_FIGURES[family], exact.get("rows"), exact["other_rows"], outside)
    numbers: dict[str, Any] = {"count": count, "figures": figures,
                               "exact": {k: v for k, v in (exact or {}).items() if not k.endswith("rows")} or exact}
    said = "; ".join(f"{n} {f['aiperf_estimate']:.4g} (Prometheus {f['prometheus_estimate']:.4g}) in "
                     f"{_bounds(*f['rank_bucket'])}" for n, f in figures.items() if n in ("p50", "p90", "p99"))
    if problems:
        return Finding(check, FAIL, f"{family} ({count:g} observations): " + "; ".join(problems[:4]) + note, numbers)
    if mismatch and exact is not None:
        return Finding(check, CANNOT, f"{family}: the profiling phase counts {count:g} observations, the traces have "
                       f"{exact['traced']} requests ending inside it (AIPerf's scrapes do not fall on the phase's "
                       f"edges): not the same requests, so not judged against them; every estimate lies in the buckets "
                       f"of its observations: {said}", numbers)
    if exact is None:
        why = ("no traced figure is mapped to this family" if with_db else
               "pass --db with the run's traces to compare with the exact figures")
        return Finding(check, CANNOT, f"{family} ({count:g} observations): every estimate lies in the buckets that "
                       f"hold its observations: {said}; {why}", numbers)
    return Finding(check, PASS, f"{family} ({count:g} observations, {exact['traced']} traced): every estimate lies in "
                   f"the buckets of its observations and within the traced requests' range: {said}{note}", numbers)

