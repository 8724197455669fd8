"""AIPerf's summary statistics recomputed from a complete ``profile_export.jsonl``.

AIPerf's method: per metric, the values of the successful records (error records left out),
numpy linear percentiles (p1 ... p99), population std, avg, min, max, sum and count
(queries/audit/distribution_stats.sql does the same in SQL). A metric is recomputed when every
successful record it summarises is in the file (the record count equals the summary's
``count``) and the record's unit is the summary's; a list-valued record metric (e.g.
``inter_chunk_latency``) or one whose records are partial is named, not guessed.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import duckdb

from analyzer.audit.compare import (
    CANNOT,
    FAIL,
    PASS,
    Finding,
    compare_figure,
    distribution_stats,
    load_values,
)
from analyzer.errors import AuditInputError

__all__ = ["recompute_summary"]

#: summary statistic -> column of distribution_stats.sql
_COLUMNS = {"avg": "mean_value", "min": "min_value", "max": "max_value", "std": "std_pop", "sum": "sum_value",
            "count": "n_values", "p1": "p1", "p5": "p5", "p10": "p10", "p25": "p25", "p50": "p50", "p75": "p75",
            "p90": "p90", "p95": "p95", "p99": "p99"}


def _record_values(path: Path) -> tuple[dict[str, list[float]], dict[str, set[str]], set[str]]:
    """metric -> the successful records' scalar values, metric -> their units, list-valued metrics."""
    values: dict[str, list[float]] = {}
    units: dict[str, set[str]] = {}
    lists: set[str] = set()
    try:
        lines = path.read_text().splitlines()
    except FileNotFoundError:
        raise AuditInputError(f"{path}: no such file") from None
    for number, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            rec = json.loads(line)
        except json.JSONDecodeError as exc:
            raise AuditInputError(f"{path}:{number}: not valid JSON ({exc.msg})") from None
        if not isinstance(rec, dict) or rec.get("error") is not None:
            continue
        for name, item in (rec.get("metrics") or {}).items():
            if not isinstance(item, dict):
                continue
            value = item.get("value")
            if isinstance(value, list):
                lists.add(name)
            elif isinstance(value, (int, float)) and not isinstance(value, bool):
                values.setdefault(name, []).append(float(value))
                units.setdefault(name, set()).add(str(item.get("unit")))
    return values, units, lists


def recompute_summary(records_path: Path, m: dict[str, dict[str, Any]], con: duckdb.DuckDBPyConnection,
                      rel_tol: float) -> Finding:
    """``recompute_stats``: every statistic of every summarised record metric, recomputed."""
    values, units, lists = _record_values(records_path)
    summarised = {name: s for name, s in m.items() if isinstance(s.get("count"), (int, float)) and
                  any(k in s for k in _COLUMNS if k not in ("count", "avg"))}
    partial, other_unit, absent = [], [], []
    chosen: list[str] = []
    for name, s in summarised.items():
        if name in lists or name not in values:
            absent.append(name)
        elif len(values[name]) != s["count"]:
            partial.append(f"{name} ({len(values[name])} records, summary count {s['count']:g})")
        elif units[name] != {str(s.get("unit"))}:
            other_unit.append(f"{name} (records {', '.join(sorted(units[name]))}, summary {s.get('unit')})")
        else:
            chosen.append(name)
    numbers: dict[str, Any] = {"recomputed": chosen, "partial": partial, "other_unit": other_unit,
                               "not_in_records": sorted(absent),
                               "method": "AIPerf/numpy: linear percentiles, population std"}
    if not chosen:
        why = ("the records are partial: " + "; ".join(partial[:3])) if partial else "no summarised metric is a " \
              "scalar in the records"
        return Finding("recompute_stats", CANNOT, f"{records_path.name}: {why}", numbers)
    load_values(con, ((name, v) for name in chosen for v in values[name]))
    stats = distribution_stats(con)
    figures: dict[str, Any] = {}
    failures: list[Finding] = []
    for name in chosen:
        row, s = stats[name], summarised[name]
        for stat, column in _COLUMNS.items():
            claimed = s.get(stat)
            if not isinstance(claimed, (int, float)) or isinstance(claimed, bool):
                continue
            wrong = {"std_sample_not_population": row["std_samp"]} if stat == "std" else {}
            if f"{stat}_nearest_rank" in row:
                wrong["nearest_rank_percentile"] = row[f"{stat}_nearest_rank"]
            f = compare_figure("recompute_stats", float(claimed), row[column], rel_tol, what=f"{name}.{stat}",
                               unit=str(s.get("unit", "")), wrong=wrong,
                               explain={"std_sample_not_population": "it is the sample std (n - 1); AIPerf uses "
                                                                     "numpy's population std",
                                        "nearest_rank_percentile": "it is a nearest-rank percentile; AIPerf uses "
                                                                   "numpy's linear percentile"})
            figures[f"{name}.{stat}"] = {"claimed": claimed, "recomputed": row[column], "verdict": f.verdict}
            if f.verdict == FAIL:
                failures.append(f)
    numbers["figures"] = figures
    left = ""
    if partial or other_unit:
        left = "; not recomputed: " + "; ".join([*partial, *other_unit][:4])
    if failures:
        numbers["diagnosis"] = failures[0].numbers.get("diagnosis")
        return Finding("recompute_stats", FAIL, f"{len(failures)} of {len(figures)} summary figures differ: "
                       + "; ".join(f.detail for f in failures[:3]) + left, numbers)
    return Finding("recompute_stats", PASS, f"{len(figures)} summary figures of {len(chosen)} metrics recomputed from "
                   f"the {records_path.name} records (AIPerf's method: numpy linear percentiles, population std) "
                   f"match{left}", numbers)
