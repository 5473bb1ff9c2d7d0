"""The backend contract (tests/kernels/backend_contract.py) on the xla backend, on the CPU: every op,
bf16, f16 and f32; test_xla_kernel.py adds every strategy on random shapes."""

from __future__ import annotations

from tests.kernels.backend_contract import BackendContract


class TestXlaContract(BackendContract):
    backend_name = "xla"
