"""Comparing a report's figures with recomputed ones: tolerance, diagnosis, and the audit SQL.

Recomputed figures always come from SQL (``queries/audit/*.sql`` or the metric queries);
this module only runs those files and compares. Tolerance of a comparison: the larger of
``rel_tol x |recomputed|`` and half a unit of the last decimal the claimed figure prints
(a figure written ``38.31`` stands for 38.305 ... 38.315). A report's integers get no
rounding slack unless the caller knows how the figure was written: ``half_unit`` (a claims
file's ``tpot_ms: 148`` stands for 147.5 ... 148.5; see analyzer/audit/claims_file.py).
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from decimal import Decimal
from typing import Any

import duckdb

from analyzer.audit.claims import CANNOT, FAIL, PASS, Finding
from analyzer.query.runner import run_query

__all__ = [
    "DEFAULT_REL_TOL",
    "DEFINITION_REL_TOL",
    "written_half_unit",
    "tolerance",
    "agree",
    "diagnose",
    "audit_query",
    "distribution_stats",
    "load_values",
    "create_table",
    "compare_figure",
    "PASS",
    "FAIL",
    "CANNOT",
    "Finding",
]

# Default relative tolerance: a recomputation from the same arrays differs only by float
# noise (vLLM's TPOT from ttft + sum(itls): 1.5e-7), while real mix-ups differ by more
# (vLLM sample's mean ITL vs mean TPOT: 7.6e-4).
DEFAULT_REL_TOL = 1e-4
# Matching a figure to a definition whose inputs were timed slightly differently (LLMPerf's
# ITL x O ends at the last chunk, its E2E when the stream closes: 2.3e-4 apart).
DEFINITION_REL_TOL = 1e-2


def _rounding_half_unit(claimed: float) -> float:
    if not math.isfinite(claimed) or claimed == int(claimed):
        return 0.0
    exponent = Decimal(repr(claimed)).as_tuple().exponent
    assert isinstance(exponent, int)
    return 0.5 * 10.0 ** exponent


def written_half_unit(raw: Any) -> float:
    """Half a unit of the last digit ``raw`` is written to: the precision a figure stands for.

    ``raw`` as a parser gives it: an ``int`` was written without decimals (``148``: 147.5 ...
    148.5, half unit 0.5); a ``float`` with the decimals of its shortest form (``147.8``: 0.05;
    ``148.0``: 0.05); a string with the decimals it shows (``"3,915"``: 0.5, ``"38.31"``:
    0.005; an exponent counts: ``"1.5e3"``: 50). 0.0 when it cannot be told (not finite).
    """
    if isinstance(raw, bool):
        return 0.0
    if isinstance(raw, int):
        return 0.5
    text = raw.replace(",", "").replace("_", "").strip() if isinstance(raw, str) else repr(float(raw))
    try:
        number = Decimal(text)
    except ArithmeticError:
        return 0.0
    if not number.is_finite():
        return 0.0
    exponent = number.as_tuple().exponent
    assert isinstance(exponent, int)
    return 0.5 * 10.0 ** exponent


def tolerance(claimed: float, recomputed: float, rel_tol: float, half_unit: float | None = None) -> float:
    """Absolute tolerance for ``claimed`` vs ``recomputed`` (same unit as both). ``half_unit``:
    the precision the figure was written to, when the caller knows it (else read from the
    float's decimals, integers exact)."""
    written = _rounding_half_unit(claimed) if half_unit is None else half_unit
    return max(rel_tol * abs(recomputed), written, 1e-12)


def agree(claimed: float | None, recomputed: float | None, rel_tol: float, half_unit: float | None = None) -> bool:
    """True when both are given and differ by at most :func:`tolerance`."""
    if claimed is None or recomputed is None:
        return False
    return abs(claimed - recomputed) <= tolerance(claimed, recomputed, rel_tol, half_unit)


def diagnose(claimed: float, candidates: Mapping[str, float | None], rel_tol: float,
             half_unit: float | None = None) -> str | None:
    """Name of the closest wrong-definition candidate that the claim matches, else None."""
    best: tuple[float, str] | None = None
    for name, value in candidates.items():
        if value is None or not agree(claimed, value, rel_tol, half_unit):
            continue
        gap = abs(claimed - value)
        if best is None or gap < best[0]:
            best = (gap, name)
    return best[1] if best else None


def audit_query(con: duckdb.DuckDBPyConnection, name: str, params: Mapping[str, Any] | None = None) -> list[dict[str, Any]]:
    """Rows of ``queries/audit/<name>.sql`` as dicts (no adapter views are installed)."""
    return run_query(con, f"audit/{name}", params, views=False).dicts()


def load_values(con: duckdb.DuckDBPyConnection, rows: Iterable[tuple[str, float | None]]) -> None:
    """(Re)create ``audit_values(metric, value)`` from (metric, value) pairs."""
    batch = list(rows)
    create_table(con, "audit_values", {"metric": "VARCHAR", "value": "DOUBLE"}, batch)


def create_table(con: duckdb.DuckDBPyConnection, name: str, columns: Mapping[str, str],
                 rows: list[tuple[Any, ...]]) -> None:
    """(Re)create temp table ``name`` with typed ``columns`` from row tuples (bulk, via Arrow)."""
    import pyarrow as pa

    arrow_types = {"VARCHAR": pa.string(), "DOUBLE": pa.float64(), "BIGINT": pa.int64(), "INTEGER": pa.int32()}
    casts = {"DOUBLE": float, "BIGINT": int, "INTEGER": int, "VARCHAR": str}
    cols: list[Any] = list(zip(*rows)) if rows else [[] for _ in columns]
    table = pa.table({c: pa.array([None if x is None else casts[t](x) for x in v], type=arrow_types[t])
                      for (c, t), v in zip(columns.items(), cols)})
    con.register("_audit_arrow_rows", table)
    try:
        typed = ", ".join(f"CAST({c} AS {t}) AS {c}" for c, t in columns.items())
        con.execute(f"CREATE OR REPLACE TEMP TABLE {name} AS SELECT {typed} FROM _audit_arrow_rows")
    finally:
        con.unregister("_audit_arrow_rows")


def distribution_stats(con: duckdb.DuckDBPyConnection) -> dict[str, dict[str, Any]]:
    """``audit/distribution_stats.sql`` over ``audit_values``: metric -> statistics."""
    return {row["metric"]: row for row in audit_query(con, "distribution_stats")}


def compare_figure(
    check: str,
    claimed: float | None,
    recomputed: float | None,
    rel_tol: float,
    *,
    what: str,
    unit: str,
    wrong: Mapping[str, float | None] | None = None,
    explain: Mapping[str, str] | None = None,
    missing: str | None = None,
    half_unit: float | None = None,
) -> Finding:
    """One figure vs its recomputation. On a mismatch, name the wrong definition it matches.

    ``wrong`` maps a diagnosis name to the value that wrong definition gives; ``explain``
    maps it to a sentence. ``missing`` is the reason for ``cannot_check`` when a side is None.
    ``half_unit``: the precision the claimed figure was written to (see :func:`tolerance`);
    it applies to the right definition and to every wrong one alike.
    """
    numbers: dict[str, Any] = {"claimed": claimed, "recomputed": recomputed, "unit": unit, "rel_tol": rel_tol}
    if claimed is None or recomputed is None:
        reason = missing or (f"{what}: the report does not give it" if claimed is None else f"{what}: cannot be recomputed")
        return Finding(check, CANNOT, reason, numbers)
    if half_unit is not None:
        numbers["written_half_unit"] = half_unit
    numbers["tolerance"] = tolerance(claimed, recomputed, rel_tol, half_unit)
    numbers["difference"] = claimed - recomputed
    if agree(claimed, recomputed, rel_tol, half_unit):
        within = ""
        if half_unit and abs(claimed - recomputed) > max(rel_tol * abs(recomputed), 1e-12):
            within = f" within the precision it is written to (+/- {half_unit:g})"
        return Finding(check, PASS, f"{what}: {claimed:.6g} {unit} matches the recomputed {recomputed:.6g}{within}",
                       numbers)
    candidates = dict(wrong or {})
    sentences = dict(explain or {})
    if unit in ("ms", "s"):
        smaller = "ms" if unit == "s" else "us"
        larger = "s" if unit == "ms" else "ks"
        candidates.setdefault("unit_slip_x1000", recomputed * 1000)
        candidates.setdefault("unit_slip_div1000", recomputed / 1000)
        sentences.setdefault("unit_slip_x1000", f"it is 1000 x the recomputed value: a figure in {smaller} "
                             f"labelled {unit} (ms vs s slip)")
        sentences.setdefault("unit_slip_div1000", f"it is the recomputed value / 1000: a figure in {larger} "
                             f"labelled {unit} (ms vs s slip)")
    found = diagnose(claimed, candidates, rel_tol, half_unit)
    if found is not None:
        numbers["diagnosis"] = found
        numbers["diagnosis_value"] = candidates[found]
        sentence = sentences.get(found, found.replace("_", " "))
        return Finding(check, FAIL, f"{what}: {claimed:.6g} {unit} is not the recomputed {recomputed:.6g}: {sentence}",
                       numbers)
    return Finding(check, FAIL, f"{what}: {claimed:.6g} {unit} differs from the recomputed {recomputed:.6g} "
                   f"by {claimed - recomputed:+.4g} (tolerance {numbers['tolerance']:.3g})", numbers)
