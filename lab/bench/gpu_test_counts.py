"""Adds up the JUnit files of the GPU test shards (lab/device/gpu_tests.sh): passed, failed,
errors and skipped per shard and in all, the failing tests by id, and the shards still missing.

    python3 lab/bench/gpu_test_counts.py run1/gpu_tests_0_of_4.xml run2/gpu_tests_1_of_4.xml ...

Exit 1 when a test failed or errored, or a shard of the split is missing; 0 when every shard passed.
"""

from __future__ import annotations

import argparse
import re
import sys
import xml.etree.ElementTree as ET
from pathlib import Path

SHARD = re.compile(r"gpu_tests_(\d+)_of_(\d+)\.xml$")


def counts(path: Path) -> dict:
    """One shard's counts and failing test ids; a shard cut at its time box leaves no file."""
    root = ET.parse(path).getroot()
    suites = [root] if root.tag == "testsuite" else list(root.iter("testsuite"))
    total = {"tests": 0, "failures": 0, "errors": 0, "skipped": 0, "failed_ids": []}
    for suite in suites:
        for key in ("tests", "failures", "errors", "skipped"):
            total[key] += int(suite.get(key, 0))
        for case in suite.iter("testcase"):
            if case.find("failure") is not None or case.find("error") is not None:
                total["failed_ids"].append(f"{case.get('classname')}::{case.get('name')}")
    total["passed"] = total["tests"] - total["failures"] - total["errors"] - total["skipped"]
    return total


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("files", nargs="+", type=Path)
    args = parser.parse_args(argv)
    shards: dict[int, dict] = {}
    splits = set()
    for path in args.files:
        match = SHARD.search(path.name)
        if match is None:
            print(f"error: {path}: not a gpu_tests_<shard>_of_<shards>.xml file", file=sys.stderr)
            return 2
        shard, split = int(match.group(1)), int(match.group(2))
        splits.add(split)
        shards[shard] = counts(path)
    if len(splits) != 1:
        print(f"error: the files come from different splits: {sorted(splits)}", file=sys.stderr)
        return 2
    (split,) = splits
    keys = ("passed", "failures", "errors", "skipped")
    for shard, c in sorted(shards.items()):
        print(f"shard {shard} of {split}: " + ", ".join(f"{c[k]} {k}" for k in keys))
    total = {k: sum(c[k] for c in shards.values()) for k in keys}
    missing = sorted(set(range(split)) - set(shards))
    print(
        "all: "
        + ", ".join(f"{total[k]} {k}" for k in keys)
        + (f"; missing shards {missing}" if missing else "")
    )
    for c in shards.values():
        for test in c["failed_ids"]:
            print(f"failed: {test}")
    return 1 if total["failures"] or total["errors"] or missing else 0


if __name__ == "__main__":
    raise SystemExit(main())
