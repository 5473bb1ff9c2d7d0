"""A database for the dashboard tests: sweeps of the simulated backend ("sim", registered while the
context lasts) on two GPU kinds, winners of a shipped model's problems and of one no model plans, a stale
winner, dispatch misses, and markup in values that come from the database."""

from __future__ import annotations

import contextlib
import dataclasses
from collections.abc import Iterator

from moetune.db import open_store
from moetune.kernels import registry
from moetune.tuner.plan import load_model
from tests.db import db_factories
from tests.tuner import sim_backend
from tests.tuner.sim_sweeps import DEVICE, run_sim_sweep

OTHER_GPU = dataclasses.replace(DEVICE, device_kind="Simulated GPU B", core_count=8)
# Markup in a device kind: shown on every page; unescaped, it would load an image and open an alert.
MARKUP = '<img src="missing.png" onerror="alert(1)">'
MARKUP_GPU = dataclasses.replace(DEVICE, device_kind=MARKUP, core_count=16)
# tile 3 fastest; 2 and 4 fail verification; 1 is the heuristic default.
COSTS = {1: 2e-3, 2: None, 3: 1e-3, 4: None, 5: 1.5e-3, 6: 1.2e-3, 7: 1.1e-3, 8: 1.3e-3}
UNPLANNED = "m=8,k=64,n=64,g=4"  # no shipped model plans k=64,n=64


def _text(problem) -> str:
    p = problem
    return f"m={p.m},k={p.k},n={p.n},g={p.g},dtype={p.lhs_dtype}"


def tiny(part: str, tokens: int):
    """The problem the shipped model `tiny` plans for `part` at T=`tokens`."""
    label = f"tiny {part} T={tokens}"
    return next(p.problem for p in load_model("tiny").problems() if p.label == label)


@dataclasses.dataclass(frozen=True)
class Seeded:
    url: str
    sweeps: dict[str, int]  # "first" (DEVICE), "second" (OTHER_GPU), "markup" (MARKUP_GPU), "dead"
    stale_trial: int  # the trial of the stale winner


@contextlib.contextmanager
def seeded(url: str) -> Iterator[Seeded]:
    registry.register("sim", "tests.tuner.sim_backend")
    sim_backend.COSTS.clear()
    try:
        with open_store(url) as store:
            first = run_sim_sweep(store, [_text(tiny("down", 8)), UNPLANNED], costs=COSTS)
            second = run_sim_sweep(store, [_text(tiny("gate_up", 8))], costs=COSTS, device=OTHER_GPU)
            markup = run_sim_sweep(store, [UNPLANNED], costs=COSTS, device=MARKUP_GPU)
            # Marked running, never heartbeating: shown as dead.
            spec = {"spec": {}, "problems": [], "device": DEVICE.to_dict()}
            dead = store.create_sweep(backend="sim", strategy="grid", spec=spec, host="h", user="u")
            store.record_trial(
                db_factories.trial(
                    config={"tile": 5},
                    status="crashed",
                    median_s=None,
                    error=MARKUP,
                    device=DEVICE,
                    backend="sim",
                    problem=tiny("down", 8),
                    sweep_id=first,
                )
            )
            # Tuned with an older kernel source than the backend's now ("sim-v1"): stale.
            old = db_factories.trial(
                config={"tile": 6},
                device=DEVICE,
                backend="sim",
                source_hash="sim-v0",
                problem=tiny("down", 64),
            )
            stale_trial = store.record_trial(old)
            store.promote(stale_trial, reason=f"promoted by hand {MARKUP}")
            for problem, count in ((tiny("down", 64), 1), (tiny("gate_up", 64), 3)):
                for _ in range(count):
                    store.record_miss(device=DEVICE, backend="sim", problem=problem)
            store.record_miss(device=MARKUP_GPU, backend="sim", problem=tiny("down", 8))
        yield Seeded(url, {"first": first, "second": second, "markup": markup, "dead": dead}, stale_trial)
    finally:
        registry.unregister("sim")
        sim_backend.COSTS.clear()
