"""Property tests: random valid traces round-trip exactly through every format that can carry
their fields; random corruption gives an error or a counted reject, never a crash or an
unaccounted line."""

from __future__ import annotations

import json

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from analyzer.db.schema import DEDICATED_COLUMNS, SPAN_KINDS, STATUS_CODES
from analyzer.db.store import connect
from analyzer.errors import LoadError
from analyzer.formats.load import load_paths
from analyzer.formats.otlp_proto import write_length_prefixed
from analyzer.formats.parquet_export import export_parquet
from analyzer.formats.writers import to_jaeger_trace, to_otlp_json, to_otlp_proto

SETTINGS = settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])

text = st.text(st.characters(blacklist_categories=("Cs",), blacklist_characters="\x00"), max_size=8)
nonempty = text.filter(bool)
hex_id = lambda n: st.integers(1, 2 ** (4 * n) - 1).map(lambda i: f"{i:0{n}x}")  # noqa: E731 - a strategy factory, named like the others
finite = st.floats(allow_nan=False, allow_infinity=False, width=64)
plain = st.recursive(st.none() | st.booleans() | st.integers(-(2**63), 2**63 - 1) | finite | text,
                     lambda c: st.lists(c, max_size=3), max_leaves=5)  # fmt: skip


@st.composite
def attr_maps(draw, prefix: str, scalar_only: bool = False) -> dict:
    keys = draw(st.lists(nonempty, unique=True, max_size=5))
    kinds = ["str", "int", "double", "bool"] + ([] if scalar_only else ["json"])
    maps: dict = {f"{prefix}_{k}": {} for k in ("str", "int", "double", "bool", "json")}
    for key in keys:
        kind = draw(st.sampled_from(kinds))
        value = {"str": text, "int": st.integers(-(2**63), 2**63 - 1), "double": finite, "bool": st.booleans(),
                 "json": plain.filter(lambda v: isinstance(v, list) or v is None).map(lambda v: json.dumps(v, separators=(",", ":")))}[kind]  # fmt: skip
        maps[f"{prefix}_{kind}"][key] = draw(value)
    return maps


@st.composite
def spans(draw, jaeger: bool = False) -> list[dict]:
    """Canonical span dicts (with events/links) of one trace; jaeger=True keeps what Jaeger JSON carries."""
    trace = draw(hex_id(32 if not jaeger else 16)).rjust(32, "0")
    ids = draw(st.lists(hex_id(16), min_size=1, max_size=4, unique=True))
    service = draw(nonempty)
    out = []
    for i, sid in enumerate(ids):
        us = 1000 if jaeger else 1
        start = draw(st.integers(1000, 2**61)) // us * us
        end = start + draw(st.integers(0, 10**12)) // us * us
        res = draw(attr_maps("resource", scalar_only=jaeger).filter(lambda m: "service.name" not in m["resource_str"]))
        res["resource_str"] = {"service.name": service, **res["resource_str"]}
        s = {"trace_id": trace, "span_id": sid, "parent_span_id": ids[0] if i else None,
             "trace_state": None if jaeger else draw(st.none() | nonempty), "flags": draw(st.none() | st.integers(1, 2**32 - 1)),
             "name": draw(text), "kind": draw(st.sampled_from(SPAN_KINDS)), "start_ns": start, "end_ns": end,
             "status_code": draw(st.sampled_from(STATUS_CODES)), "status_message": draw(st.none() | nonempty),
             "service_name": service, "service_instance_id": None, "host_name": None, "clock_domain": f"{service}||",
             "scope_name": draw(st.none() | nonempty), "scope_version": draw(st.none() | nonempty),
             **draw(attr_maps("attr", scalar_only=jaeger).filter(
                 lambda m: not any(k.startswith(("otel.", "span.kind", "error", "w3c.")) for mm in m.values() for k in mm))),
             **res,
             "scope_attributes_json": None if jaeger else draw(st.none() | st.dictionaries(
                 nonempty, st.booleans() | text, min_size=1, max_size=2).map(lambda d: json.dumps(d, separators=(",", ":")))),
             "dropped_attributes_count": 0 if jaeger else draw(st.integers(0, 5)), "dropped_events_count": 0 if jaeger else draw(st.integers(0, 5)),
             "dropped_links_count": 0 if jaeger else draw(st.integers(0, 5))}  # fmt: skip
        if jaeger and s["status_code"] == "UNSET":
            s["status_message"] = None
        s["events"] = [{"trace_id": trace, "span_id": sid, "event_index": j, "time_ns": draw(st.integers(1000, 2**61)) // us * us,
                        "name": draw(text.filter(lambda t: not jaeger or t != "")) if not jaeger else draw(nonempty),
                        **draw(attr_maps("attr", scalar_only=jaeger).filter(lambda m: not jaeger or all("event" not in mm for mm in m.values()))),
                        "dropped_attributes_count": 0 if jaeger else draw(st.integers(0, 3))}
                       for j in range(draw(st.integers(0, 2)))]  # fmt: skip
        links = []
        for j in range(draw(st.integers(0, 2))):
            if jaeger:
                link_attrs = {"attr_str": {"opentracing.ref_type": "follows_from"}, "attr_int": {}, "attr_double": {}, "attr_bool": {}, "attr_json": {}}
            else:
                link_attrs = draw(attr_maps("attr"))
            links.append({"trace_id": trace, "span_id": sid, "link_index": j, "linked_trace_id": draw(hex_id(32)),
                          "linked_span_id": draw(hex_id(16)), "trace_state": None if jaeger else draw(st.none() | nonempty),
                          "flags": None if jaeger else draw(st.none() | st.integers(1, 255)), **link_attrs,
                          "dropped_attributes_count": 0 if jaeger else draw(st.integers(0, 3))})  # fmt: skip
        s["links"] = links
        out.append(s)
    return out


def _without_dedicated(table: str, row: dict) -> dict:
    """The row without its dedicated columns, once each is checked to equal its map's value."""
    for c in DEDICATED_COLUMNS[table]:
        assert row.pop(c.name) == row[c.map_column].get(c.key), (table, c.name)
    return row


def _db_spans(con) -> list[dict]:
    cur = con.execute("SELECT * EXCLUDE (load_id) FROM spans ORDER BY span_id")
    cols = [d[0] for d in cur.description]
    result = [_without_dedicated("spans", dict(zip(cols, r))) for r in cur.fetchall()]
    for table, key, order in (("span_events", "events", "event_index"), ("span_links", "links", "link_index")):
        cur = con.execute(f"SELECT * FROM {table} ORDER BY span_id, {order}")
        cc = [d[0] for d in cur.description]
        rows = [_without_dedicated(table, dict(zip(cc, r))) for r in cur.fetchall()]
        for s in result:
            s[key] = [r for r in rows if r["span_id"] == s["span_id"]]
    return result


def _expected(generated: list[dict]) -> list[dict]:
    return sorted(generated, key=lambda s: s["span_id"])


@SETTINGS
@given(spans())
def test_round_trip_otlp_json_protobuf_and_parquet(tmp_path_factory, generated):
    d = tmp_path_factory.mktemp("rt")
    (d / "t.jsonl").write_text(json.dumps(to_otlp_json(generated)) + "\n")
    (d / "t.json").write_text(json.dumps(to_otlp_json(generated), indent=2))
    (d / "t.pb").write_bytes(write_length_prefixed([to_otlp_proto(generated)]))
    for name in ("t.jsonl", "t.json", "t.pb"):
        con = connect()
        f = load_paths(con, [str(d / name)]).files[0]
        assert f.spans_loaded == len(generated)
        assert _db_spans(con) == _expected(generated), name
    export_parquet(con, d / "pq")
    con2 = connect()
    load_paths(con2, [str(d / "pq")])
    assert _db_spans(con2) == _expected(generated)


@SETTINGS
@given(spans(jaeger=True))
def test_round_trip_jaeger_json(tmp_path_factory, generated):
    d = tmp_path_factory.mktemp("jg")
    (d / "t.json").write_text(json.dumps(to_jaeger_trace(generated)))
    con = connect()
    assert load_paths(con, [str(d / "t.json")]).files[0].spans_loaded == len(generated)
    assert _db_spans(con) == _expected(generated)


#: Up to four byte edits (position, operation, bytes) for :func:`corrupt`.
EDITS = st.lists(st.tuples(st.integers(0, 10**6), st.sampled_from(["delete", "flip", "insert"]), st.binary(min_size=1, max_size=3)),
                 min_size=1, max_size=4)  # fmt: skip


def corrupt(data: bytes, edits: list[tuple[int, str, bytes]]) -> bytes:
    """``data`` with each edit applied in turn (positions wrap around the current length)."""
    out = bytearray(data)
    for pos, op, blob in edits:
        i = pos % len(out)
        if op == "delete":
            del out[i]
        elif op == "flip":
            out[i] = blob[0]
        else:
            out[i:i] = blob
    return bytes(out)


@SETTINGS
@given(spans(), EDITS)
def test_corruption_is_an_error_or_a_counted_reject(tmp_path_factory, generated, edits):
    lines = [json.dumps(to_otlp_json([s])) for s in generated]
    p = tmp_path_factory.mktemp("bad") / "t.jsonl"
    data = corrupt("\n".join(lines).encode() + b"\n", edits)
    p.write_bytes(data)
    con = connect()
    try:
        report = load_paths(con, [str(p)], lenient=True)
    except LoadError:
        return  # a file-level error (e.g. no longer recognisable as OTLP): one readable line
    f = report.files[0]
    assert f.spans_read == f.spans_loaded + f.duplicates_identical + f.rejected - _record_level(con)
    if f.format == "otlp_json_lines":  # every non-blank line is one record
        assert f.records_read == sum(1 for ln in bytes(data).split(b"\n") if ln.strip())
    else:  # read as one document: it is the one record, kept whole if rejected
        assert f.records_read == 1
        if f.rejected_by_reason == {"invalid_json": 1}:
            assert con.execute("SELECT raw FROM rejects").fetchone()[0] == bytes(data).decode("utf-8", "replace")
    assert con.execute("SELECT count(*) FROM rejects").fetchone()[0] == f.rejected
    assert con.execute("SELECT count(*) FROM spans").fetchone()[0] == f.spans_loaded


def _record_level(con) -> int:
    """Rejects that are whole records (no span was counted for them): they carry no span id,
    whatever the reason (a broken line, or a resource whose attributes cannot be read)."""
    return con.execute("SELECT count(*) FROM rejects WHERE span_id IS NULL AND trace_id IS NULL").fetchone()[0]
