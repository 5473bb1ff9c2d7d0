"""Routings -> group sizes: balanced, zipf, recorded expert ids; and the verification draws."""

from __future__ import annotations

import numpy as np
import pytest

from moetune.kernels.errors import ConfigInvalid
from moetune.tuner.routing import Routing, capped, describe_routings, parse_routings, verification_draws


def test_balanced_splits_evenly_with_the_remainder_first():
    sizes = Routing.parse("balanced").group_sizes(10, 4, seed=0)
    assert sizes.tolist() == [3, 3, 2, 2]
    assert sizes.dtype == np.int32


def test_zipf_is_skewed_seeded_and_sums_to_m():
    routing = Routing.parse("zipf:1.5")
    a = routing.group_sizes(4096, 8, seed=3)
    assert a.sum() == 4096
    assert np.array_equal(a, routing.group_sizes(4096, 8, seed=3))
    assert not np.array_equal(a, routing.group_sizes(4096, 8, seed=4))
    # With exponent 1.5 the most popular expert takes far more than an even share (512).
    assert a.max() > 1500
    uniform = Routing.parse("zipf:0").group_sizes(8000, 8, seed=1)
    assert (uniform > 800).all() and len(set(uniform.tolist())) > 1  # near-balanced, but ragged


def test_recorded_routing_counts_expert_ids(tmp_path):
    ids = np.array([[0, 1], [0, 2], [0, 3], [1, 2]], dtype=np.int64)
    path = tmp_path / "ids.npy"
    np.save(path, ids)
    routing = Routing.parse(str(path))
    sizes = routing.group_sizes(8, 4, seed=0)
    assert sizes.sum() == 8
    assert sizes.tolist() == np.bincount(ids.reshape(-1), minlength=4).tolist()  # all 8 ids, in some rotation
    assert routing.group_sizes(20, 4, seed=1).sum() == 20  # longer than the recording: wraps around
    with pytest.raises(ConfigInvalid, match="expert id 3 >= g=2"):
        routing.group_sizes(8, 2, seed=0)


@pytest.mark.parametrize(
    "content, message",
    [
        (np.zeros(5, np.int32), r"expected integer expert ids \[T, top_k\]"),
        (np.zeros((2, 2), np.float32), "float32"),
        (np.array([[-1, 0]]), "negative expert id"),
    ],
)
def test_bad_routing_files(tmp_path, content, message):
    path = tmp_path / "bad.npy"
    np.save(path, content)
    with pytest.raises(ConfigInvalid, match=message):
        Routing.parse(str(path))


@pytest.mark.parametrize("text", ["skewed", "zipf:x", "zipf:-1", "missing.npy"])
def test_bad_routing_specs(text):
    with pytest.raises(ConfigInvalid):
        Routing.parse(text)


def test_verification_draws_include_padding_rows_and_an_empty_expert():
    routing = Routing.parse("balanced")
    draws = verification_draws((routing,), 64, 4, seed=0, count=3)
    assert draws[0].tolist() == routing.group_sizes(64, 4, seed=0).tolist()
    assert all(d.sum() < 64 for d in draws[1:])  # rows past sum(group_sizes) exist to be checked
    assert (draws[1] == 0).any()
    with pytest.raises(ConfigInvalid, match="at least two"):
        verification_draws((routing,), 64, 4, seed=0, count=1)


def test_several_routings_parse_in_order_and_each_at_most_once():
    routings = parse_routings(" balanced , zipf:1.2")
    assert [str(r) for r in routings] == ["balanced", "zipf:1.2"]
    with pytest.raises(ConfigInvalid, match="twice"):
        parse_routings("zipf:1.2,zipf:1.2")
    with pytest.raises(ConfigInvalid, match="empty"):
        parse_routings(" , ")
    with pytest.raises(ConfigInvalid, match="zipf exponent"):
        parse_routings("balanced,zipf:x")


def test_several_routings_verify_on_each_timing_draw_then_an_edge_draw():
    routings = parse_routings("balanced,zipf:1.2")
    draws = verification_draws(routings, 64, 4, seed=3, count=2)
    assert len(draws) == 3
    assert draws[0].tolist() == routings[0].group_sizes(64, 4, seed=3).tolist()
    assert draws[1].tolist() == routings[1].group_sizes(64, 4, seed=3).tolist()
    assert draws[2].sum() < 64 and (draws[2] == 0).any()
    described = describe_routings(routings, draws[:2], seed=3)
    assert described["routing"] == "balanced,zipf:1.2"
    assert described["group_sizes"] == [d.tolist() for d in draws[:2]]


def test_a_capacity_keeps_a_skewed_draw_skewed_with_at_most_that_many_rows_an_expert():
    # A router's draw (the decode block: 8 tokens x top_k 4 over 16 experts): at most 8 rows an expert.
    for routing in ("zipf:2", "balanced", "zipf:0"):
        sizes = Routing.parse(routing).group_sizes(32, 16, seed=3, capacity=8)
        assert sizes.sum() == 32 and sizes.max() <= 8 and sizes.dtype == np.int32
    skewed = Routing.parse("zipf:2").group_sizes(32, 16, seed=3, capacity=8)
    assert sorted(skewed)[-2:] == [8, 8]  # the largest experts stay full
    # Below the capacity nothing moves: the draw is the one without it.
    assert np.array_equal(
        Routing.parse("zipf:0").group_sizes(32, 16, seed=1, capacity=32),
        Routing.parse("zipf:0").group_sizes(32, 16, seed=1),
    )
    rng = np.random.default_rng(0)
    assert capped(np.array([4, 0, 1, 1]), 2, rng).tolist() in ([2, 1, 2, 1], [2, 2, 1, 1], [2, 1, 1, 2])
    assert capped(np.array([4, 0, 1, 1]), 2, rng, empty=1).tolist() in ([2, 0, 2, 2],)
    with pytest.raises(ConfigInvalid, match="7 rows do not fit 3 experts of at most 2"):
        capped(np.array([4, 0, 3]), 2, rng)


def test_a_routers_verification_draws_route_every_row_within_the_capacity():
    routings = parse_routings("zipf:1.2")
    draws = verification_draws(routings, 24, 8, seed=0, count=3, capacity=4)
    assert len(draws) == 3
    assert all(d.sum() == 24 and d.max() <= 4 for d in draws)  # no row left out
    assert (draws[1] == 0).sum() >= 1  # an edge draw leaves an expert empty where the rest hold every row
    # top_k == E: every token takes every expert, so no expert can be left empty.
    full = verification_draws(routings, 12, 4, seed=0, count=2, capacity=3)
    assert all(d.tolist() == [3, 3, 3, 3] for d in full)
