"""steps / stalls over a committed real capture (tests/fixtures/continuous_engine: `tokentrace
serve --engine continuous`, tiny model, five streams, a 1,117-token prompt arriving while
three others decode; README.md there says how it was made and what it holds).

Exact values read off the capture (engine_step spans 5..24; step 9 prefilled the 1,117-token
prompt and an 18-token one beside two decodes), the whole of every query against the
independent reading of the OTLP/JSON lines in tests/step_reference.py, and the CLI verbs.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner

import step_reference as ref
from analyzer.cli import cli
from analyzer.db.store import connect
from analyzer.formats.canonical import SPAN_COLUMNS
from analyzer.formats.load import load_paths
from analyzer.query.runner import run_query

FIXTURE = Path(__file__).resolve().parent / "fixtures" / "continuous_engine"
FILES = [FIXTURE / "server.otlp.jsonl", FIXTURE / "client.otlp.jsonl"]
LONG_REQUEST = "d7a1e5cc3bbe54a4"  # 1,117 prompt tokens, 6 generated
SHORT_REQUEST = "317fdb03744cdced"  # 24 prompt tokens, 16 generated


@pytest.fixture(scope="module")
def db(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("fixture") / "traces.duckdb"
    con = connect(path)
    report = load_paths(con, [str(f) for f in FILES])
    assert report.total("spans_loaded") == 101 and report.total("rejected") == 0
    con.close()
    return path


@pytest.fixture(scope="module")
def con(db: Path) -> Any:
    from analyzer.db.source import open_source

    connection = open_source(db=db)
    yield connection
    connection.close()


def _rows(con: Any, name: str, **params: Any) -> list[dict[str, Any]]:
    return run_query(con, name, params).dicts()


def test_exact_steps_of_the_capture(con: Any) -> None:
    steps = _rows(con, "steps")
    assert [r["step"] for r in steps] == list(range(5, 25))
    by_step = {r["step"]: r for r in steps}
    assert (by_step[9]["batch_size"], by_step[9]["scheduled_tokens"], by_step[9]["prefill_tokens"]) == (4, 1137, 1135)
    assert by_step[9]["step_ms"] == 417.360897 and by_step[9]["prefill_tokens_bucket"] == ">1024"
    assert (by_step[10]["prefill_tokens"], by_step[10]["step_ms"]) == (557, 229.531602)
    assert {r["kv_blocks_total"] for r in steps} == {2048} and {r["kv_block_tokens"] for r in steps} == {16}
    summary = {(r["grouping"], r["group_label"]): r for r in _rows(con, "steps_summary")}
    assert summary[("all", "all")]["steps"] == 20
    assert summary[("scheduled_tokens", ">1024")]["steps"] == 1
    assert summary[("batch_size", "3")]["null_reason"] == "fit needs steps with at least two distinct scheduled_tokens values"
    # a line that explains 7.7 % of step time is not a finding: no slope, the reason
    weak = summary[("scheduled_tokens", "1-16")]
    assert weak["steps"] == 16 and weak["fit_r2"] == pytest.approx(0.0770788209, abs=1e-9)
    assert weak["ms_per_scheduled_token"] is None and weak["fixed_ms"] is None
    assert weak["null_reason"] == "fit does not hold: r2 0.077 below 0.5 (min_fit_r2) over 16 steps"
    two = summary[("scheduled_tokens", "17-128")]  # two points always fit (r2 = 1): too few steps to say so
    assert two["fit_r2"] == pytest.approx(1.0) and two["ms_per_scheduled_token"] is None
    assert two["null_reason"] == "fit does not hold: 2 steps, fewer than 5 (min_fit_steps)"
    strong = summary[("all", "all")]
    assert strong["ms_per_scheduled_token"] == pytest.approx(0.345385952677, rel=1e-9) and strong["null_reason"] is None
    looser = {(r["grouping"], r["group_label"]): r for r in _rows(con, "steps_summary", min_fit_steps=2, min_fit_r2=0.0)}
    assert looser[("scheduled_tokens", "1-16")]["ms_per_scheduled_token"] == pytest.approx(1.21886640625, rel=1e-9)


def test_exact_stalls_of_the_capture(con: Any) -> None:
    gaps = _rows(con, "stalls")
    assert len(gaps) == 3 * 15 + 2 * 5 and all(g["null_reason"] is None for g in gaps)
    groups = {(r["grouping"], r["group_label"]): r for r in _rows(con, "stalls_groups")}
    prefill = {label: groups[("prefill_tokens", label)] for label in ("0", "1-128", "129-1024", ">1024")}
    assert [prefill[k]["gaps"] for k in prefill] == [48, 1, 4, 2]
    assert prefill[">1024"]["itl_max_ms"] == 417.722926 and prefill["129-1024"]["itl_max_ms"] == 229.839349
    assert prefill["1-128"]["itl_mean_ms"] == 74.946545
    (slowest,) = _rows(con, "stalls_slowest", per_request=1, trace_id=_trace_of(con, SHORT_REQUEST))
    assert (slowest["token_index"], slowest["itl_ms"], slowest["step"]) == (5, 417.722926, 9)
    assert (slowest["shared_sequences"], slowest["shared_prefill_sequences"], slowest["shared_prefill_tokens"]) == (3, 2, 1135)
    assert (slowest["largest_shared_prefill_request_span_id"], slowest["largest_shared_prefill_tokens"]) == (LONG_REQUEST, 1117)
    assert slowest["untraced_sequences"] == 0


def _trace_of(con: Any, request_span_id: str) -> str:
    return con.execute("SELECT trace_id FROM spans WHERE span_id = $s", {"s": request_span_id}).fetchone()[0]


def _same(got: dict[str, Any], want: dict[str, Any]) -> None:
    for key, value in want.items():
        if key in got:
            assert got[key] == (pytest.approx(value, rel=1e-9, abs=1e-9) if isinstance(value, float) else value), key


def test_every_query_equals_the_independent_reading(con: Any) -> None:
    spans = ref.from_otlp_json_lines(*FILES)
    want_steps = ref.steps(spans)
    got_steps = _rows(con, "steps")
    assert len(got_steps) == len(want_steps)
    for g, w in zip(got_steps, want_steps):
        _same(g, w)
    summary = {(r["grouping"], r["group_label"]): r for r in _rows(con, "steps_summary")}
    for key, w in ref.step_summary(want_steps).items():
        _same(summary[key], w)
    want_gaps = ref.gaps(spans)
    got_gaps = _rows(con, "stalls")
    assert len(got_gaps) == len(want_gaps)
    for g, w in zip(got_gaps, want_gaps):
        _same(g, w)
    groups = {(r["grouping"], r["group_label"]): r for r in _rows(con, "stalls_groups")}
    for key, w in ref.stall_groups(want_gaps).items():
        _same(groups[key], w)
    slow = _rows(con, "stalls_slowest")
    want_slow = ref.slowest(spans, want_gaps, 3)
    assert len(slow) == len(want_slow)
    for g, w in zip(slow, want_slow):
        _same(g, w)


def test_cli_steps_and_stalls(db: Path, runner: CliRunner) -> None:
    out = runner.invoke(cli, ["steps", "--db", str(db), "--format", "json"], catch_exceptions=False)
    assert out.exit_code == 0, out.output
    doc = json.loads(out.output)
    assert set(doc) == {"steps", "summary", "notes"} and len(doc["steps"]) == 20
    out = runner.invoke(cli, ["stalls", "--db", str(db), "--section", "slowest", "--per-request", "1",
                              "--format", "json"], catch_exceptions=False)
    assert out.exit_code == 0, out.output
    doc = json.loads(out.output)
    assert set(doc) == {"slowest", "notes"} and len(doc["slowest"]) == 5
    out = runner.invoke(cli, ["stalls", "--db", str(db)], catch_exceptions=False)
    assert out.exit_code == 0
    # the table leads with the answer (slowest, groups, then every gap), long sections cut
    lines = out.stdout.splitlines()
    assert [line for line in lines if line.endswith("row(s)")] == [
        "slowest: 15 row(s)", "groups: 9 row(s)", "gaps: 55 row(s)"]
    assert "20 of 55 gaps shown, largest itl_ms first, 35 left out: --limit N shows more," in lines
    out = runner.invoke(cli, ["stalls", "--db", str(db), "--section", "gaps", "--all"], catch_exceptions=False)
    assert "gaps: 55 row(s)" in out.stdout and "left out" not in out.stdout
    slowest = json.loads(runner.invoke(cli, ["stalls", "--db", str(db), "--section", "slowest", "--format",
                                             "json"]).stdout)["slowest"]
    out = runner.invoke(cli, ["stalls", "--db", str(db), "--section", "slowest", "--limit", "4"],
                        catch_exceptions=False)
    shown = [float(line.split()[3]) for line in out.stdout.splitlines()[4:8]]
    assert shown == [round(x, 1) for x in sorted((r["itl_ms"] for r in slowest), reverse=True)[:4]], out.stdout
    assert "4 of 15 gaps shown, largest itl_ms first, 11 left out" in out.stdout
    out = runner.invoke(cli, ["steps", "--db", str(db), "--section", "summary", "--format", "csv"],
                        catch_exceptions=False)
    lines = out.stdout.splitlines()  # notes go to stderr; csv is the one table, no "# summary" line
    assert lines[0].startswith("grouping,group_label") and len(lines) == 1 + 10


@pytest.mark.parametrize(("args", "message"), [
    (["stalls", "--trace-id", "xyz"], "--trace-id 'xyz': expected 32 hexadecimal digits"),
    (["steps", "--engine", "spark", "--parquet", "dump"], "this verb runs on DuckDB only"),
    (["steps", "--section", "rows"], "Invalid value for '--section'"),
    (["stalls", "--per-request", "0"], "Invalid value for '--per-request'"),
    (["stalls", "--limit", "5", "--format", "csv"], "--limit and --all shape the table; --format csv always writes"),
    (["itl", "--all", "--format", "json"], "--limit and --all shape the table; --format json always writes"),
    (["itl", "--all", "--limit", "3"], "--limit and --all: give one of them"),
])
def test_cli_errors_are_one_line(db: Path, runner: CliRunner, args: list[str], message: str) -> None:
    out = runner.invoke(cli, [*args, *(["--db", str(db)] if "--parquet" not in args else [])])
    assert out.exit_code != 0 and message in out.output and "Traceback" not in out.output


def test_cli_missing_database(tmp_path: Path, runner: CliRunner) -> None:
    out = runner.invoke(cli, ["steps", "--db", str(tmp_path / "none.duckdb")])
    assert out.exit_code == 1 and "no such database" in out.output


def _loaded() -> Any:
    con = connect()
    load_paths(con, [str(f) for f in FILES])
    return con


def test_an_ambiguous_step_id_is_null_with_its_reason_never_joined_twice() -> None:
    """Two engine_step spans with one (clock domain, step), as two engines sharing a
    service.instance.id would write: the gaps of that step keep one row each."""
    con = _loaded()
    before = run_query(con, "stalls").dicts()
    stored = [*SPAN_COLUMNS, "load_id"]  # not the dedicated columns: generated from the maps
    values = ["'ffffffffffffffff'" if c == "span_id" else c for c in stored]
    con.execute(f"INSERT INTO spans ({', '.join(stored)}) SELECT {', '.join(values)} FROM spans "
                "WHERE name = 'engine_step' AND attr_int['tokentrace.engine.step'] = 9")
    after = run_query(con, "stalls").dicts()
    assert len(after) == len(before)
    hit = [g for g in after if g["step"] == 9]
    assert hit and all(g["batch_size"] is None and g["null_reason"].startswith("step id ambiguous") for g in hit)
    assert all(g["null_reason"] is None for g in after if g["step"] != 9)
    assert len(run_query(con, "steps").rows) == 21  # one row per engine_step span


def test_a_missing_decode_span_makes_the_next_gap_unknown() -> None:
    """decode_spans every:N, or a lost span: the gap after the missing token is NULL with a
    reason, the gap before it (ending at the missing emission) is gone with its span."""
    con = _loaded()
    con.execute("DELETE FROM spans WHERE name = 'decode' AND parent_span_id = $r AND attr_int['tokentrace.step'] = 3",
                {"r": SHORT_REQUEST})
    gaps = {g["token_index"]: g for g in run_query(con, "stalls").dicts() if g["request_span_id"] == SHORT_REQUEST}
    assert 4 not in gaps and len(gaps) == 14
    assert gaps[5]["itl_ms"] is None and gaps[5]["step"] == 9 and gaps[5]["batch_size"] == 4
    assert gaps[5]["null_reason"].startswith("gap unknown: the previous token's decode span is missing")
    assert gaps[6]["itl_ms"] is not None and gaps[6]["null_reason"] is None


@pytest.mark.parametrize("says_step", [True, False])
def test_a_recompute_prefill_emits_the_token_of_the_step_it_stands_for(says_step: bool) -> None:
    """After a preemption the recompute prefill emits token k + 1 and decode step k has no
    span (docs/spans.md): with ``tokentrace.step`` = k on it (written by the current plugin) the gaps on
    both sides of that token are measured; a file written before says why they are not."""
    con = _loaded()
    step_attr = "map_concat(attr_int, MAP {'tokentrace.step': 3::BIGINT})" if says_step else \
        "map_from_entries(list_filter(map_entries(attr_int), lambda e: e.key <> 'tokentrace.step'))"
    con.execute(f"""UPDATE spans SET name = 'prefill', attr_int = {step_attr},
                        attr_bool = map_concat(attr_bool, MAP {{'tokentrace.prefill.recompute': true}})
                    WHERE name = 'decode' AND parent_span_id = $r AND attr_int['tokentrace.step'] = 3""",
                {"r": SHORT_REQUEST})
    gaps = {g["token_index"]: g for g in run_query(con, "stalls").dicts() if g["request_span_id"] == SHORT_REQUEST}
    untouched = {g["token_index"]: g for g in run_query(_loaded(), "stalls").dicts()
                 if g["request_span_id"] == SHORT_REQUEST}
    if says_step:
        assert gaps.keys() == untouched.keys() and len(gaps) == 15
        for k in (4, 5):  # the recompute's own token and the one after it
            assert gaps[k]["itl_ms"] == untouched[k]["itl_ms"] and gaps[k]["null_reason"] is None
    else:
        assert 4 not in gaps and gaps[5]["itl_ms"] is None
        assert gaps[5]["null_reason"].startswith("gap unknown: a recompute prefill after a preemption emitted")


def test_cli_itl_table_leads_with_the_largest_gaps(db: Path, runner: CliRunner) -> None:
    gaps = json.loads(runner.invoke(cli, ["itl", "--db", str(db), "--format", "json"]).stdout)
    rows = gaps["rows"] if isinstance(gaps, dict) else gaps
    itl = sorted((r["itl_ms"] for r in rows if r["itl_ms"] is not None), reverse=True)
    assert len(rows) > 20
    out = runner.invoke(cli, ["itl", "--db", str(db)], catch_exceptions=False)
    assert out.exit_code == 0, out.output
    lines = out.stdout.splitlines()
    table = [line for line in lines if line.startswith("chatcmpl-")]  # the gap rows, by the request's response id
    # the 20 largest of every perspective's gaps, shown under their perspective's title
    assert sorted((float(line.split()[-2]) for line in table), reverse=True) == [round(x, 1) for x in itl[:20]]
    assert f"20 of {len(rows)} gaps shown, largest itl_ms first, {len(rows) - 20} left out: --limit N shows" in \
        " ".join(lines)
    everything = runner.invoke(cli, ["itl", "--db", str(db), "--all"], catch_exceptions=False).stdout
    assert "left out" not in everything
