"""The sweep loop: one central driver asks strategies, hands tasks to an executor and writes every
result to the store the moment it arrives (so a killed driver loses nothing that finished).

    for each problem: strategy warm-started (heuristic, current winner, winners of neighbouring M) and
                      told every config already done on this device and kernel source (never re-timed)
    loop:   fill the executor's free slots: an XLA baseline per problem, then configs the strategies
            propose (within the per-problem budget and the sweep's minutes)
            wait for results -> record each trial at once -> tell its strategy
            a problem whose search is over -> re-time its finalists interleaved -> promote or keep

A compile-only sweep (a target this machine lacks) runs the same loop with CompileOnlyTasks: statuses
ok / pruned / compile_error and the binaries' facts, recorded under a stand-in fingerprint, no timing.

Everything that touches the world (store, executor, clock, progress display) is injected, so the same
loop runs on a Ray cluster or synchronously in-process with a simulated runner.
"""

from __future__ import annotations

import dataclasses
import math
import time
import uuid
from collections.abc import Callable
from typing import Any

from moetune.kernels import registry
from moetune.kernels.config import KernelConfig
from moetune.kernels.device import DeviceFingerprint
from moetune.kernels.errors import Unsupported
from moetune.tuner import finalists, strategies, summary
from moetune.tuner.plan import PlannedProblem
from moetune.tuner.problem_run import Known, ProblemRun
from moetune.tuner.progress import NullProgress, Progress, Snapshot
from moetune.tuner.routing import describe_routings, parse_routings, verification_draws
from moetune.tuner.spec import SweepSpec
from moetune.tuner.summary import SweepOutcome
from moetune.tuner.tasks import (
    OK,
    CandidateResult,
    CandidateTask,
    CompileOnlyTask,
    Result,
    RetimeResult,
    RetimeTask,
    canonical,
)
from moetune.tuner.warm_start import BASELINE_BACKEND, baseline_config, warm_start_configs


@dataclasses.dataclass
class _Pending:
    run: ProblemRun
    kind: str  # candidate | baseline | retime
    config: KernelConfig | None = None
    finalists: list[finalists.Finalist] = dataclasses.field(default_factory=list)


def largest_first(runs: list[ProblemRun]) -> list[ProblemRun]:
    """The order in which problems get free workers: most FLOPs first (plan order among equals).

    Large problems' trials hold the device longest (timing and references scale with M; a T=16384 trial
    of the Mixtral sweep held the H200 for 0.3-1.6 s, a T=1 trial for ~0.08 s), so starting them first lets
    the small problems' compile-bound trials fill the workers around them instead of leaving a tail of
    large problems queueing for the lane at the end (longest-processing-time-first scheduling). On two
    H200s the plan's small-first order left the T=16384 problems to start last and finish 10 s after
    every other problem.
    """
    return sorted(runs, key=lambda run: -run.problem.flops)


class SweepDriver:
    def __init__(
        self,
        store: Any,
        executor: Any,
        spec: SweepSpec,
        *,
        backend: str,
        progress: Progress | None = None,
        clock: Callable[[], float] = time.monotonic,
        poll_s: float = 0.25,
        compile_target: str | None = None,
        device: DeviceFingerprint | None = None,
    ) -> None:
        """`compile_target` makes this a compile-only sweep for that target, recorded under `device` (a
        stand-in fingerprint); otherwise trials are recorded under the executor's device."""
        self.store = store
        self.executor = executor
        self.spec = spec
        self.backend = registry.get(backend)
        self.progress = progress or NullProgress()
        self.clock = clock
        self.poll_s = poll_s
        self.compile_target = compile_target
        self.device = device or executor.device
        self.routings = parse_routings(spec.routing)
        self._pending: dict[str, _Pending] = {}
        self.sweep_id: int | None = None
        self._recorded = 0
        self._started = 0.0
        self.runs: list[ProblemRun] = []
        self._schedule: list[ProblemRun] = []

    # --- setup ------------------------------------------------------------------------------------

    def prepare(self, planned: list[PlannedProblem], sweep_id: int | None) -> list[ProblemRun]:
        """Build each problem's state: space, warm-started strategy, what is known already."""
        self.runs = [self._prepare_one(p, sweep_id) for p in planned]
        self._schedule = largest_first(self.runs)
        return self.runs

    def _prepare_one(self, planned: PlannedProblem, sweep_id: int | None) -> ProblemRun:
        problem, device = planned.problem, self.device
        source_hash = self.backend.source_hash()
        try:
            self.backend.check(problem)
            search_space = self.backend.search_space(problem, device).restricted(self.spec.space)
            space = strategies.CandidateSpace(search_space, problem, device)
        except Unsupported as e:
            return ProblemRun(planned, self.backend, source_hash, None, phase="skipped", skipped=str(e))
        winner = self.store.current_winner(
            fingerprint_hash=device.hash, backend=self.backend.name, problem_key=problem.key
        )
        warm, heuristic = warm_start_configs(self.store, self.backend, problem, device, search_space.seeds)
        baseline = baseline_config() if self.spec.baseline and not self.compile_target else None
        if baseline is not None and self.backend.name == BASELINE_BACKEND:
            warm.append(self.backend.config_cls.from_dict(baseline))  # the baseline is one of the candidates
        if self.spec.space:  # a narrowed space means only those configs, warm starts included
            warm = [config for config in warm if search_space.contains(config)]
        strategy = strategies.get(self.spec.strategy)(space, seed=self.spec.seed, warm_start=warm)
        timing = [r.group_sizes(problem.m, problem.g, seed=self.spec.seed) for r in self.routings]
        draws = verification_draws(
            self.routings, problem.m, problem.g, seed=self.spec.seed, count=self.spec.verify_draws
        )
        run = ProblemRun(
            planned,
            self.backend,
            source_hash,
            strategy,
            timing_sizes=tuple(tuple(int(x) for x in sizes) for sizes in timing),
            verify_sizes=tuple(tuple(int(x) for x in d) for d in draws),
            routing=describe_routings(self.routings, timing, seed=self.spec.seed)
            | {"verify_draws": len(draws)},
            budget=self.spec.budget,
            heuristic=heuristic.to_dict() if heuristic is not None else None,
            valid_count=len(space.valid()),
            pruned_count=len(space.pruned()),
        )
        if winner is not None and winner.source_hash == source_hash:
            run.winner_trial_id = winner.trial_id
        done = self.store.done_configs(
            fingerprint_hash=device.hash,
            backend=self.backend.name,
            source_hash=source_hash,
            problem_key=problem.key,
        )
        for row in done.values():
            run.observe(Known(row.id, row.config, row.status, row.median_s, row.sweep_id))
            if self.compile_target and row.details and row.details.get("binary_hash"):
                run.binaries.setdefault(row.details["binary_hash"], row.id)
        run.used = sum(1 for k in run.known.values() if sweep_id is not None and k.sweep_id == sweep_id)
        if baseline is not None and self.backend.name != BASELINE_BACKEND:
            self._prepare_baseline(run, baseline)
        return run

    def _prepare_baseline(self, run: ProblemRun, config: dict[str, Any]) -> None:
        xla = registry.get(BASELINE_BACKEND)
        done = self.store.done_configs(
            fingerprint_hash=self.device.hash,
            backend=xla.name,
            source_hash=xla.source_hash(),
            problem_key=run.problem.key,
        )
        row = done.get(canonical(config))
        if row is not None:
            run.baseline = Known(row.id, row.config, row.status, row.median_s, row.sweep_id)
        else:
            run.baseline_wanted = True

    # --- the loop ---------------------------------------------------------------------------------

    def run(self, planned: list[PlannedProblem], *, sweep_id: int) -> SweepOutcome:
        self.sweep_id = sweep_id
        self._started = self.clock()
        self.prepare(planned, sweep_id)
        status = "failed"
        try:
            self.progress.start(self._snapshot())
            while not all(r.phase in ("done", "skipped") for r in self.runs):
                self._fill()
                if not self.executor.in_flight():
                    self._fill()  # a problem changed phase (e.g. its search ended): its next step goes now
                    if not self.executor.in_flight() and not all(
                        r.phase in ("done", "skipped") for r in self.runs
                    ):
                        stuck = [
                            f"{r.label} ({r.phase})" for r in self.runs if r.phase not in ("done", "skipped")
                        ]
                        raise RuntimeError(
                            f"sweep {sweep_id} stalled with nothing to run: {', '.join(stuck)}"
                        )
                    continue
                for result in self.executor.wait(self.poll_s):
                    self._handle(result)
                self.progress.update(self._snapshot())
            status = "done"
        except KeyboardInterrupt:
            status = "interrupted"
            raise
        finally:
            self.store.finish_sweep(sweep_id, status)
            self.progress.close(self._snapshot())
        return self.outcome(status)

    def _past_deadline(self) -> bool:
        return self.spec.minutes is not None and self.clock() - self._started > self.spec.minutes * 60

    def _fill(self) -> None:
        for run in self._schedule:
            if run.phase in ("done", "skipped"):
                continue
            if run.baseline_wanted and run.baseline_task is None and self._has_capacity():
                if self._past_deadline():
                    run.baseline_wanted = False
                else:
                    self._submit_baseline(run)
            if run.phase == "search":
                self._search(run)
            if run.phase == "retime_wanted" and self._has_capacity():
                self._submit_retime(run)
            if run.phase == "settled" and run.baseline_task is None:
                run.phase = "done"

    def _has_capacity(self) -> bool:
        return self.executor.capacity() > 0

    def _search(self, run: ProblemRun) -> None:
        asked, room = 0, 0
        if not self._past_deadline():
            # Each problem searching gets an equal share of the workers (one each, when there are more
            # problems than workers): a worker's first trial of a problem makes its inputs and compiles
            # their checks (a median 19 s on the H200, against 1.4-4 s for its later trials of the same
            # problem; benchmarks/README.md), and affinity (ray_pool) keeps a problem on the workers that
            # hold it. A model-based strategy also learns between smaller batches.
            searching = sum(1 for r in self.runs if r.phase == "search")
            share = -(-self.executor.workers // max(1, searching))
            room = min(self.executor.capacity(), share - len(run.in_flight))
            left = run.budget_left()
            if left is not None:
                room = min(room, left)
            if room > 0:
                for config in run.strategy.ask(room):
                    self._submit_candidate(run, config)
                    asked += 1
        if run.in_flight:
            return
        # Nothing proposed although there was room: the strategy has nothing more for this problem.
        stalled = room > 0 and asked == 0
        finished = self._past_deadline() or run.budget_left() == 0 or run.strategy.exhausted or stalled
        if finished:
            self._end_search(run)

    def _end_search(self, run: ProblemRun) -> None:
        if self.compile_target:  # nothing was timed: nothing to re-time or promote
            counts = run.counts(self.sweep_id) if self.sweep_id is not None else {}
            worth = counts.get(OK, 0) - run.duplicates
            run.decision = finalists.Decision(
                None,
                f"compile-only for {self.compile_target}: {worth} worth timing, {run.duplicates} duplicates",
            )
            run.phase = "settled"
            return
        candidates = [finalists.Finalist(k.trial_id, k.config, k.median_s) for k in run.ok_trials()]
        winner = self._winner_finalist(run)
        if winner is not None:
            candidates = [c for c in candidates if c.config != winner.config]
        chosen = finalists.choose(candidates, winner, self.spec.finalists)
        if not candidates:
            if winner is not None:
                reason = "winner kept: no challenger"
            elif not run.known and self._past_deadline():
                reason = "not reached: the sweep's --minutes ran out first (finish it with --resume)"
            else:
                reason = "no candidate passed verification"
            run.decision = finalists.Decision(None, reason)
            run.phase = "settled"
            return
        run.phase = "retime_wanted"
        run.retime_finalists = chosen

    def _winner_finalist(self, run: ProblemRun) -> finalists.Finalist | None:
        if run.winner_trial_id is None:
            return None
        winner = self.store.current_winner(
            fingerprint_hash=self.device.hash, backend=self.backend.name, problem_key=run.problem.key
        )
        if winner is None:
            return None
        return finalists.Finalist(winner.trial_id, winner.config, winner.median_s or math.inf, is_winner=True)

    # --- tasks ------------------------------------------------------------------------------------

    def _new_id(self) -> str:
        return uuid.uuid4().hex[:12]

    def _submit_candidate(self, run: ProblemRun, config: KernelConfig) -> None:
        if self.compile_target:
            task = CompileOnlyTask(
                self._new_id(),
                self.backend.name,
                run.problem,
                config.to_dict(),
                self.compile_target,
                label=f"{run.label} {config}",
            )
        else:
            task = self._candidate_task(run, config)
        run.in_flight[task.task_id] = config
        self._pending[task.task_id] = _Pending(run, "candidate", config)
        self.executor.submit(task)

    def _candidate_task(self, run: ProblemRun, config: KernelConfig) -> CandidateTask:
        return CandidateTask(
            self._new_id(),
            self.backend.name,
            run.problem,
            config.to_dict(),
            run.timing_sizes,
            run.verify_sizes,
            runs=self.spec.runs,
            seed=self.spec.seed,
            label=f"{run.label} {config}",
        )

    def _submit_baseline(self, run: ProblemRun) -> None:
        task = CandidateTask(
            self._new_id(),
            BASELINE_BACKEND,
            run.problem,
            baseline_config(),
            run.timing_sizes,
            run.verify_sizes,
            runs=self.spec.runs,
            seed=self.spec.seed,
            label=f"{run.label} baseline xla ragged_dot",
            timer_backend=self.backend.name,
        )
        run.baseline_task = task.task_id
        self._pending[task.task_id] = _Pending(run, "baseline")
        self.executor.submit(task)

    def _submit_retime(self, run: ProblemRun) -> None:
        chosen = run.retime_finalists
        task = RetimeTask(
            self._new_id(),
            self.backend.name,
            run.problem,
            tuple(f.config for f in chosen),
            run.timing_sizes,
            rounds=self.spec.retime_rounds,
            seed=self.spec.seed,
            label=f"{run.label} re-timing {len(chosen)} finalists",
        )
        run.retime_task = task.task_id
        run.phase = "retime"
        self._pending[task.task_id] = _Pending(run, "retime", finalists=chosen)
        self.executor.submit(task)

    # --- results ----------------------------------------------------------------------------------

    def _handle(self, result: Result) -> None:
        pending = self._pending.pop(result.task_id)
        run = pending.run
        if pending.kind == "retime":
            self._settle(run, pending.finalists, result)
            return
        if pending.kind == "baseline":
            xla = registry.get(BASELINE_BACKEND)
            trial_id = self._record(run, xla.name, xla.source_hash(), baseline_config(), result, run.routing)
            run.baseline = Known(trial_id, baseline_config(), result.status, result.median_s, self.sweep_id)
            run.baseline_task = None
            run.baseline_wanted = False
            return
        config = run.in_flight.pop(result.task_id)
        routing, details = run.routing, None
        if self.compile_target:
            # No routing exists without a device; the details keep the binary's facts instead, and which
            # earlier trial compiled to the same binary (time only that one).
            routing, details = None, dict(result.static or {"target": self.compile_target})
            duplicate_of = run.binaries.get(details.get("binary_hash"))
            if duplicate_of is not None:
                details["duplicate_of"] = duplicate_of
                run.duplicates += 1
        trial_id = self._record(
            run, self.backend.name, run.source_hash, config.to_dict(), result, routing, details
        )
        if self.compile_target and result.static and result.static.get("binary_hash"):
            run.binaries.setdefault(result.static["binary_hash"], trial_id)
        run.used += 1
        run.known[canonical(config.to_dict())] = Known(
            trial_id, config.to_dict(), result.status, result.median_s, self.sweep_id
        )
        run.strategy.tell(config, result.median_s if result.status == OK else None)

    def _record(
        self,
        run: ProblemRun,
        backend: str,
        source_hash: str,
        config: dict,
        result: CandidateResult,
        routing: dict | None,
        details: dict | None = None,
    ) -> int:
        from moetune.db.records import TrialRecord

        if result.phases:  # where the worker's time went (benchmarks/sweep_timeline.py reads them)
            details = (details or {}) | {"phases": dict(result.phases)}
        if result.lane:  # which device timed it (sweep_timeline.py's per-lane busy time)
            details = (details or {}) | {"lane": result.lane}
        record = TrialRecord(
            sweep_id=self.sweep_id,
            device=self.device,
            backend=backend,
            family=run.problem.op,
            source_hash=source_hash,
            problem=run.problem,
            config=config,
            status=result.status,
            samples_s=result.samples_s,
            median_s=result.median_s,
            compile_s=result.compile_s,
            verify_error=result.verify_error,
            error=result.error,
            host=result.host,
            worker=result.worker,
            routing=routing,
            started_at=result.started_at,
            finished_at=result.finished_at,
            details=details,
        )
        trial_id = self.store.record_trial(record)
        self._recorded += 1
        return trial_id

    def _settle(self, run: ProblemRun, chosen: list[finalists.Finalist], result: RetimeResult) -> None:
        decision = finalists.decide(chosen, result.samples_s, self.spec.min_gain)
        if result.error and decision.promote is None:
            decision = dataclasses.replace(decision, reason=f"{decision.reason} ({result.error})")
        if decision.promote is not None:
            self.store.promote(decision.promote.trial_id, reason=f"sweep {self.sweep_id}: {decision.reason}")
        run.decision = decision
        run.retime_task = None
        run.phase = "settled"

    # --- reporting --------------------------------------------------------------------------------

    def _snapshot(self) -> Snapshot:
        counts: dict[str, int] = {}
        best = []
        planned = 0
        for run in self.runs:
            if run.phase == "skipped":
                continue
            for status, count in run.counts(self.sweep_id).items():
                counts[status] = counts.get(status, 0) + count
            top = run.best()
            best.append(
                (
                    run.label,
                    top.median_s if top else None,
                    run.median_of(run.heuristic),
                    top.config if top else None,
                )
            )
            planned += run.used + len(run.in_flight) + _remaining_estimate(run)
        return Snapshot(
            elapsed_s=self.clock() - self._started,
            recorded=self._recorded,
            planned=planned,
            counts=counts,
            lanes=self.executor.lanes(),
            best=best,
            workers=self.executor.workers,
        )

    def outcome(self, status: str) -> SweepOutcome:
        baseline = baseline_config() if self.spec.baseline and not self.compile_target else None
        return summary.outcome(
            self.store,
            self.runs,
            sweep_id=self.sweep_id,
            device=self.device,
            backend=self.backend.name,
            status=status,
            elapsed_s=self.clock() - self._started,
            recorded=self._recorded,
            baseline=baseline if self.backend.name == BASELINE_BACKEND else None,
            compile_target=self.compile_target,
        )


def _remaining_estimate(run: ProblemRun) -> int:
    """Trials this problem will still run: the budget left, or (about) the untried valid configs."""
    if run.phase != "search":
        return 0
    untried = max(0, run.valid_count - len(run.known) - len(run.in_flight))
    left = run.budget_left()
    return untried if left is None else min(left, untried)
