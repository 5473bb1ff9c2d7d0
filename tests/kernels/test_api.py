"""The public API: grouped_matmul under jit, backend choice, fallback (opt-in for a named backend), explain,
the compiled program."""

from __future__ import annotations

import logging
import re

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import moetune.kernels as mk
from moetune.kernels import lookup
from moetune.kernels.backends.xla import XlaBackend, XlaConfig
from moetune.kernels.errors import ConfigInvalid, UnknownBackend, Unsupported
from moetune.kernels.lookup import Winner
from moetune.kernels.problem import Problem
from moetune.kernels.reference import reference_grouped_matmul, relative_error, tolerance

PROBLEM = Problem("grouped_matmul", m=40, k=16, n=8, g=5)  # bf16


def operands(m=40, k=16, n=8, g=5, dtype=jnp.bfloat16, transpose=False, seed=0):
    rng = np.random.default_rng(seed)
    lhs = jnp.asarray(rng.standard_normal((m, k)), dtype)
    rhs = jnp.asarray(rng.standard_normal((g, n, k) if transpose else (g, k, n)), dtype)
    sizes = jnp.asarray([7, 0, 12, 1, 15][:g], jnp.int32)
    return lhs, rhs, sizes


# -- the call ------------------------------------------------------------------------------------------


@pytest.mark.parametrize("dtype", [jnp.bfloat16, jnp.float16, jnp.float32])
@pytest.mark.parametrize("transpose", [False, True])
def test_jit_matches_the_reference(dtype, transpose):
    lhs, rhs, sizes = operands(dtype=dtype, transpose=transpose)
    fn = jax.jit(mk.grouped_matmul, static_argnames="transpose_rhs")
    out = fn(lhs, rhs, sizes, transpose_rhs=transpose)
    assert (out.shape, out.dtype) == ((40, 8), dtype)
    ref = reference_grouped_matmul(lhs, rhs, sizes, transpose_rhs=transpose)
    assert relative_error(out, ref) < tolerance(dtype)
    assert not np.any(np.asarray(out[35:], np.float32))


def test_preferred_element_type_sets_the_output_dtype_and_the_key():
    lhs, rhs, sizes = operands()
    out = mk.grouped_matmul(lhs, rhs, sizes, preferred_element_type=jnp.float32)
    assert out.dtype == jnp.float32
    assert relative_error(out, reference_grouped_matmul(lhs, rhs, sizes)) < tolerance(jnp.float32) * 10
    assert mk.explain(lhs, rhs, preferred_element_type=jnp.float32).problem.out_dtype == "float32"


def test_numpy_operands_work_eagerly():
    lhs, rhs, sizes = (np.asarray(x) for x in operands(dtype=jnp.float32))
    out = mk.grouped_matmul(lhs, rhs, sizes)
    np.testing.assert_allclose(out, reference_grouped_matmul(lhs, rhs, sizes), rtol=1e-5, atol=1e-5)


def test_other_integer_group_sizes_are_accepted():
    lhs, rhs, sizes = operands(dtype=jnp.float32)
    out = jax.jit(mk.grouped_matmul)(lhs, rhs, sizes.astype(jnp.int16))
    np.testing.assert_allclose(out, reference_grouped_matmul(lhs, rhs, sizes), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize(
    "shapes, message",
    [
        (((40,), (5, 16, 8), (5,)), r"lhs must be \[M, K\]; got shape \(40,\)"),
        (((40, 16), (16, 8), (5,)), r"rhs must be \[G, K, N\]; got shape \(16, 8\)"),
        (((40, 16), (5, 12, 8), (5,)), r"lhs has K=16 but rhs \[G, K, N\] has K=12"),
        (((40, 16), (5, 16, 8), (4,)), r"group_sizes must have shape \(5,\) for G=5; got \(4,\)"),
    ],
)
def test_bad_shapes_fail_with_one_clear_message(shapes, message):
    lhs, rhs = (jnp.zeros(shape, jnp.bfloat16) for shape in shapes[:2])
    sizes = jnp.zeros(shapes[2], jnp.int32)
    with pytest.raises(ValueError, match=message):
        mk.grouped_matmul(lhs, rhs, sizes)


def test_float_group_sizes_and_unknown_dtypes_are_refused():
    lhs, rhs, sizes = operands()
    with pytest.raises(ValueError, match="group_sizes must be integers"):
        mk.grouped_matmul(lhs, rhs, sizes.astype(jnp.float32))
    with pytest.raises(ConfigInvalid, match="dtype='int8' is not one of"):
        mk.grouped_matmul(lhs.astype(jnp.int8), rhs.astype(jnp.int8), sizes)


def test_explicit_config_is_used():
    lhs, rhs, sizes = operands()
    config = XlaConfig(strategy="segments")
    explanation = mk.explain(lhs, rhs, config=config)
    assert (explanation.backend, explanation.config, explanation.source) == ("xla", config, "explicit config")
    assert explanation.backend_reason == "backend of the XlaConfig argument"
    hlo = jax.jit(lambda *a: mk.grouped_matmul(*a, config=config)).lower(lhs, rhs, sizes).as_text()
    assert "while" in hlo  # the per-group loop of the segments strategy


def test_config_for_another_backend_is_refused(probe_backends):
    probe_backends("probe")
    with pytest.raises(ConfigInvalid, match="config XlaConfig is not a config of backend 'probe'"):
        mk.explain(PROBLEM, backend="probe", config=XlaConfig())


def test_unknown_backend_names_the_registered_ones(monkeypatch):
    with pytest.raises(UnknownBackend, match="unknown backend 'nope'; registered: .*xla"):
        mk.explain(PROBLEM, backend="nope")
    monkeypatch.setenv("MOETUNE_BACKEND", "nope")
    with pytest.raises(UnknownBackend, match="unknown backend 'nope'"):
        mk.explain(PROBLEM)


# -- choosing the backend ------------------------------------------------------------------------------


def test_default_is_the_highest_priority_available_backend(probe_backends):
    probe_backends("low", priority=-1)
    probe_backends("high", priority=7)
    probe_backends("higher_but_absent", priority=9, unavailable="needs a device this machine lacks")
    explanation = mk.explain(PROBLEM)
    assert (explanation.backend, explanation.declined) == ("high", ())
    assert explanation.backend_reason == "highest-priority backend available on this device"


def test_argument_beats_environment_beats_default(probe_backends, monkeypatch):
    probe_backends("envchoice", priority=-1)
    probe_backends("argchoice", priority=-2)
    monkeypatch.setenv("MOETUNE_BACKEND", "envchoice")
    env = mk.explain(PROBLEM)
    assert (env.backend, env.backend_reason) == ("envchoice", "MOETUNE_BACKEND=envchoice")
    arg = mk.explain(PROBLEM, backend="argchoice")
    assert (arg.backend, arg.backend_reason) == ("argchoice", "backend argument")


def test_declining_backends_fall_through_by_priority_to_xla(probe_backends, caplog):
    probe_backends("first", priority=9, check_reason="K=16 is too small for first")
    probe_backends("absent", priority=8, unavailable="not on this device")
    probe_backends("second", priority=5, build_reason="no kernel for bf16 here")
    lhs, rhs, sizes = operands()
    with caplog.at_level(logging.INFO, "moetune"):
        out = jax.jit(lambda *a: mk.grouped_matmul(*a))(lhs, rhs, sizes)
    (record,) = [r for r in caplog.records if "runs on xla: first: K=16 is too small" in r.message]
    assert record.levelno == logging.INFO  # the default backend declining is routine
    explanation = mk.explain(lhs, rhs)
    assert explanation.backend == "xla"
    assert explanation.declined == ("first: K=16 is too small for first", "second: no kernel for bf16 here")
    assert relative_error(out, reference_grouped_matmul(lhs, rhs, sizes)) < tolerance(jnp.bfloat16)


def test_a_named_backend_that_is_unavailable_raises_saying_why(probe_backends):
    probe_backends("absent", priority=8, unavailable="not on this device")
    lhs, rhs, sizes = operands()
    expected = (
        r"^backend absent \(backend argument\) cannot run grouped_matmul/m=40,k=16,n=8,g=5,\S+ on \S+: "
        r"not on this device; pass fallback=True to let the next backend run it"
    )
    with pytest.raises(Unsupported, match=expected) as raised:
        mk.grouped_matmul(lhs, rhs, sizes, backend="absent")
    assert "\n" not in str(raised.value)  # one line
    with pytest.raises(Unsupported, match=expected):  # explain makes the same decision
        mk.explain(PROBLEM, backend="absent")
    with pytest.raises(Unsupported, match=expected):  # and under jit, at trace time (jax adds a note)
        jax.jit(lambda *a: mk.grouped_matmul(*a, backend="absent"))(lhs, rhs, sizes)


def test_a_named_backend_that_declines_the_problem_raises(probe_backends):
    probe_backends("picky", priority=8, check_reason="K=16 is too small for picky")
    probe_backends("builder", priority=7, build_reason="no kernel for bf16 here")
    with pytest.raises(Unsupported, match=r"backend picky \(backend argument\) .*: K=16 is too small"):
        mk.explain(PROBLEM, backend="picky")
    with pytest.raises(Unsupported, match=r"builder .*: no kernel for bf16 here; pass fallback=True"):
        mk.grouped_matmul(*operands(), backend="builder")


def test_the_config_or_the_environment_names_a_backend_as_the_argument_does(probe_backends, monkeypatch):
    absent = probe_backends("absent", priority=8, unavailable="not on this device")
    with pytest.raises(Unsupported, match=r"backend absent \(backend of the ProbeConfig argument\)"):
        mk.grouped_matmul(*operands(), config=absent.config_cls())
    monkeypatch.setenv("MOETUNE_BACKEND", "absent")
    with pytest.raises(Unsupported, match=r"\(MOETUNE_BACKEND=absent\) .*; unset MOETUNE_BACKEND or pass"):
        mk.grouped_matmul(*operands())
    assert mk.explain(PROBLEM, fallback=True).backend == "xla"


def test_the_real_mosaic_gpu_backend_off_hopper_raises_instead_of_running_xla():
    from moetune.kernels.backends.mosaic_gpu.config import MosaicGpuConfig
    from moetune.kernels.device import current_fingerprint

    if mk.explain(PROBLEM).backend == "mosaic_gpu":
        pytest.skip("this machine runs mosaic_gpu")
    here = re.escape(current_fingerprint().device_kind)
    with pytest.raises(
        Unsupported, match=rf"^backend mosaic_gpu \(backend argument\) cannot run .* on {here}: "
    ):
        mk.grouped_matmul(*operands(), backend="mosaic_gpu")
    with pytest.raises(Unsupported, match=r"^backend mosaic_gpu \(backend of the MosaicGpuConfig argument\)"):
        mk.grouped_matmul(*operands(), config=MosaicGpuConfig())
    told = mk.explain(PROBLEM, backend="mosaic_gpu", fallback=True)
    assert told.backend == "xla" and told.declined[0].startswith("mosaic_gpu: ")


def test_fallback_true_lets_a_named_backend_fall_through_with_a_warning(probe_backends, caplog):
    probe_backends("absent", priority=8, unavailable="not on this device")
    with caplog.at_level(logging.INFO, "moetune"):
        explanation = mk.explain(PROBLEM, backend="absent", fallback=True)
        out = mk.grouped_matmul(*operands(), backend="absent", fallback=True)
    assert (explanation.backend, explanation.declined) == ("xla", ("absent: not on this device",))
    (record,) = [r for r in caplog.records if "runs on xla: absent: not on this device" in r.message]
    assert record.levelno == logging.WARNING
    lhs, rhs, sizes = operands()
    assert relative_error(out, reference_grouped_matmul(lhs, rhs, sizes)) < tolerance(jnp.bfloat16)


def test_fallback_false_makes_the_default_choice_strict(probe_backends):
    probe_backends("first", priority=9, check_reason="first says no")
    assert mk.explain(PROBLEM).backend == "xla"  # the default falls through
    with pytest.raises(Unsupported, match=r"^backend first \(highest-priority backend available on this"):
        mk.explain(PROBLEM, fallback=False)


def test_when_every_backend_declines_one_exception_group_has_every_reason(probe_backends, monkeypatch):
    probe_backends("first", priority=9, check_reason="first says no")

    def refuse(self, problem):
        raise Unsupported("xla says no")

    monkeypatch.setattr(XlaBackend, "check", refuse)
    with pytest.raises(ExceptionGroup) as info:
        mk.grouped_matmul(*operands())
    assert "no backend can compute grouped_matmul/m=40" in str(info.value)
    assert [str(e) for e in info.value.exceptions] == ["first: first says no", "xla: xla says no"]
    assert all(isinstance(e, Unsupported) for e in info.value.exceptions)


def test_a_stored_config_the_backend_rejects_gives_way_to_its_heuristic(probe_backends, caplog):
    probe = probe_backends("probe", priority=9)
    with lookup.overlay(winners=[Winner("probe", PROBLEM, {"block": 13})]), caplog.at_level(logging.WARNING):
        explanation = mk.explain(PROBLEM)
    assert (explanation.backend, explanation.config, explanation.source) == (
        "probe",
        probe.config_cls(),
        "heuristic",
    )
    assert "rejects its overlay exact config" in caplog.text
    with pytest.raises(ConfigInvalid, match="block=13 is unlucky"):
        mk.explain(PROBLEM, config=probe.config_cls(block=13))
    assert probe.built  # the heuristic config was built


# -- explain -------------------------------------------------------------------------------------------


def test_explain_names_source_nearest_m_and_staleness():
    stale = Winner(
        "xla", PROBLEM.with_m(64), XlaConfig(strategy="dense_masked").to_dict(), fingerprint_hash="f" * 16
    )
    with lookup.overlay(winners=[stale]):
        explanation = mk.explain(
            jax.ShapeDtypeStruct((40, 16), jnp.bfloat16), jax.ShapeDtypeStruct((5, 16, 8), jnp.bfloat16)
        )
    assert explanation.problem == PROBLEM
    assert (explanation.source, explanation.from_m) == ("overlay nearest", 64)
    text = str(explanation)
    assert "source:   overlay nearest (from m=64)" in text
    assert re.search(r"stale:    yes: tuned on device fingerprint f{16}", text)
    assert "config:   strategy=dense_masked" in text
    data = explanation.to_dict()
    assert data["from_m"] == 64 and data["config"]["strategy"] == "dense_masked" and data["stale"]


def test_explain_without_winners_says_heuristic():
    text = str(mk.explain(PROBLEM))
    assert "backend:  xla (highest-priority backend available on this device)" in text
    assert "source:   heuristic" in text and "stale:    no" in text


# -- the compiled program holds only the kernel ----------------------------------------------------------


def _opcodes(hlo: str) -> set[str]:
    return set(re.findall(r"=\s*\S+\s+([a-z][a-z0-9-]*)\(", hlo))


@pytest.mark.parametrize("transpose", [False, True])
def test_ragged_dot_strategy_compiles_to_what_ragged_dot_compiles_to(transpose):
    lhs, rhs, sizes = operands(transpose=transpose)
    if transpose:
        dims = jax.lax.RaggedDotDimensionNumbers((((1,), (2,)), ((), ())), (0,), (0,))
        plain = jax.jit(lambda a, b, c: jax.lax.ragged_dot_general(a, b, c, dims))
    else:
        plain = jax.jit(jax.lax.ragged_dot)
    problem = mk.problem_of(lhs, rhs, sizes, transpose_rhs=transpose)
    with lookup.overlay(winners=[Winner("xla", problem, {"strategy": "ragged_dot"})]):
        call = lambda a, b, c: mk.grouped_matmul(a, b, c, transpose_rhs=transpose)  # noqa: E731
        jaxpr = jax.make_jaxpr(call)(lhs, rhs, sizes)
        ours_hlo = jax.jit(call).lower(lhs, rhs, sizes).compile().as_text()
    # The traced program is the one ragged_dot equation inside the op's custom VJP: the lookup left
    # nothing behind.
    assert [e.primitive.name for e in jaxpr.eqns] == ["custom_vjp_call"]
    inner = jaxpr.eqns[0].params["call_jaxpr"]
    assert [e.primitive.name for e in inner.eqns] == ["ragged_dot_general"]
    plain_hlo = plain.lower(lhs, rhs, sizes).compile().as_text()
    assert {"dot", "parameter"} <= _opcodes(plain_hlo)
    assert _opcodes(ours_hlo) == _opcodes(plain_hlo)
    assert "custom-call" not in ours_hlo and "callback" not in ours_hlo.lower()
