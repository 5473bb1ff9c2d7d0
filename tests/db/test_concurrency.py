"""Many writers at once: 8 processes x 500 trials each into one database, each with its own Store."""

from __future__ import annotations

import concurrent.futures
import multiprocessing

import pytest
from db_factories import GATE_UP, H200, trial

from moetune.db import open_store

WRITERS = 8
TRIALS_EACH = 500


def _write_trials(url: str, sweep_id: int | None, writer: int, count: int) -> list[int]:
    with open_store(url) as store:
        return [
            store.record_trial(
                trial(
                    sweep_id=sweep_id, config={"block_m": 8 * (i + 1), "writer": writer}, worker=f"w{writer}"
                )
            )
            for i in range(count)
        ]


def _promote_all(url: str, trial_ids: list[int]) -> None:
    with open_store(url) as store:
        for trial_id in trial_ids:
            store.promote(trial_id, reason="race")


def _open_and_count(url: str) -> int:
    with open_store(url) as store:
        store.record_miss(device=H200, backend="fake", problem=GATE_UP)
        return len(store.trials())


def _pool(workers: int) -> concurrent.futures.ProcessPoolExecutor:
    # forkserver: every writer is a fresh process with no state from pytest, like a separate tuner
    # process, but the imports (jax among them) happen once in the server rather than once per writer.
    context = multiprocessing.get_context("forkserver")
    context.set_forkserver_preload(["moetune.db", "db_factories"])
    return concurrent.futures.ProcessPoolExecutor(workers, mp_context=context)


@pytest.mark.slow
def test_parallel_writers_lose_nothing(db_url):
    with open_store(db_url) as store:
        sweep_id = store.create_sweep(backend="fake", strategy="grid", spec={}, host="h", user="u")
    with _pool(WRITERS) as pool:
        futures = [pool.submit(_write_trials, db_url, sweep_id, w, TRIALS_EACH) for w in range(WRITERS)]
        ids = [i for f in futures for i in f.result()]  # re-raises any writer's error
    assert len(ids) == len(set(ids)) == WRITERS * TRIALS_EACH
    with open_store(db_url) as store:
        rows = store.trials(sweep_id=sweep_id)
    assert len(rows) == WRITERS * TRIALS_EACH
    assert {(r.worker, r.config["block_m"]) for r in rows} == {
        (f"w{w}", 8 * (i + 1)) for w in range(WRITERS) for i in range(TRIALS_EACH)
    }


def test_fresh_database_opened_by_many_processes_at_once_is_migrated_once(db_url):
    with _pool(4) as pool:
        assert list(pool.map(_open_and_count, [db_url] * 4)) == [0] * 4
    with open_store(db_url) as store:
        assert [m.count for m in store.misses()] == [4]


def test_parallel_promotions_of_one_key_keep_one_active_winner(db_url):
    """Racing promotions of the same (fingerprint, backend, problem): none fails, none is lost."""
    with open_store(db_url) as store:
        ids = [store.record_trial(trial(config={"block_m": 8 * (i + 1)})) for i in range(4 * 20)]
    with _pool(4) as pool:
        list(pool.map(_promote_all, [db_url] * 4, [ids[w::4] for w in range(4)]))
    with open_store(db_url) as store:
        history = store.winners(active_only=False)
    assert len(history) == len(ids) and sorted(w.trial_id for w in history) == ids
    assert [w.state for w in history].count("active") == 1
