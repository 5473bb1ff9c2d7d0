"""The cost model's calibration replays: every fitted constant is re-derived from the measurements its
calibration file holds, with the fit the file names, and must lie within the file's stated tolerance of
the result; the model plans with the file's values; a Hopper part without a file of its own falls back to
the H200's and says so."""

from __future__ import annotations

import statistics

import pytest

from moetune.kernels.api import Explanation
from moetune.kernels.backends.mosaic_gpu import calibration, cost_model
from moetune.kernels.backends.mosaic_gpu.config import MosaicGpuConfig
from moetune.kernels.device import DeviceFingerprint
from moetune.kernels.problem import Problem

H200 = DeviceFingerprint("NVIDIA H200", "gpu", 132, 0, "9.0", "", "", "", "")
CAL = calibration.load("NVIDIA H200")
FITTED = sorted(name for name, c in CAL.constants.items() if c["evidence"] is not None)
# What the model's fitted constants were before the calibration file: every one of them is in it.
MODEL_CONSTANTS = (
    "LAUNCH_S", "PROLOGUE_S", "REDUCTION_S", "PAD_S", "WALK_S_PER_GROUP", "EPILOGUE_S", "CTA_S",
    "WGMMA_ISSUE_CYCLES", "PLAIN_MMA_EFFICIENCY", "M_SPLIT_MMA_EFFICIENCY", "PROMOTE_OPS", "TALL_PROMOTION",
    "STEP_WAIT_S", "ZERO_FILL_COST", "SMOOTH_MAX_POWER", "TIE",
)  # fmt: skip


def estimate(problem: dict, config: dict, constants: dict[str, float]) -> float:
    """The model's seconds for one timed side, with `constants` in place of the model's own."""
    saved = {name: getattr(cost_model, name) for name in constants}
    try:
        for name, value in constants.items():
            setattr(cost_model, name, value)
        return cost_model.estimate(Problem(**problem), MosaicGpuConfig(**config), H200).seconds
    finally:
        for name, value in saved.items():
            setattr(cost_model, name, value)


def replay(cal: calibration.Calibration, name: str) -> tuple[float, float]:
    """(the constant's value, what its fit re-derives from the file's measurements)."""
    fitted = calibration.refit(cal, name, estimate)
    assert fitted is not None, f"{name}: the fit has no root in its bracket"
    return cal.value(name), fitted


@pytest.mark.parametrize("name", FITTED)
def test_each_fitted_constant_re_derives_from_its_measurements_within_its_tolerance(name):
    value, fitted = replay(CAL, name)
    evidence = CAL.constants[name]["evidence"]
    tolerance = evidence["tolerance"]
    assert fitted / tolerance <= value <= fitted * tolerance, (name, value, fitted, tolerance)
    # The file's own record of the fit is what the replay gives (a refit must be written back).
    assert evidence["fitted"] == pytest.approx(fitted, rel=1e-3)


@pytest.mark.parametrize(
    ("name", "neutral"), [("ZERO_FILL_COST", 1.0), ("STEP_WAIT_S", 0.0), ("PROMOTE_OPS", 0.0)]
)
def test_a_neutral_value_does_not_survive_the_replay(name, neutral):
    """Setting a fitted constant to the value that switches its term off fails the replay above."""
    constants = {k: dict(v) for k, v in CAL.constants.items()}
    constants[name]["value"] = neutral
    edited = calibration.Calibration(CAL.device_kind, CAL.file, constants, CAL.measurements, CAL.requested)
    value, fitted = replay(edited, name)
    tolerance = constants[name]["evidence"]["tolerance"]
    assert not fitted / tolerance <= value <= fitted * tolerance


def test_the_model_plans_with_the_files_values():
    assert set(MODEL_CONSTANTS) <= set(CAL.constants)
    for name in CAL.constants:
        assert getattr(cost_model, name) == CAL.value(name), name


def test_constants_without_evidence_say_why():
    for name, constant in CAL.constants.items():
        if constant["evidence"] is None:
            assert constant["reason"].strip(), name
    # The three that once could be set neutral without any test failing: two are fitted now.
    assert {"ZERO_FILL_COST", "STEP_WAIT_S"} <= set(FITTED)


def test_measurements_are_recorded_whole():
    """Each measurement names its date, GPU, versions and command, and each timed side its problem,
    config and raw samples, whose median is the one the fits use."""
    evidence = [CAL.constants[name]["evidence"] for name in FITTED]
    used = {pair["measurement"] for e in evidence for pair in calibration.pairs(e)}
    assert used <= set(CAL.measurements)
    for key, m in CAL.measurements.items():
        assert m["date"] and m["gpu"] == CAL.device_kind and m["versions"] and m["command"], key
        for label, side in m["sides"].items():
            Problem(**side["problem"])
            MosaicGpuConfig(**side["config"])
            assert len(side["samples"]) >= 5, (key, label)
            assert side["median"] == pytest.approx(statistics.median(side["samples"]), rel=1e-4), (key, label)


def test_an_unknown_hopper_part_plans_with_the_h200s_file_and_says_so():
    h100 = calibration.load("NVIDIA H100 80GB HBM3")
    assert h100.fallback and h100.device_kind == "NVIDIA H200" and h100.constants == CAL.constants
    assert "no calibration for NVIDIA H100 80GB HBM3" in h100.describe()
    assert not CAL.fallback and "no calibration" not in CAL.describe()
    assert calibration.file_name("NVIDIA H200") == "nvidia_h200.json"


def test_explain_shows_which_calibration_the_heuristic_planned_with():
    from moetune.kernels.backends.mosaic_gpu import BACKEND
    from moetune.kernels.backends.xla import BACKEND as XLA

    h100 = DeviceFingerprint("NVIDIA H100 80GB HBM3", "gpu", 132, 0, "9.0", "", "", "", "")
    assert BACKEND.heuristic_basis(h100) == calibration.describe("NVIDIA H100 80GB HBM3")
    assert "no calibration" not in BACKEND.heuristic_basis(H200)
    assert XLA.heuristic_basis(H200) is None  # a backend folder without a calibration module
    problem = Problem("grouped_matmul", m=4096, k=2048, n=768, g=128)
    explanation = Explanation(
        problem, h100, "mosaic_gpu", "backend argument", BACKEND.heuristic(problem, h100), "heuristic", None,
        (), (), heuristic_basis=BACKEND.heuristic_basis(h100),
    )  # fmt: skip
    assert "source:   heuristic (cost model calibrated on NVIDIA H200" in str(explanation)
    assert "no calibration for NVIDIA H100 80GB HBM3" in explanation.to_dict()["heuristic_basis"]


def test_hardware_facts_taken_from_measurements_hold_their_evidence():
    """hardware.py keeps its facts (the kernel source hash covers it); those that are measurements or
    bounds from them are recorded with their evidence in the calibration file, and must equal it."""
    import math

    from moetune.kernels.backends.mosaic_gpu import hardware, tiling

    facts = hardware.ARCHS["9.0"]
    values = {
        'PART_HBM_BYTES_PER_S["NVIDIA H200"]': hardware.PART_HBM_BYTES_PER_S["NVIDIA H200"],
        'ARCHS["9.0"].l2_bytes_per_s': facts.l2_bytes_per_s,
        'ARCHS["9.0"].sustained_clock_hz': facts.sustained_clock_hz,
        'ARCHS["9.0"].memory_latency_s': facts.memory_latency_s,
    }
    assert set(values) == set(CAL.hardware)
    for name, value in values.items():
        fact = CAL.hardware[name]
        assert fact["value"] == value, name
        assert fact["evidence"] is not None or fact["reason"].strip(), name
    # HBM: the largest read rate the rows measured, rounded up to 0.1 TB/s.
    hbm = CAL.hardware['PART_HBM_BYTES_PER_S["NVIDIA H200"]']
    fastest = max(hbm["evidence"]["read_GBps"].values()) * 1e9
    assert hbm["value"] == math.ceil(fastest / 1e11) * 1e11
    assert fastest <= hbm["value"] <= fastest * hbm["evidence"]["tolerance"]
    # L2: at least the operand tiles the measured config copied into shared memory over its time.
    l2 = CAL.hardware['ARCHS["9.0"].l2_bytes_per_s']
    side = CAL.measurements[l2["evidence"]["measurement"]]["sides"][l2["evidence"]["side"]]
    problem, config = Problem(**side["problem"]), MosaicGpuConfig(**side["config"])
    geo = tiling.geometry(problem, config)
    items = cost_model.estimate(problem, config, H200).items
    copied = items * (geo.cta_m + tiling.weight_tiles(problem) * geo.cta_n) * problem.k / geo.split_k * 2
    bound = copied / (side["median"] * 1e-3)
    assert bound <= l2["value"] <= bound * l2["evidence"]["tolerance"]
