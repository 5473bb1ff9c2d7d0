"""lab/bench/gpu_test_counts.py on synthetic JUnit files of GPU test shards."""

from __future__ import annotations

from moetune_lab.bench import gpu_test_counts as counts


def junit(path, tests, failures=0, errors=0, skipped=0, failed=()):
    cases = "".join(
        f'<testcase classname="tests.gpu.test_k" name="{name}"><failure message="x"/></testcase>'
        for name in failed
    )
    path.write_text(
        f'<?xml version="1.0"?><testsuites><testsuite name="pytest" tests="{tests}" failures="{failures}" '
        f'errors="{errors}" skipped="{skipped}">{cases}</testsuite></testsuites>'
    )
    return path


def test_every_shard_passed_adds_up_and_exits_0(tmp_path, capsys):
    a = junit(tmp_path / "gpu_tests_0_of_2.xml", 10, skipped=2)
    b = junit(tmp_path / "gpu_tests_1_of_2.xml", 7)
    assert counts.main([str(a), str(b)]) == 0
    assert "all: 15 passed, 0 failures, 0 errors, 2 skipped" in capsys.readouterr().out


def test_a_failure_or_a_missing_shard_exits_1_naming_them(tmp_path, capsys):
    a = junit(tmp_path / "gpu_tests_0_of_3.xml", 4, failures=1, failed=["test_a"])
    assert counts.main([str(a)]) == 1
    out = capsys.readouterr().out
    assert "missing shards [1, 2]" in out and "failed: tests.gpu.test_k::test_a" in out


def test_files_of_two_splits_or_another_name_are_refused(tmp_path, capsys):
    a = junit(tmp_path / "gpu_tests_0_of_2.xml", 1)
    b = junit(tmp_path / "gpu_tests_0_of_3.xml", 1)
    assert counts.main([str(a), str(b)]) == 2
    assert counts.main([str(junit(tmp_path / "other.xml", 1))]) == 2
    assert "not a gpu_tests_<shard>_of_<shards>.xml file" in capsys.readouterr().err
