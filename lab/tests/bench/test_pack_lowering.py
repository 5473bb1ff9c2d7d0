"""lab/bench/pack_lowering.py on a CPU: every entry of a pack is lowered as its backend builds it, whatever
the op and its Config class, and the same kernel hashes the same."""

from __future__ import annotations

import dataclasses

import pytest

from moetune.kernels import packs, registry
from moetune.kernels.backends.mosaic_gpu.kernel_decode import DecodeBlockConfig
from moetune.kernels.backends.xla.config import XlaConfig
from moetune.kernels.device import current_fingerprint
from moetune.kernels.problem import Problem
from moetune_lab.bench import pack_lowering

BLOCK = Problem("moe_decode_block", 8, 256, 512, 16, "bfloat16", "bfloat16", "bfloat16", top_k=2)
FUSED = DecodeBlockConfig()
NARROWER = dataclasses.replace(FUSED, block_f=16)


@pytest.fixture(scope="module")
def shipped():
    return packs.load(pack_lowering.PACK)


@pytest.fixture(autouse=True)
def stripped():
    with pack_lowering.stripped_locations():
        yield


def test_the_default_pack_is_the_shipped_one():
    assert pack_lowering.PACK.is_file() and pack_lowering.PACK.parent.name == "tuned"


def test_a_gemm_entry_hashes_the_same_each_time_it_is_lowered(shipped):
    mosaic, entry = registry.get("mosaic_gpu"), shipped.entries[0]
    first = pack_lowering.module_hash(mosaic, entry, shipped.device)
    assert pack_lowering.module_hash(mosaic, entry, shipped.device) == first
    assert "mosaic_gpu" in pack_lowering.module_text(mosaic, entry, shipped.device)


def test_a_decode_block_winner_is_lowered_with_its_own_config_class(shipped):
    mosaic = registry.get("mosaic_gpu")
    pack = dataclasses.replace(
        shipped,
        entries=(
            shipped.entries[0],
            packs.PackEntry(BLOCK, FUSED.to_dict(), 1e-5),
            packs.PackEntry(dataclasses.replace(BLOCK, m=4), DecodeBlockConfig(fused=False).to_dict(), 1e-5),
        ),
    )
    found = pack_lowering.hashes(pack)
    assert found["kernel_source_hash"] == mosaic.source_hash()
    assert set(found["modules"]) == {e.problem.key for e in pack.entries}
    fused = pack_lowering.module_text(mosaic, pack.entries[1], shipped.device)
    assert fused.count("xla.gpu.triton") == 2  # the block's two Pallas Triton kernels
    # The unfused path as on the H200: the routing kernel (4 tokens fit it) and the dispatched GEMMs.
    unfused = pack_lowering.module_text(mosaic, pack.entries[2], shipped.device)
    assert unfused.count("xla.gpu.triton") == 1 and unfused.count("mosaic_gpu") >= 2
    # The config reaches the kernels: another tiling is another module, the same one the same.
    narrower = packs.PackEntry(BLOCK, NARROWER.to_dict())
    assert pack_lowering.module_hash(mosaic, narrower, shipped.device) != found["modules"][BLOCK.key]
    assert pack_lowering.module_hash(mosaic, pack.entries[1], shipped.device) == found["modules"][BLOCK.key]


def test_a_pack_of_another_backend_is_lowered_and_stamped_by_that_backend():
    xla = registry.get("xla")
    gemm = Problem("grouped_matmul", m=16, k=32, n=64, g=4, lhs_dtype="float32", rhs_dtype="float32")
    entries = tuple(
        packs.PackEntry(dataclasses.replace(gemm, m=m), XlaConfig(strategy=s).to_dict(), 1e-5)
        for m, s in ((16, "ragged_dot"), (32, "segments"))
    )
    pack = packs.Pack(current_fingerprint(), "xla", xla.source_hash(), entries)
    found = pack_lowering.hashes(pack)
    assert found["kernel_source_hash"] == xla.source_hash() != registry.get("mosaic_gpu").source_hash()
    ragged, segments = (pack_lowering.module_text(xla, e, pack.device) for e in entries)
    assert "stablehlo.while" in segments and "stablehlo.while" not in ragged  # each its strategy
    assert "tensor<16x32xf32>" in ragged and "tensor<32x32xf32>" in segments


def test_restamp_refuses_a_changed_kernel_or_drops_its_entry_when_asked(tmp_path, monkeypatch):
    import json
    import sys

    xla = registry.get("xla")
    gemm = Problem("grouped_matmul", m=16, k=32, n=64, g=4, lhs_dtype="float32", rhs_dtype="float32")
    entries = tuple(
        packs.PackEntry(dataclasses.replace(gemm, m=m), XlaConfig().to_dict(), 1e-5) for m in (16, 32)
    )
    pack = packs.Pack(current_fingerprint(), "xla", "older", entries)
    path = tmp_path / "pack.json"
    path.write_text(json.dumps(pack.to_dict()))
    before = pack_lowering.hashes(pack) | {"kernel_source_hash": "older"}
    before["modules"][entries[1].problem.key] = "the old kernel's"
    (tmp_path / "before.json").write_text(json.dumps(before))
    argv = ["pack_lowering.py", "restamp", str(tmp_path / "before.json"), str(tmp_path / "after.json")]
    monkeypatch.setattr(sys, "argv", [*argv, "--pack", str(path)])
    assert pack_lowering.main() == 1 and packs.load(path).kernel_source_hash == "older"
    monkeypatch.setattr(sys, "argv", [*argv, "--pack", str(path), "--drop-changed"])
    assert pack_lowering.main() == 0
    restamped = packs.load(path)
    assert restamped.kernel_source_hash == xla.source_hash()
    assert [e.problem for e in restamped.entries] == [entries[0].problem]
