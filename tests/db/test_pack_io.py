"""Config packs: export from one database, import into another; a bad pack writes nothing."""

from __future__ import annotations

import dataclasses
import importlib.resources
import json
import threading
import time

import pytest
from db_factories import GATE_UP, H200, H200_NEW_DRIVER, MI300, trial

from moetune.db import open_store, pack_io
from moetune.db.errors import DatabaseError, RecordNotFound
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
        (
            lambda d: d["entries"][1]["config"].update(block_m=12),
            r"entries\[1\] .* bad fake config: block_m=12",
        ),
        (lambda d: d["entries"][1]["config"].update(tile_q=3), r"entries\[1\] .*tile_q: unknown field"),
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


# --- check_pack: configs against their backend -----------------------------------------------------


def _shipped():
    return packs.load(importlib.resources.files("moetune.configs") / "tuned" / "nvidia_h200__mosaic_gpu.json")


def test_the_shipped_pack_passes_every_check():
    """Every entry passes; the checked configs are the packed ones as values of the backend's Config (a
    field added since the pack was written takes its default, the kernel the entry was tuned with)."""
    from moetune.kernels import registry

    pack = _shipped()
    typed = lambda e: registry.get(pack.backend).config_class(e.problem.op).from_dict(e.config)  # noqa: E731
    checked = pack_io.check_pack(pack, "shipped").entries
    assert [(e.problem, e.median_s) for e in checked] == [(e.problem, e.median_s) for e in pack.entries]
    assert [typed(e) for e in checked] == [typed(e) for e in pack.entries]


def _with_first(pack, *, problem=None, **config):
    """The pack led by one of its Mixtral-8x7B gate_up entries (K=4096), changed: the cases below name it."""
    first = next(
        e for e in pack.entries if (e.problem.op, e.problem.g, e.problem.k) == ("grouped_matmul", 8, 4096)
    )
    rest = [e for e in pack.entries if e is not first]
    entry = packs.PackEntry(problem or first.problem, {**first.config, **config}, first.median_s)
    return dataclasses.replace(pack, entries=(entry, *rest))


@pytest.mark.parametrize(
    ("change", "expect"),
    [
        (dict(block_m=64.0), "block_m=64.0: input should be a valid integer"),
        (dict(block_m="64"), "block_m='64': input should be a valid integer"),
        (dict(persistent=1), "persistent=1: input should be a valid boolean"),
        (dict(block_m=96), "block_m=96 is not a multiple of 8 below 64, nor 64, 128, 192, 256"),
        (dict(tile_q=1), "tile_q: unknown field"),
        # K=4096 is 43 steps of 96 (the last partial), not splitting over 2 CTAs: the kernel cannot run it
        (dict(block_k=96, split_k=2), "k_steps_fit: K=4096 makes 43 steps of block_k=96"),
    ],
)
def test_a_config_is_checked_against_its_backend(change, expect):
    pack = _with_first(_shipped(), **change)
    with pytest.raises(PackInvalid, match=r"shipped: entries\[0\] \(grouped_matmul/") as caught:
        pack_io.check_pack(pack, "shipped")
    assert expect in str(caught.value)


def test_a_problem_the_backend_declines_is_refused():
    first = _shipped().entries[0]
    problem = dataclasses.replace(first.problem, lhs_dtype="float32", rhs_dtype="float32")
    with pytest.raises(PackInvalid, match="cannot run this config: mosaic_gpu needs bfloat16 or float16"):
        pack_io.check_pack(_with_first(_shipped(), problem=problem), "shipped")


def test_pruning_only_constraints_do_not_refuse_a_config():
    """pad_lhs on a problem taller than the CTA tile changes nothing: the search never times it, but it
    runs."""
    from moetune.kernels.backends.mosaic_gpu import space as mosaic_gpu_space

    shipped = _shipped()
    tallest = max(shipped.entries, key=lambda e: e.problem.m)
    entry = packs.PackEntry(tallest.problem, {**tallest.config, "pad_lhs": True}, tallest.median_s)
    pack = dataclasses.replace(shipped, entries=(entry,))
    config = mosaic_gpu_space.MosaicGpuConfig.from_dict(entry.config)
    assert mosaic_gpu_space.pad_lhs_only_small_m(entry.problem, config, pack.device) is not None
    assert pack_io.check_pack(pack, "shipped").entries[0].config == config.to_dict()


def test_a_config_missing_fields_takes_the_defaults(sqlite_url, fake_backend):
    with open_store(sqlite_url) as store:
        _tuned(store)
        pack = store.export_pack(device_kind="NVIDIA H200", backend="fake")
    first, *rest = pack.entries
    short = dataclasses.replace(pack, entries=(packs.PackEntry(first.problem, {"block_m": 16}, 1e-3), *rest))
    assert pack_io.check_pack(short).entries[0].config == {"block_m": 16, "block_n": 128}


def test_a_pack_built_in_python_gets_the_file_checks(fake_backend):
    device = dataclasses.replace(H200, device_kind="x" * 200)
    pack = packs.Pack(device, "fake", "src1", (packs.PackEntry(GATE_UP, {"block_m": 8}, 1e-3),))
    with pytest.raises(PackInvalid, match="device.device_kind=.*at most 128 characters"):
        pack_io.check_pack(pack)


# --- chunked import: other writers get the lock between chunks -------------------------------------


def _big_pack(entries: int) -> packs.Pack:
    return packs.Pack(
        H200,
        "fake",
        "src1",
        tuple(
            packs.PackEntry(GATE_UP.with_m(m), {"block_m": 8, "block_n": 128}, 1e-3)
            for m in range(1, entries + 1)
        ),
    )


def test_a_large_import_commits_chunk_by_chunk(sqlite_url, fake_backend, monkeypatch):
    monkeypatch.setattr(pack_io, "IMPORT_CHUNK_ENTRIES", 7)
    transactions = []
    with open_store(sqlite_url) as store:
        original = store._run

        def counting(fn, *, write):
            transactions.append(write)
            return original(fn, write=write)

        monkeypatch.setattr(store, "_run", counting)
        assert store.import_pack(_big_pack(30), source="big.json") == 30
        monkeypatch.undo()
        assert transactions == [True] * 5  # ceil(30 / 7)
        (sweep,) = {t.sweep_id for t in store.trials(limit=None)}
        assert store.get_sweep(sweep).status == "done"
        assert len(store.winners()) == 30


def test_an_import_failing_part_way_marks_its_sweep_failed(sqlite_url, fake_backend, monkeypatch):
    monkeypatch.setattr(pack_io, "IMPORT_CHUNK_ENTRIES", 10)
    real_promote = pack_io.winners.promote
    calls = []

    def promote(session, trial_id, reason):
        calls.append(trial_id)
        if len(calls) == 15:
            raise DatabaseError("disk full")
        return real_promote(session, trial_id, reason)

    monkeypatch.setattr(pack_io.winners, "promote", promote)
    with open_store(sqlite_url) as store:
        with pytest.raises(DatabaseError, match="disk full"):
            store.import_pack(_big_pack(30), source="big.json")
        monkeypatch.undo()
        assert len(store.winners()) == 10  # the first chunk is in, the second rolled back
        (sweep,) = {t.sweep_id for t in store.trials(limit=None)}
        assert store.get_sweep(sweep).status == "failed"
        assert store.import_pack(_big_pack(30), source="big.json") == 20  # again: finishes it


def test_a_concurrent_writer_gets_through_while_a_large_import_runs(db_url, fake_backend, monkeypatch):
    """A sweep recording a trial beside a large import waits for one chunk, not for the whole pack."""
    monkeypatch.setattr(pack_io, "IMPORT_CHUNK_ENTRIES", 40)
    pack = _big_pack(600)  # 15 chunks
    with open_store(db_url) as store:
        store.ensure_device(H200)  # the migration and the device row, before the race
    finished: dict[str, float] = {}

    def run_import():
        with open_store(db_url) as importer:
            importer.import_pack(pack, source="big.json")
        finished["import"] = time.monotonic()

    thread = threading.Thread(target=run_import)
    thread.start()
    try:
        with open_store(db_url) as sweep:
            deadline = time.monotonic() + 120
            # Start writing once the import has committed something (a single transaction commits last).
            while not sweep.trials(limit=1) and thread.is_alive() and time.monotonic() < deadline:
                time.sleep(0.01)
            sweep.record_trial(trial(problem=GATE_UP.with_m(10**6), worker="sweep"))
            finished["writer"] = time.monotonic()
    finally:
        thread.join(timeout=300)
    assert not thread.is_alive()
    assert finished["writer"] < finished["import"], "the writer waited for the whole import"
    with open_store(db_url) as store:
        assert len(store.winners()) == 600 and store.trials(limit=None)[0].worker in ("sweep", "pack-import")


@pytest.mark.parametrize(
    ("chunk_m", "expect"),
    [
        (8 * 10**30, "chunk_m=8000000000000000000000000000000: 8000000000000000000000000000000 does not fit"),
        (8e30, "chunk_m=8e+30: input should be a valid integer"),
    ],
)
def test_an_xla_chunk_that_would_break_every_trace_is_refused(chunk_m, expect, tmp_path):
    """chunk_m=8e30 once imported, and then every jax.jit of a call of that shape failed."""
    cpu = dataclasses.replace(H200, device_kind="cpu", platform="cpu", compute_capability="x86_64")
    good = packs.Pack(
        cpu, "xla", "src1", (packs.PackEntry(GATE_UP, {"strategy": "chunked", "chunk_m": 64}, 1e-3),)
    )
    assert pack_io.check_pack(good).entries[0].config["chunk_m"] == 64
    data = json.loads(good.dumps())
    data["entries"][0]["config"]["chunk_m"] = chunk_m
    path = tmp_path / "xla.json"
    path.write_text(json.dumps(data))
    with pytest.raises(PackInvalid, match="entries") as caught:
        pack_io.check_pack(packs.load(path), str(path))
    assert expect in str(caught.value)


@pytest.mark.parametrize(
    "newer, version",
    [
        (("grouped_matmul_fp8", 256, 1024, 512, 8, "float8_e4m3fn", "float8_e4m3fn"), 2),
        (("moe_decode_block", 8, 2048, 1536, 128), 3),
    ],
    ids=["fp8-scale_layout", "routed-top_k"],
)
def test_a_newer_problems_winner_exports_in_its_pack_version_and_imports_whole(
    db_url, tmp_path, newer, version
):
    from moetune.kernels.problem import Problem

    fields = {2: {"scale_layout": "row_channel"}, 3: {"top_k": 8}}[version]
    problem = Problem(*newer, **fields)
    with open_store(db_url) as source:
        for each in (GATE_UP, problem):  # on xla, which serves every op
            record = trial(problem=each, backend="xla", config={"strategy": "ragged_dot"})
            source.promote(source.record_trial(record))
        pack = source.export_pack(device_kind="NVIDIA H200", backend="xla")
    assert pack.schema_version == version and {e.problem for e in pack.entries} == {GATE_UP, problem}
    path = tmp_path / "newer.json"
    path.write_text(pack.dumps())
    assert json.loads(path.read_text())["schema_version"] == version
    with open_store(f"sqlite:///{tmp_path / 'other.db'}") as target:
        assert target.import_pack(packs.load(path), source=str(path)) == 2
        assert {w.problem for w in target.winners()} == {GATE_UP, problem}
