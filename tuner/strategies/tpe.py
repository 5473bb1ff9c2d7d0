"""Optuna's TPE sampler through ask/tell, driven centrally: the driver asks a batch, dispatches it to
workers and tells results as they come back (Optuna's constant liar keeps a batch from piling onto one
spot while its results are pending).

Encoding (tuner/optuna_space.py, ranked): an ordered numeric domain (block sizes 64, 128, 256) becomes
the integer index into the domain, so TPE's kernels see that 128 lies between 64 and 256; any other
domain (strategy names, flags) is categorical. A failed candidate, or a point a constraint forbids, is
told as +inf, so TPE learns to avoid the region rather than ignoring the trial.

Discrete spaces run out: when TPE keeps proposing configs that were already tried, the strategy falls
back to unseen valid configs in a seeded random order, so a batch is always filled while any remain. A
space too large to enumerate (CandidateSpace.enumerable) is never exhausted: its fallback draws random
points instead, and the sweep's budget or time limit ends the search.
"""

from __future__ import annotations

import math
import random
from collections.abc import Iterable, Sequence
from typing import Any

from moetune.kernels.config import KernelConfig
from moetune.kernels.errors import ConfigInvalid
from moetune.tuner.optuna_space import OptunaSpace
from moetune.tuner.strategies.base import CandidateSpace, Strategy

# Proposals one `ask` may waste on known or forbidden points before the fallback fills the batch: each
# proposal costs milliseconds, and near the end of a small space almost every proposal is a repeat.
MAX_WASTED_PROPOSALS = 10
# Random points one fallback may draw from a space too large to enumerate, per config it wants.
FALLBACK_DRAWS = 200
FAILED = math.inf


class TpeStrategy(Strategy):
    name = "tpe"

    def __init__(
        self,
        space: CandidateSpace,
        *,
        seed: int = 0,
        warm_start: Sequence[KernelConfig] = (),
        startup_trials: int = 10,
    ) -> None:
        import optuna

        super().__init__(space, seed=seed, warm_start=warm_start)
        optuna.logging.set_verbosity(optuna.logging.WARNING)
        self._optuna = optuna
        self._encoding = OptunaSpace(space.domains, ranked=True)
        self._distributions = self._encoding.distributions
        sampler = optuna.samplers.TPESampler(seed=seed, n_startup_trials=startup_trials, multivariate=True)
        self._study = optuna.create_study(direction="minimize", sampler=sampler)
        self._asked: dict[KernelConfig, Any] = {}  # config -> its open optuna trial
        self._fallback: list[KernelConfig] | None = None
        self._valid: frozenset[KernelConfig] | None = None
        self._seen_valid = 0
        self._rng = random.Random(seed)

    def _record(self, config: KernelConfig, value: float | None) -> None:
        """Add a result for a config that TPE did not propose (warm start, fallback, earlier sweep)."""
        try:
            params = self._encoding.encode(config.to_dict())
        except (KeyError, ValueError):  # a stored config from an older space: nothing TPE can place
            return
        trial = self._optuna.trial.create_trial(
            params=params, distributions=self._distributions, value=FAILED if value is None else value
        )
        self._study.add_trial(trial)

    def tell(self, config: KernelConfig, value: float | None) -> None:
        super().tell(config, value)
        trial = self._asked.pop(config, None)
        if trial is None:
            self._record(config, value)
        else:
            self._study.tell(trial, FAILED if value is None else value)

    def ask(self, n: int) -> list[KernelConfig]:
        taken = self._take_unseen(self._warm, n)
        wasted = 0
        while len(taken) < n and not self.exhausted and wasted < MAX_WASTED_PROPOSALS:
            trial = self._study.ask(self._distributions)
            try:
                config = self.space.make(self._encoding.decode(trial.params))
            except ConfigInvalid:
                self._study.tell(trial, FAILED)
                wasted += 1
                continue
            if config in self._seen:
                # Known already: tell TPE nothing new (a failed state is ignored by the sampler).
                self._study.tell(trial, state=self._optuna.trial.TrialState.FAIL)
                wasted += 1
                continue
            self._mark_seen(config)
            self._asked[config] = trial
            taken.append(config)
        if len(taken) < n:
            taken += self._take_unseen(self._fallback_order(n - len(taken)), n - len(taken))
        return taken

    def _fallback_order(self, wanted: int) -> Iterable[KernelConfig]:
        if not self.space.enumerable:
            return self.space.sample(self._rng, FALLBACK_DRAWS * wanted)
        if self._fallback is None:
            self._fallback = list(self.space.valid())
            random.Random(self.seed).shuffle(self._fallback)
        return self._fallback

    def _valid_set(self) -> frozenset[KernelConfig]:
        if self._valid is None:
            self._valid = frozenset(self.space.valid())
        return self._valid

    def _mark_seen(self, config: KernelConfig) -> None:
        if self.space.enumerable and config not in self._seen and config in self._valid_set():
            self._seen_valid += 1
        super()._mark_seen(config)

    @property
    def exhausted(self) -> bool:
        return self.space.enumerable and self._seen_valid >= len(self._valid_set())
