"""`moetune worker` that holds its candidates after the first few until the test lets them go.

A test that stops a running job (cancel, SIGKILL, SIGTERM) must find the job's sweep still running when it
acts, however slow the machine: with this entry point the first `HOLD_AFTER_ENV` candidates (default 1) run
and are recorded (the test's sign that the job runs), and the next one waits until the file named by
`RELEASE_ENV` exists or the process is interrupted (the KeyboardInterrupt that the worker's job heartbeat
raises in the main thread once it sees a cancel, tuner/job_runner.py). Nothing else can end the sweep.

    python -c "import tests.queue.held_worker as w; w.main()" worker --inline ...
"""

from __future__ import annotations

import os
import time

from moetune.tuner.candidate import CandidateRunner

HOLD_AFTER_ENV = "MOETUNE_TEST_HOLD_AFTER"
RELEASE_ENV = "MOETUNE_TEST_RELEASE"
# A safety net only: a test still waiting after this long has failed on its own timeouts already.
HOLD_S = 600.0

_evaluate = CandidateRunner.evaluate
_evaluated = 0


def _held_evaluate(self, task):
    global _evaluated
    _evaluated += 1
    if _evaluated > int(os.environ.get(HOLD_AFTER_ENV, "1")):
        release = os.environ.get(RELEASE_ENV)
        deadline = time.monotonic() + HOLD_S
        while not (release and os.path.exists(release)) and time.monotonic() < deadline:
            time.sleep(0.05)  # the heartbeat thread's interrupt_main() raises here
    return _evaluate(self, task)


def main() -> None:
    from moetune.cli import main as cli_main

    CandidateRunner.evaluate = _held_evaluate
    cli_main()
