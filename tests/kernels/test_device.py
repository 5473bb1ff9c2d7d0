import dataclasses

from moetune.kernels.device import DeviceFingerprint, current_fingerprint

H200 = DeviceFingerprint(
    device_kind="NVIDIA H200",
    platform="gpu",
    core_count=132,
    memory_bytes=150_000_000_000,
    compute_capability="9.0",
    driver="580.159.04",
    runtime="",
    jax_version="0.11.2",
    jaxlib_version="0.11.2",
)


def test_hash_ignores_the_allocator_dependent_memory_figure():
    # A tuning worker under XLA_PYTHON_CLIENT_ALLOCATOR=platform reported 0 on the H200.
    assert dataclasses.replace(H200, memory_bytes=0).hash == H200.hash


def test_hash_changes_with_every_fact_that_can_change_kernel_speed():
    for field in ("device_kind", "core_count", "compute_capability", "driver", "runtime", "jax_version"):
        changed = dataclasses.replace(H200, **{field: 7 if field == "core_count" else "other"})
        assert changed.hash != H200.hash, field


def test_round_trip_and_current_device():
    assert DeviceFingerprint.from_dict(H200.to_dict()) == H200
    running = current_fingerprint()
    assert running.core_count >= 1 and running.jax_version


def test_the_fingerprint_does_not_depend_on_what_was_imported_before(tmp_path):
    # jax.extend appears as an attribute of jax only once something imports it (Pallas Mosaic GPU does);
    # the runtime must be read the same way either way, or one program's winners read as stale in another.
    import subprocess
    import sys

    script = (
        "import sys, types\n"
        "import jax\n"
        "if sys.argv[1] == 'extend': import jax.extend\n"
        "from moetune.kernels.device import fingerprint_of\n"
        "cpu = jax.devices()[0]\n"
        "gpu = types.SimpleNamespace(platform='gpu', device_kind='NVIDIA H200', core_count=132,\n"
        "    compute_capability='9.0', local_hardware_id=0, client=cpu.client)\n"
        "print(fingerprint_of(gpu).runtime, fingerprint_of(gpu).hash)\n"
    )
    path = tmp_path / "fp.py"
    path.write_text(script)
    plain, extended = (
        subprocess.run([sys.executable, str(path), mode], capture_output=True, text=True, check=True).stdout
        for mode in ("plain", "extend")
    )
    assert plain == extended
    assert plain.split()[0]  # the client's platform_version, never empty
