"""One side of a comparison: a run's per-request figures and gaps, read from the SQL in
``queries/`` (``compare/requests.sql``, ``itl.sql``, ``phases.sql``, ``stalls.sql``) into numpy
arrays.

Nothing here derives a metric: TTFT, TPOT, E2E, the gaps, queue and prefill come from the
queries as they are; this module only lines them up by request (``trace_id``,
``request_span_id``, the key every perspective shares, docs/metrics.md "Perspectives").
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import duckdb
import numpy as np

from analyzer.errors import UserError

__all__ = ["PERSPECTIVE_ORDER", "RunData", "open_run", "perspectives_of", "pick_perspective", "read_run"]

#: The perspective compare picks when none is given: the first both runs have.
PERSPECTIVE_ORDER = ("client", "server", "engine")


@dataclass
class RunData:
    """A run's requests from one perspective. Every per-request array has one entry per
    request, in the order of ``compare/requests.sql`` (by start); NaN where the query's
    figure is NULL. ``gap_ms`` / ``gap_request`` hold every known visible-chunk gap
    (itl.sql) and the index of its request in these arrays."""

    label: str
    perspective: str
    s_ns: np.ndarray  # int64, ns since the epoch on the perspective's clock
    end_ns: np.ndarray  # int64, the request span's end
    input_tokens: np.ndarray  # float (NaN: unknown), tokens
    output_tokens: np.ndarray  # float (NaN: unknown), tokens
    succeeded: np.ndarray  # bool
    failed: np.ndarray  # bool (cancelled requests are neither, as in window.sql)
    meets_slo: np.ndarray  # bool
    ttft_ms: np.ndarray
    tpot_ms: np.ndarray
    e2e_ms: np.ndarray
    output_tokens_per_s: np.ndarray  # whole-request output rate, tokens/s
    queue_ms: np.ndarray  # from phases.sql (server phase spans); NaN where there are none
    prefill_ms: np.ndarray
    gap_ms: np.ndarray  # float, ms
    gap_request: np.ndarray  # int64 index into the per-request arrays
    # engine gaps joined to their engine step (stalls.sql), only those with step data: the
    # gap (ms, on the engine's clock), the step's batch size and co-scheduled prefill tokens
    step_itl_ms: np.ndarray = field(default_factory=lambda: np.zeros(0))
    step_batch_size: np.ndarray = field(default_factory=lambda: np.zeros(0))
    step_prefill_tokens: np.ndarray = field(default_factory=lambda: np.zeros(0))
    slo_known: bool = True  # meets_slo computed (window.sql's rule); False: a benchmark report's records
    models: tuple[str, ...] = ()  # the models its requests name (gen_ai.response.model / request.model)
    notes: list[str] = field(default_factory=list)

    @property
    def requests(self) -> int:
        """Requests of this perspective (every outcome)."""
        return int(self.s_ns.size)

    @property
    def window_s(self) -> float:
        """The run's window in seconds: earliest start to latest span end (window.sql's
        default closed-cohort bounds); 0 when there is no request."""
        if self.s_ns.size == 0:
            return 0.0
        return float(self.end_ns.max() - self.s_ns.min()) / 1e9


def _floats(values: list[Any]) -> np.ndarray:
    return np.array([np.nan if v is None else float(v) for v in values], dtype=float)


def perspectives_of(con: duckdb.DuckDBPyConnection) -> dict[str, int]:
    """Requests per perspective in the source (view request_metrics)."""
    from analyzer.db.views import install_views

    install_views(con)
    rows = con.execute("SELECT perspective, count(*) FROM request_metrics GROUP BY perspective").fetchall()
    return {str(p): int(n) for p, n in rows}


def pick_perspective(wanted: str | None, found: dict[str, dict[str, int]]) -> str:
    """``wanted``, or the first of client, server, engine both runs have; ``found``: the
    requests per perspective (:func:`perspectives_of`) of each run by its label. One line
    naming what is missing otherwise."""
    (a_label, a_has), (b_label, b_has) = found.items()

    def listing(has: dict[str, int]) -> str:
        return ", ".join(f"{p} ({n} requests)" for p, n in has.items()) or "no requests"

    for label, has in found.items():
        if not has:
            raise UserError(f"no common metric: {label} holds no requests (nothing to compare)")
    if wanted is not None:
        for label, has in found.items():
            if wanted not in has:
                raise UserError(f"no common metric: {label} has no {wanted} perspective (it has {listing(has)})")
        return wanted
    for perspective in PERSPECTIVE_ORDER:
        if perspective in a_has and perspective in b_has:
            return perspective
    raise UserError(f"no common metric: no perspective in both runs ({a_label}: {listing(a_has)}; "
                    f"{b_label}: {listing(b_has)})")


def read_run(con: duckdb.DuckDBPyConnection, label: str, perspective: str,
             slo: Mapping[str, float | None]) -> RunData:
    """The run in ``con`` seen from ``perspective``; ``slo``: slo_ttft_ms, slo_tpot_ms,
    slo_e2e_ms (None: not applied) for meets_slo."""
    from analyzer.query.runner import run_query

    def query_rows(name: str, params: Mapping[str, Any]) -> Any:  # every perspective's rows, views kept
        return run_query(con, name, params)

    params = {"perspective": perspective, **{k: v for k, v in slo.items() if v is not None}}
    req = query_rows("compare/requests", params).dicts()
    key_index = {(r["trace_id"], r["request_span_id"]): i for i, r in enumerate(req)}

    def column(name: str) -> list[Any]:
        return [r[name] for r in req]

    queue = np.full(len(req), np.nan)
    prefill = np.full(len(req), np.nan)
    notes: list[str] = []
    if req:
        phases = query_rows("phases", {}).dicts()
        for row in phases:
            at = key_index.get((row["trace_id"], row["request_span_id"]))
            if at is not None:
                queue[at] = np.nan if row["queue_ms"] is None else float(row["queue_ms"])
                prefill[at] = np.nan if row["prefill_ms"] is None else float(row["prefill_ms"])
        if not phases:
            notes.append(f"{label}: no server phase spans (phases): queue and prefill not known")
    gap_values: list[float] = []
    gap_owner: list[int] = []
    if req:
        gaps = query_rows("itl", {"perspective": perspective})
        trace_at, span_at, itl_at = (gaps.columns.index(c) for c in ("trace_id", "request_span_id", "itl_ms"))
        for row in gaps.rows:
            at = key_index.get((row[trace_at], row[span_at]))
            if at is not None and row[itl_at] is not None:
                gap_values.append(float(row[itl_at]))
                gap_owner.append(at)
    step_rows: list[tuple[float, float, float]] = []
    if req:
        for row in query_rows("stalls", {}).dicts():
            if ((row["trace_id"], row["request_span_id"]) in key_index and row["itl_ms"] is not None
                    and row["batch_size"] is not None and row["prefill_tokens"] is not None):
                step_rows.append((float(row["itl_ms"]), float(row["batch_size"]), float(row["prefill_tokens"])))
    steps = np.array(step_rows, dtype=float).reshape(-1, 3)
    outcome = column("outcome")
    return RunData(
        label=label,
        perspective=perspective,
        s_ns=np.array(column("s_ns"), dtype=np.int64),
        end_ns=np.array(column("end_ns"), dtype=np.int64),
        input_tokens=_floats(column("input_tokens")),
        output_tokens=_floats(column("output_tokens")),
        succeeded=np.array([o == "succeeded" for o in outcome], dtype=bool),
        failed=np.array([o == "failed" for o in outcome], dtype=bool),
        meets_slo=np.array([bool(v) for v in column("meets_slo")], dtype=bool),
        ttft_ms=_floats(column("ttft_ms")),
        tpot_ms=_floats(column("tpot_ms")),
        e2e_ms=_floats(column("e2e_ms")),
        output_tokens_per_s=_floats(column("whole_request_output_tokens_per_second")),
        queue_ms=queue,
        prefill_ms=prefill,
        gap_ms=np.array(gap_values, dtype=float),
        gap_request=np.array(gap_owner, dtype=np.int64),
        step_itl_ms=steps[:, 0],
        step_batch_size=steps[:, 1],
        step_prefill_tokens=steps[:, 2],
        models=tuple(sorted({m for m in column("model") if m})),
        notes=notes,
    )


def open_run(path: str, label: str) -> duckdb.DuckDBPyConnection:
    """A connection to ``path``: a Parquet dump folder (``tokentrace export``) or a database
    file (``tokentrace load``), as --parquet / --db read them; one line when it is neither."""
    from pathlib import Path

    from analyzer.db.source import open_source
    from analyzer.errors import SourceError

    target = Path(path)
    if not target.exists():
        raise UserError(f"{label} {path}: no such file or folder")
    try:
        return open_source(parquet=target) if target.is_dir() else open_source(db=target)
    except SourceError as exc:
        raise UserError(str(exc)) from None
