"""Fixtures shared across test folders: no test touches the user's database, database URLs, a store per
test, and a fake backend.

PostgreSQL tests run against MOETUNE_TEST_POSTGRES_URL (.ci/run starts a server and sets it); each test
gets a schema of its own, selected through search_path, and dropped afterwards. Without the variable
they skip, except under CI=true, where a missing server is a failure rather than a silent skip. One test
restarts the server: it holds it alone (`postgres_alone`), while every other PostgreSQL test holds it
shared, so that no test of another xdist worker meets the restart.
"""

from __future__ import annotations

import dataclasses
import fcntl
import os
import sys
import tempfile
import types
import uuid

import pytest

# The kernels under test run interpreted on XLA:CPU over tiny arrays: compiling them costs far more than
# running them, and LLVM's optimisation passes are most of that compile. Set before any backend starts,
# and inherited by the subprocesses and Ray workers the tests start. Not on a GPU host, whose XLA code
# the GPU tests leave as a user gets it.
_FAST_COMPILE = "--xla_backend_optimization_level=0"
if not os.path.exists("/dev/nvidia0") and _FAST_COMPILE not in os.environ.get("XLA_FLAGS", ""):
    os.environ["XLA_FLAGS"] = f"{os.environ.get('XLA_FLAGS', '')} {_FAST_COMPILE}".strip()


def _build_cli_commands_once() -> None:
    """typer.testing's CliRunner turns the Typer app into a click command on every invoke: about 0.2 s for
    moetune's commands on a 2-core machine, paid by every CLI invocation of every test. The command depends
    only on what the app has registered, so it is built again only when that changed."""
    import typer.main
    import typer.testing

    build = typer.main.get_command
    built: dict[int, tuple] = {}

    def registered(app) -> tuple:
        groups = tuple(registered(group.typer_instance) for group in app.registered_groups)
        return len(app.registered_commands), app.registered_callback is not None, groups

    def get_command(app):
        state = registered(app)
        hit = built.get(id(app))
        if hit is None or hit[0] is not app or hit[1] != state:
            hit = built[id(app)] = (app, state, build(app))
        return hit[2]

    if getattr(typer.testing, "_get_command", None) is build:  # another typer: left as it is, only slower
        typer.testing._get_command = get_command


_build_cli_commands_once()

POSTGRES_ENV = "MOETUNE_TEST_POSTGRES_URL"
# Shared by every PostgreSQL test of this machine's test processes; the test that restarts the server
# converts its hold to exclusive. The open file of this process's current test: flock locks belong to it.
POSTGRES_LOCK = os.path.join(tempfile.gettempdir(), "moetune-test-postgres.lock")
_postgres_hold: list = []


@pytest.fixture(autouse=True)
def no_default_database(monkeypatch, tmp_path):
    """No test may touch the user's real database through $MOETUNE_DB or the default path."""
    monkeypatch.delenv("MOETUNE_DB", raising=False)
    monkeypatch.setenv("XDG_DATA_HOME", str(tmp_path / "xdg"))


@pytest.fixture
def sqlite_url(tmp_path):
    return f"sqlite:///{tmp_path / 'moetune.db'}"


@pytest.fixture
def postgres_url():
    base = os.environ.get(POSTGRES_ENV)
    if not base:
        if os.environ.get("CI") == "true":
            pytest.fail(f"{POSTGRES_ENV} is not set; .ci/run starts PostgreSQL and sets it")
        pytest.skip(f"{POSTGRES_ENV} is not set")
    import sqlalchemy as sa

    hold = open(POSTGRES_LOCK, "a")  # noqa: SIM115 - held for the test, closed below
    fcntl.flock(hold, fcntl.LOCK_SH)
    _postgres_hold.append(hold)
    schema = f"test_{uuid.uuid4().hex[:12]}"
    admin = sa.create_engine(base, isolation_level="AUTOCOMMIT", pool_pre_ping=True)  # survives a restart
    with admin.connect() as connection:
        connection.execute(sa.text(f'CREATE SCHEMA "{schema}"'))
    url = sa.make_url(base).update_query_dict({"options": f"-csearch_path={schema}"})
    yield url.render_as_string(hide_password=False)
    with admin.connect() as connection:
        connection.execute(sa.text(f'DROP SCHEMA "{schema}" CASCADE'))
    admin.dispose()
    _postgres_hold.remove(hold)
    hold.close()  # releases the lock


@pytest.fixture
def postgres_alone(postgres_url):
    """postgres_url, with no other PostgreSQL test running in any test process until this one ends."""
    fcntl.flock(_postgres_hold[-1], fcntl.LOCK_EX)  # converts this test's shared hold
    return postgres_url


@pytest.fixture(params=["sqlite", pytest.param("postgres", marks=pytest.mark.postgres)])
def db_url(request):
    """Each test using it runs once on SQLite and once on PostgreSQL."""
    return request.getfixturevalue(f"{request.param}_url")


@pytest.fixture
def store(db_url):
    from moetune.db import open_store

    with open_store(db_url) as s:
        yield s


@pytest.fixture
def fake_backend(monkeypatch):
    """A registered backend named "fake" whose Config has block_m (multiple of 8) and block_n."""
    from moetune.kernels import registry
    from moetune.kernels.backend import Backend
    from moetune.kernels.config import KernelConfig
    from moetune.kernels.errors import ConfigInvalid

    @dataclasses.dataclass(frozen=True, slots=True)
    class FakeConfig(KernelConfig):
        block_m: int = 64
        block_n: int = 128

        def validate(self) -> None:
            if self.block_m % 8:
                raise ConfigInvalid(f"block_m={self.block_m} is not a multiple of 8")

    class FakeBackend(Backend):
        name = "fake"
        config_cls = FakeConfig
        kernels = {"grouped_matmul": "build"}  # never built

        def available(self, device):
            return None

        def search_space(self, problem, device):
            raise NotImplementedError

        def heuristic(self, problem, device):
            return FakeConfig()

        def build(self, problem, config):
            raise NotImplementedError

    module = types.ModuleType("moetune_test_fake_backend")
    module.BACKEND = FakeBackend()
    monkeypatch.setitem(sys.modules, module.__name__, module)
    registry.register("fake", module.__name__)
    yield module.BACKEND
    registry.unregister("fake")


@pytest.fixture
def triton_lowering_for_h200():
    """Pallas's Triton lowering asks the local GPU for its compute capability; on a CPU, answer as an H200
    would. Lowering to Triton IR happens in Python; only compiling that IR needs the GPU."""
    import unittest.mock

    from jax._src.pallas.triton import gpu_info
    from jax.experimental.pallas import triton as pltriton

    h200 = lambda: gpu_info.get_gpu_info_from_version(pltriton.GpuVersion.H200)  # noqa: E731
    with unittest.mock.patch.object(gpu_info, "get_gpu_info", h200):
        yield
