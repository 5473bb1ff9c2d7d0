"""The winner lookup: order (exact, nearest M, heuristic), precedence, packs, the database, staleness."""

from __future__ import annotations

import dataclasses
import json
import logging
import statistics
import sys
import time

import jax.numpy as jnp
import pytest

from moetune.kernels import api, lookup, packs
from moetune.kernels.backends.xla import BACKEND, XlaConfig
from moetune.kernels.device import current_fingerprint
from moetune.kernels.lookup import LOOKUP, Winner
from moetune.kernels.problem import Problem

FP = current_fingerprint()
BASE = Problem(
    "grouped_matmul", m=512, k=32, n=16, g=4, lhs_dtype="float32", rhs_dtype="float32", out_dtype="float32"
)
SEGMENTS = XlaConfig(strategy="segments")
DENSE = XlaConfig(strategy="dense_masked")
CHUNKED = XlaConfig(strategy="chunked", chunk_m=32, items_per_step=2)


def winner(m: int, config: XlaConfig, **fields) -> Winner:
    return Winner(backend="xla", problem=BASE.with_m(m), config=config.to_dict(), **fields)


def resolve(m: int = BASE.m, problem: Problem | None = None):
    return LOOKUP.resolve(problem or BASE.with_m(m), BACKEND, FP)


def write_pack(folder, entries, *, device=FP, backend="xla", source_hash=None, name=None):
    pack = packs.Pack(
        device=device,
        backend=backend,
        kernel_source_hash=source_hash or BACKEND.source_hash(),
        entries=tuple(packs.PackEntry(p, c.to_dict(), 1e-3) for p, c in entries),
    )
    path = folder / (name or packs.file_name(FP.device_kind, "xla"))
    path.write_text(pack.dumps())
    return path


# -- order ---------------------------------------------------------------------------------------------


def test_exact_then_nearest_then_heuristic():
    with lookup.overlay(winners=[winner(512, SEGMENTS), winner(128, DENSE), winner(2048, CHUNKED)]):
        exact = resolve(512)
        assert (exact.config, exact.source, exact.from_m, exact.stale) == (
            SEGMENTS,
            "overlay exact",
            None,
            (),
        )
        near = resolve(300)  # |ln 300/512| = 0.53 < |ln 300/128| = 0.85
        assert (near.config, near.source, near.from_m) == (SEGMENTS, "overlay nearest", 512)
        assert resolve(150).from_m == 128
        assert resolve(8192).from_m == 2048  # 4x: still near
        assert resolve(32).from_m == 128
        assert resolve(8193).source == "heuristic"  # more than NEAREST_MAX_RATIO away from every tuned M
        assert resolve(31).source == "heuristic"
        other_shape = dataclasses.replace(BASE, n=64)
        fallback = resolve(problem=other_shape)
        assert fallback.source == "heuristic"
        assert fallback.config == BACKEND.heuristic(other_shape, FP)


def test_nearest_ties_go_to_the_larger_m():
    with lookup.overlay(winners=[winner(128, DENSE), winner(2048, CHUNKED)]):
        assert resolve(512).from_m == 2048  # log distance ln 4 either way


def test_nearest_only_within_the_same_shape_key():
    transposed = dataclasses.replace(BASE, transpose_rhs=True)
    other_dtype = dataclasses.replace(BASE, out_dtype="bfloat16")
    with lookup.overlay(winners=[winner(512, SEGMENTS)]):
        assert resolve(problem=transposed.with_m(256)).source == "heuristic"
        assert resolve(problem=other_dtype).source == "heuristic"


def test_winners_of_other_backends_are_ignored():
    other = Winner(backend="mosaic_gpu", problem=BASE, config={"block_m": 64})
    with lookup.overlay(winners=[other]):
        assert resolve().source == "heuristic"


def test_overlay_is_scoped_and_nests():
    with lookup.overlay(winners=[winner(512, SEGMENTS)]):
        with lookup.overlay(winners=[winner(512, DENSE)]):
            assert resolve().config == DENSE
        assert resolve().config == SEGMENTS
    assert resolve().source == "heuristic"


def test_a_winner_whose_config_no_longer_parses_is_skipped(caplog):
    broken = Winner(backend="xla", problem=BASE, config={"strategy": "chunked", "tile": 3})
    with lookup.overlay(winners=[broken]), caplog.at_level(logging.WARNING, "moetune"):
        assert resolve().source == "heuristic"
    assert "unknown XlaConfig fields: tile" in caplog.text


def test_lookup_is_fast_after_the_first_load():
    with lookup.overlay(winners=[winner(128 * i, SEGMENTS) for i in range(1, 200)]):
        resolve()
        samples = []
        for i in range(100):
            start = time.perf_counter()
            resolve(1000 + i)
            samples.append(time.perf_counter() - start)
    # Loose on purpose: a sanity check that nothing is reloaded per call, not a benchmark.
    assert statistics.median(samples) < 1e-3


# -- staleness -----------------------------------------------------------------------------------------


def test_stale_fingerprint_is_used_flagged_and_warned_once(caplog):
    stale = winner(512, SEGMENTS, fingerprint_hash="0" * 16, source_hash=BACKEND.source_hash())
    with lookup.overlay(winners=[stale]), caplog.at_level(logging.WARNING, "moetune"):
        resolution = resolve()
        assert resolution.config == SEGMENTS
        assert resolution.stale == (f"tuned on device fingerprint {'0' * 16}, running {FP.hash}",)
        LOOKUP.note_use(BASE, resolution, FP)
        LOOKUP.note_use(BASE, resolution, FP)
    assert caplog.text.count("stale xla winner") == 1


def test_stale_kernel_source_is_flagged():
    stale = winner(512, SEGMENTS, fingerprint_hash=FP.hash, source_hash="feedfacefeedface")
    with lookup.overlay(winners=[stale]):
        (reason,) = resolve().stale
    assert reason == f"tuned with kernel source feedfacefeedface, running {BACKEND.source_hash()}"


def test_a_fresh_winner_beats_a_stale_one_of_the_same_origin():
    stale = winner(512, DENSE, fingerprint_hash="0" * 16)
    fresh = winner(512, SEGMENTS, fingerprint_hash=FP.hash, source_hash=BACKEND.source_hash())
    with lookup.overlay(winners=[stale, fresh]):
        assert resolve().config == SEGMENTS


# -- packs ---------------------------------------------------------------------------------------------


def test_pack_exact_and_nearest(tmp_path):
    write_pack(tmp_path, [(BASE, SEGMENTS), (BASE.with_m(64), DENSE)])
    with lookup.using_packs(tmp_path):
        exact = resolve()
        assert (exact.config, exact.source, exact.stale) == (SEGMENTS, "pack exact", ())
        assert exact.median_s == 1e-3
        near = resolve(80)
        assert (near.config, near.source, near.from_m) == (DENSE, "pack nearest", 64)
    assert resolve().source == "heuristic"


def test_one_pack_file_served_alone_whatever_its_name(tmp_path, sqlite_url):
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    path = write_pack(elsewhere, [(BASE, SEGMENTS)], name="an_old_session.json")
    write_pack(tmp_path, [(BASE, DENSE)])
    with lookup.using_db(sqlite_url), lookup.using_packs(tmp_path), lookup.using_pack_file(path):
        served = resolve()
        assert LOOKUP.db_url() is None
    assert (served.config, served.source) == (SEGMENTS, "pack exact")
    with lookup.using_packs(tmp_path):
        assert resolve().config == DENSE


def test_stale_pack_is_flagged(tmp_path):
    other_driver = dataclasses.replace(FP, driver="0.0-other")
    write_pack(tmp_path, [(BASE, SEGMENTS)], device=other_driver)
    with lookup.using_packs(tmp_path):
        resolution = resolve()
    assert resolution.source == "pack exact"
    assert resolution.stale == (f"tuned on device fingerprint {other_driver.hash}, running {FP.hash}",)


@pytest.mark.parametrize(
    "content", ["{not json", json.dumps({"schema": "moetune.pack", "schema_version": 99})]
)
def test_broken_pack_is_ignored_with_a_warning(tmp_path, caplog, content):
    (tmp_path / packs.file_name(FP.device_kind, "xla")).write_text(content)
    with lookup.using_packs(tmp_path), caplog.at_level(logging.WARNING, "moetune"):
        assert resolve().source == "heuristic"
    assert "ignoring config pack" in caplog.text


def test_dispatch_and_import_trust_the_same_pack_entries(tmp_path, caplog):
    """One policy (lookup.trusted_pack_entries): dispatch skips each untrusted entry with a warning and
    uses the rest; `moetune import` (db.pack_io.check_pack) refuses the pack, naming the same entry."""
    from moetune.db.pack_io import check_pack
    from moetune.kernels.errors import PackInvalid

    path = write_pack(tmp_path, [(BASE, SEGMENTS), (BASE.with_m(256), DENSE), (BASE, DENSE)])
    data = json.loads(path.read_text())
    data["entries"][1]["config"]["chunk_m"] = 0  # XlaConfig rejects it
    path.write_text(json.dumps(data))
    pack = packs.load(path)
    trusted, rejected = lookup.trusted_pack_entries(pack)
    assert [(e.problem, c) for e, c in trusted] == [(BASE, SEGMENTS)]
    assert rejected[0].startswith(f"entries[1] ({BASE.with_m(256).key}): bad xla config")
    assert rejected[1] == f"entries[2] repeats problem {BASE.key}"
    with lookup.using_packs(tmp_path), caplog.at_level(logging.WARNING, "moetune"):
        assert (resolve().config, resolve().source) == (SEGMENTS, "pack exact")
        assert resolve(256).source == "pack nearest"  # from m=512: entry 1 is not there
    assert caplog.text.count("ignoring entries[") == 2
    assert [w.problem for w in lookup.pack_winners(pack)] == [BASE]
    with pytest.raises(PackInvalid, match=r"entries\[1\] \(.*\): bad xla config"):
        check_pack(pack)
    assert check_pack(packs.Pack(pack.device, "xla", "h", (pack.entries[0],))).entries == pack.entries[:1]
    with pytest.raises(PackInvalid, match="not usable here"):
        check_pack(dataclasses.replace(pack, backend="nosuchbackend"))


def test_pack_for_another_backend_is_ignored(tmp_path, caplog):
    write_pack(tmp_path, [(BASE, SEGMENTS)], backend="triton")  # under xla's file name
    with lookup.using_packs(tmp_path), caplog.at_level(logging.WARNING, "moetune"):
        assert resolve().source == "heuristic"
    assert "holds triton winners" in caplog.text


def test_shipped_packs_load_through_importlib_resources(tmp_path, monkeypatch):
    package = tmp_path / "fake_moetune_configs"
    (package / "tuned").mkdir(parents=True)
    (package / "__init__.py").write_text("")
    write_pack(package / "tuned", [(BASE, CHUNKED)])
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setattr(lookup, "PACKS_PACKAGE", "fake_moetune_configs")
    try:
        assert resolve().source == "pack exact"
    finally:
        sys.modules.pop("fake_moetune_configs", None)


# -- database ------------------------------------------------------------------------------------------


def promote(store, problem: Problem, config: XlaConfig, *, device=FP, source_hash=None) -> int:
    from moetune.db.records import TrialRecord

    record = TrialRecord(
        sweep_id=None,
        device=device,
        backend="xla",
        family="xla",
        source_hash=source_hash or BACKEND.source_hash(),
        problem=problem,
        config=config.to_dict(),
        status="ok",
        samples_s=(2e-3, 2e-3),
        median_s=2e-3,
    )
    return store.promote(store.record_trial(record), reason="test")


@pytest.fixture
def store(sqlite_url):
    from moetune.db import open_store

    with open_store(sqlite_url) as s:
        yield s


def test_database_exact_nearest_and_precedence_over_packs(store, sqlite_url, tmp_path):
    promote(store, BASE, SEGMENTS)
    promote(store, BASE.with_m(4096), CHUNKED)
    write_pack(tmp_path, [(BASE, DENSE), (BASE.with_m(2048), DENSE)])
    with lookup.using_db(sqlite_url), lookup.using_packs(tmp_path):
        exact = resolve()
        assert (exact.config, exact.source, exact.median_s) == (SEGMENTS, "db exact", 2e-3)
        assert resolve(2048).source == "pack exact"
        near = resolve(3000)
        assert (near.config, near.source, near.from_m) == (CHUNKED, "db nearest", 4096)


def test_database_winner_of_another_fingerprint_is_stale(store, sqlite_url):
    old_jax = dataclasses.replace(FP, jaxlib_version="0.0.1")
    promote(store, BASE, SEGMENTS, device=old_jax)
    with lookup.using_db(sqlite_url):
        resolution = resolve()
    assert (resolution.source, resolution.config) == ("db exact", SEGMENTS)
    assert resolution.stale == (f"tuned on device fingerprint {old_jax.hash}, running {FP.hash}",)


def test_database_loads_once_until_clear(store, sqlite_url):
    with lookup.using_db(sqlite_url):
        assert resolve().source == "heuristic"
        promote(store, BASE, SEGMENTS)
        assert resolve().source == "heuristic"  # cached for the process
        LOOKUP.clear()
        assert resolve().source == "db exact"


def test_misses_are_logged_once_and_counted_once_per_process(store, sqlite_url, caplog):
    lhs, rhs = jnp.ones((24, 32)), jnp.ones((4, 32, 16))
    sizes = jnp.asarray([6, 6, 6, 6], jnp.int32)
    with lookup.using_db(sqlite_url), caplog.at_level(logging.INFO, "moetune"):
        api.grouped_matmul(lhs, rhs, sizes)
        api.grouped_matmul(lhs, rhs, sizes)
        assert caplog.text.count("no tuned xla config for grouped_matmul/m=24") == 1
        (miss,) = store.misses(backend="xla")
        assert (miss.problem, miss.count, miss.fingerprint_hash) == (BASE.with_m(24), 1, FP.hash)
        LOOKUP.clear()  # as a new process would
        api.grouped_matmul(lhs, rhs, sizes)
    (miss,) = store.misses(backend="xla")
    assert miss.count == 2


def test_nearest_hits_count_as_misses_and_exact_hits_do_not(store, sqlite_url):
    promote(store, BASE.with_m(32), SEGMENTS)
    sizes = jnp.asarray([6, 6, 6, 6], jnp.int32)
    with lookup.using_db(sqlite_url):
        api.grouped_matmul(jnp.ones((32, 32)), jnp.ones((4, 32, 16)), sizes)
        assert store.misses() == []
        api.grouped_matmul(jnp.ones((24, 32)), jnp.ones((4, 32, 16)), sizes)
    assert [m.problem.m for m in store.misses()] == [24]


def test_explain_records_no_miss(store, sqlite_url):
    with lookup.using_db(sqlite_url):
        assert api.explain(BASE).source == "heuristic"
    assert store.misses() == []


def test_a_broken_database_never_breaks_the_call(tmp_path, monkeypatch, caplog):
    not_a_db = tmp_path / "garbage.db"
    not_a_db.write_bytes(b"this is not sqlite" * 100)
    monkeypatch.setenv("MOETUNE_DB", f"sqlite:///{not_a_db}")
    sizes = jnp.asarray([2, 2, 2, 2], jnp.int32)
    with caplog.at_level(logging.WARNING, "moetune"):
        for m in (8, 9):
            out = api.grouped_matmul(jnp.ones((m, 32)), jnp.ones((4, 32, 16)), sizes)
            assert out.shape == (m, 16)
    # Tried and reported once per process, not on every call.
    assert caplog.text.count("not using the database for winners") == 1
    assert caplog.text.count("could not count a miss") == 1


def test_database_from_environment_and_default_path(tmp_path, monkeypatch):
    from moetune.db import open_store, urls

    assert LOOKUP.db_url() is None  # the default file does not exist (XDG_DATA_HOME is a fresh folder)
    with open_store(urls.default_url()) as default_store:
        promote(default_store, BASE, DENSE)
    LOOKUP.clear()
    assert LOOKUP.db_url() == urls.default_url()
    assert resolve().source == "db exact"
    explicit = f"sqlite:///{tmp_path / 'team.db'}"
    monkeypatch.setenv("MOETUNE_DB", explicit)
    assert LOOKUP.db_url() == explicit
    with lookup.using_db(None):
        assert LOOKUP.db_url() is None
