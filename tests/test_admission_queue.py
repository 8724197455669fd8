"""The admission controller's two KV modes and its queue depth (instrument/gateway/admission.py)."""

from __future__ import annotations

import pytest

from instrument.gateway.admission import AdmissionBudgets, AdmissionController, AdmissionRefused


def test_paged_engines_queue_on_kv_and_only_refuse_what_could_never_fit() -> None:
    """kv_reserve=False (the continuous engine): requests over the KV left are admitted (they
    wait in the engine's queue); one over the whole cache is refused as permanent (400)."""
    block = 16 * 256
    adm = AdmissionController(AdmissionBudgets(max_queued_requests=4, kv_budget_bytes=6 * block),
                              kv_bytes_for=lambda i, m: -(-(i + m) // 16) * block, kv_reserve=False)
    tickets = [adm.admit(10, 38) for _ in range(4)]  # 3 blocks each, 12 > 6 blocks: all admitted
    assert adm.kv_bytes_in_flight == 0 and all(t.kv_bytes == 0 for t in tickets)
    with pytest.raises(AdmissionRefused) as full:
        adm.admit(10, 38)
    assert full.value.budget == "requests" and not full.value.permanent  # the queue bound: 429
    with pytest.raises(AdmissionRefused) as never:
        adm.admit(10, 90)  # 7 blocks > the 6-block cache
    assert never.value.budget == "kv" and never.value.permanent
    for t in tickets:
        adm.release(t)
    assert adm.requests_in_flight == 0


def test_queue_depth_is_requests_waiting_and_in_flight_is_its_own_figure() -> None:
    waiting = [0]
    adm = AdmissionController(AdmissionBudgets(max_queued_requests=10), kv_bytes_per_token=256,
                              waiting=lambda: waiting[0])
    first = adm.admit(5, 5)
    assert (first.queue_depth, first.requests_in_flight, first.tokens_ahead) == (0, 0, 0)
    second = adm.admit(5, 5)  # the first runs: nothing waits
    assert (second.queue_depth, second.requests_in_flight, second.tokens_ahead) == (0, 1, 10)
    waiting[0] = 1  # the second waits for KV
    third = adm.admit(5, 5)
    assert (third.queue_depth, third.requests_in_flight) == (1, 2)
    # without an engine count, depth falls back to the requests in flight (contract v1's figure)
    plain = AdmissionController(AdmissionBudgets())
    plain.admit(1, 1)
    assert plain.admit(1, 1).queue_depth == 1
