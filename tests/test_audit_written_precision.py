"""The audit reads figures as written.

A claims file's figure is judged within the precision it is written to: ``tpot_ms: 26`` stands
for 25.5 ... 26.5, ``26.1`` for 26.05 ... 26.15, ``26.0`` for 25.95 ... 26.05 (counts and
kv_bytes_per_token are exact). A finding names the figure that does not fit. With --db, a
model constant (kv_bytes_per_token) needs no statistic. Run as a user runs it: the CLI on the
worked example (O = 150, TTFT 190 ms, E2E 3,915 ms, TPOT 25 ms; E2E / O = 26.1 ms).
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml
from click.testing import CliRunner

from analyzer.audit.compare import written_half_unit
from analyzer.cli import cli
from analyzer.db.store import connect
from analyzer.formats.load import load_paths
from data_paths import CAPTURES

SEED_REQUEST = "measured: false\ninput_tokens: 1025\noutput_tokens: 150\nttft_ms: 190\ne2e_ms: 3915\n"


def _audit(tmp_path: Path, text: str, *args: str, name: str = "claims.yaml") -> tuple[int, str, dict]:
    path = tmp_path / name
    path.write_text(text)
    table = CliRunner().invoke(cli, ["audit", str(path), *args])
    js = CliRunner().invoke(cli, ["audit", str(path), *args, "--format", "json"])
    assert table.exit_code == js.exit_code and "Traceback" not in table.output
    return table.exit_code, table.output, {f["check"]: f for f in json.loads(js.output)}


def _block(output: str, check: str) -> tuple[str, str]:
    """(verdict, detail) of one finding in the table output."""
    lines = output.splitlines()
    at = next(i for i, line in enumerate(lines) if line[14:] == check)
    body = []
    for line in lines[at + 1:]:
        if not line.startswith("    "):
            break
        body.append(line.strip())
    return lines[at][:13].strip(), " ".join(body)


@pytest.mark.parametrize("raw, half", [(148, 0.5), (147.8, 0.05), (148.0, 0.05), ("3,915", 0.5), ("38.31", 0.005),
                                       (0.02, 0.005), ("1.5e3", 50.0), (True, 0.0)])
def test_written_half_unit(raw, half) -> None:
    assert written_half_unit(raw) == pytest.approx(half)


@pytest.mark.parametrize("tpot", ["26", "26.1"])
def test_tpot_e2e_over_o_is_named_as_written_integer_or_not(tmp_path, tpot) -> None:
    # E2E / O = 3915 / 150 = 26.1: written as 26 (an integer) or 26.1, the same diagnosis,
    # pinned on TPOT; E2E, TTFT and O fit each other
    code, output, js = _audit(tmp_path, SEED_REQUEST + f"tpot_ms: {tpot}\n")
    assert code == 1
    assert [c for c, f in js.items() if f["verdict"] == "fail"] == ["tpot_definition"]
    f = js["tpot_definition"]
    assert f["diagnosis"] == "tpot_includes_first_token" and f["diagnosis_value"] == pytest.approx(26.1)
    assert f["claimed"] == float(tpot) and f["recomputed"] == pytest.approx(25)
    assert "e2e_gaps" not in js
    verdict, detail = _block(output, "tpot_definition")
    assert verdict == "FAIL"
    assert detail.startswith(f"TPOT: {tpot} ms is not the recomputed 25: it is E2E / O")
    span = "25.5 to 26.5" if tpot == "26" else "26.05 to 26.15"
    assert f"(TPOT {tpot} ({span}) ms; E2E 3915, TTFT 190 and O 150 fit each other" in detail


def test_an_integer_tpot_fits_within_half_a_unit_a_decimal_one_does_not(tmp_path) -> None:
    # E2E 3950: (3950 - 190) / 149 = 25.2349 ms. Written 25 it stands for 24.5 ... 25.5: consistent
    text = "measured: false\noutput_tokens: 150\nttft_ms: 190\ne2e_ms: 3950\n"
    code, output, js = _audit(tmp_path, text + "tpot_ms: 25\n")
    assert code == 0
    assert js["e2e_gaps"]["verdict"] == "pass" and js["e2e_gaps"]["tpot_ms_recomputed"] == pytest.approx(3760 / 149)
    assert js["e2e_gaps"]["written_half_unit"] == {"ttft_ms": 0.5, "tpot_ms": 0.5, "e2e_ms": 0.5}
    verdict, detail = _block(output, "e2e_gaps")
    assert detail.startswith("E2E = TTFT + TPOT x (O - 1) holds within the precision the figures are written to: "
                             "TPOT 25 (24.5 to 25.5) ms, and (E2E - TTFT) / (O - 1) = (3950 - 190) / 149 = 25.2349 ms")
    # (E2E - TTFT) / O = 25.0667 is inside 24.5 ... 25.5 too: said, not hidden
    assert "(E2E - TTFT) / O = 25.0667 ms is also within it" in detail
    # written 25.0 it stands for 24.95 ... 25.05: no definition gives it; both readings named
    code, output, js = _audit(tmp_path, text + "tpot_ms: 25.0\n")
    assert code == 1 and js["e2e_gaps"]["verdict"] == "fail" and "diagnosis" not in js["e2e_gaps"]
    verdict, detail = _block(output, "e2e_gaps")
    assert verdict == "FAIL"
    assert "TTFT 190 (189.5 to 190.5) + TPOT 25.0 (24.95 to 25.05) x 149 = 3915 ms, E2E is 3950" in detail
    assert "Either TPOT does not fit: from E2E, TTFT and O it is (E2E - TTFT) / (O - 1) = 25.2349 ms" in detail
    assert "or E2E, TTFT or O does not (with this TPOT E2E would be 3915 ms)" in detail


def test_json_claims_read_the_same_way(tmp_path) -> None:
    # JSON keeps 26 (an int) and 26.0 (a float) apart: 26.0 stands for 25.95 ... 26.05, not 26.1
    base = {"measured": False, "output_tokens": 150, "ttft_ms": 190, "e2e_ms": 3915}
    _, _, js = _audit(tmp_path, json.dumps({**base, "tpot_ms": 26}), name="claims.json")
    assert js["tpot_definition"]["diagnosis"] == "tpot_includes_first_token"
    code, _, js = _audit(tmp_path, json.dumps({**base, "tpot_ms": 26.0}), name="claims.json")
    assert code == 1 and "tpot_definition" not in js and js["e2e_gaps"]["verdict"] == "fail"
    # a string figure keeps its written decimals
    _, _, js = _audit(tmp_path, yaml.safe_dump({**base, "tpot_ms": "26"}))
    assert js["tpot_definition"]["diagnosis"] == "tpot_includes_first_token"


def test_seed_example_still_flags_its_two_broken_cases(tmp_path) -> None:
    # the worked example's "150 gaps" (190 + 150 x 25 = 3,940) is matched exactly before any rounding slack
    code, output, js = _audit(tmp_path, SEED_REQUEST.replace("3915", "3940") + "tpot_ms: 25\n")
    assert code == 1 and js["e2e_o_gaps_for_o_tokens"]["verdict"] == "fail"
    # ... and what a rounded TPOT would allow is said beside it (3750 / 149 = 25.1678 is in 24.5 ... 25.5)
    assert js["e2e_o_gaps_for_o_tokens"]["also_fits_rounded_tpot"] is True
    assert "(TPOT as written, 25 (24.5 to 25.5) ms, would also allow (E2E - TTFT) / (O - 1) = 25.1678 ms" in \
        _block(output, "e2e_o_gaps_for_o_tokens")[1]
    # written 25.0 (24.95 ... 25.05) it would not: no such clause
    _, _, js = _audit(tmp_path, SEED_REQUEST.replace("3915", "3940") + "tpot_ms: 25.0\n")
    assert "also_fits_rounded_tpot" not in js["e2e_o_gaps_for_o_tokens"]
    code, _, js = _audit(tmp_path, SEED_REQUEST + "tpot_ms: 25\n")
    assert code == 0 and js["e2e_gaps"]["verdict"] == "pass" and js["e2e_gaps"]["e2e_ms"] == 3915


def _db(tmp_path: Path) -> Path:
    path = tmp_path / "traces.duckdb"
    con = connect(path)
    load_paths(con, [str(CAPTURES / "aiperf-0.13.0-tokentrace" / "traces.jsonl")])
    con.close()
    return path


def test_db_compares_a_model_constant_without_a_statistic(tmp_path) -> None:
    # 12 traced requests of tokentrace's tiny model: 256 KV bytes per token on each
    db = str(_db(tmp_path))
    code, output, js = _audit(tmp_path, "measured: true\nkv_bytes_per_token: 256\n", "--db", db)
    f = js["traces:kv_bytes_per_token"]
    assert f["verdict"] == "pass" and f["recomputed"] == 256 and f["claimed"] == 256
    verdict, detail = _block(output, "traces:kv_bytes_per_token")
    assert "stat" not in detail and "the same on all 12 traced request rows that give it" in detail
    # a figure-wide stat does not change a constant; a wrong one fails, exactly (no rounding slack)
    code, output, js = _audit(tmp_path, "measured: true\nstat: mean\nkv_bytes_per_token: 257\n", "--db", db)
    assert code == 1 and js["traces:kv_bytes_per_token"]["verdict"] == "fail"
    assert js["traces:kv_bytes_per_token"]["tolerance"] < 0.5
    # per-request figures over many requests still ask which statistic they are
    _, _, js = _audit(tmp_path, "measured: true\nttft_ms: 1200\n", "--db", db)
    assert js["traces:ttft_ms"]["verdict"] == "cannot_check" and "add stat" in js["traces:ttft_ms"]["detail"]
