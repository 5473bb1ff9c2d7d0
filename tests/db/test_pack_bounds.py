"""The pack format's bounds fit the columns an imported pack lands in, on every dialect: what SQLite
would take and PostgreSQL refuse (an Integer past 32 bits, a String past its length) never validates."""

from __future__ import annotations

import pytest
from sqlalchemy import BigInteger, Integer, String

from moetune.db.models import Device, Kernel, ProblemRow, Winner
from moetune.kernels import ops, pack_schema
from moetune.kernels.problem import DTYPES, FP8_DTYPES, SCALE_LAYOUTS, Problem


def _max_length(model, field: str) -> int:
    (constraint,) = [m for m in model.model_fields[field].metadata if hasattr(m, "max_length")]
    return constraint.max_length


def _maximum(model, field: str) -> int:
    return next(m.le for m in model.model_fields[field].metadata if getattr(m, "le", None) is not None)


def _column(table, name: str):
    return table.__table__.c[name].type


@pytest.mark.parametrize("field", sorted(pack_schema.DEVICE_TEXT_LENGTHS))
def test_device_text_fits_its_column(field):
    column = _column(Device, field)
    assert isinstance(column, String) and _max_length(pack_schema.DeviceModel, field) <= column.length


def test_device_numbers_fit_their_columns():
    assert type(_column(Device, "core_count")) is Integer
    assert _maximum(pack_schema.DeviceModel, "core_count") == 2**31 - 1  # PostgreSQL's integer
    assert isinstance(_column(Device, "memory_bytes"), BigInteger)
    assert _maximum(pack_schema.DeviceModel, "memory_bytes") == 2**63 - 1


@pytest.mark.parametrize("dim", ["m", "k", "n", "g"])
def test_problem_dims_fit_their_integer_columns(dim):
    assert type(_column(ProblemRow, dim)) is Integer
    assert _maximum(pack_schema.ProblemModel, dim) == 2**31 - 1


def test_names_and_hashes_fit_their_columns():
    for table, name in ((Kernel, "backend"), (Winner, "backend"), (ProblemRow, "op")):
        assert pack_schema.NAME_LENGTH <= _column(table, name).length
    assert pack_schema.HASH_LENGTH <= _column(Kernel, "source_hash").length
    assert all(len(op) <= pack_schema.NAME_LENGTH for op in ops.names())
    assert all(len(dtype) <= _column(ProblemRow, "lhs_dtype").length for dtype in DTYPES + FP8_DTYPES)


def test_the_longest_problem_key_fits_its_column():
    def problems(op):
        if ops.get(op).routed and ops.get(op).scale_operands:  # the FP8 block: top_k and scale_layout
            return (
                Problem(
                    op,
                    2**31 - 1,
                    2**31 - 1 - 127,
                    2**31 - 256,
                    2**31 - 1,
                    d,
                    "float8_e4m3fn",
                    d,
                    True,
                    s,
                    top_k=2**31 - 1,
                )
                for d in DTYPES
                for s in ("row_channel", "block_1x128_128x128")
            )
        if ops.get(op).routed:  # top_k as long as g
            return (
                Problem(op, 2**31 - 1, 2**31 - 1, 2**31 - 2, 2**31 - 1, d, d, d, top_k=2**31 - 1)
                for d in DTYPES
            )
        if not ops.get(op).scale_operands:
            return (Problem(op, 2**31 - 1, 2**31 - 1, 2**31 - 2, 2**31 - 1, d, d, d) for d in DTYPES)
        return (
            Problem(op, 2**31 - 1, 2**31 - 1 - 127, 2**31 - 256, 2**31 - 1, d, d, "float32", scale_layout=s)
            for d in FP8_DTYPES
            for s in SCALE_LAYOUTS[1:]
        )

    biggest = max((p for op in ops.names() for p in problems(op)), key=lambda p: len(p.key))
    assert len(biggest.key) <= _column(ProblemRow, "key").length
    assert len(biggest.shape_key) <= _column(ProblemRow, "shape_key").length


def test_a_recorded_sweep_file_path_fits_its_column():
    from moetune.db.models import Sweep
    from moetune.tuner import spec

    assert spec.SWEEP_FILE_LENGTH == Sweep.__table__.c.sweep_file.type.length
