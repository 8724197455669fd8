"""The engine timeline's rows, read once for the report's Timeline section and for
``tokentrace export --perfetto``: every request's lane (queries/report/timeline.sql), the
engine steps (queries/steps.sql: counters and step slices), and the clock-skew verdicts
(queries/skew_offsets.sql). Nothing is derived here: the rows are the queries'."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import duckdb

from analyzer.query.runner import install_views, run_query

__all__ = ["Lane", "Timeline", "read_timeline"]


@dataclass
class Lane:
    """One request: its ``request`` row and the rows of its lane (queue, prefill, decode,
    token, chunk, preemption), in time order; times in ns on ``clock_domain``'s clock."""

    request: dict[str, Any]
    items: list[dict[str, Any]] = field(default_factory=list)

    @property
    def key(self) -> tuple[str, str]:
        return self.request["trace_id"], self.request["request_span_id"]

    @property
    def clock_domain(self) -> str:
        return self.request["clock_domain"] or ""

    def kind(self, *kinds: str) -> list[dict[str, Any]]:
        return [i for i in self.items if i["kind"] in kinds]

    @property
    def start_ns(self) -> int:
        """The earliest time of the request or any item of its lane (ns)."""
        return min([self.request["start_ns"], *(i["start_ns"] for i in self.items)])

    @property
    def end_ns(self) -> int:
        """The latest time of the request or any item of its lane (ns)."""
        return max([self.request["end_ns"], *(i["end_ns"] for i in self.items)])

    @property
    def label(self) -> str:
        """What a person calls the request: its response id, else its span id."""
        return self.request.get("response_id") or self.request["request_span_id"]


@dataclass
class Timeline:
    """Lanes by request start; engine steps (rows of queries/steps.sql with a step) by clock
    domain and step; why a clock domain has no step (steps.sql's null_reason rows); skew
    verdicts (queries/skew_offsets.sql)."""

    lanes: list[Lane]
    steps: list[dict[str, Any]]
    no_steps: list[dict[str, Any]]
    skew: list[dict[str, Any]]

    def steps_of(self, clock_domain: str) -> list[dict[str, Any]]:
        return [s for s in self.steps if s["clock_domain"] == clock_domain]

    def no_steps_reason(self) -> str | None:
        """One line saying why there is no engine track, when no clock domain has steps."""
        if self.steps:
            return None
        reasons = sorted({r["null_reason"] for r in self.no_steps if r.get("null_reason")})
        if reasons:
            return "no engine track: " + "; ".join(reasons)
        return ("no engine track: no engine_step span and no prefill span in the traces "
                "(a client's spans only, or another engine's)")


def read_timeline(con: duckdb.DuckDBPyConnection) -> Timeline:
    """Run the timeline's queries on ``con`` (views installed here)."""
    install_views(con)
    lanes: list[Lane] = []
    by_key: dict[tuple[str, str], Lane] = {}
    for row in run_query(con, "report/timeline", views=False).dicts():
        key = (row["trace_id"], row["request_span_id"])
        if row["kind"] == "request":
            by_key[key] = Lane(row)
            lanes.append(by_key[key])
        else:
            by_key[key].items.append(row)
    steps = run_query(con, "steps", views=False).dicts()
    skew = run_query(con, "skew_offsets", views=False).dicts()
    return Timeline(lanes=lanes, steps=[s for s in steps if s["step"] is not None],
                    no_steps=[s for s in steps if s["step"] is None], skew=skew)
