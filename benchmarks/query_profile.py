"""Where a metric query's time goes: each statement the library runs for it, and its slowest operators.

On a Parquet dump written by ``benchmarks/queries.py --keep DIR`` (``DIR/n<N>``), for each
query named (default: the full set, requests itl summary, on one connection in that order,
as ``queries.py`` runs it; ``--alone``: each on its own connection, as a CLI command runs it):

1. the views are kept as analyzer.query.runner keeps them for the query (``install_views``,
   ``materialize_views``) with DuckDB's query log on, which gives the statements it ran: the
   views kept as temp tables (one the library fills range by range, the gap table, is
   filled here in one statement); then the query itself, fetched as Arrow batches of 1M
   rows, each dropped (itl in one piece, not range by range as the CLI streams it);
2. a fresh connection runs the same statements again, each with DuckDB's JSON profiler on,
   and prints per statement its wall time (s) and the operators that took most of it: their
   own time (s, summed over threads, as DuckDB reports it), the rows they produced, and what
   they did (the table scanned, the join or the grouping, cut to fit 80 columns).

Read the wall times within one run; the profiler's operator times are CPU time over all
threads and add up to more than the wall time on a machine with more than one core.

    .venv/bin/python benchmarks/query_profile.py /tmp/tt-bench/n100000 [--queries requests itl]
        [--top 4] [--alone] [--json FILE]
"""

from __future__ import annotations

import argparse
import json
import re
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run from a checkout without installing

FULL_SET = ("requests", "itl", "summary")


def _open(dump: Path) -> Any:
    from analyzer.db.source import open_source
    from analyzer.db.views import install_views

    con = open_source(parquet=str(dump))
    con.execute("SET temp_directory = $d", {"d": str(dump.parent / "duckdb_tmp")})
    install_views(con)
    return con


def statements_of(dump: Path, names: list[str]) -> list[tuple[str, str, Any]]:
    """(query name, statement, its parameters) for every statement the library ran for
    ``names`` on one connection, after its views were installed (setup statements left out)."""
    from analyzer.db.views import materialize_views
    from analyzer.query.runner import load_query

    con = _open(dump)
    con.execute("CALL enable_logging('QueryLog')")
    found: list[tuple[str, str, Any]] = []
    seen = 0
    for name in names:
        query = load_query(name)
        materialize_views(con, query.sql, keep_chunks=len(names) > 1)
        con.execute("SELECT 'tokentrace: the query'").fetchall()  # (its place in the log: it is not run here)
        logged = [row[0] for row in con.execute(
            "SELECT message FROM duckdb_logs WHERE type = 'QueryLog' ORDER BY timestamp").fetchall()]
        for text in logged[seen:]:
            head = " ".join(text.split()).upper()
            if "DUCKDB_" in head or "TT_VIEW_STATE" in head or head.startswith(
                    ("SELECT COUNT(*)", "SELECT CURRENT_SETTING", "SELECT MIN(PERSPECTIVE_KEY)", "SELECT 1, MAX(")):
                continue  # the library reading its own catalog state
            if head.startswith("INSERT") and "BETWEEN $LOW AND $HIGH" in head:
                # a kept table the library fills range by range (to bound its memory): here at once
                text = re.sub(r"WHERE\s+request_key\s+BETWEEN\s+\$low\s+AND\s+\$high", "", text, flags=re.I)
                if any(text == earlier for _, earlier, _ in found):
                    continue
                found.append((name, text, None))
            elif head.startswith("INSERT") and "$CANDIDATE_FROM" in head:
                # tokentrace's gaps from the ordered chunk table (queries/keep/): every range at once
                bounds = con.execute("SELECT 1, max(request_key), min(perspective_key), max(perspective_key)"
                                     " FROM tt_request_keys").fetchall()[0]
                found.append((name, text, dict(zip(("request_key_from", "request_key_to", "candidate_from",
                                                    "candidate_to"), bounds))))
            elif text == "SELECT 'tokentrace: the query'":  # the query itself, with its default parameters
                found.append((name, query.sql, query.bind({}) or None))
            else:  # a view kept as a table, and the view then pointed at it
                found.append((name, text, None))
        seen = len(logged)
    con.close()
    return found


def _operators(node: dict[str, Any], out: list[tuple[float, int, str, str]]) -> None:
    name = node.get("name") or node.get("operator_name") or "?"
    extra = node.get("extra_info") or {}
    what = ""
    for key in ("Table", "Conditions", "Join Type", "Groups", "Aggregates", "Order By", "Function"):
        if key in extra:
            value = extra[key]
            what += f"{key.lower()} {', '.join(value) if isinstance(value, list) else value}; "
    out.append((float(node.get("timing") or node.get("operator_timing") or 0.0),
                int(node.get("intermediate_rows") or node.get("operator_cardinality") or 0), name, what.rstrip("; ")))
    for child in node.get("children", []):
        _operators(child, out)


def profile(dump: Path, found: list[tuple[str, str, Any]], top: int) -> list[dict[str, Any]]:
    """Each statement run again on a fresh connection under DuckDB's JSON profiler."""
    con = _open(dump)
    out: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory(prefix="query-profile-") as tmp:
        path = Path(tmp) / "profile.json"
        con.execute("SET enable_profiling = 'json'")
        con.execute("SET profiling_output = $p", {"p": str(path)})
        for name, text, params in found:
            start = time.perf_counter()
            if text.lstrip().upper().startswith("INSERT"):
                con.execute(text, params).fetchall()
            elif params is not None or text.lstrip().upper().startswith(("SELECT", "WITH", "FROM", "--")):
                # fetched as Arrow batches of 1M rows, each dropped (itl at 1e6: 298M rows)
                for _ in con.sql(text, params=params).to_arrow_reader(1_000_000):
                    pass
            else:
                con.execute(text, params).fetchall()
            wall = time.perf_counter() - start
            ops: list[tuple[float, int, str, str]] = []
            for root in json.loads(path.read_text()).get("operator", []) or []:
                _operators(root, ops)
            ops.sort(reverse=True)
            out.append({"query": name, "statement": " ".join(text.split())[:200], "wall_s": wall,
                        "operators": [{"s": t, "rows": r, "name": n, "what": w} for t, r, n, w in ops[:top]]})
    con.close()
    return out


def _title(text: str) -> str:
    words = text.split()
    if words and words[0].upper() in ("CREATE", "INSERT"):
        table = next((w for w in words[1:6] if w.upper() not in ("OR", "REPLACE", "TEMP", "TEMPORARY", "TABLE",
                                                                  "INTO", "VIEW")), "?")
        return f"keep {table.removeprefix('temp.')}"
    return "the query"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     epilog="example: .venv/bin/python benchmarks/query_profile.py /tmp/tt-bench/n100000")
    parser.add_argument("dump", type=Path, help="a dump folder written by benchmarks/queries.py --keep (DIR/n<N>)")
    parser.add_argument("--queries", nargs="+", default=list(FULL_SET))
    parser.add_argument("--alone", action="store_true", help="each query on its own connection (as the CLI)")
    parser.add_argument("--top", type=int, default=4, help="operators shown per statement (default 4)")
    parser.add_argument("--json", type=Path, metavar="FILE", help="write every statement's profile")
    args = parser.parse_args()
    if not (args.dump / "spans").is_dir():
        raise SystemExit(f"query_profile: {args.dump} has no spans/ folder (benchmarks/queries.py --keep writes one)")
    groups = [[name] for name in args.queries] if args.alone else [list(args.queries)]
    results: list[dict[str, Any]] = []
    for names in groups:
        results += profile(args.dump, statements_of(args.dump, names), args.top)
    total = sum(r["wall_s"] for r in results)
    print(f"{args.dump}:\n{len(results)} statements, {total:.2f} s wall in all (those over 1 % shown)\n")
    for r in results:
        if r["wall_s"] < 0.01 * total:  # (renames, view swaps)
            continue
        print(f"{r['query']}: {_title(r['statement'])}: {r['wall_s']:.2f} s")
        for op in r["operators"]:
            line = f"  {op['s']:7.2f} s {op['rows']:>12,} rows  {op['name']}"
            detail = f" {op['what']}" if op["what"] else ""
            print((line + detail)[:80])
    if args.json:
        args.json.write_text(json.dumps(results, indent=1))
        print(f"\nevery statement: {args.json}")


if __name__ == "__main__":
    main()
