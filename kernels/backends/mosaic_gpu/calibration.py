"""The cost model's fitted constants per GPU, read from calibration/<part>.json beside this module.

Each file holds the measurements themselves (date, GPU, versions, command, each timed side's problem and
config, raw samples and median) and, per constant, its value and the measurements and named fit it comes
from, or `"evidence": null` with the reason there is none. tests/kernels/backends/mosaic_gpu/
test_calibration.py re-derives every fitted constant from its file (`refit`), so a value cannot drift from
its evidence. A Hopper part without a file of its own plans with the H200's, and `describe` says so.
"""

from __future__ import annotations

import dataclasses
import functools
import json
import re
import statistics
from collections.abc import Callable
from importlib import resources
from typing import Any

DEFAULT_KIND = "NVIDIA H200"


@dataclasses.dataclass(frozen=True)
class Calibration:
    device_kind: str  # the part the measurements were taken on
    file: str
    constants: dict[str, dict[str, Any]]
    measurements: dict[str, dict[str, Any]]
    requested: str  # the part asked for; differs from device_kind on a fallback
    # hardware.py's measured facts and the bounds it takes from measurements, with their evidence: they
    # stay in hardware.py, which the kernel source hash covers, and the replay test holds them equal.
    hardware: dict[str, dict[str, Any]] = dataclasses.field(default_factory=dict)

    @property
    def fallback(self) -> bool:
        return self.requested != self.device_kind

    def value(self, name: str) -> float:
        return self.constants[name]["value"]

    def describe(self) -> str:
        """One line for explain: which file the heuristic's cost model plans with, and why."""
        line = f"cost model calibrated on {self.device_kind} ({self.file}"
        return line + (f"; no calibration for {self.requested})" if self.fallback else ")")


def file_name(device_kind: str) -> str:
    """'NVIDIA H200' -> 'nvidia_h200.json'."""
    return re.sub(r"[^a-z0-9]+", "_", device_kind.lower()).strip("_") + ".json"


@functools.cache
def load(device_kind: str = DEFAULT_KIND) -> Calibration:
    """The part's calibration, else the H200's (a Hopper part without its own file plans with it)."""
    folder = resources.files(__package__).joinpath("calibration")
    name = file_name(device_kind)
    path = folder.joinpath(name)
    if not path.is_file():
        name = file_name(DEFAULT_KIND)
        path = folder.joinpath(name)
    data = json.loads(path.read_text())
    return Calibration(
        device_kind=data["device_kind"],
        file=name,
        constants=data["constants"],
        measurements=data["measurements"],
        requested=device_kind,
        hardware=data.get("hardware", {}),
    )


def describe(device_kind: str) -> str:
    return load(device_kind).describe()


# --- Fits: what the replay test (and a refit in the lab) runs -------------------------------------------


def bisect(error: Callable[[float], float], lo: float, hi: float, steps: int = 60) -> float | None:
    """The root of `error` in [lo, hi], or None where it keeps one sign there."""
    e_lo, e_hi = error(lo), error(hi)
    if e_lo == 0:
        return lo
    if e_lo * e_hi > 0:
        return None
    for _ in range(steps):
        mid = (lo + hi) / 2
        e_mid = error(mid)
        if e_mid * e_lo <= 0:
            hi = mid
        else:
            lo, e_lo = mid, e_mid
    return (lo + hi) / 2


def pairs(evidence: dict[str, Any]) -> list[dict[str, str]]:
    """A "difference" fit's pairs of timed sides: one (measurement, slower, faster), or a list of them."""
    if "pairs" in evidence:
        return list(evidence["pairs"])
    return [{key: evidence[key] for key in ("measurement", "slower", "faster")}]


def refit(
    cal: Calibration,
    name: str,
    estimate: Callable[[dict, dict, dict[str, float]], float],
    keep: Callable[[dict[str, str]], bool] | None = None,
) -> float | None:
    """Re-derive constant `name` from its evidence with its named fit. `estimate(problem, config,
    constants)` is the model's seconds for a side's problem and config (dicts as the file holds them)
    with `constants` overriding the model's; every other constant stays at its value in `cal`.

    "difference": per pair, the constant's root over its bracket of the model's slower-minus-faster
    estimate against the measured median difference; over several pairs, the median of their roots
    (`keep` picks the pairs to fit, e.g. all but one shape's for a leave-one-out)."""
    evidence = cal.constants[name]["evidence"]
    if evidence is None:
        return None
    if evidence["fit"] != "difference":
        raise ValueError(f"{name}: unknown fit {evidence['fit']!r}")
    held = {k: c["value"] for k, c in cal.constants.items()}
    roots = []
    for pair in pairs(evidence):
        if keep is not None and not keep(pair):
            continue
        measurement = cal.measurements[pair["measurement"]]
        slower, faster = measurement["sides"][pair["slower"]], measurement["sides"][pair["faster"]]
        scale = 1e-3 if measurement["unit"] == "ms" else 1.0
        measured = (slower["median"] - faster["median"]) * scale

        def error(value: float, slower=slower, faster=faster, measured=measured) -> float:
            consts = dict(held, **{name: value})
            gap = estimate(slower["problem"], slower["config"], consts) - estimate(
                faster["problem"], faster["config"], consts
            )
            return gap - measured

        root = bisect(error, *evidence["bracket"])
        if root is not None:
            roots.append(root)
    return statistics.median(roots) if roots else None
