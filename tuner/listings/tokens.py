"""T (tokens) of a problem, as the sweep that planned it recorded it.

m counts rows, T * top_k for a model's MoE layer (each token goes to top_k experts); T is known only
where a model planned the problem, and the sweep that tuned it recorded it.
"""

from __future__ import annotations

from typing import Any

from moetune.kernels.errors import MoetuneError


class SweepTokens:
    """T of a problem as the sweep that planned it recorded it, each sweep read once."""

    def __init__(self, store: Any) -> None:
        self.store = store
        self._by_sweep: dict[int, dict[str, int]] = {}

    def __call__(self, sweep_id: int | None, problem_key: str) -> int | None:
        if sweep_id is None:
            return None
        if sweep_id not in self._by_sweep:
            self._by_sweep[sweep_id] = self._read(sweep_id)
        return self._by_sweep[sweep_id].get(problem_key)

    def _read(self, sweep_id: int) -> dict[str, int]:
        from moetune.tuner.plan import PlannedProblem

        try:
            spec = self.store.get_sweep(sweep_id).spec
        except MoetuneError:
            return {}
        tokens: dict[str, int] = {}
        planned_problems = spec.get("problems") if isinstance(spec, dict) else None
        for item in planned_problems or ():
            try:
                planned = PlannedProblem.from_dict(item)
            except (KeyError, TypeError, ValueError, MoetuneError):  # a sweep not planned by `tune`
                continue
            if planned.tokens is not None:
                tokens.setdefault(planned.problem.key, planned.tokens)
        return tokens
