"""Checks of published figures against recomputed ones: the broken cases of docs/metrics.md.

Each check returns a :class:`Finding` (check name, verdict, detail, numbers). The timeline
calculator uses the two seed checks; the audit (``tokentrace audit``) runs these and more.
Recomputed figures come from the metric SQL or from :mod:`instrument.kv.formula`; this module only
compares them with claims.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

from instrument.kv.formula import KVLayout, kv_bytes_per_token

__all__ = [
    "Finding",
    "check_e2e_claim",
    "check_kv_claim",
    "close",
]

PASS, FAIL, CANNOT = "pass", "fail", "cannot_check"


@dataclass
class Finding:
    """One check's outcome: ``verdict`` is ``pass``, ``fail`` or ``cannot_check``."""

    check: str
    verdict: str
    detail: str
    numbers: dict[str, Any] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        return {"check": self.check, "verdict": self.verdict, "detail": self.detail, **self.numbers}


def close(a: float, b: float, rel: float = 1e-3, abs_: float = 1e-9) -> bool:
    """True when a and b agree within a relative tolerance (default 0.1 %)."""
    return math.isclose(a, b, rel_tol=rel, abs_tol=abs_)


def check_kv_claim(claimed_bytes_per_token: float, kv: KVLayout, q_heads: int | None = None) -> Finding:
    """Compare a claimed KV bytes/token with the formula over KV heads.

    A claim equal to the same formula over *query* heads is the broken architecture case
    assumption: it overstates the cache by q_heads / kv_heads.
    """
    truth = kv.kv_bytes_per_token
    numbers: dict[str, Any] = {
        "claimed_kv_bytes_per_token": claimed_bytes_per_token,
        "kv_bytes_per_token": truth,
        "kv_heads": kv.kv_heads,
        "ratio_claim_to_truth": claimed_bytes_per_token / truth,
    }
    if close(claimed_bytes_per_token, truth):
        return Finding("kv_bytes_per_token", PASS, f"claim matches 2 x {kv.total_layers} layers x "
                       f"{kv.kv_heads} KV heads x {kv.head_dim} x {kv.bytes_per_element} B", numbers)
    q = q_heads if q_heads is not None else (kv.q_heads if kv.layout != "unknown" else None)
    if q is not None and q != kv.kv_heads:
        with_q = kv_bytes_per_token(kv.total_layers, q, kv.head_dim, kv.bytes_per_element)
        numbers.update({"q_heads": q, "kv_bytes_per_token_with_query_heads": with_q})
        if close(claimed_bytes_per_token, with_q):
            factor = q / kv.kv_heads
            numbers["factor"] = factor
            return Finding(
                "kv_query_heads_for_kv_heads",
                FAIL,
                f"the claim uses query heads ({q}) instead of KV heads ({kv.kv_heads}): it overstates "
                f"the KV cache by q_heads/kv_heads = {q}/{kv.kv_heads} = {factor:g}x "
                f"({claimed_bytes_per_token:g} vs {truth} bytes/token)",
                numbers,
            )
    return Finding(
        "kv_bytes_per_token",
        FAIL,
        f"claimed {claimed_bytes_per_token:g} bytes/token, the formula gives {truth} "
        f"(ratio {claimed_bytes_per_token / truth:.4g})",
        numbers,
    )


def check_e2e_claim(claimed_e2e_ms: float, ttft_ms: float, tpot_ms: float | None, output_tokens: int,
                    recomputed_e2e_ms: float | None = None) -> Finding:
    """Compare a claimed E2E with TTFT + TPOT x (O - 1).

    A claim equal to TTFT + TPOT x O charges O gaps for O tokens: the broken timing case
    denominator (190 + 150 x 25 = 3,940 ms instead of 3,915 ms).
    """
    numbers: dict[str, Any] = {"claimed_e2e_ms": claimed_e2e_ms, "ttft_ms": ttft_ms, "tpot_ms": tpot_ms,
                               "output_tokens": output_tokens}
    if tpot_ms is None or output_tokens < 1:
        return Finding("e2e_gaps", CANNOT, "TPOT is undefined (one output token or fewer)", numbers)
    expected = recomputed_e2e_ms if recomputed_e2e_ms is not None else ttft_ms + tpot_ms * (output_tokens - 1)
    wrong = ttft_ms + tpot_ms * output_tokens
    numbers.update({"e2e_ms": expected, "e2e_ms_with_o_gaps": wrong, "itl_gaps": output_tokens - 1})
    if close(claimed_e2e_ms, expected):
        return Finding("e2e_gaps", PASS, f"E2E = TTFT + TPOT x (O - 1) = {expected:g} ms", numbers)
    if close(claimed_e2e_ms, wrong):
        return Finding(
            "e2e_o_gaps_for_o_tokens",
            FAIL,
            f"the claim charges {output_tokens} gaps for {output_tokens} tokens: TTFT + TPOT x O = "
            f"{wrong:g} ms; token 1 arrives at TTFT and only {output_tokens - 1} gaps follow, so "
            f"E2E = {expected:g} ms",
            numbers,
        )
    return Finding("e2e_gaps", FAIL, f"claimed E2E {claimed_e2e_ms:g} ms, recomputed {expected:g} ms", numbers)
