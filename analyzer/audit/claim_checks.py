"""Checks of a claims file (or tokentrace artifact): per-request identities, token rates, KV,
the system window, and labelling. Every implied figure comes from ``queries/audit/*.sql``
(request_identities, window_identities) or :mod:`instrument.kv.formula`; this module compares."""

from __future__ import annotations

import math
from typing import Any

import duckdb

from analyzer.audit.claims import check_e2e_claim, check_kv_claim
from analyzer.audit.claims_file import Claims
from analyzer.audit.compare import CANNOT, FAIL, PASS, Finding, agree, audit_query, compare_figure
from instrument.kv.formula import PHYSICAL_MEMORY_OMISSIONS, kv_bytes_per_token

__all__ = ["check_claims", "SEED_SYNTHETIC_FIGURES"]

RATE_FIGURES = ("decode_output_tokens_per_second", "whole_request_output_tokens_per_second",
                "request_throughput_rps", "observed_goodput_rps")

# The synthetic worked example of docs/metrics.md (and its exercise): figures that are teaching values,
# not measurements of any provider.
SEED_SYNTHETIC_FIGURES: dict[str, tuple[float, ...]] = {
    "input_tokens": (1025, 4096), "output_tokens": (150, 256), "ttft_ms": (190, 420), "tpot_ms": (25, 18),
    "e2e_ms": (3915, 5010), "decode_output_tokens_per_second": (40, 55.56),
    "whole_request_output_tokens_per_second": (38.31, 51.1), "kv_bytes_per_token": (327680, 49152),
    "window_s": (10,), "attempted": (100,), "succeeded": (98,), "slo_passing": (95,),
    "request_throughput_rps": (9.8,), "observed_goodput_rps": (9.5,), "error_rate": (0.02,),
}


def check_claims(claims: Claims, con: duckdb.DuckDBPyConnection, rel_tol: float) -> list[Finding]:
    """All claims-file checks whose inputs the file gives (partial inputs: ``cannot_check``)."""
    findings: list[Finding] = []
    findings += _request_checks(claims, con, rel_tol)
    findings += _kv_checks(claims)
    findings += _window_checks(claims, con, rel_tol)
    findings += _rate_statistic_checks(claims, con, rel_tol)
    findings.append(_labelling(claims, rel_tol))
    return findings


def _request_checks(claims: Claims, con: duckdb.DuckDBPyConnection, rel_tol: float) -> list[Finding]:
    names = ("ttft_ms", "tpot_ms", "e2e_ms", "output_tokens")
    given = [n for n in names if n in claims.figures]
    rate_names = [n for n in ("decode_output_tokens_per_second", "whole_request_output_tokens_per_second")
                  if n in claims.figures]
    if not given and not rate_names:
        return []
    per_request = {n: claims.value(n) for n in names}
    stats = {n: claims.figures[n].stat for n in given}
    ident = audit_query(con, "request_identities", {
        "ttft_ms": per_request["ttft_ms"], "tpot_ms": per_request["tpot_ms"], "e2e_ms": per_request["e2e_ms"],
        "output_tokens": int(per_request["output_tokens"]) if per_request["output_tokens"] is not None else None,
    })[0]
    out: list[Finding] = []
    if len(given) >= 2:
        out.append(_e2e_relation(claims, per_request, stats, ident, rel_tol))
    for name in rate_names:
        out.append(_rate_check(claims, name, ident, rel_tol))
    return out


def _written(claims: Claims, name: str) -> float:
    """Half a unit of the last digit the claim is written to (0: exact)."""
    claim = claims.figures.get(name)
    return claim.half_unit if claim is not None else 0.0


def _as_written(value: float, half: float) -> str:
    """A figure with the decimals it was written to (``25.0`` when written so)."""
    decimals = round(-math.log10(2 * half)) if 0 < half < 0.5 else 0
    return f"{value:.{decimals}f}" if decimals > 0 else f"{value:g}"


def _span(value: float, half: float) -> str:
    """How a written figure reads: ``26 (25.5 to 26.5)``; exact figures alone."""
    if not half:
        return f"{value:g}"
    return f"{_as_written(value, half)} ({value - half:.6g} to {value + half:.6g})"


_TPOT_DEFINITIONS = {"tpot_includes_first_token": "E2E / O", "tpot_divides_decode_time_by_o": "(E2E - TTFT) / O"}


def _e2e_relation(claims: Claims, v: dict[str, Any], stats: dict[str, str], ident: dict[str, Any],
                  rel_tol: float) -> Finding:
    """E2E = TTFT + TPOT x (O - 1), each figure judged within the precision it is written to.

    Held exactly: pass. E2E = TTFT + TPOT x O exactly: O gaps for O tokens (the worked example's broken case). Else
    TPOT (the figure derived from the others) is matched to a definition within its written
    precision (an integer TPOT: +/- 0.5) plus what the others' precision allows: the right one
    passes (the figures are consistent as written), a wrong one names TPOT and the definition
    it follows; none: the relation fails, naming both readings (TPOT from E2E, or E2E from
    TPOT)."""
    missing = [n for n in v if n not in claims.figures]
    numbers: dict[str, Any] = {k: claims.figures[k].value for k in claims.figures if k in v}
    if missing:
        return Finding("e2e_gaps", CANNOT, f"E2E = TTFT + TPOT x (O - 1) needs {', '.join(missing)} as well", numbers)
    not_request = {k: s for k, s in stats.items() if s != "request"}
    if not_request:
        return Finding("e2e_gaps", CANNOT, "E2E = TTFT + TPOT x (O - 1) holds per request; "
                       f"{', '.join(f'{k} is a {s}' for k, s in not_request.items())}, and a statistic of a sum "
                       "is not the sum of the statistics", numbers)
    o = int(v["output_tokens"])
    finding = check_e2e_claim(v["e2e_ms"], v["ttft_ms"], v["tpot_ms"], o, recomputed_e2e_ms=ident["e2e_ms"])
    h_ttft, h_tpot, h_e2e = (_written(claims, n) for n in ("ttft_ms", "tpot_ms", "e2e_ms"))
    # TPOT's precision, plus what E2E's and TTFT's allow (/ (O - 1): the largest of the divisors)
    half = h_tpot + (h_ttft + h_e2e) / max(o - 1, 1)
    precision = {"written_half_unit": {"ttft_ms": h_ttft, "tpot_ms": h_tpot, "e2e_ms": h_e2e},
                 "tpot_half_unit_with_others": half}
    tpot, right = v["tpot_ms"], ident["tpot_ms"]
    if finding.check == "e2e_o_gaps_for_o_tokens" and half and agree(tpot, right, rel_tol, half):
        # an exact match to TTFT + TPOT x O is kept as the diagnosis; a rounded TPOT would also fit: said
        finding.numbers.update({**precision, "also_fits_rounded_tpot": True, "tpot_ms_recomputed": right})
        finding.detail += (f" (TPOT as written, {_span(tpot, h_tpot)} ms, would also allow (E2E - TTFT) / (O - 1) "
                           f"= {right:.6g} ms: if TPOT was rounded, E2E may be right; E2E equal to TTFT + TPOT x O "
                           "exactly says it was computed with O gaps)")
    if finding.check != "e2e_gaps" or finding.verdict != FAIL:
        return finding
    wrong = {"tpot_includes_first_token": ident["tpot_ms_including_first_token"],
             "tpot_divides_decode_time_by_o": ident["tpot_ms_divided_by_o"]}
    explain = {
        "tpot_includes_first_token": "it is E2E / O, a per-token latency that includes TTFT (LLMPerf's and "
                                     "guidellm's definition), not TPOT = (E2E - TTFT) / (O - 1)",
        "tpot_divides_decode_time_by_o": "it divides decode time by O tokens, crediting the first token "
                                         "(which arrives at TTFT) to decode time",
    }
    if half and agree(tpot, right, rel_tol, half):
        also = [n for n, value in wrong.items() if agree(tpot, value, rel_tol, half)]
        detail = (f"E2E = TTFT + TPOT x (O - 1) holds within the precision the figures are written to: TPOT "
                  f"{_span(tpot, h_tpot)} ms, and (E2E - TTFT) / (O - 1) = ({v['e2e_ms']:g} - {v['ttft_ms']:g}) / "
                  f"{o - 1} = {right:.6g} ms")
        if also:
            detail += ("; " + " and ".join(f"{_TPOT_DEFINITIONS[n]} = {wrong[n]:.6g} ms" for n in also)
                       + " is also within it: the figures as written cannot tell these definitions apart")
        return Finding("e2e_gaps", PASS, detail, {**finding.numbers, **precision, "tpot_ms_recomputed": right,
                                                  "also_within_precision": also})
    # E2E does not follow from TTFT and TPOT: which TPOT definition did the claim use?
    diagnosed = compare_figure("tpot_definition", tpot, right, rel_tol, what="TPOT", unit="ms",
                               wrong=wrong, explain=explain, half_unit=half or None)
    if diagnosed.verdict == FAIL and "diagnosis" in diagnosed.numbers:
        diagnosed.numbers.update({**finding.numbers, **precision})
        diagnosed.detail += (f" (TPOT {_span(tpot, h_tpot)} ms; E2E {v['e2e_ms']:g}, TTFT {v['ttft_ms']:g} and "
                             f"O {o} fit each other: (E2E - TTFT) / (O - 1) = {right:.6g} ms)")
        return diagnosed
    expected = ident["e2e_ms"]
    finding.numbers.update({**precision, "tpot_ms_recomputed": right})
    finding.detail = (f"E2E = TTFT + TPOT x (O - 1) does not hold, even within the precision the figures are "
                      f"written to: TTFT {_span(v['ttft_ms'], h_ttft)} + TPOT {_span(tpot, h_tpot)} x {o - 1} = "
                      f"{expected:.6g} ms, E2E is {_span(v['e2e_ms'], h_e2e)} ms. Either TPOT does not fit: from E2E, "
                      f"TTFT and O it is (E2E - TTFT) / (O - 1) = {right:.6g} ms, and no known definition of TPOT "
                      f"gives {_as_written(tpot, h_tpot)}; or E2E, TTFT or O does not (with this TPOT E2E would be "
                      f"{expected:.6g} ms)")
    return finding


def _rate_check(claims: Claims, name: str, ident: dict[str, Any], rel_tol: float) -> Finding:
    claim = claims.figures[name]
    if claim.stat != "request":
        return Finding(name, CANNOT, f"{name} is a {claim.stat} over requests: it cannot be derived from one "
                       "request's TTFT/E2E/O", {"claimed": claim.value})
    decode = ident["decode_output_tokens_per_second"]
    if decode is None and claims.value("e2e_ms") is None:
        decode = ident["decode_output_tokens_per_second_from_tpot"]
    whole = ident["whole_request_output_tokens_per_second"]
    if name == "decode_output_tokens_per_second":
        return compare_figure(name, claim.value, decode, rel_tol, what="decode-only rate (O - 1) / (E2E - TTFT)",
                              half_unit=claim.half_unit,
                              unit="tokens/s",
                              wrong={"decode_whole_rates_swapped": whole,
                                     "decode_rate_counts_first_token": ident["decode_rate_counting_first_token"]},
                              explain={"decode_whole_rates_swapped": "it is the whole-request rate O / E2E "
                                       "(decode-only and whole-request rates swapped)",
                                       "decode_rate_counts_first_token": "it is O / (E2E - TTFT): all O tokens "
                                       "over decode time, crediting prefill's first token to decode"},
                              missing="needs ttft_ms, e2e_ms and output_tokens (or tpot_ms)")
    return compare_figure(name, claim.value, whole, rel_tol, what="whole-request rate O / E2E", unit="tokens/s",
                          half_unit=claim.half_unit,
                          wrong={"decode_whole_rates_swapped": decode},
                          explain={"decode_whole_rates_swapped": "it is the decode-only rate (O - 1) / (E2E - "
                                   "TTFT) (decode-only and whole-request rates swapped)"},
                          missing="needs e2e_ms and output_tokens")


def _kv_checks(claims: Claims) -> list[Finding]:
    claim = claims.figures.get("kv_bytes_per_token")
    if claim is None:
        return []
    if claims.model is None:
        return [Finding("kv_bytes_per_token", CANNOT, "no model given: add 'model' (layers, kv_heads, head_dim, "
                        "kv_dtype or config) to the claims file, or pass --model-config", {"claimed": claim.value})]
    kv = claims.model
    finding = check_kv_claim(claim.value, kv, claims.model_q_heads)
    finding.numbers["heads_used"] = f"kv_heads={kv.kv_heads}" + (
        f", q_heads={claims.model_q_heads}" if claims.model_q_heads else "")
    if finding.check == "kv_bytes_per_token" and finding.verdict == FAIL:
        for other in (1, 2, 4):
            if other == kv.bytes_per_element:
                continue
            with_other = kv_bytes_per_token(kv.total_layers, kv.kv_heads, kv.head_dim, other)
            if agree(claim.value, with_other, 1e-9):
                finding = Finding("kv_dtype_bytes", FAIL, f"the claim uses {other} byte(s) per element; the KV dtype "
                                  f"{kv.dtype} has {kv.bytes_per_element}: off by {other / kv.bytes_per_element:g}x "
                                  f"({claim.value:g} vs {kv.kv_bytes_per_token} bytes/token)",
                                  {**finding.numbers, "claimed_bytes_per_element": other,
                                   "bytes_per_element": kv.bytes_per_element,
                                   "factor": other / kv.bytes_per_element})
    physical = Finding("kv_physical_memory", CANNOT, "the formula gives the logical unsharded K/V payload; physical "
                       "memory also needs: " + "; ".join(PHYSICAL_MEMORY_OMISSIONS),
                       {"kv_bytes_per_token": kv.kv_bytes_per_token, "limitations": kv.limitations})
    return [finding, physical]


def _window_checks(claims: Claims, con: duckdb.DuckDBPyConnection, rel_tol: float) -> list[Finding]:
    names = ("window_s", "attempted", "succeeded", "slo_passing", "request_throughput_rps",
             "observed_goodput_rps", "error_rate")
    if not any(n in claims.figures for n in names):
        return []
    v = {n: claims.value(n, None) for n in names}
    ident = audit_query(con, "window_identities", {
        "window_s": v["window_s"], "attempted": _int(v["attempted"]), "succeeded": _int(v["succeeded"]),
        "slo_passing": _int(v["slo_passing"]),
    })[0]
    out: list[Finding] = []
    if v["request_throughput_rps"] is not None:
        out.append(compare_figure("request_throughput_rps", v["request_throughput_rps"], ident["request_throughput_rps"],
                                  rel_tol, what="succeeded / window_s", unit="requests/s",
                                  wrong={"throughput_counts_attempted": ident["request_throughput_rps_counting_attempted"]},
                                  explain={"throughput_counts_attempted": "it is attempted / window_s: failed "
                                           "requests counted as throughput"},
                                  missing="needs window_s and succeeded",
                                  half_unit=_written(claims, "request_throughput_rps")))
    if v["observed_goodput_rps"] is not None:
        out.append(compare_figure("observed_goodput_rps", v["observed_goodput_rps"], ident["observed_goodput_rps"],
                                  rel_tol, what="slo_passing / window_s", unit="requests/s",
                                  missing="needs window_s and slo_passing",
                                  half_unit=_written(claims, "observed_goodput_rps")))
    if v["error_rate"] is not None:
        out.append(compare_figure("error_rate", v["error_rate"], ident["error_rate"], rel_tol,
                                  what="(attempted - succeeded) / attempted", unit="fraction",
                                  wrong={"error_rate_percent_as_fraction": ident["error_rate_as_percent"],
                                         "error_rate_over_succeeded": ident["error_rate_over_succeeded"]},
                                  explain={"error_rate_percent_as_fraction": "it is a percentage where a fraction "
                                           "belongs (2 for 0.02)",
                                           "error_rate_over_succeeded": "it divides failures by succeeded requests"},
                                  missing="needs attempted and succeeded",
                                  half_unit=_written(claims, "error_rate")))
    good, thr = v["observed_goodput_rps"], v["request_throughput_rps"]
    if good is not None and thr is not None:
        ok = good <= thr * (1 + rel_tol)
        out.append(Finding("goodput_le_throughput", PASS if ok else FAIL,
                           f"goodput {good:g} {'<=' if ok else '>'} throughput {thr:g} requests/s"
                           + ("" if ok else ": SLO-passing requests are a subset of succeeded ones"),
                           {"observed_goodput_rps": good, "request_throughput_rps": thr}))
    counts = [v["slo_passing"], v["succeeded"], v["attempted"]]
    if sum(c is not None for c in counts) >= 2:
        present = [c for c in counts if c is not None]
        ok = all(a <= b for a, b in zip(present, present[1:]))
        out.append(Finding("request_counts_order", PASS if ok else FAIL,
                           "need slo_passing <= succeeded <= attempted: "
                           + " <= ".join(f"{c:g}" if c is not None else "?" for c in counts),
                           {"slo_passing": v["slo_passing"], "succeeded": v["succeeded"], "attempted": v["attempted"]}))
    return out


def _rate_statistic_checks(claims: Claims, con: duckdb.DuckDBPyConnection, rel_tol: float) -> list[Finding]:
    out: list[Finding] = []
    for name in RATE_FIGURES:
        claim = claims.figures.get(name)
        if claim is None or claim.stat not in ("p90", "p99"):
            continue
        out.append(Finding("rate_percentile_direction", FAIL,
                           f"{name} is given as its {claim.stat}: for a rate, high percentiles are the FAST tail "
                           f"({100 - int(claim.stat[1:])} % of requests were faster), not a floor that most requests "
                           f"reach; a floor is a low percentile (p1, p10) or the minimum",
                           {"figure": name, "stat": claim.stat, "claimed": claim.value}))
    rate, itl = claims.figures.get("decode_output_tokens_per_second"), None
    for name in ("itl_ms", "tpot_ms"):
        if claims.figures.get(name) is not None and claims.figures[name].stat == "mean":
            itl = claims.figures[name]
            break
    # 1000 / mean gap: request_identities.sql's rate from a per-token gap (NULL unless the gap > 0)
    inverse = (audit_query(con, "request_identities", {"tpot_ms": itl.value})[0]
               ["decode_output_tokens_per_second_from_tpot"] if itl is not None else None)
    if rate is not None and rate.stat == "mean" and itl is not None and inverse is not None:
        numbers = {"mean_rate": rate.value, f"mean_{itl.name}": itl.value, "inverse_mean_per_second": inverse}
        if agree(rate.value, inverse, rel_tol):
            out.append(Finding("mean_rate_vs_inverse_mean_itl", FAIL,
                               f"mean decode rate {rate.value:g} tokens/s is exactly 1000 / mean {itl.name} "
                               f"({inverse:.6g}): a mean of per-request rates is not 1 / mean gap unless every "
                               "request has the same rate; it was derived, not averaged", numbers))
        elif rate.value < inverse:
            out.append(Finding("mean_rate_vs_inverse_mean_itl", FAIL,
                               f"mean decode rate {rate.value:g} < 1000 / mean {itl.name} = {inverse:.6g}: "
                               "impossible for a mean of per-request rates (Jensen: mean(1/x) >= 1/mean(x))", numbers))
        else:
            out.append(Finding("mean_rate_vs_inverse_mean_itl", PASS,
                               f"mean decode rate {rate.value:g} >= 1000 / mean {itl.name} = {inverse:.6g}, as a "
                               "mean of per-request rates must be (they differ by definition)", numbers))
    return out


def _labelling(claims: Claims, rel_tol: float) -> Finding:
    matches = sorted(name for name, claim in claims.figures.items()
                     if any(agree(claim.value, seed, rel_tol) for seed in SEED_SYNTHETIC_FIGURES.get(name, ())))
    synthetic = len(matches) >= 3 or claims.self_labelled_synthetic
    numbers: dict[str, Any] = {"measured": claims.measured, "seed_synthetic_matches": matches,
                               "self_labelled_synthetic": claims.self_labelled_synthetic}
    why = ("the artifact labels itself synthetic" if claims.self_labelled_synthetic
           else f"{len(matches)} figures equal the synthetic worked example of docs/metrics.md ({', '.join(matches)})")
    if synthetic and claims.measured:
        return Finding("synthetic_presented_as_measured", FAIL,
                       f"measured: true, but {why}: synthetic figures presented as measurements", numbers)
    if synthetic and claims.measured is None and not claims.self_labelled_synthetic:
        return Finding("synthetic_presented_as_measured", FAIL,
                       f"{why}, and the file does not say measured: false", numbers)
    if synthetic:
        return Finding("labelling", PASS, f"{why}, and it is labelled synthetic", numbers)
    if claims.measured is None:
        return Finding("labelling", CANNOT, "the file does not say whether its figures are measured "
                       "(add measured: true | false)", numbers)
    return Finding("labelling", PASS, f"measured: {str(claims.measured).lower()}; no figure set matches the "
                   "synthetic worked example of docs/metrics.md", numbers)


def _int(value: float | None) -> int | None:
    return None if value is None else int(value)
