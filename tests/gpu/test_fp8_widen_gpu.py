"""The FP8 widening's PTX (kernels/moe/fp8_widen.py) on the GPU: every e4m3 code, in every position of
its word, widens to the value astype gives, NaN to NaN; the FP8 block gives bitwise the same output by
either widening."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.experimental import pallas as pl

from moetune.kernels.moe import fp8_widen

pytestmark = pytest.mark.gpu


def test_every_code_widens_to_its_value():
    # Row r holds the 256 codes rotated by r: each code meets every position of a 4-code word.
    codes = (np.arange(256)[None, :] + np.arange(16)[:, None]) % 256
    w = jax.lax.bitcast_convert_type(jnp.asarray(codes, jnp.uint8), jnp.float8_e4m3fn)

    def kernel(w_ref, out_ref):
        out_ref[...] = fp8_widen.widen(w_ref[...], jnp.bfloat16, "bits", interpret=False)

    got = pl.pallas_call(kernel, out_shape=jax.ShapeDtypeStruct(w.shape, jnp.bfloat16))(w)
    want = w.astype(jnp.bfloat16)
    got, want = np.asarray(got, np.float32), np.asarray(want, np.float32)
    np.testing.assert_array_equal(got, want)  # NaN where NaN; a negative zero may widen to +0
    assert np.isnan(got).sum() == 2 * 16
    assert got[0, 1] == 2.0**-9  # the smallest subnormal kept
