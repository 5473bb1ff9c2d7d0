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

Faults end honestly. A task that fails for reasons outside its config gets one more attempt on another
worker (the executor has replaced the one that died): a crashed candidate (a kernel that really crashes
crashes twice; a worker killed from outside passes the second time; the trial's details keep the first
attempt), and a re-timing whose finalists all came back untimed. A re-timing that fails twice leaves
its problem without a new winner and the sweep `incomplete` (`--resume` re-times it). A database that
stops accepting writes ends the sweep at once, `failed` where that can still be written. With an
`owner`, the sweep's lease (moetune.db.leases) is kept alive from a background thread; a run whose lease
was taken over stops without writing anything more.

Everything that touches the world (store, executor, clock, progress display) is injected, so the same
loop runs on a Ray cluster or synchronously in-process with a simulated runner.
"""

from __future__ import annotations

import contextlib
import dataclasses
import math
import threading
import time
import uuid
from collections.abc import Callable
from typing import Any

from moetune.db import leases
from moetune.db.errors import DatabaseError, LeaseLost
from moetune.db.leases import Heartbeat, Owner
from moetune.kernels import registry
from moetune.kernels.config import KernelConfig
from moetune.kernels.device import DeviceFingerprint
from moetune.kernels.errors import Unsupported
from moetune.tuner import decided, finalists, strategies, summary
from moetune.tuner.cost_model import CostModel, TrialCost
from moetune.tuner.eta import Eta
from moetune.tuner.plan import PlannedProblem
from moetune.tuner.problem_run import Known, ProblemRun
from moetune.tuner.progress import (
    NullProgress,
    ProblemProgress,
    Progress,
    Snapshot,
    problem_phase,
    setup_rows,
)
from moetune.tuner.progress_db import Published
from moetune.tuner.routing import describe_routings, parse_routings, verification_draws
from moetune.tuner.spec import SweepSpec
from moetune.tuner.summary import SweepOutcome
from moetune.tuner.tasks import (
    CRASHED,
    OK,
    CandidateResult,
    CandidateTask,
    CompileOnlyTask,
    Result,
    RetimeResult,
    RetimeTask,
    Task,
    canonical,
)
from moetune.tuner.warm_start import BASELINE_BACKEND, baseline_config, warm_start_configs


@dataclasses.dataclass
class _Pending:
    run: ProblemRun
    kind: str  # candidate | baseline | retime
    task: Task
    config: KernelConfig | None = None
    finalists: list[finalists.Finalist] = dataclasses.field(default_factory=list)
    first_attempt: CandidateResult | RetimeResult | None = None  # on a second attempt: the first's result

    def first_attempt_details(self) -> dict[str, Any] | None:
        """What the trial's details keep of a first, failed attempt (None when there was none)."""
        first = self.first_attempt
        if not isinstance(first, CandidateResult):
            return None
        times = {
            name: value.isoformat()
            for name in ("started_at", "finished_at")
            if (value := getattr(first, name))
        }
        kept = {"status": first.status, "error": first.error, "host": first.host, "worker": first.worker}
        return {"first_attempt": kept | times}


def _failed_outside_config(result: Result) -> bool:
    """Whether the result may be the worker's fault rather than the config's, so worth one more try: a
    crashed candidate, or a re-timing in which no finalist was timed."""
    if isinstance(result, RetimeResult):
        return not any(result.samples_s)
    return result.status == CRASHED


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
        owner: Owner | None = None,
        costs: CostModel | None = None,
        stop: threading.Event | None = None,
    ) -> None:
        """`compile_target` makes this a compile-only sweep for that target, recorded under `device` (a
        stand-in fingerprint); otherwise trials are recorded under the executor's device. `owner` holds
        the sweep's lease: `run` keeps it alive and finishes the sweep only while it holds it. `costs`
        prices trials for the ETA (default: calibrated from the store's trials). Once `stop` is set, nothing
        new is submitted: the candidates in flight are finished and recorded, then the sweep ends
        interrupted (KeyboardInterrupt), as `moetune worker` stops on SIGTERM."""
        self.store = store
        self.owner = owner
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
        self._costs = costs
        self._stop = stop
        self._eta = Eta(workers=executor.workers, lanes=len(executor.lanes()))

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
        if search_space.baseline is not None:  # what the op replaces is timed first, always (SearchSpace)
            warm.insert(0, search_space.baseline)
        strategy = strategies.get(self.spec.strategy)(space, seed=self.spec.seed, warm_start=warm)
        # An op routing its tokens itself draws each token's choices, at most one per expert (routing.py).
        capacity = problem.spec.expert_capacity(problem)
        timing = [
            r.group_sizes(planned.rows, problem.g, seed=self.spec.seed, capacity=capacity)
            for r in self.routings
        ]
        draws = verification_draws(
            self.routings,
            planned.rows,
            problem.g,
            seed=self.spec.seed,
            count=self.spec.verify_draws,
            capacity=capacity,
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
            valid_count=len(space.valid()) if space.enumerable else None,
            pruned_count=len(space.pruned()) if space.enumerable else None,
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
            kernels = dict((row.details or {}).get("kernels") or [])
            run.observe(Known(row.id, row.config, row.status, row.median_s, row.sweep_id), kernels)
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
        """Run the sweep to its end; its row is finished with the status (also when this raises: failed,
        or interrupted on KeyboardInterrupt), except after LeaseLost. A DatabaseError met while finishing
        a sweep that failed already is left out: the first failure is the one raised."""
        self.sweep_id = sweep_id
        self._started = self.clock()
        # A lost connection (a database server restarting) is retried, by every write and the heartbeat,
        # for as long as the lease stays this process's; the sweep fails only past that.
        reconnect_s, self.store.reconnect_s = self.store.reconnect_s, leases.RECONNECT_S
        # The display it was given, and the same progress in the sweep's row for the dashboard.
        if not isinstance(self.progress, Published):
            self.progress = Published(self.progress, self.store, sweep_id, clock=self.clock)
        heartbeat = self._heartbeat(sweep_id)
        status: str | None = "failed"
        failure: BaseException | None = None
        try:
            if self._costs is None:
                self._costs = CostModel.from_store(self.store, self.backend, self.device, self.spec.runs)
            self.prepare(planned, sweep_id)
            self.progress.start(self._snapshot())
            self._loop(sweep_id, heartbeat)
            status = "incomplete" if any(r.incomplete for r in self.runs) else "done"
        except KeyboardInterrupt as e:
            status, failure = "interrupted", e
            raise
        except LeaseLost as e:
            status, failure = None, e  # the sweep is another process's now: its row is not ours to write
            raise
        except BaseException as e:
            failure = e
            raise
        finally:
            if heartbeat is not None:
                heartbeat.stop()
            self.progress.close(self._snapshot())
            if status is not None:
                self._finish(sweep_id, status, failure)
            self.store.reconnect_s = reconnect_s
        return self.outcome(status)

    def _heartbeat(self, sweep_id: int) -> Heartbeat | None:
        if self.owner is None or not self.store.shared:  # no other process can see a private database
            return None
        owner = self.owner

        def beat() -> bool:
            held = self.store.heartbeat(sweep_id, owner)
            self.store.checkpoint()  # a database file that stopped taking writes is found here
            return held

        heartbeat = Heartbeat(beat, f"sweep {sweep_id}", interval_s=leases.HEARTBEAT_S)
        heartbeat.start()
        return heartbeat

    def _finish(self, sweep_id: int, status: str, failure: BaseException | None) -> None:
        try:
            if failure is None:  # before "done" is written: no sweep ends well with its trials in -wal only
                self.store.checkpoint()
            self.store.finish_sweep(sweep_id, status, owner=self.owner)
        except DatabaseError:
            if failure is not None:
                return  # finishing failed too (the database that failed the sweep): report the first failure
            with contextlib.suppress(DatabaseError):  # failed where that can still be written
                self.store.finish_sweep(sweep_id, "failed", owner=self.owner)
            raise

    def _loop(self, sweep_id: int, heartbeat: Heartbeat | None) -> None:
        while not all(r.phase in ("done", "skipped") for r in self.runs):
            if heartbeat is not None:
                heartbeat.check()  # a lost lease or a database refusing the heartbeat ends the sweep
            if self._stop is not None and self._stop.is_set():
                self._finish_in_flight(heartbeat)
                raise KeyboardInterrupt
            self._fill()
            if not self.executor.in_flight():
                self._fill()  # a problem changed phase (e.g. its search ended): its next step goes now
                if not self.executor.in_flight() and not all(
                    r.phase in ("done", "skipped") for r in self.runs
                ):
                    stuck = [
                        f"{r.label} ({r.phase})" for r in self.runs if r.phase not in ("done", "skipped")
                    ]
                    raise RuntimeError(f"sweep {sweep_id} stalled with nothing to run: {', '.join(stuck)}")
                continue
            for result in self.executor.wait(self.poll_s):
                self._handle(result)
            self.progress.update(self._snapshot())

    def _finish_in_flight(self, heartbeat: Heartbeat | None) -> None:
        while self.executor.in_flight():
            if heartbeat is not None:
                heartbeat.check()
            for result in self.executor.wait(self.poll_s):
                self._handle(result)
            self.progress.update(self._snapshot())

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
            # problem; lab/README.md), and affinity (ray_pool) keeps a problem on the workers that
            # hold it. A model-based strategy also learns between smaller batches.
            searching = sum(1 for r in self.runs if r.phase == "search")
            share = -(-self.executor.workers // max(1, searching))
            room = min(self.executor.capacity(), share - len(run.in_flight))
            left = run.budget_left()
            if left is not None:
                room = min(room, left)
            if room > 0:
                for config in run.strategy.next_configs(room):
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
        self._submit(_Pending(run, "candidate", task, config))

    def _submit(self, pending: _Pending) -> None:
        self._pending[pending.task.task_id] = pending
        cost = self._retime_cost(pending.run) if pending.kind == "retime" else self._trial_cost(pending.run)
        self._eta.started(pending.task.task_id, cost, self.clock(), group=pending.run.problem.key)
        self.executor.submit(pending.task)

    def _trial_cost(self, run: ProblemRun) -> TrialCost:
        cost = self._costs.cost(run.problem)
        return dataclasses.replace(cost, device_s=0.0) if self.compile_target else cost

    def _retime_cost(self, run: ProblemRun) -> TrialCost:
        runs = self.spec.finalists * self.spec.retime_rounds * RetimeTask.runs_per_round
        return self._costs.retime(run.problem, runs)

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
        self._submit(_Pending(run, "baseline", task))

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
        self._submit(_Pending(run, "retime", task, finalists=chosen))

    def _retry(self, pending: _Pending, result: Result) -> bool:
        """Submit the task once more when its first attempt failed outside its config; True if it did.

        The worker that failed is gone (the executor replaced it), so the second attempt runs elsewhere.
        It takes the first one's place, in flight and in the budget: one config, one trial."""
        if pending.first_attempt is not None or not _failed_outside_config(result):
            return False
        task = dataclasses.replace(pending.task, task_id=self._new_id())
        run = pending.run
        if pending.kind == "candidate":
            run.in_flight[task.task_id] = run.in_flight.pop(result.task_id)
        elif pending.kind == "baseline":
            run.baseline_task = task.task_id
        else:
            run.retime_task = task.task_id
        self._submit(dataclasses.replace(pending, task=task, first_attempt=result))
        return True

    # --- results ----------------------------------------------------------------------------------

    def _handle(self, result: Result) -> None:
        pending = self._pending.pop(result.task_id)
        self._eta.finished(result.task_id, self.clock())
        if self._retry(pending, result):
            return
        run = pending.run
        if pending.kind == "retime":
            self._settle(run, pending, result)
            return
        first = pending.first_attempt_details()
        if pending.kind == "baseline":
            xla = registry.get(BASELINE_BACKEND)
            config = baseline_config()
            trial_id = self._record(run, xla.name, xla.source_hash(), config, result, run.routing, first)
            run.baseline = Known(trial_id, config, result.status, result.median_s, self.sweep_id)
            run.baseline_task = None
            run.baseline_wanted = False
            return
        config = run.in_flight.pop(result.task_id)
        routing, details = run.routing, first
        if self.compile_target:
            # No routing exists without a device; the details keep the binary's facts instead, and which
            # earlier trial compiled to the same binary (time only that one).
            routing = None
            details = (first or {}) | dict(result.static or {"target": self.compile_target})
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
        if result.status == OK and result.kernels:
            run.strategy.note_kernels(config, dict(result.kernels))

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

        if result.phases:  # where the worker's time went (lab/bench/sweep_timeline.py reads them)
            details = (details or {}) | {"phases": dict(result.phases)}
        if result.lane:  # which device timed it (sweep_timeline.py's per-lane busy time)
            details = (details or {}) | {"lane": result.lane}
        if result.kernels:  # which of the op's kernels the time went to
            details = (details or {}) | {"kernels": [[name, seconds] for name, seconds in result.kernels]}
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
        # Checked in the write itself: the heartbeat finds a take-over only at its next beat.
        trial_id = self.store.record_trial(record, owner=self.owner)
        self._recorded += 1
        return trial_id

    def _settle(self, run: ProblemRun, pending: _Pending, result: RetimeResult) -> None:
        chosen = pending.finalists
        if pending.first_attempt is not None and _failed_outside_config(result):
            # Twice no finalist timed: no decision can be made. The winner stays; --resume re-times.
            errors = "; ".join(dict.fromkeys(r.error for r in (pending.first_attempt, result) if r.error))
            run.decision = finalists.Decision(None, f"re-timing failed twice, no new winner ({errors})")
            run.incomplete = True
            run.retime_task = None
            run.phase = "settled"
            return
        decision = finalists.decide(chosen, result.samples_s, self.spec.min_gain)
        if result.error and decision.promote is None:
            decision = dataclasses.replace(decision, reason=f"{decision.reason} ({result.error})")
        if decision.promote is not None:
            record = decided.record(
                decision, sweep_id=self.sweep_id, rounds=self.spec.retime_rounds, heuristic=run.heuristic
            )
            reason = f"sweep {self.sweep_id}: {decision.reason}"
            self.store.promote(decision.promote.trial_id, reason=reason, decision=record)
        run.decision = decision
        run.retime_task = None
        run.phase = "settled"

    # --- reporting --------------------------------------------------------------------------------

    def _snapshot(self) -> Snapshot:
        counts: dict[str, int] = {}
        best = []
        planned = 0
        activity = self.executor.activity()
        states = {a.task_id: a.state for a in activity if a.task_id}
        problems = []
        for run in self.runs:
            tasks = [*run.in_flight, *filter(None, (run.baseline_task, run.retime_task))]
            problem_planned = run.used + len(run.in_flight) + _remaining_estimate(run)
            phase = problem_phase(run.phase, tasks, states)
            problems.append(ProblemProgress(run.label, run.used, problem_planned, phase))
            if run.phase == "skipped":
                continue
            for status, count in run.counts(self.sweep_id).items():
                counts[status] = counts.get(status, 0) + count
            best.append(summary.live_row(run, self.sweep_id, self.spec.retime_rounds))
            planned += problem_planned
        now = self.clock()
        return Snapshot(
            elapsed_s=now - self._started,
            recorded=self._recorded,
            planned=planned,
            counts=counts,
            lanes=self.executor.lanes(),
            best=best,
            workers=self.executor.workers,
            estimate_s=self._eta.estimate_s(self._work_left(), elapsed_s=now - self._started, now=now),
            problems=problems,
            setup=setup_rows(activity),
        )

    def _work_left(self) -> list[tuple[TrialCost, float, str]]:
        """The tasks still to submit, priced: candidates, baselines and re-timings."""
        left = []
        for run in self.runs:
            if run.phase in ("skipped", "done"):
                continue
            key = run.problem.key
            left.append((self._trial_cost(run), _remaining_estimate(run), key))
            if run.baseline_wanted and run.baseline_task is None:
                left.append((self._trial_cost(run), 1, key))
            if run.phase in ("search", "retime_wanted") and not self.compile_target:
                left.append((self._retime_cost(run), 1, key))
        return left

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
            rounds=self.spec.retime_rounds,
        )


def _remaining_estimate(run: ProblemRun) -> int:
    """Trials this problem will still run: the budget left, or (about) the untried valid configs (none
    counted in a space too large to enumerate: its time limit ends it)."""
    if run.phase != "search":
        return 0
    left = run.budget_left()
    if run.valid_count is None:
        return left or 0
    untried = max(0, run.valid_count - len(run.known) - len(run.in_flight))
    return untried if left is None else min(left, untried)
