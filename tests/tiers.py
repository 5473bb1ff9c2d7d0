"""A parametrized test over the product of several axes, split between the two tiers: a few rows that
together take every value of every axis run in the fast tier, the rest of the product in the slow one
(`-m slow`). For tests whose rows each take seconds (an interpreted kernel, a cost model's ranking of a
whole space): a change that breaks one value fails the fast tier, and CI still runs every combination."""

from __future__ import annotations

import itertools
from collections.abc import Mapping, Sequence
from typing import Any

import pytest


def each_value_fast(axes: Mapping[str, Sequence[Any] | Mapping[str, Any]]) -> tuple[list[str], list[Any]]:
    """(argnames, params) for pytest.mark.parametrize over the product of `axes` (name -> values, or
    name -> {id: value}). The fast rows are picked greedily, each the first in product order to take the
    most values no fast row has taken yet; every other row is marked slow."""
    names = list(axes)
    columns = [_ided(axes[name]) for name in names]
    rows = list(itertools.product(*columns))
    takes = [{(axis, id_) for axis, (id_, _) in enumerate(row)} for row in rows]  # each row's values
    untaken = set().union(*takes)
    fast = set()
    while untaken:
        best = max(range(len(rows)), key=lambda i: (len(untaken & takes[i]), -i))
        fast.add(best)
        untaken -= takes[best]
    params = [
        pytest.param(
            *(value for _, value in row),
            id="-".join(id_ for id_, _ in row),
            marks=() if i in fast else pytest.mark.slow,
        )
        for i, row in enumerate(rows)
    ]
    return names, params


def _ided(values: Sequence[Any] | Mapping[str, Any]) -> list[tuple[str, Any]]:
    if isinstance(values, Mapping):
        return list(values.items())
    return [(str(value), value) for value in values]
