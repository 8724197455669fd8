"""Read the two sides of a comparison, whatever each is: a database, a Parquet dump folder, or
a benchmark report's per-request records (analyzer/compare/bench_records.py), seen from one
perspective both have."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from analyzer.compare.bench_records import read_benchmark_run
from analyzer.compare.run_data import RunData, open_run, perspectives_of, pick_perspective, read_run
from analyzer.errors import UserError

__all__ = ["read_sides"]


def read_sides(paths: Sequence[str], names: Sequence[str], wanted: str | None,
               slo: Mapping[str, float | None]) -> tuple[list[RunData], str]:
    """The runs at ``paths`` (labelled by ``names``, e.g. BASELINE and CANDIDATE) and the
    perspective they are compared from: ``wanted``, else the first of client, server, engine
    both have. A benchmark report is the client's view, so beside one the other side is read
    from its client perspective."""
    bench = [read_benchmark_run(path, name) for path, name in zip(paths, names)]
    if any(run is not None for run in bench):
        if wanted not in (None, "client"):
            named = next(name for name, run in zip(names, bench) if run is not None)
            raise UserError(f"no common metric: {named} is a benchmark report (the client's figures): "
                            f"--perspective {wanted} cannot be compared with it")
        wanted = "client"
    runs: list[RunData | None] = list(bench)
    trace_sides = [i for i, run in enumerate(bench) if run is None]
    connections = {i: open_run(paths[i], names[i]) for i in trace_sides}
    try:
        found = {f"{names[i]} {paths[i]}": perspectives_of(connections[i]) for i in trace_sides}
        for i, run in enumerate(bench):
            if run is not None:
                found[f"{names[i]} {paths[i]}"] = {"client": run.requests} if run.requests else {}
        chosen = pick_perspective(wanted, {f"{n} {p}": found[f"{n} {p}"] for n, p in zip(names, paths)})
        for i in trace_sides:
            runs[i] = read_run(connections[i], names[i], chosen, slo)
    finally:
        for con in connections.values():
            con.close()
    return [run for run in runs if run is not None], chosen
