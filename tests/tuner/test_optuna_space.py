"""The one encoding of a search space into Optuna distributions: ranked for the TPE sampler, by value for
the report and the export."""

from __future__ import annotations

import pytest
from optuna.distributions import CategoricalDistribution, IntDistribution

from moetune.tuner.optuna_space import OptunaSpace

DOMAINS = {
    "block_n": (64, 128, 256),  # ordered, not evenly spaced
    "stages": (2, 3, 4, 5, 6),  # evenly spaced
    "epi_m": (64, 128),  # evenly spaced, step 64
    "split_k": (1,),
    "order": ("m", "n", "expert"),
    "persistent": (True, False),
}
CONFIG = {"block_n": 256, "stages": 5, "epi_m": 128, "split_k": 1, "order": "expert", "persistent": False}


def test_ranked_places_ordered_numbers_by_position_for_the_sampler():
    space = OptunaSpace(DOMAINS, ranked=True)
    assert space.distributions == {
        "block_n": IntDistribution(0, 2),
        "stages": IntDistribution(0, 4),
        "epi_m": IntDistribution(0, 1),
        "split_k": IntDistribution(0, 0),
        "order": CategoricalDistribution(["m", "n", "expert"]),
        "persistent": CategoricalDistribution([True, False]),
    }
    encoded = space.encode(CONFIG)
    assert encoded == {
        "block_n": 2,
        "stages": 3,
        "epi_m": 1,
        "split_k": 0,
        "order": "expert",
        "persistent": False,
    }
    assert space.decode(encoded) == CONFIG


def test_by_value_keeps_every_value_as_it_is():
    space = OptunaSpace(DOMAINS, ranked=False)
    assert space.distributions == {
        "block_n": CategoricalDistribution([64, 128, 256]),
        "stages": IntDistribution(2, 6),
        "epi_m": IntDistribution(64, 128, step=64),
        "split_k": IntDistribution(1, 1),
        "order": CategoricalDistribution(["m", "n", "expert"]),
        "persistent": CategoricalDistribution([True, False]),
    }
    assert space.encode(CONFIG) == CONFIG
    for name, dist in space.distributions.items():
        assert dist.to_external_repr(dist.to_internal_repr(CONFIG[name])) == CONFIG[name]


@pytest.mark.parametrize("ranked", [True, False])
def test_a_value_outside_the_domain_or_a_missing_parameter_is_refused(ranked):
    space = OptunaSpace(DOMAINS, ranked=ranked)
    with pytest.raises(ValueError, match=r"block_n=512 is not one of \[64, 128, 256\]"):
        space.encode(CONFIG | {"block_n": 512})
    with pytest.raises(ValueError, match="order='k'"):
        space.encode(CONFIG | {"order": "k"})
    older = {k: v for k, v in CONFIG.items() if k != "stages"}
    with pytest.raises(KeyError):
        space.encode(older)
    assert "stages" not in space.encode(older, partial=True)
