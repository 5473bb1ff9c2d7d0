"""The weight gradient (grouped_matmul_drhs, one output slice per expert) is tuned as any op is: drawn,
verified against its own reference, swept on the xla backend, its winner stored under its own key and
looked up by the backward of a jax.grad."""

from __future__ import annotations

import json
import logging

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from typer.testing import CliRunner

from moetune.cli import _load_commands, app
from moetune.db import open_store
from moetune.kernels import grouped_matmul
from moetune.kernels.errors import WrongResult
from moetune.kernels.lookup import LOOKUP
from moetune.kernels.problem import Problem
from moetune.kernels.reference import reference_of
from moetune.tuner import input_cache, verify
from moetune.tuner.input_cache import InputCache, Inputs

_load_commands()
SIZES = (9, 0, 20, 3)  # an empty expert and rows past the groups (m=40)


def drhs(transpose_rhs: bool = False, dtype: str = "float32") -> Problem:
    return Problem(
        "grouped_matmul_drhs", m=40, k=16, n=24, g=4, lhs_dtype=dtype, rhs_dtype=dtype, out_dtype=dtype,
        transpose_rhs=transpose_rhs,
    )  # fmt: skip


def test_inputs_are_lhs_and_dout_drawn_by_the_spec_and_share_no_weights():
    cache = InputCache()
    inputs = cache.inputs(drhs(), 0)
    lhs, dout = inputs.sets[0]
    assert lhs.shape == (40, 16) and dout.shape == (40, 24) and np.count_nonzero(np.asarray(dout)) > 900
    args = cache.verify_args(inputs, SIZES)
    assert [a.shape for a in args] == [(40, 16), (40, 24), (4,)]
    # A grouped GEMM of the same (g, k, n) has weights; the weight gradient must not take them for dout.
    cache.inputs(Problem("grouped_matmul", m=40, k=16, n=24, g=4, lhs_dtype="f32", rhs_dtype="f32"), 0)
    assert cache.inputs(drhs(), 0).sets[0][1].shape == (40, 24)


@pytest.mark.parametrize("transpose_rhs", [False, True], ids=["kn", "nk"])
def test_the_reference_is_the_ops_and_wrong_weight_gradients_fail(transpose_rhs):
    problem = drhs(transpose_rhs)
    cache = InputCache()
    inputs = cache.inputs(problem, 0)
    args = cache.verify_args(inputs, SIZES)
    want = reference_of(problem)(*args)
    ref = cache.reference(inputs, SIZES)
    assert np.allclose(np.asarray(ref.values), np.asarray(want)) and not np.asarray(want)[1].any()
    assert verify.check_output(want, ref, SIZES, problem) == 0.0
    with pytest.raises(WrongResult, match="experts with no rows are not zero"):
        verify.check_output(want.at[1, 2, 3].set(1e-3), ref, SIZES, problem)
    with pytest.raises(WrongResult, match="NaN"):
        verify.check_output(want.at[2, 0, 0].set(jnp.nan), ref, SIZES, problem)
    with pytest.raises(WrongResult, match="worst row"):
        verify.check_output(want.at[0].multiply(1.01), ref, SIZES, problem)

    # A kernel that lets rows past sum(group_sizes) contribute fails, though every shape is right.
    def counts_the_tail(lhs, dout, sizes):
        return reference_of(problem)(lhs, dout, sizes.at[-1].add(8))

    with pytest.raises(WrongResult):
        verify.verify(counts_the_tail, inputs, cache, [SIZES])
    assert verify.verify(reference_of(problem), inputs, cache, [SIZES]) == 0.0


def test_a_large_weight_gradient_is_checked_on_a_sample_of_k_indices(monkeypatch):
    monkeypatch.setattr(input_cache, "REFERENCE_MAX_BYTES", 4 * 24 * 4 * 5)  # 5 of 16 K indices
    problem = drhs(transpose_rhs=True)
    cache = InputCache()
    inputs = Inputs.make(problem, seed=0)
    ref = cache.reference(inputs, SIZES)
    ks = np.asarray(ref.rows)
    assert len(ks) == 5 and ref.values.shape == (4, 24, 5)
    full = reference_of(problem)(*cache.verify_args(inputs, SIZES))
    assert np.allclose(np.asarray(ref.values), np.asarray(full)[:, :, ks])
    # The sampled reference is its own program (lhs's sampled columns, then the contraction): XLA may
    # block that dot differently from the full one, so the two agree to float32 rounding, not bit for bit.
    assert verify.verify(reference_of(problem), inputs, cache, [SIZES]) <= 1e-6
    with pytest.raises(WrongResult, match="worst row"):  # one wrong value at a sampled K index
        verify.check_output(full.at[0, 3, ks[2]].add(1.0), ref, SIZES, problem)


def test_a_drhs_sweep_stores_its_winner_and_the_backward_of_jax_grad_looks_it_up(sqlite_url, caplog):
    text = "op=grouped_matmul_drhs,m=40,k=16,n=24,g=4,dtype=f32"
    args = ["tune", "--problem", text, "--backend", "xla", "--budget", "3", "--inline", "--json"]
    result = CliRunner().invoke(app, [*args, "--db", sqlite_url])
    assert result.exit_code == 0, result.output
    outcome = json.loads(result.output[result.output.index("{") :])
    key = drhs().key
    with open_store(sqlite_url) as store:
        trials = [t for t in store.trials(sweep_id=outcome["sweep_id"]) if t.backend == "xla"]
        assert trials and all(t.status == "ok" and t.problem.key == key for t in trials)
        [winner] = store.winners(backend="xla", problem_key=key)
    assert winner.problem.op == "grouped_matmul_drhs"

    lhs = jax.random.normal(jax.random.key(1), (40, 16), jnp.float32)
    rhs = jax.random.normal(jax.random.key(2), (4, 16, 24), jnp.float32)
    sizes = jnp.asarray(SIZES, jnp.int32)
    with LOOKUP.using_db(sqlite_url), caplog.at_level(logging.DEBUG, logger="moetune.kernels.api"):
        jax.grad(lambda b: grouped_matmul(lhs, b, sizes).sum())(rhs)
    used = {r.args[0]: r.args[2:] for r in caplog.records if r.name == "moetune.kernels.api"}
    config, source = used[key]
    assert source == "db exact" and config.to_dict() == winner.config
