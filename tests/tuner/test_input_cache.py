"""The per-worker cache of operands, references and timing rotations: made once, shared, bounded."""

from __future__ import annotations

import sys
import types

import jax.numpy as jnp
import numpy as np
import pytest

from moetune.kernels.problem import Problem
from moetune.kernels.timing import Rotation, WallTimer
from moetune.tuner import input_cache
from moetune.tuner.input_cache import InputCache, Inputs


def problem(m: int, k: int = 64, n: int = 48) -> Problem:
    return Problem("grouped_matmul", m=m, k=k, n=n, g=4, lhs_dtype="bf16", rhs_dtype="bf16", out_dtype="bf16")


SIZES = (10, 0, 12, 6)


def test_inputs_rotate_and_are_never_zero():
    inputs = Inputs.make(problem(32), seed=0)
    assert len(inputs.sets) >= 2
    (lhs0, rhs0), (lhs1, rhs1) = inputs.sets[:2]
    assert lhs0.shape == (32, 64) and rhs0.shape == (4, 64, 48) and lhs0.dtype == jnp.bfloat16
    assert not np.array_equal(np.asarray(lhs0), np.asarray(lhs1))
    assert not np.array_equal(np.asarray(rhs0), np.asarray(rhs1))
    assert np.count_nonzero(np.asarray(lhs0, np.float32)) > 0.99 * lhs0.size


def test_problems_that_differ_only_in_m_share_their_weights():
    cache = InputCache()
    small, large = cache.inputs(problem(8), 0), cache.inputs(problem(256), 0)
    assert all(a[1] is b[1] for a, b in zip(small.sets, large.sets, strict=True))
    assert cache.made["weights"] == 1 and cache.made["inputs"] == 2
    # Shared or made afresh, the operands are the same numbers: results never depend on the cache.
    fresh = Inputs.make(problem(256), 0)
    for (lhs, rhs), (lhs2, rhs2) in zip(large.sets, fresh.sets, strict=True):
        assert np.array_equal(np.asarray(lhs), np.asarray(lhs2))
        assert np.array_equal(np.asarray(rhs), np.asarray(rhs2))
    other_seed = cache.inputs(problem(8), 1)
    assert other_seed.sets[0][1] is not small.sets[0][1] and cache.made["weights"] == 2
    # Weights held by two problems count once.
    assert cache.nbytes < sum(a.nbytes for p in (small, large, other_seed) for pair in p.sets for a in pair)


def test_references_and_rotations_are_made_once_per_draw_and_timer():
    cache = InputCache()
    inputs = cache.inputs(problem(32), 0)
    ref = cache.reference(inputs, SIZES)
    assert ref.values.dtype == jnp.float32 and ref.values.shape == (32, 48)  # every row, the tail's zero
    assert not np.asarray(ref.values)[sum(SIZES) :].any()
    assert cache.reference(inputs, list(SIZES)) is ref
    assert cache.reference(inputs, (8, 8, 8, 8)) is not ref
    assert cache.made["reference"] == 2
    timer = WallTimer()
    rotation = cache.rotation(inputs, SIZES, timer)
    assert isinstance(rotation, Rotation) and len(rotation.sets) == len(inputs.sets)
    assert cache.rotation(inputs, SIZES, timer) is rotation
    assert cache.rotation(inputs, SIZES, WallTimer()) is not rotation  # another timer, its own rotation
    assert cache.made["rotation"] == 2
    assert rotation.sets[0][2] is cache.verify_args(inputs, SIZES)[2]  # one device copy of the sizes


def test_several_problems_stay_until_the_byte_bound_evicts_the_oldest():
    cache = InputCache()
    a, b = cache.inputs(problem(32), 0), cache.inputs(problem(16, k=32), 0)
    cache.reference(a, SIZES)
    cache.trim()
    assert cache.inputs(problem(32), 0) is a and cache.inputs(problem(16, k=32), 0) is b  # both kept
    assert cache.made["inputs"] == 2
    # Bound between one and two problems: the least recently used (now a, b was touched last) goes.
    alone = InputCache()
    alone.inputs(problem(16, k=32), 0)
    b_bytes = alone.nbytes
    cache.inputs(problem(16, k=32), 0)
    cache.max_bytes = b_bytes
    cache.trim()
    assert cache.nbytes == b_bytes
    assert cache.inputs(problem(16, k=32), 0) is b and cache.made["inputs"] == 2
    tight = InputCache(max_bytes=1024)
    c = tight.inputs(problem(32), 0)
    tight.trim()
    assert tight.nbytes == 0 and tight.inputs(problem(32), 0) is not c


def test_a_new_problem_makes_room_before_its_operands_are_drawn():
    """Without a trim in between, the cache stays within its bound when a problem of other weights comes
    in (the older one goes first), and keeps a problem whose weights the new one shares."""
    alone = InputCache()
    alone.inputs(problem(16, k=32), 0)
    b_bytes = alone.nbytes
    cache = InputCache(max_bytes=b_bytes)
    a = cache.inputs(problem(32), 0)
    b = cache.inputs(problem(16, k=32), 0)
    assert cache.nbytes <= b_bytes and cache.made["inputs"] == 2
    assert cache.inputs(problem(16, k=32), 0) is b and cache.inputs(problem(32), 0) is not a
    # problem(8) shares problem(32)'s weights (only M differs): drawing it evicts b, never the weights.
    shared = cache.inputs(problem(8), 0)
    assert shared.weights() == cache.inputs(problem(32), 0).weights()
    assert cache.made["weights"] == 3  # a, b, a again; problem(8) drew none


class _Device:
    def __init__(self, stats, platform="cpu"):
        self._stats = stats
        self.platform = platform

    def memory_stats(self):
        return self._stats


def test_the_default_bound_is_a_share_of_device_memory():
    assert input_cache.default_max_bytes(_Device(None)) == input_cache.HOST_CACHE_BYTES
    limit = 8 << 30
    shared = input_cache.default_max_bytes(_Device({"bytes_limit": limit}), share=0.25)
    assert shared == pytest.approx(limit * 0.25 * input_cache.DEVICE_CACHE_FRACTION, abs=1)
    assert input_cache.device_share() == 1.0  # no Ray worker here


def test_without_an_allocator_limit_a_gpu_is_bounded_by_its_total_memory(monkeypatch):
    # XLA_PYTHON_CLIENT_ALLOCATOR=platform: jax reports no bytes_limit; the driver's total memory counts.
    total = 141 << 30
    monkeypatch.setattr(
        input_cache, "fingerprint_of", lambda device: types.SimpleNamespace(memory_bytes=total)
    )
    bound = input_cache.default_max_bytes(_Device({}, platform="gpu"), share=0.5)
    assert bound == pytest.approx(total * 0.5 * input_cache.DEVICE_CACHE_FRACTION, abs=1)
    assert input_cache.default_max_bytes(_Device({}, platform="cpu")) == input_cache.HOST_CACHE_BYTES


class _RayContext:
    def __init__(self, mode: int, gpus: float) -> None:
        self.worker = types.SimpleNamespace(mode=mode)
        self._gpus = gpus

    def get_assigned_resources(self):
        if self.worker.mode != 1:
            raise AssertionError("only available when the process is a worker")  # as Ray does
        return {"GPU": self._gpus}


@pytest.mark.parametrize(("mode", "gpus", "share"), [(0, 0.5, 1.0), (1, 0.5, 0.5), (1, 1.0, 1.0)])
def test_a_ray_driver_holds_its_whole_device_and_a_worker_its_assigned_share(monkeypatch, mode, gpus, share):
    # A driver that ran a Ray sweep and then an inline one asks too (Ray initialized, not a worker).
    fake = types.SimpleNamespace(
        WORKER_MODE=1, is_initialized=lambda: True, get_runtime_context=lambda: _RayContext(mode, gpus)
    )
    monkeypatch.setitem(sys.modules, "ray", fake)
    assert input_cache.device_share() == share
