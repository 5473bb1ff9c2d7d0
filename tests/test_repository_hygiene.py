"""The product speaks of the software only: no tracked file says how the work was organised (a session,
a call or an issue by number) or names a path on a developer's machine. History belongs in git and in
CHANGELOG.md, the one file left out; binary files are skipped."""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
# Written so that this file does not match itself.
PATTERNS = {
    "work-log word": re.compile(r"\b(?:sessions?|calls?|issues?|waves?)[ -]?#?\d+", re.IGNORECASE),
    "machine path": re.compile(r"(?<![\w.])/(?:work|root|home)/|(?<![\w.$}])/tmp/[a-z]", re.IGNORECASE),
}
SKIPPED = {"CHANGELOG.md"}


def findings(name: str, text: str) -> list[str]:
    """'file:line: what (the match)' for every line of `text` that matches a pattern."""
    found = []
    for number, line in enumerate(text.splitlines(), 1):
        for what, pattern in PATTERNS.items():
            for match in pattern.finditer(line):
                found.append(f"{name}:{number}: {what} {match.group(0)!r}")
    return found


def tracked_text_files() -> list[tuple[str, str]]:
    listed = subprocess.run(["git", "ls-files", "-z"], cwd=ROOT, capture_output=True, check=True).stdout
    files = []
    for name in filter(None, listed.decode().split("\0")):
        path = ROOT / name
        if name in SKIPPED or not path.is_file():
            continue
        data = path.read_bytes()
        if b"\0" in data[:8192]:
            continue  # binary
        try:
            files.append((name, data.decode()))
        except UnicodeDecodeError:
            continue  # binary
    return files


def test_the_patterns_catch_work_log_words_and_machine_paths():
    bad = "\n".join(
        [
            "fine line",
            "measured in ses" + "sion 15, ca" + "ll 3",
            "see iss" + "ue #7 and the Ses" + "sion-9 run",
            "wave" + " 2 of the service",
            "raw: /" + "work/main/x.json, /" + "root/out, /" + "home/me, /" + "tmp/e2e",
        ]
    )
    assert [f.split(": ", 1)[0] for f in findings("f.md", bad)] == ["f.md:2"] * 2 + ["f.md:3"] * 2 + [
        "f.md:4"
    ] + ["f.md:5"] * 4


def test_ordinary_words_and_paths_pass():
    fine = "\n".join(
        [
            "a call to grouped_matmul; calls grouped_matmul; the session's results; the issue tracker",
            "JAX_COMPILATION_CACHE_DIR=~/.cache/moetune/xla; $OUT/bench.json; ${TMPDIR:-/tmp}/x; a/tmp/b",
            "optuna/optuna#820 (a public thread); 3 waves of 132 CTAs",
        ]
    )
    assert findings("f.md", fine) == []


@pytest.mark.skipif(shutil.which("git") is None or not (ROOT / ".git").exists(), reason="not a git checkout")
def test_no_tracked_file_speaks_of_sessions_calls_issues_or_machine_paths():
    found = [line for name, text in tracked_text_files() for line in findings(name, text)]
    assert not found, "\n" + "\n".join(found)
