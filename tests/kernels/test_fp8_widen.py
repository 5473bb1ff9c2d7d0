"""The FP8 widening's PTX (kernels/moe/fp8_widen.py), executed on this CPU by a small model of the
instructions it uses, on every e4m3 code in every byte of a word: it gives astype's bfloat16 values."""

import re

import jax
import jax.numpy as jnp
import ml_dtypes
import numpy as np
import pytest

from moetune.kernels.errors import ConfigInvalid
from moetune.kernels.moe import decode_block as db
from moetune.kernels.moe import fp8_widen

U32 = np.uint32


def _prmt(a, b, selector):
    """prmt.b32's default mode: result byte i is byte (nibble i & 7) of {b:a}, or with nibble i & 8 that
    byte's sign bit copied over all eight bits."""
    source = (a.astype(np.uint64) | (b.astype(np.uint64) << 32)).astype(np.uint64)
    out = np.zeros_like(a)
    for i in range(4):
        nibble = (selector >> (4 * i)) & 0xF
        byte = ((source >> np.uint64(8 * (nibble & 7))) & np.uint64(0xFF)).astype(U32)
        if nibble & 8:
            byte = np.where(byte & 0x80, U32(0xFF), U32(0))
        out |= byte << U32(8 * i)
    return out


def _lop3(a, b, c, lut):
    out = np.zeros_like(a)
    for bit in range(32):
        index = (((a >> U32(bit)) & 1) << 2) | (((b >> U32(bit)) & 1) << 1) | ((c >> U32(bit)) & 1)
        out |= ((U32(lut) >> index) & 1) << U32(bit)
    return out


def _bf16x2(word):
    lo = (word & 0xFFFF).astype(np.uint16).view(ml_dtypes.bfloat16).astype(np.float64)
    hi = (word >> U32(16)).astype(np.uint16).view(ml_dtypes.bfloat16).astype(np.float64)
    return lo, hi


def _fma_bf16x2(a, b, c):
    """fma.rn.bf16x2: a * b + c per 16-bit lane, rounded once (float64 holds these products and sums
    exactly), subnormals kept."""
    lanes = [x * y + z for x, y, z in zip(_bf16x2(a), _bf16x2(b), _bf16x2(c), strict=True)]
    lo, hi = (v.astype(ml_dtypes.bfloat16).view(np.uint16).astype(U32) for v in lanes)
    return lo | (hi << U32(16))


def run_ptx(text: str, word: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """($0, $1) of the inline assembly for input words $2."""
    regs = {"$2": word.astype(U32)}
    value = lambda op: regs[op] if op in regs else np.full_like(word, int(op, 0), dtype=U32)  # noqa: E731
    for line in text.splitlines():
        found = re.match(r"\s*([\w.]+)\s+(.*);", line)
        if not found or found.group(1) == ".reg":
            continue
        op, args = found.group(1), [a.strip() for a in found.group(2).split(",")]
        dst, src = args[0], args[1:]
        if op == "mov.b32":
            regs[dst] = value(src[0])
        elif op == "prmt.b32":
            regs[dst] = _prmt(value(src[0]), value(src[1]), int(src[2], 0))
        elif op == "and.b32":
            regs[dst] = value(src[0]) & value(src[1])
        elif op == "shr.b32":
            regs[dst] = value(src[0]) >> U32(int(src[1], 0))
        elif op == "add.u32":
            regs[dst] = value(src[0]) + value(src[1])
        elif op == "lop3.b32":
            regs[dst] = _lop3(value(src[0]), value(src[1]), value(src[2]), int(src[3], 0))
        elif op == "fma.rn.bf16x2":
            regs[dst] = _fma_bf16x2(value(src[0]), value(src[1]), value(src[2]))
        else:
            raise AssertionError(f"no model of {op}")
    return regs["$0"], regs["$1"]


def _values(words):
    return np.stack([np.stack(_bf16x2(w), axis=-1) for w in words], axis=1).reshape(len(words[0]), 4)


@pytest.mark.parametrize("position", range(4))
def test_every_code_in_every_byte_widens_to_its_value(position):
    codes = np.arange(256, dtype=U32)
    rng = np.random.default_rng(position)
    others = rng.integers(0, 256, size=(256, 4), dtype=U32)
    others[:, position] = codes
    word = sum(others[:, i] << U32(8 * i) for i in range(4))
    got = _values(run_ptx(fp8_widen.E4M3_TO_BF16, word))
    want = others.astype(np.uint8).view(ml_dtypes.float8_e4m3fn).astype(np.float64)
    np.testing.assert_array_equal(got, want)  # NaN where NaN; -0 and +0 compare equal
    assert np.isnan(got[:, position]).sum() == 2  # 0x7f and 0xff


def test_subnormal_codes_keep_their_values():
    word = np.array([0x04030201, 0x87868584], dtype=U32)  # e4m3 subnormals, both signs
    got = _values(run_ptx(fp8_widen.E4M3_TO_BF16, word))
    np.testing.assert_array_equal(got[0], np.arange(1, 5) * 2.0**-9)
    np.testing.assert_array_equal(got[1], -np.arange(4, 8) * 2.0**-9)


def test_model_catches_a_wrong_sequence():
    """The model is not vacuous: the sequence without its NaN addend widens NaN codes to 480."""
    broken = fp8_widen.E4M3_TO_BF16.replace("t0, k, c0", "t0, k, 0")
    got = _values(run_ptx(broken, np.array([0x0000007F], dtype=U32)))
    assert got[0, 0] == 480.0


def test_unfit_modes_say_why():
    assert fp8_widen.unfit_reason("bits", jnp.float8_e4m3fn, jnp.bfloat16) is None
    assert "float8_e4m3fn" in fp8_widen.unfit_reason("bits", jnp.float8_e5m2, jnp.bfloat16)
    assert "bfloat16" in fp8_widen.unfit_reason("bits", jnp.float8_e4m3fn, jnp.float16)
    assert "one of" in fp8_widen.unfit_reason("shift", jnp.float8_e4m3fn, jnp.bfloat16)
    with pytest.raises(ConfigInvalid, match="widen_up"):
        db.DecodeConfig(widen_up="shift")


def test_block_refuses_bits_on_16_bit_weights():
    x = jnp.ones((1, 64), jnp.bfloat16)
    logits = jnp.zeros((1, 4), jnp.float32)
    w_gate_up, w_down = jnp.ones((4, 64, 64), jnp.bfloat16), jnp.ones((4, 32, 64), jnp.bfloat16)
    config = db.DecodeConfig(block_f=16, block_k=32, block_h=32, block_fd=32, widen_down="bits")
    with pytest.raises(ConfigInvalid, match="widen_down"):
        db.decode_block(x, logits, w_gate_up, w_down, top_k=1, config=config, interpret=True)


def test_jax_agrees_on_the_codes():
    """astype, which the interpreter and `convert` use, gives ml_dtypes' values too (the reference above)."""
    codes = jax.lax.bitcast_convert_type(jnp.arange(256, dtype=jnp.uint8), jnp.float8_e4m3fn)
    got = np.asarray(codes.astype(jnp.bfloat16)).astype(np.float64)
    want = np.arange(256, dtype=np.uint8).view(ml_dtypes.float8_e4m3fn).astype(np.float64)
    np.testing.assert_array_equal(got, want)
