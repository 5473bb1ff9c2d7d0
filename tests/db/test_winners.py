"""Winners keep their history (promotion supersedes, rollback restores) and misses are counted."""

from __future__ import annotations

import pytest
from db_factories import GATE_UP, H200, H200_NEW_DRIVER, MI300, trial

from moetune.db.errors import InvalidRecord, RecordNotFound


def _promote(store, block_m, *, device=H200, problem=GATE_UP, reason=""):
    trial_id = store.record_trial(trial(config={"block_m": block_m}, device=device, problem=problem))
    return store.promote(trial_id, reason=reason)


def _current(store, device=H200, problem=GATE_UP):
    return store.current_winner(fingerprint_hash=device.hash, backend="fake", problem_key=problem.key)


def test_promotion_supersedes_and_keeps_history(store):
    assert _current(store) is None
    first = _promote(store, 64, reason="sweep 1")
    winner = _current(store)
    assert (winner.id, winner.config, winner.active, winner.reason, winner.state) == (
        first,
        {"block_m": 64},
        True,
        "sweep 1",
        "active",
    )
    assert winner.device == H200 and winner.problem == GATE_UP and winner.source_hash == "src1"
    second = _promote(store, 128)
    assert _current(store).id == second and _current(store).config == {"block_m": 128}
    history = store.winners(device_kind="NVIDIA H200", active_only=False)
    assert [(w.id, w.state) for w in history] == [(second, "active"), (first, "superseded")]
    assert history[1].retired_at is not None
    assert [w.id for w in store.winners()] == [second]


def test_promoting_the_active_trial_again_changes_nothing(store):
    trial_id = store.record_trial(trial())
    assert store.promote(trial_id) == store.promote(trial_id)
    assert len(store.winners(active_only=False)) == 1


def test_only_ok_trials_can_win(store):
    crashed = store.record_trial(trial(status="crashed", median_s=None))
    with pytest.raises(InvalidRecord, match="status=crashed"):
        store.promote(crashed)
    with pytest.raises(RecordNotFound):
        store.promote(crashed + 100)
    assert store.winners(active_only=False) == []


def test_rollback_restores_the_previous_winner_step_by_step(store):
    one, two, three = (_promote(store, b) for b in (16, 32, 48))
    restored = store.rollback(backend="fake", problem_key=GATE_UP.key, fingerprint_hash=H200.hash)
    assert restored.id == two and restored.active and _current(store).id == two
    restored = store.rollback(backend="fake", problem_key=GATE_UP.key, device_kind="NVIDIA H200")
    assert restored.id == one
    with pytest.raises(InvalidRecord, match="nothing to roll back to"):
        store.rollback(backend="fake", problem_key=GATE_UP.key, device_kind="NVIDIA H200")
    states = {w.id: w.state for w in store.winners(active_only=False)}
    assert states == {one: "active", two: "rolled_back", three: "rolled_back"}
    # A new promotion after rollbacks supersedes the restored one, and rolling it back restores it again:
    # rolled-back winners never come back.
    four = _promote(store, 64)
    assert store.rollback(backend="fake", problem_key=GATE_UP.key, device_kind="NVIDIA H200").id == one
    assert {w.id: w.state for w in store.winners(active_only=False)}[four] == "rolled_back"


def test_rollback_needs_an_unambiguous_device(store):
    _promote(store, 16)
    _promote(store, 32)
    _promote(store, 16, device=H200_NEW_DRIVER)
    with pytest.raises(InvalidRecord, match="2 device fingerprints") as info:
        store.rollback(backend="fake", problem_key=GATE_UP.key, device_kind="NVIDIA H200")
    assert H200.hash in str(info.value) and H200_NEW_DRIVER.hash in str(info.value)
    assert store.rollback(backend="fake", problem_key=GATE_UP.key, fingerprint_hash=H200.hash).config == {
        "block_m": 16
    }
    with pytest.raises(InvalidRecord, match="no active winner"):
        store.rollback(backend="fake", problem_key=GATE_UP.key, device_kind="AMD Instinct MI300X")
    with pytest.raises(RecordNotFound, match="no problem"):
        store.rollback(backend="fake", problem_key="grouped_matmul/m=1/v1", device_kind="NVIDIA H200")
    with pytest.raises(InvalidRecord, match="exactly one"):
        store.rollback(backend="fake", problem_key=GATE_UP.key)


def test_winner_queries_by_problem_fields(store):
    _promote(store, 16)
    _promote(store, 32, problem=GATE_UP.with_m(128))
    _promote(store, 64, device=MI300)
    assert len(store.winners()) == 3
    assert [w.problem.m for w in store.winners(device_kind="NVIDIA H200")] == [128, 4096]
    assert [w.config for w in store.winners(m=128)] == [{"block_m": 32}]
    assert len(store.winners(k=4096, n=28672, g=8)) == 3
    assert store.winners(g=64) == []
    assert len(store.winners(shape_key=GATE_UP.shape_key, device_kind="NVIDIA H200")) == 2
    assert [w.device_kind for w in store.winners(fingerprint_hash=MI300.hash)] == ["AMD Instinct MI300X"]


def test_misses_are_counted_per_key(store):
    for _ in range(3):
        store.record_miss(device=H200, backend="fake", problem=GATE_UP)
    store.record_miss(device=H200, backend="fake", problem=GATE_UP.with_m(1))
    store.record_miss(device=MI300, backend="other", problem=GATE_UP)
    misses = store.misses()
    assert [(m.device_kind, m.backend, m.problem.m, m.count) for m in misses] == [
        ("NVIDIA H200", "fake", 4096, 3),
        ("NVIDIA H200", "fake", 1, 1),
        ("AMD Instinct MI300X", "other", 4096, 1),
    ]
    assert misses[0].last_seen >= misses[0].first_seen and misses[0].fingerprint_hash == H200.hash
    assert [m.count for m in store.misses(device_kind="NVIDIA H200", backend="fake")] == [3, 1]
    assert store.misses(backend="nope") == []


def test_a_winner_keeps_its_decision_as_data_and_refuses_what_is_not_json(store):
    decision = {"rule": "first_winner", "rounds": 5, "finalists": [{"trial_id": 1, "retimed_median_s": 9e-4}]}
    trial_id = store.record_trial(trial(sweep_id=None))
    store.promote(trial_id, reason="sweep 1: first winner", decision=decision)
    winner = _current(store)
    assert winner.decision == decision and winner.reason == "sweep 1: first winner"
    assert [w.decision for w in store.winners()] == [decision]
    other = store.record_trial(trial(config={"block_m": 128}))
    with pytest.raises(InvalidRecord, match="decision is not plain JSON"):
        store.promote(other, decision={"median_s": float("nan")})
    assert _current(store).trial_id == trial_id  # nothing was written
    store.promote(other)  # a winner promoted without a decision (an import, say) has none
    assert _current(store).decision is None


def test_a_winner_names_the_sweep_of_its_trial(store):
    sweep_id = store.create_sweep(backend="fake", strategy="grid", spec={}, host="h", user="u")
    store.promote(store.record_trial(trial(sweep_id=sweep_id)))
    assert _current(store).sweep_id == sweep_id
