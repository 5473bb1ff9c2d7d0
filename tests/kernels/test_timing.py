import jax.numpy as jnp

from moetune.kernels.timing import WallTimer


def test_the_default_time_each_times_every_rotation_in_order():
    seen: list[int] = []

    def fn(x):
        seen.append(x.shape[0])
        return x + 1

    timer = WallTimer(warmup=1)
    small, large = [(jnp.ones((2,)),)], timer.rotation([(jnp.ones((5,)),), (jnp.ones((5,)),)])
    samples = timer.time_each(fn, [small, large], runs=3)
    assert [len(s) for s in samples] == [3, 3]
    assert all(t >= 0 for s in samples for t in s)
    # Each rotation's warm-up and runs, the first rotation's before the second's.
    assert seen == [2] * (1 + 3) + [5] * (1 + 3)


def test_cupti_session_records_one_call_between_start_and_stop():
    from moetune.kernels.backends.mosaic_gpu.timer import CuptiSession

    events = []

    class FakeExtension:  # the CUDA jaxlib's Mosaic GPU extension, as CuptiSession drives it
        def _cupti_init(self):
            events.append("start")

        def _cupti_get_timings(self, finalize):
            events.append("stop")
            return [("kernel_a", 0.5), ("kernel_b", 0.25)]

    session = object.__new__(CuptiSession)  # no CUDA extension on a CPU
    session._ext = FakeExtension()
    kernels = session.record(lambda: events.append("call") or jnp.ones(2))
    assert events == ["start", "call", "stop"]
    assert kernels == [("kernel_a", 0.5), ("kernel_b", 0.25)]
