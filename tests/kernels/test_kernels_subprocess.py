"""Checks that need a fresh interpreter: what `import moetune.kernels` loads, and shard_map on a CPU mesh
(the fake device count can only be set before jax is imported)."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

HEAVY = ("ray", "optuna", "sqlalchemy", "alembic")


def run_python(code: str, tmp_path, **env: str) -> str:
    environment = {
        k: v for k, v in os.environ.items() if k not in ("MOETUNE_DB", "MOETUNE_BACKEND", "XLA_FLAGS")
    }
    environment.update(XDG_DATA_HOME=str(tmp_path / "xdg"), JAX_PLATFORMS="cpu", **env)
    result = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code)],
        capture_output=True,
        text=True,
        env=environment,
        cwd=tmp_path,
        timeout=120,
    )
    assert result.returncode == 0, result.stderr
    return result.stdout + result.stderr


def test_import_and_a_call_without_a_database_load_no_heavy_package(tmp_path):
    output = run_python(
        f"""
        import sys
        import moetune.kernels
        import moetune.kernels.backends.xla, moetune.kernels.reference, moetune.kernels.backends.xla.space
        heavy = {HEAVY!r}
        loaded = lambda: sorted({{m.split(".")[0] for m in sys.modules}} & set(heavy))
        print("after import:", loaded())
        import jax.numpy as jnp
        sizes = jnp.array([3, 5], jnp.int32)
        out = moetune.kernels.grouped_matmul(jnp.ones((8, 4)), jnp.ones((2, 4, 3)), sizes)
        assert float(out.sum()) == 8 * 3 * 4
        print("after a call:", loaded())
        """,
        tmp_path,
    )
    assert "after import: []" in output
    assert "after a call: []" in output


def test_the_database_layer_and_the_cli_load_no_kernel_and_every_public_name_resolves(tmp_path):
    """moetune.kernels's and moetune.kernels.moe's public names load on first use, so a process that only
    reads the database and problems' keys (every CLI command's module, the service) loads none of the
    kernels' modules or Pallas's lowerings, and reading the ops' specs (operands, shapes, FLOPs, bytes)
    loads no jax: jax comes with the first reference or kernel a process computes."""
    output = run_python(
        """
        import importlib, pkgutil, sys
        import moetune.cli, moetune.db, moetune.kernels.errors, moetune.kernels.problem, moetune.service
        for command in pkgutil.iter_modules(moetune.cli.__path__):
            if command.name != "__main__":
                importlib.import_module(f"moetune.cli.{command.name}")
        from moetune.kernels import ops
        from moetune.kernels.problem import Problem
        problem = Problem("grouped_matmul_swiglu", 8, 128, 256, 4)  # checked by its op's spec
        assert ops.get(problem.op).flops(problem) > 0 and len(ops.names()) > 1
        block = Problem("moe_decode_block", 4, 128, 256, 8, top_k=2)
        assert all(ops.get(p.op).bytes_touched(p) > 0 for p in (problem, block))
        print("jax:", sorted({m.split(".")[0] for m in sys.modules} & {"jax", "jaxlib"}))
        heavy = ("moetune.kernels.api", "moetune.kernels.moe.", "moetune.kernels.backends.")
        heavy += ("jax._src.pallas.",)
        reference = "moetune.kernels.moe.reference"  # the dense reference the ops' specs compute with
        print("kernels:", sorted(m for m in sys.modules if m.startswith(heavy) and m != reference))
        import moetune.kernels as kernels
        assert sorted(kernels.__all__) == sorted(kernels._HOMES) and set(kernels.__all__) <= set(dir(kernels))
        for name in kernels.__all__:
            home = importlib.import_module(f"moetune.kernels.{kernels._HOMES[name]}")
            assert getattr(kernels, name) is getattr(home, name), name
        try:
            kernels.no_such_name
        except AttributeError as e:
            print("missing:", e)
        """,
        tmp_path,
    )
    assert "kernels: []" in output and "jax: []" in output
    assert "missing: module 'moetune.kernels' has no attribute 'no_such_name'" in output


def test_packs_load_without_jax_or_the_tuners_packages(tmp_path):
    output = run_python(
        f"""
        import importlib.resources, sys
        from moetune.kernels import pack_schema, packs
        shipped = importlib.resources.files("moetune.configs") / "tuned" / "nvidia_h200__mosaic_gpu.json"
        assert packs.load(shipped).entries and pack_schema.json_schema()
        print("loaded:", sorted({{m.split(".")[0] for m in sys.modules}} & {{"jax", *{HEAVY!r}}}))
        """,
        tmp_path,
    )
    assert "loaded: []" in output


def test_shard_map_keys_on_per_shard_shapes_for_every_strategy(tmp_path):
    output = run_python(
        """
        import logging
        import jax, jax.numpy as jnp, numpy as np
        from jax.sharding import NamedSharding, PartitionSpec as P
        import moetune.kernels as mk
        from moetune.kernels import lookup
        from moetune.kernels.problem import Problem

        logging.basicConfig(level=logging.WARNING, format="%(message)s")
        logging.getLogger("moetune.kernels").setLevel(logging.DEBUG)
        assert jax.device_count() == 2, jax.devices()
        mesh = jax.make_mesh((2,), ("x",))
        rng = np.random.default_rng(0)
        lhs = jnp.asarray(rng.standard_normal((64, 16)), jnp.float32)
        rhs = jnp.asarray(rng.standard_normal((4, 16, 8)), jnp.float32)
        # Per shard: [5, 0, 20, 3] and [10, 10, 0, 12].
        sizes = jnp.asarray([5, 0, 20, 3, 10, 10, 0, 12], jnp.int32)
        specs = (P("x"), P(), P("x"))
        args = [jax.device_put(a, NamedSharding(mesh, s)) for a, s in zip((lhs, rhs, sizes), specs)]
        expected = jnp.concatenate([jax.lax.ragged_dot(lhs[:32], rhs, sizes[:4]),
                                    jax.lax.ragged_dot(lhs[32:], rhs, sizes[4:])])

        per_shard = Problem("grouped_matmul", m=32, k=16, n=8, g=4, lhs_dtype="float32", rhs_dtype="float32",
                            out_dtype="float32")
        configs = [{"strategy": "ragged_dot"}, {"strategy": "dense_masked"}, {"strategy": "segments"},
                   {"strategy": "chunked", "chunk_m": 8, "items_per_step": 1},
                   {"strategy": "chunked", "chunk_m": 16, "items_per_step": 64}]
        for config in configs:
            # A new function each time: jax caches traces per function, and the lookup runs while tracing.
            f = jax.shard_map(lambda *a: mk.grouped_matmul(*a), mesh=mesh, in_specs=specs, out_specs=P("x"))
            with lookup.overlay(winners=[mk.Winner("xla", per_shard, config)]):
                out = jax.jit(f)(*args)
            np.testing.assert_allclose(np.asarray(out), np.asarray(expected), rtol=1e-5, atol=1e-5)
            print("shard_map ok:", config["strategy"])
        """,
        tmp_path,
        XLA_FLAGS="--xla_force_host_platform_device_count=2",
    )
    for strategy in ("ragged_dot", "dense_masked", "segments", "chunked"):
        assert f"shard_map ok: {strategy}" in output
    assert "grouped_matmul/m=32,k=16,n=8,g=4" in output
    assert "-> xla strategy=segments,chunk_m=128,items_per_step=8 (overlay exact)" in output
    assert "-> xla strategy=chunked,chunk_m=8,items_per_step=1 (overlay exact)" in output
    assert "m=64" not in output
