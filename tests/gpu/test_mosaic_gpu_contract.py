"""The backend contract (tests/kernels/backend_contract.py) on the mosaic_gpu backend, on a Hopper GPU:
its ops (the weight gradient included) with bf16 and f16 (it declines f32), each with the heuristic
config and a plain and a warp-specialized one where the op's space admits them; test_mosaic_gpu_kernel.py
adds random shapes and configs from the whole space."""

from __future__ import annotations

import pytest

from moetune.kernels.backends.mosaic_gpu.config import MosaicGpuConfig
from moetune.kernels.device import current_fingerprint
from tests.kernels.backend_contract import BackendContract

pytestmark = pytest.mark.gpu

PLAIN = MosaicGpuConfig(
    block_m=64, block_n=64, block_k=32, max_concurrent_steps=2, warp_specialized=False, wg_split="none"
)
WS_N = MosaicGpuConfig(block_m=64, block_n=64, block_k=64, max_concurrent_steps=2, wg_split="n")


class TestMosaicGpuContract(BackendContract):
    backend_name = "mosaic_gpu"

    def configs(self, problem):
        device = current_fingerprint()
        wanted = [self.backend.heuristic(problem, device), PLAIN, WS_N]
        search = self.backend.search_space(problem, device)
        valid = [c for c in wanted if search.invalid(problem, c, device) is None]
        return list(dict.fromkeys(valid))
