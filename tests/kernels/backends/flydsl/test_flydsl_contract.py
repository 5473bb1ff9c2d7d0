"""The backend contract (tests/kernels/backend_contract.py) on the flydsl backend. Its kernels run only on
a gfx942/gfx950 GPU under ROCm, so here the run tests skip with that reason; what a CPU can do is compile
every served case for both archs (with the FlyDSL toolchain; test_flydsl_compile.py has more)."""

from __future__ import annotations

import pytest

from moetune.kernels.backends.flydsl import BACKEND
from moetune.kernels.backends.flydsl.plan import ARCHS
from tests.kernels.backend_contract import BackendContract, Case


class TestFlyDSLContract(BackendContract):
    backend_name = "flydsl"

    @pytest.mark.parametrize("arch", sorted(ARCHS))
    def test_every_case_compiles_without_the_device(self, case: Case, arch: str, toolchain_in_use):
        problem = case.problem(m=40, g=4)
        config = BACKEND.heuristic(problem, BACKEND.target_device(arch))
        static = BACKEND.compile_only(problem, config, arch)
        assert len(static.binary_hash) == 64 and static.compile_s > 0
