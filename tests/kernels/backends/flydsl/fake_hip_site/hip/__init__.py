"""hip-python's package as a timing child process sees it in tests: `from hip import hip` is a FakeHip.

MOETUNE_FAKE_HIP (JSON) sets it up: `plan` (a KernelPlan's dict) names the one kernel that loads, and
`mode` says how it behaves: "ok", "corrupt" (wrong output) or "abort" (hipModuleLoadData kills the
process, as a failed load of a real code object can).
"""

import json
import os

from fake_hip import FakeHip, grouped_matmul_kernel

from moetune.kernels.backends.flydsl.plan import KernelPlan


class _AbortingHip(FakeHip):
    def hipModuleLoadData(self, image):  # noqa: N802 - hip-python's name
        os.abort()


_setup = json.loads(os.environ["MOETUNE_FAKE_HIP"])
_plan = KernelPlan(**_setup["plan"])
_kernels = {_plan.kernel_name: grouped_matmul_kernel(_plan, corrupt=_setup["mode"] == "corrupt")}
hip = (_AbortingHip if _setup["mode"] == "abort" else FakeHip)(_kernels, ms=2.0)
