"""The engine timeline's rows, for the report's Timeline section and for ``tokentrace export
--perfetto``: every request's lane (queries/report/timeline.sql, in memory or streamed), the
engine steps (queries/steps.sql: counters and step slices), and the clock-skew verdicts
(queries/skew_offsets.sql). Nothing is derived here: the rows are the queries'."""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

import duckdb

from analyzer.db.views import install_views
from analyzer.query.runner import run_query, stream_query

__all__ = ["Engine", "Lane", "labelled", "read_engine", "read_lanes", "stream_lanes"]


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
        return min(t for t in [self.request["start_ns"], *(i["start_ns"] for i in self.items)] if t is not None)

    @property
    def end_ns(self) -> int:
        """The latest time of the request or any item of its lane (ns)."""
        return max(t for t in [self.request["end_ns"], *(i["end_ns"] for i in self.items)] if t is not None)

    @property
    def label(self) -> str:
        """What a person calls the request: its response id, else its span id."""
        return self.request.get("response_id") or self.request["request_span_id"]


def labelled(lanes: Iterable[Lane]) -> Iterator[tuple[Lane, str]]:
    """Each lane with its label; a label already given (two requests with one response id)
    gets the request's span id after it, so no two lanes read the same."""
    seen: set[str] = set()
    for lane in lanes:
        text = lane.label
        if text in seen:
            text = f"{text} (span {lane.request['request_span_id']})"
        seen.add(text)
        yield lane, text


@dataclass
class Engine:
    """The engine steps (rows of queries/steps.sql with a step) by clock domain and step; why
    a clock domain has no step (steps.sql's null_reason rows); the clock-skew verdicts
    (queries/skew_offsets.sql)."""

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


def read_engine(con: duckdb.DuckDBPyConnection) -> Engine:
    """Run steps.sql and skew_offsets.sql on ``con`` (views installed here)."""
    install_views(con)
    steps = run_query(con, "steps", views=False).dicts()
    skew = run_query(con, "skew_offsets", views=False).dicts()
    return Engine(steps=[s for s in steps if s["step"] is not None], no_steps=[s for s in steps if s["step"] is None],
                  skew=skew)


def _group(rows: Iterable[dict[str, Any]]) -> Iterator[Lane]:
    """Lanes from timeline.sql's rows, which come lane by lane (each lane's request row first)."""
    lane: Lane | None = None
    for row in rows:
        if row["kind"] == "request":
            if lane is not None:
                yield lane
            lane = Lane(row)
        elif lane is not None and lane.key == (row["trace_id"], row["request_span_id"]):
            lane.items.append(row)
        else:  # never: the query orders each lane's rows after its request row
            raise ValueError(f"timeline.sql: a {row['kind']} row outside its request's lane")
    if lane is not None:
        yield lane


def read_lanes(con: duckdb.DuckDBPyConnection, *, request_span_ids: Sequence[str] | None = None,
               kinds: Sequence[str] | None = None) -> list[Lane]:
    """The lanes of queries/report/timeline.sql in request start order: every request, or
    those of ``request_span_ids``; with ``kinds`` only rows of those kinds (``["request"]``:
    the requests without their items)."""
    install_views(con)
    params = {"request_span_ids": list(request_span_ids) if request_span_ids is not None else None,
              "kinds": list(kinds) if kinds is not None else None}
    return list(_group(run_query(con, "report/timeline", params, views=False).dicts()))


def stream_lanes(con: duckdb.DuckDBPyConnection, batch_rows: int = 50_000) -> Iterator[Lane]:
    """Every lane of queries/report/timeline.sql, one at a time (the rows are fetched in
    batches of ``batch_rows``, never all at once: a run has a row per generated token)."""

    def rows() -> Iterator[dict[str, Any]]:
        for part in stream_query(con, "report/timeline"):
            cur = con.execute(part.sql, part.params)
            columns = [d[0] for d in cur.description]
            while batch := cur.fetchmany(batch_rows):
                for values in batch:
                    yield dict(zip(columns, values))

    install_views(con)
    return _group(rows())
