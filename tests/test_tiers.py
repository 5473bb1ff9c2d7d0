"""tests/tiers.py: which rows of a product run in the fast tier."""

from __future__ import annotations

import itertools

from tests.tiers import each_value_fast


def _fast_and_slow(params):
    fast = [p for p in params if not p.marks]
    slow = [p for p in params if [m.name for m in p.marks] == ["slow"]]
    assert len(fast) + len(slow) == len(params)
    return fast, slow


def test_the_fast_rows_take_every_value_and_the_slow_ones_the_rest_of_the_product():
    axes = {"layout": ["a", "b", "c"], "major": {"kn": False, "km": True}, "n": [0, 3]}
    names, params = each_value_fast(axes)
    assert names == ["layout", "major", "n"]
    assert [p.values for p in params] == list(itertools.product("abc", (False, True), (0, 3)))
    assert params[0].id == "a-kn-0" and params[-1].id == "c-km-3"
    fast, slow = _fast_and_slow(params)
    for axis in range(3):
        assert {p.values[axis] for p in fast} == {p.values[axis] for p in params}
    assert len(fast) == 3 and len(slow) == 9  # three layouts: no fewer rows can take them all


def test_one_axis_is_all_fast_and_a_single_row_is_fast():
    assert _fast_and_slow(each_value_fast({"x": [1, 2, 3]})[1])[1] == []
    assert len(_fast_and_slow(each_value_fast({"x": [1], "y": ["a"]})[1])[0]) == 1
