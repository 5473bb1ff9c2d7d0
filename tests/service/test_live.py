"""Live progress: the driver publishes its progress to the sweep's row as it goes (planned, done, failed,
best so far, ETA, lanes), a job's output is kept in the database (bounded), and the dashboard's pages
show both and refresh them without a reload (live.js, served by the app)."""

from __future__ import annotations

import sys

import pytest

from moetune.db import open_store, progress
from moetune.db.errors import DatabaseError
from moetune.kernels import registry
from moetune.service.app import create_app
from moetune.service.settings import ServiceSettings
from moetune.tuner.job_log import JobLog
from moetune.tuner.progress import Progress, Snapshot
from moetune.tuner.progress_db import Published, as_json
from tests.service.local_client import local_client
from tests.tuner.sim_sweeps import run_sim_sweep

TOKEN = "t" * 24
PROBLEMS = ["m=64,k=64,n=64,g=2,dtype=bf16", "m=128,k=64,n=64,g=2,dtype=bf16"]


@pytest.fixture
def sim():
    from tests.tuner import sim_backend

    sim_backend.COSTS.clear()
    registry.register("sim", "tests.tuner.sim_backend")
    try:
        yield
    finally:
        registry.unregister("sim")
        sim_backend.COSTS.clear()


def _client(url: str):
    return local_client(create_app(ServiceSettings(db_url=url, token=TOKEN)))


def test_a_sweep_publishes_its_progress_and_its_last_figures_stay(sqlite_url, sim):
    with open_store(sqlite_url) as store:
        sweep_id = run_sim_sweep(store, PROBLEMS, costs={2: None})  # tile 2: a wrong result
        published, age = store.sweep_progress(sweep_id)
        trials = store.trials(sweep_id=sweep_id)
    assert published["final"] is True and age is not None and age >= 0
    # The candidates' trials (each problem's baseline, also recorded, is not one of them).
    assert 0 < published["done"] <= len(trials) and published["planned"] >= published["done"]
    assert published["done"] == sum(published["counts"].values()) == published["ok"] + published["failed"]
    assert published["failed"] == published["counts"]["wrong_result"] > 0
    assert [p["label"] for p in published["problems"]] and len(published["best"]) == len(PROBLEMS)
    assert {"lanes", "eta_s", "rate_per_min", "elapsed_s"} <= set(published)


class _Store:
    def __init__(self, fail: bool = False) -> None:
        self.published: list[dict] = []
        self.fail = fail

    def publish_progress(self, sweep_id: int, data: dict) -> None:
        if self.fail:
            raise DatabaseError("the database is locked")
        self.published.append(data)


def _snapshot(done: int) -> Snapshot:
    return Snapshot(10.0, done, 10, {"ok": done}, {"gpu0": "idle"}, [])


def test_publications_are_throttled_and_the_last_one_is_final():
    now = [0.0]
    store = _Store()
    shown = []

    class Shown(Progress):
        def update(self, snapshot: Snapshot) -> None:
            shown.append(snapshot.done)

    published = Published(Shown(), store, 1, every_s=2.0, clock=lambda: now[0])
    published.start(_snapshot(0))
    for done in range(1, 6):
        now[0] += 0.5
        published.update(_snapshot(done))
    published.close(_snapshot(6))
    assert shown == [1, 2, 3, 4, 5]  # the display sees every snapshot
    assert [(p["done"], p["final"]) for p in store.published] == [(0, False), (4, False), (6, True)]


def test_a_publication_that_fails_never_stops_the_sweep(caplog):
    published = Published(Progress(), _Store(fail=True), 1)
    published.start(_snapshot(0))
    published.close(_snapshot(1))
    assert caplog.text.count("cannot publish its progress") == 1


def test_the_progress_json_is_bounded():
    from moetune.tuner.progress import ProblemProgress
    from moetune.tuner.progress_db import MAX_ROWS

    problems = [ProblemProgress(f"p{i}", 0, 1, "waiting") for i in range(MAX_ROWS + 5)]
    data = as_json(Snapshot(1.0, 0, 10, {}, {}, [], problems=problems))
    assert len(data["problems"]) == MAX_ROWS and data["more_rows"] == 5


def test_a_jobs_log_keeps_its_newest_lines(sqlite_url):
    with open_store(sqlite_url) as store:
        job_id = store.submit_job({"problems": PROBLEMS})
        for start in range(0, 30, 10):
            batch = [f"line {start + i}" for i in range(10)]
            store._run(lambda s, batch=batch: progress.append_lines(s, job_id, batch, keep=15), write=True)
        assert [line for _, line in store.job_log(job_id)] == [f"line {i}" for i in range(15, 30)]
        store.append_job_log(job_id, ["x" * 5000])
        assert len(store.job_log(job_id)[-1][1]) == progress.LINE_LENGTH


def test_stderr_during_a_job_goes_to_its_log_without_control_sequences(sqlite_url):
    with open_store(sqlite_url) as store:
        job_id = store.submit_job({"problems": PROBLEMS})
        log = JobLog(store, job_id, flush_s=0.05)
        with log.capturing():
            log.line("claimed by h:1 (attempt 1)")
            sys.stderr.write("\x1b[1mbold\x1b[0m progress 1/4\r")
            sys.stderr.write("progress 2/4\nhalf a ")
            print("line", file=sys.stderr)
            print("no newline at the end", end="", file=sys.stderr)
        lines = [line for _, line in store.job_log(job_id)]
    assert lines[0].endswith("claimed by h:1 (attempt 1)")
    assert lines[1:] == ["bold progress 1/4", "progress 2/4", "half a line", "no newline at the end"]


def test_lines_a_busy_database_did_not_take_are_written_with_the_next_batch():
    class Flaky:
        def __init__(self) -> None:
            self.calls, self.lines = 0, []

        def append_job_log(self, job_id: int, lines: list[str]) -> None:
            self.calls += 1
            if self.calls == 1:
                raise DatabaseError("busy")
            self.lines += lines

    store = Flaky()
    log = JobLog(store, 1)
    log.write("a\nb\n")
    log.flush()
    log.write("c\n")
    log.flush()
    assert store.lines == ["a", "b", "c"]


def test_the_pages_show_progress_jobs_and_log_lines_and_refresh_them(sqlite_url, sim):
    with open_store(sqlite_url) as store:
        sweep_id = run_sim_sweep(store, PROBLEMS)
        job_id = store.submit_job({"problems": PROBLEMS})
        store.append_job_log(job_id, ["worker said <b>hello</b>"])
    with _client(sqlite_url) as c:
        page = c.get(f"/sweeps/{sweep_id}").text
        assert 'data-poll="/parts/sweeps/' in page and '<script src="/static/live.js" defer>' in page
        part = c.get(f"/parts/sweeps/{sweep_id}").text
        assert "data-final" in part and "trials (" in part and "failed" in part
        jobs = c.get("/jobs").text
        assert f'href="/jobs/{job_id}"' in jobs and 'data-poll="/parts/jobs' in jobs
        job = c.get(f"/jobs/{job_id}").text
        assert "worker said &lt;b&gt;hello&lt;/b&gt;" in job and "<b>hello" not in job
        assert c.get(f"/parts/jobs/{job_id}").status_code == 200
        assert c.get("/jobs/999").status_code == 404
        script = c.get("/static/live.js")
        assert script.status_code == 200 and script.headers["content-type"].startswith("text/javascript")
        api = c.get(f"/api/sweeps/{sweep_id}/progress").json()
        assert api["progress"]["final"] is True and api["age_s"] >= 0
        assert [entry["line"] for entry in c.get(f"/api/jobs/{job_id}/log").json()] == [
            "worker said <b>hello</b>"
        ]
        assert c.get("/api/jobs/999/log").status_code == 404


def test_a_sweep_without_published_progress_says_so(sqlite_url):
    with open_store(sqlite_url) as store:
        sweep_id = store.create_sweep(backend="xla", strategy="grid", spec={}, host="h", user="u")
    with _client(sqlite_url) as c:
        assert "no progress published yet" in c.get(f"/parts/sweeps/{sweep_id}").text
        assert c.get(f"/api/sweeps/{sweep_id}/progress").json() == {"progress": None, "age_s": None}
