"""The winners matrix: a row per GPU model, model and backend, a column per token bucket T, and in each
cell every active winner there with its speedup over the heuristic default and over XLA's ragged_dot.

The speedups are the sweep report's (tuner/report.py over tuner/decided.py): re-timed against re-timed
where the other config was a finalist of the decision, else sweep median against sweep median, each
marked with which it is. A winner maps to a model through the problems the model YAMLs plan
(configs/models): a problem that several models plan shows under each; one no model plans shows under
"other", at its sweep's T where the sweep recorded one, else under its rows m.
"""

from __future__ import annotations

import dataclasses
import functools
from typing import Any

from moetune.kernels.problem import GROUPED_MATMUL
from moetune.tuner import report
from moetune.tuner.decided import Compared
from moetune.tuner.listings.tokens import SweepTokens

OTHER = "other"


@dataclasses.dataclass(frozen=True)
class Entry:
    """One winner in a cell."""

    part: str  # gate_up / down for a model's problem, else the problem's shape
    vs_heuristic: Compared | None
    vs_xla: Compared | None
    sweep_id: int | None = None  # the sweep and trial that decided it (None: imported from a pack)
    trial_id: int | None = None

    def text(self) -> str:
        return f"{self.part}: {_speedup(self.vs_heuristic)} heuristic, {_speedup(self.vs_xla)} xla"


@dataclasses.dataclass(frozen=True)
class Matrix:
    rows: list[tuple[str, str, str]]  # (GPU kind, model, backend), sorted
    columns: list[str]  # "T=8", ..., then "m=..." for problems with no known T
    cells: dict[tuple[tuple[str, str, str], str], list[Entry]]


def _speedup(compared: Compared | None) -> str:
    if compared is None or compared.ratio is None:
        return "-"
    kind = "re-timed" if compared.basis == "retimed" else "sweep"
    return f"{compared.ratio:.2f}x ({kind})"


class _SweepPlaces:
    """(model, part, T) of a problem as the sweep that planned it labelled it ("<model> <part> T=<n>"),
    each sweep read once: a model tuned from a config.json (hf:) or a YAML path, which no shipped model
    file plans, is named as its sweep named it rather than "other"."""

    def __init__(self, store: Any) -> None:
        self.store = store
        self._by_sweep: dict[int, dict[str, tuple[str, str, int]]] = {}

    def __call__(self, sweep_id: int | None, key: str) -> tuple[str, str, int] | None:
        if sweep_id is None:
            return None
        if sweep_id not in self._by_sweep:
            self._by_sweep[sweep_id] = self._read(sweep_id)
        return self._by_sweep[sweep_id].get(key)

    def _read(self, sweep_id: int) -> dict[str, tuple[str, str, int]]:
        from moetune.kernels.errors import MoetuneError
        from moetune.tuner.plan import PlannedProblem

        try:
            spec = self.store.get_sweep(sweep_id).spec
        except MoetuneError:
            return {}
        places: dict[str, tuple[str, str, int]] = {}
        for item in (spec.get("problems") if isinstance(spec, dict) else None) or ():
            try:
                planned = PlannedProblem.from_dict(item)
            except (KeyError, TypeError, ValueError, MoetuneError):  # a sweep not planned by `tune`
                continue
            words = planned.label.split()
            if planned.tokens is None or len(words) < 3 or not words[-1].startswith("T="):
                continue  # a --problem's label names no model
            places.setdefault(planned.problem.key, (" ".join(words[:-2]), words[-2], planned.tokens))
        return places


@functools.cache  # the shipped model files do not change while a server runs
def _model_index() -> dict[str, list[tuple[str, str, int]]]:
    """Problem key -> (model, part, T) for every problem a shipped model plans; a fused gate_up also under
    its plain GEMM, the op a backend without the fused kernel tunes instead (plan.for_backend)."""
    from moetune.tuner.plan import load_model, shipped_model_names

    index: dict[str, list[tuple[str, str, int]]] = {}
    for name in shipped_model_names():
        for planned in load_model(name).problems():
            part = planned.label.split()[-2]  # "<model> <part> T=<tokens>"
            entry = (name, part, planned.tokens)
            problem = planned.problem
            keys = {problem.key, dataclasses.replace(problem, op=GROUPED_MATMUL).key}
            for key in keys:
                index.setdefault(key, []).append(entry)
    return index


def _bucket_order(column: str) -> tuple[int, int]:
    kind, _, value = column.partition("=")
    return (0 if kind == "T" else 1, int(value))


def build(store: Any) -> Matrix:
    index = _model_index()
    tokens = SweepTokens(store)
    planned_by = _SweepPlaces(store)
    by_sweep: dict[int, dict[str, Any]] = {}  # sweep id -> problem key -> the report's data of it
    cells: dict[tuple[tuple[str, str, str], str], list[Entry]] = {}
    for row in store.winners(active_only=True):
        data = None
        if row.sweep_id is not None:  # None: imported from a config pack, nothing to compare with
            if row.sweep_id not in by_sweep:
                _, problems, _ = report.collect(store, row.sweep_id, studies=False)
                by_sweep[row.sweep_id] = {d.problem.key: d for d in problems}
            data = by_sweep[row.sweep_id].get(row.problem.key)
        # The report compares the current winner of the sweep's device: this row, checked all the same.
        same = data is not None and data.winner is not None and data.winner.id == row.id
        vs_heuristic = data.vs_heuristic if same else None
        vs_xla = data.vs_baseline if same else None
        p = row.problem
        places = index.get(p.key)
        if places is None and (named := planned_by(row.sweep_id, p.key)) is not None:
            places = [named]
        if places is None:
            known = tokens(row.sweep_id, p.key)
            places = [(OTHER, f"{p.op} m={p.m},k={p.k},n={p.n},g={p.g}", known)]
        for model, part, bucket_tokens in places:
            column = f"T={bucket_tokens}" if bucket_tokens is not None else f"m={p.m}"
            key = ((row.device_kind, model, row.backend), column)
            entry = Entry(part, vs_heuristic, vs_xla, sweep_id=row.sweep_id, trial_id=row.trial_id)
            cells.setdefault(key, []).append(entry)
    rows = sorted({r for r, _ in cells}, key=lambda r: (r[0], r[1] == OTHER, r[1], r[2]))
    columns = sorted({c for _, c in cells}, key=_bucket_order)
    return Matrix(rows, columns, cells)
