import jax.numpy as jnp
import pytest

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


class _RecordedSession:
    """A CUPTI session that hands back preset records: what the CUDA extension would have recorded."""

    def __init__(self, records):
        self.records = records

    def start(self):
        pass

    def stop(self):
        return list(self.records)


def test_the_cupti_timer_gives_each_kernels_median_per_call_by_name_whatever_their_record_order():
    from moetune.kernels.backends.mosaic_gpu.timer import MIN_RUNS, CuptiTimer

    # Each call launches up (ms 0.02, then 0.03 from the sixth call on), down twice (0.01 each) and a
    # copy; the records of calls past the first come in another order.
    first = [("up", 0.02), ("down", 0.01), ("copy", 0.001), ("down", 0.01)]
    records = first[:]
    for call in range(1, MIN_RUNS):
        records += [("down", 0.01), ("up", 0.02 if call < 5 else 0.03), ("down", 0.01), ("copy", 0.001)]
    timer = CuptiTimer(min_rotation_bytes=0, session=lambda: _RecordedSession(records))
    timed = timer.time_kernels(lambda x: x, [timer.rotation([(jnp.ones(2),)])], runs=MIN_RUNS, warmed=True)
    assert [name for name, _ in timed.kernels] == ["up", "down", "copy"]
    seconds = dict(timed.kernels)
    assert seconds["up"] == pytest.approx(0.025e-3)  # the median of five 0.02 and five 0.03
    assert seconds["down"] == pytest.approx(0.02e-3)  # both launches of a call
    assert seconds["copy"] == pytest.approx(0.001e-3)
    (samples,) = timed.samples
    assert samples == pytest.approx([0.041e-3] * 5 + [0.051e-3] * 5)
    assert timer.time_each(lambda x: x, [timer.rotation([(jnp.ones(2),)])], warmed=True) == timed.samples


def test_a_host_clock_times_calls_and_names_no_kernels():
    from moetune.kernels.timing import WallTimer

    timed = WallTimer(warmup=0).time_kernels(lambda x: x + 1, [[(jnp.ones(2),)]], runs=3)
    assert len(timed.samples[0]) == 3 and timed.kernels == ()
