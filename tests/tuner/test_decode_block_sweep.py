"""The fused MoE decode block through the generic tuner: its router logits made from each routing draw,
verified against its float32 reference, and a real inline sweep on xla (which runs it as the unfused MoE
path) that stores a winner a pack carries back. Nothing here names the op but the Problem."""

from __future__ import annotations

import jax
import numpy as np
import pytest

from moetune.kernels import packs
from moetune.kernels.errors import WrongResult
from moetune.kernels.moe.reference import moe_mlp_reference
from moetune.kernels.problem import Problem
from moetune.tuner import verify
from moetune.tuner.driver import SweepDriver
from moetune.tuner.executors import InlineExecutor
from moetune.tuner.input_cache import InputCache, Inputs
from moetune.tuner.plan import PlannedProblem
from moetune.tuner.spec import SweepSpec

BLOCK = Problem("moe_decode_block", 4, 64, 64, 8, "bfloat16", "bfloat16", "bfloat16", top_k=2)
SIZES = (2, 0, 1, 2, 0, 1, 1, 1)  # 8 rows: each of the 4 tokens' 2 choices, at most 4 an expert


def _block(top_k):
    return lambda x, logits, w1, w2: moe_mlp_reference(x, logits, w1, w2, top_k=top_k)


def test_the_router_logits_of_a_draw_take_their_place_among_the_operands():
    cache = InputCache()
    inputs = Inputs.make(BLOCK, seed=0)
    assert [len(s) for s in inputs.sets] == [3] * len(inputs.sets)  # x and the two weights are drawn
    x, logits, w1, w2 = cache.verify_args(inputs, SIZES)
    assert (x.shape, logits.shape, w1.shape, w2.shape) == ((4, 64), (4, 8), (8, 64, 64), (8, 32, 64))
    picked = np.asarray(jax.lax.top_k(logits, 2)[1]).reshape(-1)
    assert np.bincount(picked, minlength=8).tolist() == list(SIZES)
    assert cache.routed(inputs, SIZES) is cache.routed(inputs, SIZES)  # made once per draw
    assert verify.verify(_block(2), inputs, cache, [SIZES]) < 1e-2
    with pytest.raises(WrongResult, match="relative error"):  # one expert a token too few
        verify.verify(_block(1), inputs, cache, [SIZES])


@pytest.mark.parametrize("db_url", ["sqlite"], indirect=True)
def test_an_inline_xla_sweep_tunes_the_block_and_a_pack_carries_its_winner(store, db_url, tmp_path):
    spec = SweepSpec(
        backend="xla",
        finalists=1,
        retime_rounds=1,
        routing="zipf:1.2",
        space={"strategy": ["ragged_dot", "segments"]},
    )
    sweep_id = store.create_sweep(backend="xla", strategy=spec.strategy, spec={}, host="h", user="u")
    planned = [PlannedProblem(BLOCK, "block T=4", tokens=4)]
    outcome = SweepDriver(store, InlineExecutor(), spec, backend="xla", poll_s=0).run(
        planned, sweep_id=sweep_id
    )
    assert outcome.status == "done"
    trials = store.trials(sweep_id=outcome.sweep_id)
    assert {t.status for t in trials} == {"ok"}, {t.error for t in trials}
    assert {t.problem for t in trials} == {BLOCK}
    for trial in trials:  # the routing the logits realized: 8 rows, at most 4 on an expert
        (sizes,) = trial.routing["group_sizes"]
        assert sum(sizes) == 8 and max(sizes) <= 4
    (winner,) = store.winners(backend="xla")
    assert winner.problem == BLOCK and winner.config["strategy"] in ("ragged_dot", "segments")
    pack = store.export_pack(device_kind=InlineExecutor().device.device_kind, backend="xla")
    path = tmp_path / "pack.json"
    path.write_text(pack.dumps())
    (entry,) = packs.load(path).entries
    assert (entry.problem, entry.config) == (BLOCK, winner.config) and pack.schema_version == 3


@pytest.fixture
def interpreted():
    """mosaic_gpu's decode block in Pallas's interpreter with a simulated timer (decode_backend.py)."""
    from moetune.kernels import registry
    from tests.tuner import decode_backend

    registry.register("decode_interpreted", "tests.tuner.decode_backend")
    yield decode_backend
    registry.unregister("decode_interpreted")


TINY = Problem("moe_decode_block", 2, 64, 64, 8, "float32", "float32", "float32", top_k=2)


def _sweep(store, backend, budget):
    name = backend.BACKEND.name
    spec = SweepSpec(backend=name, budget=budget, finalists=1, retime_rounds=1, baseline=False)
    sweep_id = store.create_sweep(backend=name, strategy=spec.strategy, spec={}, host="h", user="u")
    executor = InlineExecutor(device=backend.H200)
    driver = SweepDriver(store, executor, spec, backend=name, poll_s=0)
    return driver.run([PlannedProblem(TINY, "block T=2", tokens=2)], sweep_id=sweep_id)


@pytest.mark.parametrize("db_url", ["sqlite"], indirect=True)
@pytest.mark.parametrize("unfused_wins", [False, True], ids=["fused-wins", "unfused-wins"])
def test_a_sweep_of_the_blocks_space_times_its_baseline_first_and_promotes_the_faster(
    store, db_url, interpreted, monkeypatch, unfused_wins, tmp_path
):
    from moetune.kernels.backends.mosaic_gpu import cost_model_decode, space_decode

    monkeypatch.setattr(interpreted, "UNFUSED_S", 1e-9 if unfused_wins else 1.0)
    outcome = _sweep(store, interpreted, budget=2)
    assert outcome.status == "done"
    trials = sorted(store.trials(sweep_id=outcome.sweep_id), key=lambda t: t.id)
    assert {t.status for t in trials} == {"ok"}, {t.error for t in trials}
    # The unfused path is timed first, whatever the budget; then the heuristic's pick.
    heuristic = space_decode.heuristic(TINY, interpreted.H200)
    assert [t.config for t in trials] == [space_decode.BASELINE.to_dict(), heuristic.to_dict()]
    # Each trial's details say which kernels its time went to (CUPTI's names on a GPU).
    estimate = cost_model_decode.estimate(TINY, heuristic.decode_config(), interpreted.H200)
    assert [t.details["kernels"] for t in trials] == [
        [["unfused", interpreted.UNFUSED_S]],
        [["moetune_decode_up", estimate.up.seconds], ["moetune_decode_down", estimate.down.seconds]],
    ]
    (winner,) = store.winners(backend="decode_interpreted")
    assert winner.config["fused"] is not unfused_wins
    pack = store.export_pack(device_kind="NVIDIA H200", backend="decode_interpreted")
    assert [(e.problem, e.config) for e in pack.entries] == [(TINY, winner.config)]
    assert packs.parse(pack.to_dict(), "pack").entries == pack.entries
    # Dispatch, from the pack alone: moe_mlp takes the block only where its winner is the block.
    from moetune.kernels.lookup import LOOKUP
    from moetune.kernels.moe.layer import decode_choice

    path = tmp_path / "pack.json"
    path.write_text(pack.dumps())
    x, logits, w_gate_up = (jax.ShapeDtypeStruct(s.shape, s.dtype) for s in TINY.spec.shape_dtypes(TINY)[:3])
    with LOOKUP.using_pack_file(path):
        choice = decode_choice(x, logits, w_gate_up, 2, backend="decode_interpreted", device=interpreted.H200)
    assert (choice.config is None) is unfused_wins, choice.reason
    assert choice.reason.startswith("the pack exact winner")


@pytest.mark.parametrize("db_url", ["sqlite"], indirect=True)
def test_a_dry_run_of_a_space_too_large_to_enumerate_counts_its_points_not_its_configs(
    store, db_url, interpreted
):
    from moetune.tuner.dry_run import make_plan

    spec = SweepSpec(backend="decode_interpreted", strategy="tpe", budget=12)
    planned = [PlannedProblem(TINY, "block T=2", tokens=2)]
    (row,) = make_plan(spec, planned, store, "decode_interpreted", interpreted.H200, workers=2).rows
    size = interpreted.InterpretedDecodeBackend().search_space(TINY, interpreted.H200).size
    assert size > 250_000  # the product of the two kernels' domains
    assert (row.valid, row.pruned, row.to_run) == (None, None, 12)
    assert f"{size:,} points, sampled" in row.skipped
