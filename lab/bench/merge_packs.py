"""Merge config packs of one device and kernel source into one: per problem, the entry with the lowest
recorded time (each pack's time is its sweep's interleaved re-timing of the winner, with the same timer).
A later pack's entry wins ties. Packs of another device fingerprint, backend or kernel source are refused:
their times are not comparable.

    python3 lab/bench/merge_packs.py configs/tuned/nvidia_h200__mosaic_gpu.json a.json b.json -o merged.json
"""

from __future__ import annotations

import argparse
import dataclasses
import datetime
import json
import sys
from pathlib import Path

from moetune.kernels import packs


def merge(loaded: list[packs.Pack]) -> tuple[packs.Pack, dict[str, int]]:
    """The merged pack, and per problem key the index of the pack its entry came from."""
    first = loaded[0]
    for pack in loaded[1:]:
        same = (pack.device.hash, pack.backend, pack.kernel_source_hash)
        if same != (first.device.hash, first.backend, first.kernel_source_hash):
            raise SystemExit(f"packs differ in device, backend or kernel source: {same}")
    best: dict[str, tuple[packs.PackEntry, int]] = {}
    for index, pack in enumerate(loaded):
        for entry in pack.entries:
            held = best.get(entry.problem.key)
            faster = held is None or (entry.median_s or float("inf")) <= (held[0].median_s or float("inf"))
            if faster:
                best[entry.problem.key] = (entry, index)
    entries = tuple(best[key][0] for key in sorted(best))
    created = datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
    merged = dataclasses.replace(first, entries=entries, created=created)
    return merged, {key: best[key][1] for key in sorted(best)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("packs", type=Path, nargs="+")
    parser.add_argument("-o", "--out", type=Path, required=True)
    args = parser.parse_args()
    merged, origin = merge([packs.load(p) for p in args.packs])
    args.out.write_text(merged.dumps() + "\n")
    counts = {str(p): sum(1 for i in origin.values() if i == n) for n, p in enumerate(args.packs)}
    print(json.dumps({"command": " ".join(sys.argv), "entries": len(origin), "from": counts}, indent=1))


if __name__ == "__main__":
    main()
