"""The database commands through the real CLI app: results, and one-line exit-2 failures writing nothing."""

from __future__ import annotations

import dataclasses
import importlib.resources
import json
import math
import os
import stat

import pytest
import sqlalchemy as sa
from typer.testing import CliRunner

from moetune.cli import _load_commands, app
from moetune.cli.common import json_text
from moetune.db import open_store, schema, urls
from moetune.db.models import TABLE_NAMES
from moetune.db.records import TrialRecord
from moetune.kernels import device as device_module
from moetune.kernels import lookup, packs, registry
from moetune.kernels.device import DeviceFingerprint
from moetune.kernels.problem import Problem
from tests.db.db_factories import trial

_load_commands()  # the commands register themselves on the shared app when their modules are imported

GPU = DeviceFingerprint(
    "NVIDIA H200", "gpu", 132, 150_000_000_000, "9.0", "580.65", "13.0", "0.11.2", "0.11.2"
)
PROBLEM = Problem("grouped_matmul", m=4096, k=4096, n=28672, g=8)
SECRET = "s3cr3t-pw"


@pytest.fixture(autouse=True)
def no_default_database(monkeypatch, tmp_path):
    monkeypatch.delenv("MOETUNE_DB", raising=False)
    monkeypatch.setenv("XDG_DATA_HOME", str(tmp_path / "xdg"))
    monkeypatch.delenv("XLA_PYTHON_CLIENT_PREALLOCATE", raising=False)  # `best` sets it; undone after


def strict_json(text: str):
    """json.loads refusing NaN and Infinity, which strict JSON parsers (jq, JavaScript) reject."""

    def refuse(constant):
        raise ValueError(f"not strict JSON: {constant}")

    return json.loads(text, parse_constant=refuse)


def cli(*args: str):
    """The CLI turns away a --db with a password (the process list shows it): such a URL goes in through
    $MOETUNE_DB, as a user passes it."""
    args, env = list(args), {}
    if "--db" in args and urls.has_password(args[args.index("--db") + 1]):
        at = args.index("--db")
        env[urls.ENV_DB] = args.pop(at + 1)
        del args[at]
    return CliRunner().invoke(app, args, env=env)


def ok(*args: str):
    result = cli(*args)
    assert result.exit_code == 0, (result.output, result.exception)
    return result


def bad(*args: str, expect: str):
    """Exit code 2 with exactly one line on stderr that contains `expect`."""
    result = cli(*args)
    assert result.exit_code == 2, (result.output, result.exception)
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), result.stderr
    assert expect in lines[0], lines[0]
    return lines[0]


def record(store, *, block_m=64, status="ok", problem=PROBLEM, backend="fake", median_s=1e-3):
    config = {"block_m": block_m, "block_n": 128}
    return store.record_trial(
        TrialRecord(
            sweep_id=None,
            device=GPU,
            backend=backend,
            family="sm90",
            source_hash="src1",
            problem=problem,
            config=config,
            status=status,
            samples_s=(median_s,) if status == "ok" else (),
            median_s=median_s if status == "ok" else None,
            error="" if status == "ok" else "ResourceExceeded: too much shared memory",
        )
    )


def tuned(url: str) -> None:
    """Two winners on one problem (so rollback has history), one on another, and a crashed trial."""
    with open_store(url) as store:
        store.promote(record(store, block_m=64))
        store.promote(record(store, block_m=128))
        store.promote(record(store, block_m=16, problem=PROBLEM.with_m(64)))
        record(store, status="crashed")


def snapshot(url: str) -> dict[str, list]:
    """Every row of every moetune table: 'nothing written' means this does not change."""
    engine = sa.create_engine(url)
    with engine.connect() as connection:
        names = TABLE_NAMES & set(sa.inspect(connection).get_table_names())
        rows = {
            t: sorted(map(tuple, connection.execute(sa.text(f"SELECT * FROM {t}"))), key=repr) for t in names
        }
        rows[schema.VERSION_TABLE] = list(
            map(tuple, connection.execute(sa.text(f"SELECT * FROM {schema.VERSION_TABLE}")))
        )
    engine.dispose()
    return rows


# --- schema ---------------------------------------------------------------------------------------


def test_db_current_and_upgrade(db_url, tmp_path):
    missing = f"sqlite:///{tmp_path / 'new.db'}"
    assert "not created yet" in ok("db", "current", "--db", missing).stdout
    assert not (tmp_path / "new.db").exists()
    assert "-> " + schema.head() in ok("db", "upgrade", "--db", db_url).stdout
    assert "already at schema revision" in ok("db", "upgrade", "--db", db_url).stdout
    (row,) = json.loads(ok("db", "current", "--db", db_url, "--json").stdout)
    assert (row["revision"], row["status"]) == (schema.head(), "current")


def test_db_downgrade_needs_yes(db_url):
    tuned(db_url)
    before = snapshot(db_url)
    bad("db", "downgrade", "base", "--db", db_url, expect="add --yes")
    assert snapshot(db_url) == before
    ok("db", "downgrade", "base", "--db", db_url, "--yes")
    assert json.loads(ok("db", "current", "--db", db_url, "--json").stdout)[0]["status"] == "empty"
    ok("db", "upgrade", "--db", db_url)


def test_env_variable_is_the_default_database(monkeypatch, tmp_path):
    url = f"sqlite:///{tmp_path / 'env.db'}"
    tuned(url)
    monkeypatch.setenv("MOETUNE_DB", url)
    assert len(json.loads(ok("trials", "--json").stdout)) == 4


# --- queries --------------------------------------------------------------------------------------


def test_trials_with_filters(db_url):
    tuned(db_url)
    rows = json.loads(ok("trials", "--db", db_url, "--json").stdout)
    assert len(rows) == 4 and rows[0]["id"] > rows[-1]["id"]
    (crashed,) = json.loads(ok("trials", "--db", db_url, "--status", "crashed", "--json").stdout)
    assert crashed["error"].startswith("ResourceExceeded") and crashed["samples_s"] == []
    by_problem = json.loads(
        ok("trials", "--db", db_url, "--problem", PROBLEM.with_m(64).key, "--json").stdout
    )
    assert [r["config"]["block_m"] for r in by_problem] == [16]
    assert (
        len(json.loads(ok("trials", "--db", db_url, "--gpu", "NVIDIA H200", "--limit", "2", "--json").stdout))
        == 2
    )
    assert (
        len(json.loads(ok("trials", "--db", db_url, "--backend", "fake", "--limit", "0", "--json").stdout))
        == 4
    )
    table = ok("trials", "--db", db_url).stdout
    assert "4 trials" in table and "crash" in table


def test_trials_says_when_the_limit_may_have_cut_the_list(db_url):
    tuned(db_url)
    cut = ok("trials", "--db", db_url, "--limit", "2", "--json")
    assert len(json.loads(cut.stdout)) == 2
    assert "showing the newest 2 trials; --limit 0 lists all" in cut.stderr
    whole = ok("trials", "--db", db_url, "--limit", "5", "--json")
    assert len(json.loads(whole.stdout)) == 4 and "showing" not in whole.stderr


def test_best_filters_by_problem_fields(db_url):
    tuned(db_url)
    rows = json.loads(ok("best", "--db", db_url, "--no-packs", "--json").stdout)
    assert sorted((r["problem"]["m"], r["config"]["block_m"]) for r in rows) == [(64, 16), (4096, 128)]
    (row,) = json.loads(
        ok(
            "best",
            "--db",
            db_url,
            "--no-packs",
            "--gpu",
            "NVIDIA H200",
            "--m",
            "4096",
            "--k",
            "4096",
            "--json",
        ).stdout
    )
    assert (
        row["problem"]["key"] == PROBLEM.key
        and row["fingerprint_hash"] == GPU.hash
        and row["state"] == "active"
    )
    assert json.loads(ok("best", "--db", db_url, "--n", "1", "--json").stdout) == []
    history = json.loads(
        ok("best", "--db", db_url, "--no-packs", "--m", "4096", "--history", "--json").stdout
    )
    assert [r["state"] for r in history] == ["active", "superseded"]
    table = ok("best", "--db", db_url, "--backend", "fake").stdout
    assert "2 winners" in table and "H200" in table and "fake" in table


def test_trials_json_writes_null_for_a_non_finite_verify_error(sqlite_url):
    with open_store(sqlite_url) as store:
        store.record_trial(
            TrialRecord(
                sweep_id=None,
                device=GPU,
                backend="fake",
                family="sm90",
                source_hash="src1",
                problem=PROBLEM,
                config={"block_m": 64},
                status="wrong_result",
                verify_error=math.nan,  # NaN output: stored as an infinite error
                error="WrongResult: NaN in the output",
            )
        )
    (row,) = strict_json(ok("trials", "--db", sqlite_url, "--json").stdout)
    assert row["status"] == "wrong_result" and row["verify_error"] is None


def test_json_text_is_strict_json():
    value = {"a": [1.5, math.inf, (math.nan, -math.inf)], "b": {"c": math.nan}, "d": "NaN", "e": 2}
    assert strict_json(json_text(value)) == {
        "a": [1.5, None, [None, None]],
        "b": {"c": None},
        "d": "NaN",
        "e": 2,
    }


# --- best: the database's winners beside the config packs' -----------------------------------------

SHIPPED_H200 = importlib.resources.files("moetune.configs") / "tuned" / "nvidia_h200__mosaic_gpu.json"


def running(monkeypatch, device: DeviceFingerprint) -> None:
    """Make `device` the one `best` judges freshness on."""
    monkeypatch.setattr(device_module, "current_fingerprint", lambda: device)


def test_best_on_an_empty_database_lists_the_shipped_pack(monkeypatch):
    pack = packs.load(SHIPPED_H200)
    running(monkeypatch, pack.device)
    open_store().close()  # the default database, created empty (`best` only reads: it creates none)
    rows = json.loads(ok("best", "--gpu", "NVIDIA H200", "--json").stdout)
    assert sorted((r["problem"]["key"], r["config"], r["median_s"]) for r in rows) == sorted(
        (e.problem.key, e.config, e.median_s) for e in pack.entries
    )
    assert {(r["origin"], r["backend"], r["fingerprint_hash"]) for r in rows} == {
        (SHIPPED_H200.name, "mosaic_gpu", pack.device.hash)
    }
    # On the pack's own device, each row is as fresh as dispatch finds it.
    backend = registry.get(pack.backend)
    with lookup.using_db(None):
        stale = [lookup.LOOKUP.resolve(e.problem, backend, pack.device).stale for e in pack.entries]
    assert sorted((r["freshness"], tuple(r["stale"])) for r in rows) == sorted(
        ("stale" if s else "fresh", s) for s in stale
    )
    table = ok("best", "--gpu", "NVIDIA H200").stdout
    assert f"{len(pack.entries)} winners" in table and "here" in table
    assert json.loads(ok("best", "--no-packs", "--json").stdout) == []


XLA_PROBLEM = Problem("grouped_matmul", m=256, k=512, n=1024, g=4)


def xla_pack(folder, *, device=GPU, source_hash=None) -> None:
    pack = packs.Pack(
        device=device,
        backend="xla",
        kernel_source_hash=source_hash or registry.get("xla").source_hash(),
        entries=(packs.PackEntry(XLA_PROBLEM, {"strategy": "segments"}, 2e-4),),
    )
    (folder / packs.file_name(device.device_kind, "xla")).write_text(pack.dumps())


@pytest.mark.parametrize(
    ("on", "pack_source", "freshness", "why"),
    [
        (GPU, None, "fresh", ""),
        (dataclasses.replace(GPU, driver="590.1"), None, "stale", "tuned on device fingerprint"),
        (GPU, "0" * 16, "stale", "tuned with kernel source 0000000000000000"),
        (dataclasses.replace(GPU, device_kind="NVIDIA B200"), None, "other device", ""),
    ],
)
def test_best_tells_fresh_from_stale_on_this_machine(
    sqlite_url, tmp_path, monkeypatch, on, pack_source, freshness, why
):
    xla_pack(tmp_path, source_hash=pack_source)
    running(monkeypatch, on)
    open_store(sqlite_url).close()
    with lookup.using_packs(tmp_path):
        (row,) = json.loads(ok("best", "--db", sqlite_url, "--backend", "xla", "--json").stdout)
    assert (row["origin"], row["freshness"], row["config"]) == (
        "nvidia_h200__xla.json",
        freshness,
        {"strategy": "segments"},
    )
    assert why in " ".join(row["stale"]) and bool(row["stale"]) == (freshness == "stale")


def test_best_lists_database_and_pack_rows_side_by_side(sqlite_url, tmp_path, monkeypatch):
    monkeypatch.setenv("COLUMNS", "250")  # rich reads it when printing: table cells are not cut short
    tuned(sqlite_url)
    xla_pack(tmp_path)
    (tmp_path / "nvidia_h200__triton.json").write_text("{not json")
    running(monkeypatch, GPU)
    with lookup.using_packs(tmp_path):
        result = ok("best", "--db", sqlite_url, "--gpu", "NVIDIA H200", "--json")
        rows = json.loads(result.stdout)
        # The keys of a pack row are those of a database row; what a pack has not got is null.
        assert len({tuple(sorted(r)) for r in rows}) == 1
        assert [(r["origin"], r["backend"], r["problem"]["m"]) for r in rows] == [
            ("database", "fake", 64),
            ("database", "fake", 4096),
            ("nvidia_h200__xla.json", "xla", 256),
        ]
        # "fake" is no backend here: its kernel source, hence its freshness, cannot be told.
        assert [r["freshness"] for r in rows] == ["unknown", "unknown", "fresh"]
        assert rows[2]["id"] is None and rows[0]["id"] is not None
        assert "ignoring config pack" in result.stderr and "cannot read pack" in result.stderr
        table = ok("best", "--db", sqlite_url).stdout
        assert "3 winners from 2 sources" in table and "nvidia_h200__xla.json" in table and "unknown" in table
        # A GPU or backend known only from a pack is a known filter value; one known nowhere is refused.
        (row,) = json.loads(ok("best", "--db", sqlite_url, "--backend", "xla", "--json").stdout)
        bad(
            "best",
            "--db",
            sqlite_url,
            "--backend",
            "xla",
            "--no-packs",
            expect="no backend 'xla' in the database",
        )


def test_best_ignores_a_pack_dispatch_would_not_read(sqlite_url, tmp_path):
    open_store(sqlite_url).close()
    xla_pack(tmp_path)
    (tmp_path / "nvidia_h200__xla.json").rename(tmp_path / "h200.json")  # dispatch looks up by name only
    with lookup.using_packs(tmp_path):
        result = ok("best", "--db", sqlite_url, "--json")
    assert json.loads(result.stdout) == []
    assert "h200.json" in result.stderr and "nvidia_h200__xla.json" in result.stderr


def test_misses_listing(sqlite_url):
    with open_store(sqlite_url) as store:
        for _ in range(2):
            store.record_miss(device=GPU, backend="fake", problem=PROBLEM)
    (row,) = json.loads(ok("misses", "--db", sqlite_url, "--json").stdout)
    assert (row["problem"], row["count"]) == (PROBLEM.key, 2)


# --- packs and rollback ---------------------------------------------------------------------------


def test_export_import_round_trip(db_url, tmp_path, fake_backend):
    source = f"sqlite:///{tmp_path / 'source.db'}"
    tuned(source)
    pack = tmp_path / "h200.json"
    out = ok("export", "--gpu", "NVIDIA H200", "--backend", "fake", "-o", str(pack), "--db", source).stdout
    assert "exported 2 winners" in out
    assert json.loads(pack.read_text())["schema"] == "moetune.pack"
    assert "imported 2 winners" in ok("import", str(pack), "--db", db_url).stdout
    assert "imported 0 winners" in ok("import", str(pack), "--db", db_url).stdout
    original = json.loads(ok("best", "--db", source, "--json").stdout)
    copied = json.loads(ok("best", "--db", db_url, "--json").stdout)
    assert [(r["problem"], r["config"], r["median_s"]) for r in copied] == [
        (r["problem"], r["config"], r["median_s"]) for r in original
    ]


def test_commands_that_change_something_say_what_as_json(sqlite_url, tmp_path, fake_backend):
    """export, import, rollback and db upgrade/downgrade: one JSON object, numbers as numbers."""
    upgraded = strict_json(ok("db", "upgrade", "--db", sqlite_url, "--json").stdout)
    assert (upgraded["before"], upgraded["revision"], upgraded["changed"]) == (None, schema.head(), True)
    assert strict_json(ok("db", "upgrade", "--db", sqlite_url, "--json").stdout)["changed"] is False
    tuned(sqlite_url)
    pack = tmp_path / "p.json"
    args = ("--gpu", "NVIDIA H200", "--backend", "fake")
    exported = strict_json(ok("export", *args, "-o", str(pack), "--db", sqlite_url, "--json").stdout)
    assert (exported["exported"], exported["left_out"], exported["file"]) == (2, 0, str(pack))
    assert exported["fingerprint_hash"] == GPU.hash
    other = f"sqlite:///{tmp_path / 'other.db'}"
    imported = strict_json(ok("import", str(pack), "--db", other, "--json").stdout)
    assert (imported["imported"], imported["already_current"], imported["backend"]) == (2, 0, "fake")
    restored = strict_json(
        ok("rollback", *args, "--problem", PROBLEM.key, "--db", sqlite_url, "--json").stdout
    )["restored"]
    assert restored["config"] == {"block_m": 64, "block_n": 128} and isinstance(restored["median_s"], float)
    assert restored["problem"] == PROBLEM.key and restored["promoted_at"].startswith("20")
    down = strict_json(ok("db", "downgrade", "base", "--yes", "--db", sqlite_url, "--json").stdout)
    assert (down["before"], down["revision"]) == (schema.head(), None)


def test_export_default_file_name(sqlite_url, tmp_path, monkeypatch):
    tuned(sqlite_url)
    monkeypatch.chdir(tmp_path)
    ok("export", "--gpu", "NVIDIA H200", "--backend", "fake", "--db", sqlite_url)
    assert (tmp_path / "nvidia_h200__fake.json").is_file()


def test_an_exported_pack_gets_a_plain_file_mode(sqlite_url, tmp_path):
    """A pack is written beside its name and renamed over it: the new file gets 0666 less the umask (mkstemp
    alone leaves 0600, unreadable to the team it is for), a replaced file keeps its own mode."""
    tuned(sqlite_url)
    new, kept = tmp_path / "new.json", tmp_path / "kept.json"
    kept.write_text("{}")
    kept.chmod(0o640)
    mask = os.umask(0o022)
    try:
        for path in (new, kept):
            ok("export", "--gpu", "NVIDIA H200", "--backend", "fake", "-o", str(path), "--db", sqlite_url)
    finally:
        os.umask(mask)
    assert (stat.S_IMODE(new.stat().st_mode), stat.S_IMODE(kept.stat().st_mode)) == (0o644, 0o640)
    assert json.loads(kept.read_text())["entries"]


def test_rollback_restores_the_previous_winner(db_url, fake_backend):
    tuned(db_url)
    out = ok(
        "rollback", "--gpu", "NVIDIA H200", "--backend", "fake", "--problem", PROBLEM.key, "--db", db_url
    ).stdout
    assert "restored winner" in out
    assert "config defaults," in out  # block_m=64, block_n=128 are FakeConfig's defaults: nothing differs
    (row,) = json.loads(ok("best", "--db", db_url, "--no-packs", "--m", "4096", "--json").stdout)
    assert row["config"]["block_m"] == 64
    before = snapshot(db_url)
    bad(
        "rollback", "--fingerprint", GPU.hash, "--backend", "fake", "--problem", PROBLEM.key, "--db", db_url,
        expect="nothing to roll back to",
    )  # fmt: skip
    assert snapshot(db_url) == before


# --- doctor ---------------------------------------------------------------------------------------


def test_doctor_reports_without_creating_the_database(tmp_path):
    from moetune.kernels.device import current_fingerprint

    url = f"sqlite:///{tmp_path / 'doctor.db'}"
    report = json.loads(ok("doctor", "--db", url, "--json").stdout)
    assert report["fingerprint_hash"] == current_fingerprint().hash
    assert report["database"]["status"] == "missing" and not (tmp_path / "doctor.db").exists()
    assert set(report["versions"]) >= {"python", "jax", "jaxlib", "ray", "optuna", "sqlalchemy"}
    assert report["ray"].startswith("importable")
    assert isinstance(report["backends"], dict)  # other backends come and go; each has a verdict
    assert "fingerprint hash" in ok("doctor", "--db", url).stdout


def test_doctor_masks_the_password(postgres_url):
    open_store(postgres_url).close()
    url = sa.make_url(postgres_url)
    result = ok("doctor", "--db", postgres_url, "--json")
    report = json.loads(result.stdout)
    assert report["database"]["revision"] == schema.head()
    assert report["database"]["url"] == url.render_as_string(hide_password=True)
    assert not url.password or f":{url.password}@" not in result.output


# --- bad input: one line, exit 2, nothing written -------------------------------------------------


@pytest.mark.parametrize(
    ("args", "expect"),
    [
        (["trials", "--db", "definitely not a url"], "not a database URL"),
        (["best", "--db", "nosuch://x/y"], "unsupported database URL scheme"),
        (["trials", "--db", "sqlite:////nonexistent-dir/x.db"], "no database at /nonexistent-dir/x.db"),
        (["db", "upgrade", "--db", f"postgresql+psycopg://moetune:{SECRET}@127.0.0.1:1/x"], "127.0.0.1"),
        (["doctor", "--db", f"postgresql+psycopg://moetune:{SECRET}@127.0.0.1:1/x"], "connection"),
    ],
)
def test_unusable_database_urls(args, expect):
    line = bad(*args, expect=expect)
    assert SECRET not in line


@pytest.mark.parametrize(
    ("args", "expect"),
    [
        (["trials", "--status", "bogus"], "'bogus' is not one of 'ok', 'compile_error'"),
        (["trials", "--limit", "-1"], "--limit -1"),
        (["rollback", "--backend", "fake", "--problem", "x"], "exactly one of --gpu or --fingerprint"),
    ],
)
def test_bad_options_are_refused_before_the_database_is_created(args, expect, tmp_path):
    bad(*args, "--db", f"sqlite:///{tmp_path / 'never.db'}", expect=expect)
    assert not (tmp_path / "never.db").exists()


@pytest.mark.parametrize(
    ("args", "expect"),
    [
        (["trials", "--gpu", "NVIDIA B200"], "no gpu 'NVIDIA B200' in the database; known: 'NVIDIA H200'"),
        (["trials", "--backend", "nope"], "no backend 'nope'"),
        (["trials", "--sweep", "999"], "no sweep with id 999"),
        (["trials", "--problem", "grouped_matmul/m=1/v1"], "no problem"),
        (["best", "--gpu", "H200"], "no gpu 'H200'"),
        (
            ["export", "--gpu", "NVIDIA B200", "--backend", "fake", "-o", "OUT"],
            "no winners for gpu='NVIDIA B200'",
        ),
        (
            ["rollback", "--gpu", "NVIDIA H200", "--backend", "fake", "--problem", "nokey"],
            "no problem with key",
        ),
    ],
)
def test_unknown_filter_values(db_url, tmp_path, args, expect):
    tuned(db_url)
    before = snapshot(db_url)
    out = tmp_path / "out.json"
    bad(*[str(out) if a == "OUT" else a for a in args], "--db", db_url, expect=expect)
    assert snapshot(db_url) == before
    assert not out.exists()


def _set_revision(url: str, revision: str) -> None:
    engine = sa.create_engine(url)
    with engine.begin() as connection:
        connection.execute(sa.text(f"UPDATE {schema.VERSION_TABLE} SET version_num = :r"), {"r": revision})
    engine.dispose()


@pytest.mark.parametrize(
    ("revision", "expect"),
    [("v9.9.9.z", "upgrade moetune"), ("v0.1.0.a", "run `moetune db upgrade`")],
)
@pytest.mark.parametrize("command", [["trials"], ["best"], ["misses"]])
def test_schema_mismatch(db_url, revision, expect, command):
    tuned(db_url)
    _set_revision(db_url, revision)
    before = snapshot(db_url)
    bad(*command, "--db", db_url, expect=expect)
    assert snapshot(db_url) == before


def test_db_upgrade_refuses_a_newer_schema(sqlite_url):
    tuned(sqlite_url)
    _set_revision(sqlite_url, "v9.9.9.z")
    before = snapshot(sqlite_url)
    bad("db", "upgrade", "--db", sqlite_url, expect="upgrade moetune")
    assert snapshot(sqlite_url) == before


def _valid_pack(url: str, tmp_path) -> dict:
    tuned(url)
    path = tmp_path / "good.json"
    ok("export", "--gpu", "NVIDIA H200", "--backend", "fake", "-o", str(path), "--db", url)
    return json.loads(path.read_text())


@pytest.mark.parametrize(
    ("corrupt", "expect"),
    [
        (lambda d: "{ this is not json", "cannot read pack"),
        (lambda d: json.dumps({"hello": "world"}), "not a moetune config pack"),
        (lambda d: json.dumps(d | {"schema_version": 99}), "schema_version=99"),
        (lambda d: json.dumps(d | {"device": {"device_kind": "x"}}), "device.platform: missing field"),
        (lambda d: json.dumps(d | {"backend": "nosuchbackend"}), "backend 'nosuchbackend'"),
        (
            lambda d: json.dumps(
                d | {"entries": [d["entries"][0], {**d["entries"][1], "config": {"block_m": 7}}]}
            ),
            "entries[1]",
        ),
    ],
)
def test_bad_pack_imports_nothing(db_url, tmp_path, fake_backend, corrupt, expect):
    data = _valid_pack(db_url, tmp_path)
    # Import into a database that has other winners: a bad pack must change none of them.
    with open_store(db_url) as store:
        store.rollback(backend="fake", problem_key=PROBLEM.key, device_kind="NVIDIA H200")
    before = snapshot(db_url)
    path = tmp_path / "bad.json"
    path.write_text(corrupt(data))
    bad("import", str(path), "--db", db_url, expect=expect)
    assert snapshot(db_url) == before


def test_bad_pack_does_not_create_a_database(tmp_path, fake_backend):
    path = tmp_path / "bad.json"
    path.write_text("[]")
    bad("import", str(path), "--db", f"sqlite:///{tmp_path / 'never.db'}", expect="not a moetune config pack")
    assert not (tmp_path / "never.db").exists()
    bad(
        "import",
        str(tmp_path / "missing.json"),
        "--db",
        f"sqlite:///{tmp_path / 'never.db'}",
        expect="cannot read",
    )
    assert not (tmp_path / "never.db").exists()


def test_trials_show_compile_only_details(db_url, monkeypatch):
    monkeypatch.setenv("COLUMNS", "250")  # rich reads it when printing: table cells are not wrapped
    tuned(db_url)
    facts = {
        "target": "gfx942",
        "binary_hash": "9f3c" * 16,
        "metrics": {"vgpr_count": 128, "agpr_count": 64, "vgpr_spill_count": 3, "sgpr_spill_count": 1},
        "duplicate_of": 2,
    }
    with open_store(db_url) as store:
        compiled = store.record_trial(
            trial(
                device=GPU,
                problem=PROBLEM,
                config={"block_m": 32, "block_n": 128},
                status="pruned",
                median_s=None,
                error="spills 4 registers",
                details=facts,
            )
        )
    rows = {r["id"]: r for r in json.loads(ok("trials", "--db", db_url, "--json").stdout)}
    assert rows[compiled]["details"] == facts and rows[compiled]["routing"] is None
    assert [r["details"] for i, r in rows.items() if i != compiled] == [None] * 4
    table = ok("trials", "--db", db_url, "--status", "pruned").stdout
    assert "details" in table and "9f3c9f3c" in table and "spills=4" in table
    with open_store(db_url) as store:  # a device trial's details hold only its phase times
        store.record_trial(
            trial(
                device=GPU,
                problem=PROBLEM,
                config={"block_m": 64, "block_n": 64},
                status="crashed",
                median_s=None,
                error="raised during time",
                details={"phases": {"setup_s": 1.5, "verify_s": 0.1}},
            )
        )
    # A listing without compile-only trials has no details column.
    assert "details" not in ok("trials", "--db", db_url, "--status", "crashed").stdout


def test_details_summary_names_the_binary_registers_and_spills():
    from moetune.cli.trials import _details_summary

    metrics = {"vgpr_count": 96, "agpr_count": 0, "lds_bytes": 16384, "vgpr_spill_count": 0, "args": 4}
    details = {"target": "gfx950", "binary_hash": "abcdef0123456789", "metrics": metrics, "duplicate_of": 9}
    assert _details_summary(details) == "bin abcdef01 vgpr=96 agpr=0 lds=16384 spills=0 dup of #9"
    assert _details_summary({"target": "gfx942"}) == ""
    assert _details_summary(None) == ""
