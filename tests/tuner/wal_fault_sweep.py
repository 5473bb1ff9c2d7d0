"""A sweep whose SQLite -wal and -shm stop taking writes after its third trial (chattr +i), run as a child
process by test_cli_tune_faults.py: what that used to end in, SIGBUS in SQLite's checkpoint on close,
would take a test process down with it.

    python -m tests.tuner.wal_fault_sweep DB_FILE

Simulated workers in-process (tests/tuner/sim_backend.py); the exit code is `moetune tune`'s.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from moetune.cli import _load_commands, app
from moetune.db.store import Store
from moetune.kernels import registry
from moetune.tuner import sweep_setup
from moetune.tuner.executors import InlineExecutor
from tests.tuner import sim_backend
from tests.tuner.test_driver import DEVICE


def main(path: Path) -> int:
    os.environ[registry.ENV_EXTRA] = "sim=tests.tuner.sim_backend"
    executor = lambda spec, inline=False, on_starting=None: (  # noqa: E731
        InlineExecutor(sim_backend.simulate, DEVICE),
        False,
    )
    sweep_setup.make_executor = executor
    record = Store.record_trial

    def record_then_freeze(self, rec, **kwargs):
        trial_id = record(self, rec, **kwargs)
        if trial_id == 3:
            for side in (f"{path}-wal", f"{path}-shm"):
                os.chmod(side, 0o444)
                if os.access(side, os.W_OK):  # root, whom modes do not stop
                    subprocess.run(["chattr", "+i", side], check=True)
        return trial_id

    Store.record_trial = record_then_freeze
    _load_commands()
    args = ["tune", "--db", f"sqlite:///{path}", "--no-baseline", "--problem", "m=8,k=64,n=64,g=4"]
    return app(args + ["--backend", "sim"], standalone_mode=False) or 0


if __name__ == "__main__":
    try:
        sys.exit(main(Path(sys.argv[1])))
    except SystemExit:
        raise
    except BaseException as e:  # the exit code of typer.Exit
        sys.exit(getattr(e, "exit_code", 1))
