"""Finding the FlyDSL interpreter and an ld.lld that links code object v6, with fake tools."""

from __future__ import annotations

import os
import stat

import pytest

from moetune.kernels.backends.flydsl import toolchain


def fake_tool(path, version_line):
    path.write_text(f"#!/bin/sh\necho '{version_line}'\n")
    path.chmod(path.stat().st_mode | stat.S_IEXEC)
    return path


@pytest.fixture
def isolated(monkeypatch, tmp_path):
    for name in (toolchain.ENV_LLD, toolchain.ENV_PYTHON, toolchain.ENV_VENV, "ROCM_PATH"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv(toolchain.ENV_CACHE, str(tmp_path / "cache"))
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    monkeypatch.setenv("PATH", str(bin_dir))
    monkeypatch.setattr(
        toolchain.glob,
        "glob",
        lambda pattern: (
            [str(p) for p in bin_dir.glob(os.path.basename(pattern))]
            if pattern.startswith(str(bin_dir))
            else []
        ),
    )
    return bin_dir


@pytest.mark.parametrize(
    ("text", "major"),
    [("Debian LLD 19.1.7 (compatible with GNU linkers)", 19), ("LLD 14.0.6", 14), ("GNU ld 2.40", None)],
)
def test_lld_major(text, major):
    assert toolchain.lld_major(text) == major


def test_an_old_lld_is_refused_with_the_fix(isolated):
    fake_tool(isolated / "ld.lld", "Debian LLD 14.0.6 (compatible with GNU linkers)")
    with pytest.raises(toolchain.ToolchainMissing, match="ld.lld >= 19 .*apt-get install lld-19.*14.0.6"):
        toolchain.find_lld()


def test_the_newest_suitable_lld_is_found(isolated):
    fake_tool(isolated / "ld.lld", "Debian LLD 14.0.6")
    lld19 = fake_tool(isolated / "ld.lld-19", "Debian LLD 19.1.7 (compatible with GNU linkers)")
    assert toolchain.find_lld() == (str(lld19), "Debian LLD 19.1.7 (compatible with GNU linkers)")


def test_an_explicit_lld_skips_the_version_check(isolated, monkeypatch):
    mine = fake_tool(isolated / "my-linker", "something else")
    monkeypatch.setenv(toolchain.ENV_LLD, str(mine))
    assert toolchain.find_lld()[0] == str(mine)
    monkeypatch.setenv(toolchain.ENV_LLD, str(isolated / "missing"))
    with pytest.raises(toolchain.ToolchainMissing, match="not an executable"):
        toolchain.find_lld()


def test_private_rocm_path_links_the_system_lld(isolated):
    lld = fake_tool(isolated / "ld.lld-19", "Debian LLD 19.1.7")
    root = toolchain.private_rocm_path(str(lld))
    link = os.path.join(root, "llvm", "bin", "ld.lld")
    assert os.path.realpath(link) == os.path.realpath(lld)
    assert toolchain.private_rocm_path(str(lld)) == root  # found again, not rebuilt


def test_a_real_rocm_lld_is_used_in_place(tmp_path, isolated):
    rocm_lld = tmp_path / "rocm" / "llvm" / "bin"
    rocm_lld.mkdir(parents=True)
    lld = fake_tool(rocm_lld / "ld.lld", "AMD LLD 19.0.0")
    assert toolchain.private_rocm_path(str(lld)) == str(tmp_path / "rocm")


def test_a_missing_interpreter_names_the_setup_script(isolated, monkeypatch, tmp_path):
    monkeypatch.setenv(toolchain.ENV_VENV, str(tmp_path / "nowhere"))
    with pytest.raises(toolchain.ToolchainMissing, match="scripts/setup-flydsl.sh"):
        toolchain.find_python()


def test_an_interpreter_without_flydsl_is_refused(isolated, monkeypatch):
    import sys

    monkeypatch.setenv(toolchain.ENV_PYTHON, sys.executable)  # this one has no flydsl
    with pytest.raises(toolchain.ToolchainMissing, match="cannot import flydsl"):
        toolchain.find_python()


def test_worker_environment_sets_both_arch_variables():
    tools = toolchain.Toolchain("python", "0.5.0", "/usr/bin/ld.lld-19", "LLD 19", "/x/rocm")
    env = tools.env("gfx950")
    assert (env["ARCH"], env["FLYDSL_GPU_ARCH"], env["ROCM_PATH"]) == ("gfx950", "gfx950", "/x/rocm")
