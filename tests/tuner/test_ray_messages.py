"""Ray's driver prints the raylet's error messages ("A worker died or was killed ...") from a thread of its
own; `tune --json` and every other command's stdout carry their result alone, so those go to stderr."""

from __future__ import annotations

import json

from moetune.tuner import ray_pool


def test_the_raylets_messages_go_to_stderr(capsys):
    import ray._private.worker as ray_worker

    ray_pool.route_ray_messages()
    ray_pool.route_ray_messages()  # once is enough; twice changes nothing
    message = "A worker died or was killed while executing a task by an unexpected system error."
    ray_worker.print_to_stdstream({"lines": [message], "pid": "raylet", "is_err": False}, ignore_prefix=False)
    print(json.dumps({"sweep_id": 1}))
    out, err = capsys.readouterr()
    assert json.loads(out) == {"sweep_id": 1}
    assert message in err
