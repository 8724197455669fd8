"""Regenerate tests/golden/<query>.json: every queries/*.sql over tests/trace_fixtures.mixed_world()
with the parameters in PARAMS (default: the header defaults).

Run once, then REVIEW THE DIFF BY HAND: the values must be the worked example's and the planted numbers
(tests/trace_fixtures.py says what each request plants), not whatever the code produced.

    .venv/bin/python tests/golden/generate.py
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))

#: Parameters each golden is computed with (the window's mode is pinned explicitly).
PARAMS: dict[str, dict[str, Any]] = {
    "phases": {"offset_domains": ["skewed-client"], "offset_ms": [35.0]},
    "window": {"mode": "steady_state", "slo_ttft_ms": 191.0, "slo_tpot_ms": 25.0},
}


def golden_rows(name: str) -> dict[str, Any]:
    """The golden document of one query: its parameters, columns and rows (JSON values)."""
    from analyzer.cli._options import to_jsonable
    from analyzer.query.runner import run_query
    from trace_fixtures import mixed_db

    con = mixed_db()
    try:
        result = run_query(con, name, PARAMS.get(name, {}))
    finally:
        con.close()
    return {"query": name, "params": PARAMS.get(name, {}), "columns": result.columns,
            "rows": [to_jsonable(list(r)) for r in result.rows]}


def main() -> None:
    from analyzer.query.runner import list_queries

    for name in list_queries():
        path = HERE / f"{name}.json"
        path.write_text(json.dumps(golden_rows(name), indent=1) + "\n")
        print(f"wrote {path}")


if __name__ == "__main__":
    main()
