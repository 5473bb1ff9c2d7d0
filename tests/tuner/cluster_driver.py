"""A sweep's driver in a process of its own, for tests that look at its local Ray cluster from outside,
and kill it:

    python -m tests.tuner.cluster_driver OUT.json                 # start a cluster, report, wait
    python -m tests.tuner.cluster_driver OUT.json tune ARGS...    # run `moetune tune ARGS...` here

Without a command it starts a local cluster as a sweep does (ray_pool.connect), runs one task so that a
worker is up, writes OUT and prints "ready", then waits for its stdin to close and disconnects. With
`tune` it runs the real command line in this process and writes OUT just before the sweep's executor
closes, while its workers are alive.

OUT holds what the cluster's processes show (command line, environment, listening TCP sockets) and what
Ray recorded (its job, actor and worker tables). The cluster's processes are those below this one and
those that carry MARK_ENV, which the test sets on this process and which Ray's processes inherit: a
process that left the tree is found by its mark, and one whose environment cannot be read (Ray's agents
write their process title over it) by its place in the tree.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

MARK_ENV = "MOETUNE_TEST_CLUSTER_MARK"


def evidence() -> dict:
    import psutil  # Ray ships it, and this process has imported Ray
    import ray
    from ray.core.generated import gcs_pb2

    mark = os.environ[MARK_ENV]
    below = {p.pid for p in psutil.Process().children(recursive=True)}
    processes = []
    for process in psutil.process_iter():
        try:
            environ = process.environ()
            if environ.get(MARK_ENV) != mark and process.pid not in below:
                continue
            listening = [
                [s.laddr.ip, s.laddr.port]
                for s in process.net_connections(kind="tcp")
                if s.status == psutil.CONN_LISTEN
            ]
            processes.append(
                {
                    "pid": process.pid,
                    "name": process.name(),
                    "cmdline": process.cmdline(),
                    "environ": environ,
                    "listening": listening,
                }
            )
        except (psutil.NoSuchProcess, psutil.AccessDenied):
            continue
    # Ray's internal accessor: the GCS tables as stored, every field (entrypoint, runtime_env, metadata).
    accessor = ray._private.state.state._connect_and_get_accessor()
    jobs = accessor.get_job_table(skip_submission_job_info_field=False, skip_is_running_tasks_field=True)
    tables = {
        "jobs": [str(gcs_pb2.JobTableData.FromString(row)) for row in jobs],
        "actors": [
            str(gcs_pb2.ActorTableData.FromString(row)) for row in accessor.get_actor_table(None, None)
        ],
        "workers": [str(gcs_pb2.WorkerTableData.FromString(row)) for row in accessor.get_worker_table()],
    }
    return {"driver": os.getpid(), "processes": processes, "tables": tables}


def _write(out: Path) -> None:
    out.write_text(json.dumps(evidence()))


def _pid() -> int:
    return os.getpid()


def _hold(out: Path) -> None:
    from moetune.tuner import ray_pool

    ray_pool.connect(num_cpus=1)
    import ray  # after connect(), as in a sweep: moetune sets Ray's settings before Ray is imported

    ray.get(ray.remote(_pid).remote())
    _write(out)
    print("ready", flush=True)
    sys.stdin.read()
    ray_pool.disconnect()


def _tune(out: Path, args: list[str]) -> None:
    from moetune import cli
    from moetune.tuner import ray_pool

    close = ray_pool.RayExecutor.close

    def report_then_close(self):
        _write(out)
        close(self)

    ray_pool.RayExecutor.close = report_then_close
    sys.argv = ["moetune", *args]  # what Ray records as the job's entrypoint, as for the installed command
    cli.main()


if __name__ == "__main__":
    out, *command = sys.argv[1:]
    if command:
        _tune(Path(out), command)
    else:
        _hold(Path(out))
