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
