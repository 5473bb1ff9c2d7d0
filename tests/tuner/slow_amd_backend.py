"""The "slow_device" backend on a custom device resource, registered only in tests as "slow_amd".

It declares what flydsl declares for AMD GPUs (`amd_gpu`, HIP_VISIBLE_DEVICES), so a sweep of it on a
cluster that claims `amd_gpu` units exercises the executor's seating of workers without an AMD GPU.
"""

from __future__ import annotations

from tests.tuner.slow_device_backend import SlowDeviceBackend


class SlowAmdBackend(SlowDeviceBackend):
    name = "slow_amd"
    device_resource = "amd_gpu"
    visible_devices_env = "HIP_VISIBLE_DEVICES"


BACKEND = SlowAmdBackend()
