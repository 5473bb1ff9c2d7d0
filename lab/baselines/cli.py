"""Measured baselines as data: one small, versioned file per GPU model (lab/baselines/<gpu>.json),
built from the benchmark scripts' own output files, and the tables the documentation quotes from it;
beside them the service's load on loopback, a CPU measurement (service_loopback.json, service.py).

    python3 -m moetune_lab.baselines add-gemm gate_up.json down.json   # bench_gemm.py --out files
    python3 -m moetune_lab.baselines add-finegrained dev.json          # bench_gemm.py --models --out files
    python3 -m moetune_lab.baselines add-backward drhs.json            # bench_backward.py --out file
    python3 -m moetune_lab.baselines add-backward --configs probe.json # each --config it timed
    python3 -m moetune_lab.baselines add-layer layer.json              # bench_layer_grad.py --out file
    python3 -m moetune_lab.baselines add-block block.json              # bench_block.py --out file
    python3 -m moetune_lab.baselines add-fp8 fp8.json                  # bench_fp8.py --out file
    python3 -m moetune_lab.baselines add-model model.json              # bench_model.py --out file
    python3 -m moetune_lab.baselines add-maxtext serve.json layer.json # bench_maxtext.py --out files
    python3 -m moetune_lab.baselines add-example auto.json xla.json    # examples/train_moe.py --json
        # one run of --backend auto and one of --backend xla, same config: train_example/<config>
    python3 -m moetune_lab.baselines add-tuner run.json ... --gpu "NVIDIA H200" --date 2026-11-30 \\
        --versions jax=0.11.2,jaxlib=0.11.2 --command "bash lab/device/multi_gpu.sh"
        # `moetune bench tuner --out` or compare_clusters.py --out files, which record no environment
    python3 -m moetune_lab.baselines add-serve-load load.json          # serve_load.py --out files
        # -> service_loopback.json (its own schema: a machine and the server's versions, no GPU)
    python3 -m moetune_lab.baselines render [--check]                  # the tables and quotes of PAGES

The file (schema "moetune.baselines", version 1):

    {"schema": "moetune.baselines", "schema_version": 1, "gpu": "NVIDIA H200", "entries": [
      {"name": "bench_gemm/gate_up/T=4096/balanced", "suite": "bench_gemm", "date": "2026-11-30T20:01:07Z",
       "gpu": "NVIDIA H200", "versions": {"jax": "0.11.2", "jaxlib": "0.11.2", "torch": ..., "cuda": ...},
       "command": "python3 lab/bench/bench_gemm.py ...", "unit": "ms", "samples": [...], "median": 2.37,
       "params": {"proj": "gate_up", "tokens": 4096, "m": 8192, ...},
       "peers": {"torch_grouped_mm": {"samples": [...], "median": 2.39}, ...},
       "failed_peers": {"xla_ragged_dot": "skipped: XLA's ragged_dot would expand lhs to 112 GiB"},
       "bounds": {"hbm_roofline": 0.402}, "config": {...}, "from_pack": true}, ...]}

An entry is one measurement of moetune and of each peer it is compared with, raw samples kept. Adding
a measurement replaces the entry of the same name: the file holds the current numbers, git their
history. The checks below are written out rather than left to a schema library because the scripts in
benchmarks/ run where only jax and numpy may be installed, and because the checks that matter (a
median is its samples' median, names are unique) are not expressible in a JSON Schema anyway.
"""

from __future__ import annotations

import argparse
import json
import re
import statistics
import sys
from collections.abc import Iterable
from pathlib import Path

from moetune_lab.baselines import entries as baseline_entries
from moetune_lab.baselines import files as baseline_files
from moetune_lab.baselines import quotes as baseline_quotes
from moetune_lab.baselines import service as baseline_service
from moetune_lab.baselines import tables as baseline_tables

SCHEMA = "moetune.baselines"
SCHEMA_VERSION = 1
BASELINES = Path(__file__).resolve().parent  # one <gpu>.json per GPU model, beside this module
LAB = BASELINES.parent
REPOSITORY = LAB.parent
# The lab's README carries the full tables; the product's README and docs quote rows.
PAGES = (LAB / "README.md", REPOSITORY / "README.md", *sorted((REPOSITORY / "docs").glob("*.md")))
SUITES = (
    "bench_gemm", "finegrained", "moe_block", "fp8_gemm", "backward", "layer_grad", "bench_model", "tuner",
    "train_example", "maxtext",
)  # fmt: skip
UNITS = ("ms", "s", "trials/min", "variants/min")
REQUIRED = ("name", "suite", "date", "gpu", "versions", "command", "unit", "samples", "median", "params")
OPTIONAL = ("title", "peers", "failed_peers", "bounds", "config", "from_pack")
# What each suite's tables read beyond the required fields.
SUITE_PARAMS = {
    "bench_gemm": ("proj", "tokens", "m", "k", "n", "g", "routing"),
    "finegrained": ("model", "gemm", "tokens", "m", "k", "n", "g"),
    "fp8_gemm": ("model", "gemm", "tokens", "layout", "flops"),
    "backward": ("model", "gemm", "tokens", "m", "k", "n", "g"),
    "layer_grad": ("model", "tokens"),
    "bench_model": ("model", "phase", "tokens"),
    "tuner": (),
    "train_example": (),
    "maxtext": ("model", "case", "tokens", "layers", "route"),
}
DATE = re.compile(r"\d{4}-\d{2}-\d{2}(T\d{2}:\d{2}:\d{2}(\.\d+)?(Z|[+-]\d{2}:\d{2})?)?")


def gpu_key(device_kind: str) -> str:
    """The file name of a GPU model: 'NVIDIA H200' -> 'nvidia_h200' (as config packs are named)."""
    return re.sub(r"[^a-z0-9]+", "_", device_kind.lower()).strip("_")


def _is_number(value: object) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool)


def _measurement_problems(where: str, value: dict) -> list[str]:
    samples = value.get("samples")
    if not isinstance(samples, list) or not samples:
        return [f"{where}: samples must be a non-empty list"]
    if not all(_is_number(s) and s > 0 for s in samples):
        return [f"{where}: every sample must be a positive number"]
    median, expected = value.get("median"), statistics.median(samples)
    if not _is_number(median) or abs(median - expected) > 1e-9 * expected:
        return [f"{where}: median={median!r} is not the median of its samples ({expected})"]
    return []


def _entry_problems(where: str, entry: dict, gpu: object) -> list[str]:
    problems = [f"{where}: missing {key}" for key in REQUIRED if key not in entry]
    problems += [f"{where}: unknown field {key!r}" for key in entry if key not in REQUIRED + OPTIONAL]
    if problems:
        return problems
    suite, versions, params = entry["suite"], entry["versions"], entry["params"]
    if suite not in SUITES:
        problems.append(f"{where}: suite={suite!r} is not one of {', '.join(SUITES)}")
    if entry["unit"] not in UNITS:
        problems.append(f"{where}: unit={entry['unit']!r} is not one of {', '.join(UNITS)}")
    if not isinstance(entry["date"], str) or not DATE.fullmatch(entry["date"]):
        problems.append(f"{where}: date={entry['date']!r} is not an ISO 8601 date")
    if entry["gpu"] != gpu:
        problems.append(f"{where}: gpu={entry['gpu']!r} differs from the file's gpu={gpu!r}")
    if not isinstance(versions, dict) or not {"jax", "jaxlib"} <= set(versions):
        problems.append(f"{where}: versions must name at least jax and jaxlib")
    elif not all(isinstance(v, str) and v for v in versions.values()):
        problems.append(f"{where}: every version must be a non-empty string")
    if not isinstance(entry["command"], str) or not entry["command"].strip():
        problems.append(f"{where}: command must be a non-empty string")
    if not isinstance(params, dict):
        problems.append(f"{where}: params must be an object")
    else:
        problems += [
            f"{where}: params lacks {key}" for key in SUITE_PARAMS.get(suite, ()) if key not in params
        ]
    problems += _measurement_problems(where, entry)
    peers = entry.get("peers", {})
    for peer, value in peers.items() if isinstance(peers, dict) else ():
        if not isinstance(value, dict) or set(value) != {"samples", "median"}:
            problems.append(f"{where}: peers.{peer} must hold exactly samples and median")
        else:
            problems += _measurement_problems(f"{where}: peers.{peer}", value)
    failed = entry.get("failed_peers", {})
    if not isinstance(failed, dict) or not all(isinstance(v, str) and v for v in failed.values()):
        problems.append(f"{where}: failed_peers must map each peer that did not run to its reason")
    elif set(failed) & set(peers if isinstance(peers, dict) else {}):
        problems.append(f"{where}: failed_peers names a peer that ran: {sorted(set(failed) & set(peers))}")
    bounds = entry.get("bounds", {})
    for bound, value in bounds.items() if isinstance(bounds, dict) else ():
        if not _is_number(value) or value <= 0:
            problems.append(f"{where}: bounds.{bound} must be a positive number")
    needs_bound = suite in ("bench_gemm", "finegrained")
    if needs_bound and not ("hbm_roofline" in bounds and isinstance(entry.get("config"), dict)):
        problems.append(f"{where}: a {suite} entry needs bounds.hbm_roofline and the config it timed")
    return problems


def problems_of(data: object) -> list[str]:
    """Every way `data` breaks the baselines schema, one line each; [] for a valid file."""
    gpu = data.get("gpu") if isinstance(data, dict) else None
    return baseline_files.problems_of(
        data,
        schema=SCHEMA,
        version=SCHEMA_VERSION,
        field="gpu",
        field_problem=lambda gpu: None if isinstance(gpu, str) and gpu else "gpu must be a non-empty string",
        entry_problems=lambda where, entry: _entry_problems(where, entry, gpu),
    )


def load(path: Path) -> dict:
    return baseline_files.load(path, problems_of)


def gpu_files(folder: Path = BASELINES) -> list[Path]:
    """Each GPU's baselines file: every .json of the folder but the service's (service.py)."""
    return [p for p in sorted(folder.glob("*.json")) if not baseline_service.is_service_file(p)]


def load_all(folder: Path = BASELINES) -> dict[str, dict]:
    """Every baselines file by its stem: each GPU's (the GPU key) and the service's
    (service_loopback)."""
    loaded = {path.stem: load(path) for path in gpu_files(folder)}
    for path in sorted(folder.glob("*.json")):
        if baseline_service.is_service_file(path):
            loaded[path.stem] = baseline_service.load(path)
    return loaded


def dumps(data: dict) -> str:
    """The file's text. A value that fits in a line is written on one (a measurement, the versions), and
    so is an object of scalars (a config) and a list of numbers (the samples of a long run, such as the
    training example's 299 step times); larger ones take one item a line. The file stays small, and a
    re-measured entry shows as a few changed lines."""

    def write(value: object, indent: str) -> str:
        flat = json.dumps(value, separators=(", ", ": "))
        scalars = isinstance(value, dict) and not any(isinstance(v, dict | list) for v in value.values())
        scalars |= isinstance(value, list) and all(_is_number(v) for v in value)
        if len(indent) + len(flat) <= 180 or scalars or not isinstance(value, dict | list) or not value:
            return flat
        inner = indent + " "
        if isinstance(value, list):
            return "[\n" + ",\n".join(inner + write(v, inner) for v in value) + "\n" + indent + "]"
        items = (f"{inner}{json.dumps(k)}: {write(v, inner)}" for k, v in value.items())
        return "{\n" + ",\n".join(items) + "\n" + indent + "}"

    return write(data, "") + "\n"


def upsert(data: dict, entries: Iterable[dict]) -> dict:
    """`data` with each entry added, replacing the entry of the same name where there is one."""
    return {**data, "entries": baseline_files.upserted(data["entries"], entries)}


def add(path: Path, entries: list[dict]) -> dict:
    """The baselines at `path` (a new file if there is none) with `entries` added; nothing is written
    when the result breaks the schema."""
    gpus = sorted({e["gpu"] for e in entries})
    if len(gpus) != 1:
        raise ValueError(f"the entries must be of one GPU model, not {gpus}")
    data = (
        load(path) if path.exists() else {"schema": SCHEMA, "schema_version": SCHEMA_VERSION, "gpu": gpus[0]}
    )
    data = upsert({**data, "entries": data.get("entries", [])}, entries)
    problems = problems_of(data)
    if problems:
        raise ValueError(f"{path}: " + "; ".join(problems))
    return data


def _shown(page: Path) -> str:
    return str(page.relative_to(REPOSITORY)) if page.is_relative_to(REPOSITORY) else page.name


def render(pages: Iterable[Path], baselines: dict[str, dict], *, check: bool) -> list[Path]:
    """The pages whose baselines blocks or quotes (quotes.py) differ from `baselines`; rewritten unless
    `check`. A quote of something the baselines do not hold raises quotes.QuoteError."""
    stale = []
    for page in pages:
        text = page.read_text()
        rendered = baseline_tables.render_page(text, baselines)
        rendered = baseline_quotes.render_quotes(rendered, baselines, where=_shown(page))
        if rendered != text:
            stale.append(page)
            if not check:
                page.write_text(rendered)
    return stale


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    commands = parser.add_subparsers(dest="command", required=True)
    for name in (
        "add-gemm",
        "add-finegrained",
        "add-backward",
        "add-layer",
        "add-block",
        "add-fp8",
        "add-model",
        "add-maxtext",
        "add-tuner",
        "add-example",
        "add-serve-load",
    ):
        sub = commands.add_parser(name)
        if name == "add-example":
            text = "examples/train_moe.py --json outputs: one of --backend auto, one of --backend xla"
            sub.add_argument("runs", type=Path, nargs=2, help=text)
        else:
            sub.add_argument("runs", type=Path, nargs="+", help="the benchmark's --out files")
        default = "service_loopback.json" if name == "add-serve-load" else "the runs' GPU's"
        sub.add_argument("--file", type=Path, help=f"the baselines file (default: {default})")
        if name == "add-backward":
            text = "a bench_backward.py --config run: record each given config, not the heuristic"
            sub.add_argument("--configs", action="store_true", help=text)
        if name == "add-tuner":
            sub.add_argument("--gpu", required=True, help="the GPU model as jax names it, e.g. 'NVIDIA H200'")
            sub.add_argument("--date", required=True, help="when the runs ran, e.g. 2026-11-30")
            sub.add_argument("--versions", required=True, help="e.g. jax=0.11.2,jaxlib=0.11.2,driver=580.1")
            sub.add_argument("--command", required=True, dest="run_command", help="what made the runs")
    render_cmd = commands.add_parser("render", help="rewrite the tables and quotes of the README and docs")
    render_cmd.add_argument("--check", action="store_true", help="write nothing; exit 1 if a page is stale")
    return parser


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    try:
        if args.command == "render":
            stale = render(PAGES, load_all(), check=args.check)
            verb = (
                "is out of date (run python3 -m moetune_lab.baselines render)" if args.check else "rewritten"
            )
            print("\n".join(f"{_shown(page)} {verb}" for page in stale) or "every page is up to date")
            return 1 if args.check and stale else 0
        runs = [json.loads(path.read_text()) for path in args.runs]
        if args.command == "add-gemm":
            entries = [e for run in runs for e in baseline_entries.gemm_entries(run)]
        elif args.command == "add-finegrained":
            entries = [e for run in runs for e in baseline_entries.finegrained_entries(run)]
        elif args.command == "add-backward":
            backward = baseline_entries.backward_config_entries if args.configs else None
            entries = [e for run in runs for e in (backward or baseline_entries.backward_entries)(run)]
        elif args.command == "add-layer":
            entries = [e for run in runs for e in baseline_entries.layer_entries(run)]
        elif args.command == "add-block":
            entries = [e for run in runs for e in baseline_entries.block_entries(run)]
        elif args.command == "add-fp8":
            entries = [e for run in runs for e in baseline_entries.fp8_entries(run)]
        elif args.command == "add-model":
            entries = [e for run in runs for e in baseline_entries.model_entries(run)]
        elif args.command == "add-maxtext":
            entries = [e for run in runs for e in baseline_entries.maxtext_entries(run)]
        elif args.command == "add-example":
            entries = [baseline_entries.example_entry(runs)]
        elif args.command == "add-serve-load":
            entries = [e for run in runs for e in baseline_service.load_entries(run)]
        else:
            versions = dict(pair.split("=", 1) for pair in args.versions.split(","))
            info = {"date": args.date, "versions": versions, "command": args.run_command, "gpu": args.gpu}
            entries = [baseline_entries.tuner_entry(runs, **info)]
        if not entries:
            raise ValueError(f"no measurement of moetune in {', '.join(map(str, args.runs))}")
        if args.command == "add-serve-load":
            path = args.file or BASELINES / f"{baseline_service.PREFIX}{baseline_service.SETTING}.json"
            data = baseline_service.add(path, entries)
        else:
            path = args.file or BASELINES / f"{gpu_key(entries[0]['gpu'])}.json"
            data = add(path, entries)
    except KeyError as e:
        print(
            f"error: {args.command}: a run file lacks the field {e}: not that benchmark's output?",
            file=sys.stderr,
        )
        return 2
    except (OSError, ValueError) as e:
        print(f"error: {args.command}: {e}", file=sys.stderr)
        return 2
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(dumps(data))
    print(f"{path}: {len(entries)} entries added or replaced, {len(data['entries'])} in all")
    return 0


if __name__ == "__main__":
    sys.exit(main())
