"""Config packs: export from one database, import into another; a bad pack writes nothing."""

from __future__ import annotations

import json

import pytest
from db_factories import GATE_UP, H200, H200_NEW_DRIVER, MI300, trial

from moetune.db import open_store
from moetune.db.errors import RecordNotFound
from moetune.kernels import packs
from moetune.kernels.errors import PackInvalid


def _tuned(store, *, device=H200, source_hash="src1", problems=None):
    problems = problems or (GATE_UP, GATE_UP.with_m(64))
    for i, problem in enumerate(problems):
        trial_id = store.record_trial(
            trial(
                device=device,
                source_hash=source_hash,
                problem=problem,
                config={"block_m": 8 * (i + 1), "block_n": 128},
            )
        )
        store.promote(trial_id)


def _row_counts(url):
    import sqlalchemy as sa

    from moetune.db.models import TABLE_NAMES

    engine = sa.create_engine(url)
    with engine.connect() as connection:
        counts = {
            t: connection.execute(sa.text(f"SELECT count(*) FROM {t}")).scalar() for t in sorted(TABLE_NAMES)
        }
    engine.dispose()
    return counts


def test_export_then_import_into_another_database(db_url, tmp_path, fake_backend):
    with open_store(db_url) as source:
        _tuned(source)
        _tuned(source, device=MI300)
        pack = source.export_pack(device_kind="NVIDIA H200", backend="fake")
    assert pack.device == H200 and pack.kernel_source_hash == "src1" and len(pack.entries) == 2
    path = tmp_path / packs.file_name("NVIDIA H200", "fake")
    path.write_text(pack.dumps())
    loaded = packs.load(path)

    with open_store(f"sqlite:///{tmp_path / 'other.db'}") as target:
        assert target.import_pack(loaded, source=str(path)) == 2
        imported = target.winners()
        assert {(w.problem, json.dumps(w.config, sort_keys=True), w.median_s) for w in imported} == {
            (e.problem, json.dumps(e.config, sort_keys=True), e.median_s) for e in pack.entries
        }
        assert {(w.fingerprint_hash, w.source_hash, w.backend) for w in imported} == {
            (H200.hash, "src1", "fake")
        }
        assert all(w.reason == f"imported from {path}" for w in imported)
        (import_trial, *_) = target.trials()
        assert import_trial.worker == "pack-import" and import_trial.status == "ok"
        assert target.get_sweep(import_trial.sweep_id).strategy == "import"
        # The same pack again changes nothing; the exported pack of the copy equals the original.
        assert target.import_pack(loaded, source=str(path)) == 0
        assert len(target.winners(active_only=False)) == 2
        again = target.export_pack(device_kind="NVIDIA H200", backend="fake")
        assert again.entries == pack.entries and again.device == pack.device


def test_import_supersedes_a_different_winner(sqlite_url, fake_backend):
    with open_store(sqlite_url) as store:
        _tuned(store)
        pack = store.export_pack(device_kind="NVIDIA H200", backend="fake")
        (first, *rest) = pack.entries
        changed = packs.Pack(
            pack.device, "fake", "src1", (packs.PackEntry(first.problem, {"block_m": 256}, 5e-4), *rest)
        )
        assert store.import_pack(changed) == 1
        winner = store.current_winner(
            fingerprint_hash=H200.hash, backend="fake", problem_key=first.problem.key
        )
        assert winner.config == {"block_m": 256, "block_n": 128}  # normalised by the backend's Config
        assert store.rollback(
            backend="fake", problem_key=first.problem.key, device_kind="NVIDIA H200"
        ).config == (first.config)


def test_export_takes_the_newest_fingerprint_and_source(sqlite_url):
    with open_store(sqlite_url) as store:
        _tuned(store, problems=(GATE_UP, GATE_UP.with_m(64), GATE_UP.with_m(128)))
        _tuned(store, device=H200_NEW_DRIVER, source_hash="src2", problems=(GATE_UP,))
        pack = store.export_pack(device_kind="NVIDIA H200", backend="fake")
        assert pack.device == H200_NEW_DRIVER and pack.kernel_source_hash == "src2"
        assert [e.problem for e in pack.entries] == [GATE_UP]


def test_export_with_no_winners_names_what_exists(sqlite_url):
    with open_store(sqlite_url) as store:
        _tuned(store)
        with pytest.raises(RecordNotFound, match="NVIDIA H200 / fake"):
            store.export_pack(device_kind="NVIDIA B200", backend="fake")


@pytest.mark.parametrize(
    ("mutate", "message"),
    [
        (lambda d: d["entries"][1]["config"].update(block_m=12), "entry 1 .* bad fake config .*block_m=12"),
        (lambda d: d["entries"][1]["config"].update(tile_q=3), "entry 1 .*unknown"),
        (lambda d: d["entries"].append(d["entries"][0]), "repeats problem"),
        (lambda d: d.update(backend="nosuchbackend"), "backend 'nosuchbackend'"),
    ],
)
def test_a_bad_pack_writes_nothing(db_url, fake_backend, mutate, message):
    with open_store(db_url) as store:
        _tuned(store)
        data = store.export_pack(device_kind="NVIDIA H200", backend="fake").to_dict()
        mutate(data)
        pack = packs.parse(data)
        before = _row_counts(db_url)
        with pytest.raises(PackInvalid, match=message):
            store.import_pack(pack)
        assert _row_counts(db_url) == before
