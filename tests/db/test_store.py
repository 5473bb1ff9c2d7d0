"""Store basics on SQLite and PostgreSQL: devices, sweeps, trials, queries, errors."""

from __future__ import annotations

import dataclasses
import datetime
import json
import math

import pytest
from db_factories import GATE_UP, H200, H200_NEW_DRIVER, MI300, set_immutable, trial

from moetune.db import DatabaseError, open_store
from moetune.db import trials as trials_module
from moetune.db.errors import InvalidRecord, RecordNotFound
from moetune.db.leases import Owner
from moetune.db.records import TrialRecord, canonical_config
from tests.pgpass import pgpass_password


def test_ensure_rows_are_idempotent(store):
    assert store.ensure_device(H200) == store.ensure_device(H200)
    assert store.ensure_device(H200) != store.ensure_device(H200_NEW_DRIVER)
    assert store.ensure_kernel("fake", "sm90", "a") == store.ensure_kernel("fake", "sm90", "a")
    assert store.ensure_kernel("fake", "sm90", "a") != store.ensure_kernel("fake", "sm90", "b")
    assert store.ensure_problem(GATE_UP) == store.ensure_problem(GATE_UP)
    assert store.ensure_problem(GATE_UP) != store.ensure_problem(GATE_UP.with_m(8))
    assert store.device_kinds() == ["NVIDIA H200"]
    assert store.backends() == ["fake"]
    assert store.has_problem(GATE_UP.key) and not store.has_problem(GATE_UP.with_m(3).key)


def test_a_trials_fingerprint_hash_names_its_device(store):
    store.record_trial(trial(device=H200_NEW_DRIVER))
    (row,) = store.trials()
    assert store.device(row.fingerprint_hash) == H200_NEW_DRIVER
    assert store.device("no such hash") is None


def test_sweep_lifecycle(store):
    spec = {"problems": [GATE_UP.key], "budget": 50}
    sweep_id = store.create_sweep(
        backend="fake",
        strategy="grid",
        spec=spec,
        host="node1",
        user="ana",
        sweep_file="sweeps/a.yaml",
        owner=Owner.here(),  # a live lease: without one, a running sweep shows as dead (test_leases.py)
    )
    row = store.get_sweep(sweep_id)
    assert (row.backend, row.strategy, row.spec, row.status, row.host, row.user, row.sweep_file) == (
        "fake",
        "grid",
        spec,
        "running",
        "node1",
        "ana",
        "sweeps/a.yaml",
    )
    assert row.finished_at is None
    store.finish_sweep(sweep_id, "interrupted")
    row = store.get_sweep(sweep_id)
    assert row.status == "interrupted" and row.finished_at >= row.created_at
    with pytest.raises(InvalidRecord, match="bogus"):
        store.finish_sweep(sweep_id, "bogus")
    with pytest.raises(RecordNotFound):
        store.get_sweep(sweep_id + 1000)


def test_trial_round_trip_keeps_every_field(store):
    sweep_id = store.create_sweep(backend="fake", strategy="grid", spec={}, host="h", user="u")
    started = datetime.datetime(2026, 11, 29, 12, 0, 0, 123456, tzinfo=datetime.UTC)
    record = trial(
        sweep_id=sweep_id,
        config={"block_m": 128, "block_n": 64, "swizzle": True},
        median_s=2.5e-3,
        compile_s=1.25,
        verify_error=3e-3,
        host="node7",
        worker="worker-3",
        routing={"kind": "skewed", "alpha": 1.2},
        started_at=started,
        finished_at=started + datetime.timedelta(seconds=2),
    )
    trial_id = store.record_trial(record)
    (row,) = store.trials(sweep_id=sweep_id)
    assert row.id == trial_id and row.sweep_id == sweep_id
    assert (row.device_kind, row.fingerprint_hash, row.backend, row.source_hash, row.family) == (
        "NVIDIA H200",
        H200.hash,
        "fake",
        "src1",
        "sm90",
    )
    assert row.problem == GATE_UP
    assert row.config == record.config and row.routing == record.routing and row.details is None
    assert row.samples_s == (2.5e-3, 2.5e-3) and row.median_s == 2.5e-3
    assert (row.compile_s, row.verify_error, row.host, row.worker) == (1.25, 3e-3, "node7", "worker-3")
    # Stored as naive UTC.
    assert row.started_at == started.replace(tzinfo=None)
    assert row.finished_at - row.started_at == datetime.timedelta(seconds=2)
    with pytest.raises(dataclasses.FrozenInstanceError):
        row.status = "crashed"


def test_trial_details_round_trip(store):
    """A compile-only trial keeps its binary's facts in details (nested JSON), and no routing."""
    facts = {
        "target": "gfx942",
        "binary_hash": "9f" * 32,
        "metrics": {"vgpr_count": 128, "agpr_count": 64, "vgpr_spill_count": 0, "lds_bytes": 32768},
        "duplicate_of": 7,
    }
    trial_id = store.record_trial(trial(status="pruned", median_s=None, details=facts, error="spills"))
    (row,) = store.trials()
    assert row.id == trial_id and row.details == facts and row.routing is None
    (done,) = store.done_configs(
        fingerprint_hash=H200.hash, backend="fake", source_hash="src1", problem_key=GATE_UP.key
    ).values()
    assert done.details == facts


def test_failed_trials_keep_their_error(store):
    store.record_trial(
        trial(status="compile_error", median_s=None, error="ResourceExceeded: smem 300000 > limit")
    )
    store.record_trial(trial(status="wrong_result", verify_error=math.nan))
    crashed, wrong = sorted(store.trials(), key=lambda r: r.status)[:2]
    assert crashed.status == "compile_error" and "smem" in crashed.error and crashed.samples_s == ()
    assert wrong.verify_error == math.inf  # NaN output is stored as infinitely wrong, never as NULL


def test_trial_filters(store):
    a = store.create_sweep(backend="fake", strategy="grid", spec={}, host="h", user="u")
    store.record_trial(trial(sweep_id=a))
    store.record_trial(trial(sweep_id=a, status="timeout", median_s=None))
    store.record_trial(trial(device=MI300, backend="other"))
    store.record_trial(trial(problem=GATE_UP.with_m(16)))
    assert len(store.trials()) == 4
    assert len(store.trials(sweep_id=a)) == 2
    assert [r.status for r in store.trials(status="timeout")] == ["timeout"]
    assert [r.backend for r in store.trials(backend="other")] == ["other"]
    assert [r.device_kind for r in store.trials(device_kind="AMD Instinct MI300X")] == ["AMD Instinct MI300X"]
    assert [r.problem.m for r in store.trials(problem_key=GATE_UP.with_m(16).key)] == [16]
    newest_first = store.trials(limit=2)
    assert len(newest_first) == 2 and newest_first[0].id > newest_first[1].id
    assert store.trials(device_kind="NVIDIA B200") == []
    with pytest.raises(InvalidRecord, match="status='bogus'"):
        store.trials(status="bogus")


def test_done_configs_keyed_by_canonical_config(store):
    first = trial(config={"block_n": 128, "block_m": 64}, median_s=2e-3)
    store.record_trial(first)
    latest = store.record_trial(trial(config={"block_m": 64, "block_n": 128}, median_s=1e-3))
    store.record_trial(trial(config={"block_m": 128, "block_n": 128}, status="crashed", median_s=None))
    store.record_trial(trial(config={"block_m": 8, "block_n": 8}, source_hash="other-source"))
    done = store.done_configs(
        fingerprint_hash=H200.hash, backend="fake", source_hash="src1", problem_key=GATE_UP.key
    )
    assert set(done) == {
        canonical_config({"block_m": 64, "block_n": 128}),
        canonical_config({"block_m": 128, "block_n": 128}),
    }
    assert done[json.dumps({"block_m": 64, "block_n": 128}, sort_keys=True)].id == latest
    assert (
        store.done_configs(
            fingerprint_hash="0" * 16, backend="fake", source_hash="src1", problem_key=GATE_UP.key
        )
        == {}
    )


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"status": "exploded"}, "status='exploded'"),
        ({"config": {"f": object()}}, "config is not plain JSON"),
        ({"samples_s": (1.0, math.inf)}, "non-finite"),
        ({"median_s": math.nan}, "median_s=nan"),
        ({"details": {"metrics": {"vgpr_count": math.inf}}}, "details is not plain JSON"),
    ],
)
def test_bad_trial_records_are_refused_before_the_database(change, message):
    with pytest.raises(InvalidRecord, match=message):
        TrialRecord(**{**dataclasses.asdict(trial()), "device": H200, "problem": GATE_UP, **change})


def test_unknown_sweep_id_is_a_database_error(store):
    with pytest.raises(DatabaseError, match="^database "):
        store.record_trial(trial(sweep_id=987654))
    assert store.trials() == []


def test_default_database_lives_in_the_user_data_dir(tmp_path):
    with open_store() as store:
        assert store.url == f"sqlite:///{tmp_path / 'xdg' / 'moetune' / 'moetune.db'}"
        assert store.revision() is not None
    assert (tmp_path / "xdg" / "moetune" / "moetune.db").exists()


def test_env_variable_picks_the_database(monkeypatch, tmp_path):
    monkeypatch.setenv("MOETUNE_DB", f"sqlite:///{tmp_path / 'env.db'}")
    with open_store() as store:
        assert store.url.endswith("env.db")
    with open_store(f"sqlite:///{tmp_path / 'explicit.db'}") as store:
        assert store.url.endswith("explicit.db")


@pytest.mark.parametrize(
    ("url", "message"),
    [
        ("not a url at all", "not a database URL"),
        ("nosuchdb://host/x", "unsupported database URL scheme 'nosuchdb'"),
        ("sqlite:////nonexistent-dir/sub/x.db", "unable to open database file"),
        ("postgresql+psycopg://moetune:hunter2secret@127.0.0.1:1/x", "127.0.0.1"),
    ],
)
def test_bad_urls_fail_in_one_line_without_password(url, message):
    with pytest.raises(DatabaseError) as info:
        open_store(url)
    text = str(info.value)
    assert message in text and "\n" not in text and "hunter2secret" not in text


def test_password_is_masked_in_url(postgres_url):
    from sqlalchemy import make_url

    url = make_url(postgres_url)
    if url.password is None:  # the password is in a pgpass file: put it in the URL, as a user may
        url = url.set(password=pgpass_password(url) or "unused-by-a-trusting-server")
    with open_store(url.render_as_string(hide_password=False)) as store:
        assert store.url == url.render_as_string(hide_password=True) and ":***@" in store.url
        assert f":{url.password}@" not in store.url


def test_corrupt_sqlite_file_is_a_database_error(tmp_path):
    path = tmp_path / "junk.db"
    path.write_bytes(b"this is not a database" * 100)
    with pytest.raises(DatabaseError, match="file is not a database"):
        open_store(f"sqlite:///{path}")
    assert path.read_bytes() == b"this is not a database" * 100


def test_checkpoint_reports_a_database_file_that_stopped_taking_writes(tmp_path):
    """Commits still succeed into the -wal; only a checkpoint finds that the file takes no writes."""
    path = tmp_path / "moetune.db"
    with open_store(f"sqlite:///{path}") as store:
        store.record_trial(trial())
        store.checkpoint()
        set_immutable(path, True)
        try:
            store.record_trial(trial(config={"block_m": 8}))
            with pytest.raises(DatabaseError, match="moetune.db") as info:
                store.checkpoint()
            assert "\n" not in str(info.value)
        finally:
            set_immutable(path, False)
        assert len(store.trials()) == 2


def test_a_trial_whose_commit_lost_its_connection_is_written_once(store, monkeypatch):
    """A commit may land although its connection is lost before the answer arrives: the retry finds the
    trial it wrote instead of writing it twice (the sweep driver retries lost connections)."""
    import sqlalchemy.exc

    from moetune.db import transaction

    rec = trial()
    lost = []

    def lose_the_answer(session):
        if not lost:
            lost.append(True)
            raise sqlalchemy.exc.OperationalError(
                "COMMIT", {}, ConnectionError("gone"), connection_invalidated=True
            )

    monkeypatch.setattr(transaction, "RECONNECT_DELAYS_S", (0.01,))
    ids = store._ids
    trial_id = transaction.run(
        store._engine,
        store._url,
        lambda s: trials_module.record_trial(s, rec, ids),
        write=True,
        on_commit=lose_the_answer,
        reconnect_s=5.0,
    )
    assert lost and [row.id for row in store.trials()] == [trial_id]


def test_a_lost_connection_fails_at_once_unless_reconnecting(store, monkeypatch):
    import sqlalchemy.exc

    from moetune.db import transaction

    calls = []

    def refused(session):
        calls.append(1)
        raise sqlalchemy.exc.OperationalError(
            "SELECT 1", {}, ConnectionError("refused"), connection_invalidated=True
        )

    monkeypatch.setattr(transaction, "RECONNECT_DELAYS_S", (0.01,))
    monkeypatch.setattr(transaction, "RETRY_DELAYS_S", ())
    with pytest.raises(DatabaseError):
        transaction.run(store._engine, store._url, refused, write=False)
    assert len(calls) == 1
    with pytest.raises(DatabaseError):
        transaction.run(store._engine, store._url, refused, write=False, reconnect_s=0.2)
    assert len(calls) > 5  # retried until the deadline


def test_a_routed_problem_reads_back_with_its_top_k(store):
    from moetune.kernels.problem import Problem

    block = Problem("moe_decode_block", 8, 2048, 1536, 128, top_k=8)
    other = Problem("moe_decode_block", 8, 2048, 1536, 128, top_k=4)
    for problem in (block, other):  # one row each: the key holds top_k, no column does
        store.promote(
            store.record_trial(trial(problem=problem, backend="xla", config={"strategy": "ragged_dot"}))
        )
    assert {t.problem for t in store.trials()} == {block, other}
    assert {w.problem for w in store.winners(backend="xla")} == {block, other}
