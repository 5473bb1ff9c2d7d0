"""The README's examples run as written: every ```python block right after a `<!-- runnable -->` line
runs on a CPU in a fresh process, with no database of the user's and no GPU."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

README = Path(__file__).resolve().parents[1] / "README.md"
RUNNABLE = re.compile(r"^<!-- runnable -->\n```python\n(.*?)^```$", re.DOTALL | re.MULTILINE)


def runnable_blocks(text: str) -> list[str]:
    return RUNNABLE.findall(text)


def test_marked_blocks_are_found_and_unmarked_ones_are_not():
    text = "<!-- runnable -->\n```python\nprint(1)\n```\n\n```python\nprint(2)\n```\n"
    assert runnable_blocks(text) == ["print(1)\n"]
    assert runnable_blocks(README.read_text()), "the README has no runnable example"


@pytest.mark.parametrize("index", range(len(runnable_blocks(README.read_text()))))
def test_a_runnable_readme_block_runs_on_a_cpu(index, tmp_path):
    code = runnable_blocks(README.read_text())[index]
    env = {k: v for k, v in os.environ.items() if not k.startswith("MOETUNE_")}
    env |= {"JAX_PLATFORMS": "cpu", "XDG_DATA_HOME": str(tmp_path), "HOME": str(tmp_path)}
    run = subprocess.run(
        [sys.executable, "-c", code], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300
    )
    assert run.returncode == 0, run.stderr[-3000:]
    assert not list(tmp_path.rglob("*.db")), "the example wrote a database"
