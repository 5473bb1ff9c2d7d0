"""The service's measured load as data: lab/baselines/service_loopback.json, built from
lab/bench/serve_load.py --out files (cli.py add-serve-load), with the table lab/README.md shows.

A GPU's baselines (cli.py) hold kernels timed on a GPU. The load on `moetune serve` is a CPU measurement:
the server and its clients share one machine's cores over loopback, so its figures depend on that machine
and on whatever else ran there. Its entries name the machine (CPU model, cores, OS) where a GPU entry
names its GPU, the server's packages where a GPU entry names jax's, the load average before the run and
the share of the CPU that other processes took during it:

    {"schema": "moetune.service_baselines", "schema_version": 1, "setting": "loopback", "entries": [
      {"name": "serve_load/clients=50,workers=2/packs", "suite": "serve_load", "date": "2026-12-04T23:10:00Z",
       "machine": {"cpu": "AMD EPYC", "cores": 2, "os": "Debian GNU/Linux 12 (bookworm), Linux 6.18"},
       "versions": {"python": "3.12.1", "moetune": "0.1.0", "fastapi": ..., "uvicorn": ..., ...},
       "command": "python3 lab/bench/serve_load.py --each --clients 50 --seconds 25 --workers 2 --out ...",
       "load_average": [0.2, 0.3, 0.8], "others_cpu_share": 0.01,
       "params": {"target": "packs", "paths": {"packs": "/api/packs/NVIDIA%20H200/mosaic_gpu"},
                  "clients": 50, "seconds": 25.0, "workers": 2, "revalidate": false},
       "figures": {"requests": 250000, "errors": 0, "requests_per_s": 10000.0, "p50_ms": 4.5,
                   "p99_ms": 9.5, "max_ms": 105.3, "warmup_s": 0.2},
       "goal": {"p99_ms": 25.0}}, ...]}

One entry per run of serve_load.py: a route alone (`.../packs`), or the mix of every route
(`.../mixed`, whose `by_target` holds each route's requests and latencies within the mix). The figures
are the run's summary, not its requests' latencies (hundreds of thousands per run); `warmup_s`, where a
run has it, is how long the clients' untimed first answers of each route took before the clock started
(a route's first draw in each server process); `goal` is the
service's p99 bound for the route (serve_load.GOAL_P99_MS), where it has one. As in a GPU's file, an
entry of the same name replaces the older one, and git keeps the history.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from pathlib import Path

from moetune_lab.baselines import entries as baseline_entries
from moetune_lab.baselines import files

SCHEMA = "moetune.service_baselines"
SCHEMA_VERSION = 1
PREFIX = "service_"  # lab/baselines/service_<setting>.json; every other .json there is a GPU's
SETTING = "loopback"  # serve_load.py's only one: clients and server on one machine
REQUIRED = (
    "name", "suite", "date", "machine", "versions", "command", "load_average", "params", "figures",
)  # fmt: skip
OPTIONAL = ("by_target", "goal", "others_cpu_share")
SUITES = ("serve_load",)
MACHINE = ("cpu", "cores", "os")
VERSIONS = ("python", "moetune", "fastapi", "uvicorn", "sqlalchemy")  # at least these
PARAMS = ("target", "paths", "clients", "seconds", "workers", "revalidate")
FIGURES = ("requests", "errors", "requests_per_s", "p50_ms", "p99_ms", "max_ms")
TARGET_FIGURES = ("requests", "p50_ms", "p99_ms", "max_ms")  # a route's within a mix
DATE = re.compile(r"\d{4}-\d{2}-\d{2}T\d{2}:\d{2}:\d{2}Z")


def is_service_file(path: Path) -> bool:
    return path.name.startswith(PREFIX) and path.suffix == ".json"


def _number(value: object) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool)


def _latency_problems(where: str, figures: dict, keys: tuple[str, ...]) -> list[str]:
    problems = [f"{where} lacks {key}" for key in keys if key not in figures]
    if problems:
        return problems
    if not all(_number(figures[key]) and figures[key] >= 0 for key in keys):
        return [f"{where}: every figure must be a number, at least 0"]
    if not figures["p50_ms"] <= figures["p99_ms"] <= figures["max_ms"]:
        return [f"{where}: p50_ms <= p99_ms <= max_ms does not hold"]
    return []


def _entry_problems(where: str, entry: dict) -> list[str]:
    problems = [f"{where}: missing {key}" for key in REQUIRED if key not in entry]
    problems += [f"{where}: unknown field {key!r}" for key in entry if key not in REQUIRED + OPTIONAL]
    if problems:
        return problems
    machine, versions, params, figures = (entry[k] for k in ("machine", "versions", "params", "figures"))
    if entry["suite"] not in SUITES:
        problems.append(f"{where}: suite={entry['suite']!r} is not one of {', '.join(SUITES)}")
    if not isinstance(entry["date"], str) or not DATE.fullmatch(entry["date"]):
        problems.append(f"{where}: date={entry['date']!r} is not an ISO 8601 UTC time (...T..Z)")
    if not isinstance(machine, dict) or set(machine) != set(MACHINE):
        problems.append(f"{where}: machine must hold exactly {', '.join(MACHINE)}")
    elif (
        not (isinstance(machine["cores"], int) and machine["cores"] > 0)
        or not machine["cpu"]
        or not machine["os"]
    ):
        problems.append(f"{where}: machine needs a CPU model, an OS and a positive number of cores")
    if not isinstance(versions, dict) or not set(VERSIONS) <= set(versions):
        problems.append(f"{where}: versions must name at least {', '.join(VERSIONS)}")
    elif not all(isinstance(v, str) and v for v in versions.values()):
        problems.append(f"{where}: every version must be a non-empty string")
    if not isinstance(entry["command"], str) or not entry["command"].strip():
        problems.append(f"{where}: command must be a non-empty string")
    load = entry["load_average"]
    if not (isinstance(load, list) and len(load) == 3 and all(_number(v) and v >= 0 for v in load)):
        problems.append(f"{where}: load_average must be the 1, 5 and 15 minute load averages")
    share = entry.get("others_cpu_share", 0.0)
    if not (_number(share) and 0 <= share <= 1):
        problems.append(f"{where}: others_cpu_share must be a share of the CPU, 0 to 1")
    if not isinstance(params, dict):
        problems.append(f"{where}: params must be an object")
    else:
        problems += [f"{where}: params lacks {key}" for key in PARAMS if key not in params]
    if not isinstance(figures, dict):
        return problems + [f"{where}: figures must be an object"]
    figure_problems = _latency_problems(f"{where}: figures", figures, FIGURES)
    warmup = figures.get("warmup_s", 0.0)
    figure_problems += [] if _number(warmup) and warmup >= 0 else [f"{where}: figures.warmup_s must be >= 0"]
    unknown = set(figures) - set(FIGURES) - {"warmup_s"}
    figure_problems += [f"{where}: figures has unknown {key!r}" for key in sorted(unknown)]
    problems += figure_problems
    if not figure_problems and (
        not isinstance(figures["errors"], int) or figures["errors"] > figures["requests"]
    ):
        problems.append(f"{where}: figures.errors must be a count of its requests")
    by_target = entry.get("by_target", {})
    for target, value in by_target.items() if isinstance(by_target, dict) else ():
        problems += _latency_problems(f"{where}: by_target.{target}", value, TARGET_FIGURES)
    goal = entry.get("goal", {})
    if not isinstance(goal, dict) or set(goal) - {"p99_ms"} or not all(_number(v) for v in goal.values()):
        problems.append(f"{where}: goal may hold p99_ms, a number")
    return problems


def problems_of(data: object) -> list[str]:
    """Every way `data` breaks the service baselines schema, one line each; [] for a valid file."""
    return files.problems_of(
        data,
        schema=SCHEMA,
        version=SCHEMA_VERSION,
        field="setting",
        field_problem=_setting_problem,
        entry_problems=_entry_problems,
    )


def _setting_problem(setting: object) -> str | None:
    return None if setting == SETTING else f"setting={setting!r}, expected {SETTING!r}"


def load(path: Path) -> dict:
    return files.load(path, problems_of)


def _name(result: dict) -> str:
    """serve_load/clients=50,workers=2[,revalidate][,rate=10]/TARGET: runs of other settings keep
    entries of their own."""
    setting = f"clients={result['clients']},workers={result['workers']}"
    setting += ",revalidate" if result["revalidate"] else ""
    setting += f",rate={result['rate_per_client']:g}" if result.get("rate_per_client") else ""
    return f"serve_load/{setting}/{result['target']}"


def load_entries(run: dict) -> list[dict]:
    """One entry per run of a serve_load.py --out file."""
    env = run["environment"]
    entries = []
    for result in run["results"]:
        params = {key: result[key] for key in PARAMS}
        if result.get("rate_per_client"):
            params["rate_per_client"] = result["rate_per_client"]
        entry = {
            "name": _name(result),
            "suite": "serve_load",
            "date": env["date"],
            "machine": env["machine"],
            "versions": env["versions"],
            "command": baseline_entries.portable_command(env["command"]),
            "load_average": env["load_average"],
            "params": params,
            "figures": {key: result[key] for key in (*FIGURES, "warmup_s") if key in result},
        }
        if result.get("others_cpu_share") is not None:
            entry["others_cpu_share"] = result["others_cpu_share"]
        if result.get("by_path"):
            names = {path: name for name, path in result["paths"].items()}
            entry["by_target"] = {names[path]: figures for path, figures in result["by_path"].items()}
        if result.get("goal_p99_ms") is not None:
            entry["goal"] = {"p99_ms": result["goal_p99_ms"]}
        entries.append(entry)
    return entries


def add(path: Path, entries: Iterable[dict]) -> dict:
    """The service baselines at `path` (a new file if there is none) with `entries` added, replacing
    those of the same name; nothing is written when the result breaks the schema."""
    data = load(path) if path.exists() else {"schema": SCHEMA, "schema_version": SCHEMA_VERSION}
    data = {**data, "setting": SETTING, "entries": files.upserted(data.get("entries", []), entries)}
    problems = problems_of(data)
    if problems:
        raise ValueError(f"{path}: " + "; ".join(problems))
    return data


# --- the table (lab/README.md: <!-- baselines service_loopback full -->) -----------------------------------

VERSION_NAMES = {"python": "Python", "sqlalchemy": "SQLAlchemy"}


def _setting(entry: dict) -> tuple:
    p = entry["params"]
    return (p["clients"], p["seconds"], p["revalidate"], p.get("rate_per_client"))


def _verdict(entry: dict, p99: float) -> str:
    goal = entry.get("goal", {}).get("p99_ms")
    if goal is None:
        return "-"
    return f"{goal:g}: met" if p99 <= goal else f"{goal:g}: missed by {p99 - goal:.1f}"


def _rows(entries: list[dict]) -> list[str]:
    rows = []
    order = {name: i for i, name in enumerate(dict.fromkeys(e["params"]["target"] for e in entries))}
    for e in sorted(entries, key=lambda e: (order[e["params"]["target"]], e["params"]["workers"])):
        f = e["figures"]
        cells = [e["params"]["target"], str(e["params"]["workers"]), f"{f['requests_per_s']:,.0f}"]
        cells += [f"{f[k]:.1f}" for k in ("p50_ms", "p99_ms", "max_ms")]
        cells += [str(f["errors"]), _verdict(e, f["p99_ms"]), f"{e.get('others_cpu_share', 0):.0%}"]
        cells.append(f"{f['warmup_s']:.2f}" if "warmup_s" in f else "-")
        rows.append(cells)
        for target, t in e.get("by_target", {}).items():
            cells = [f"mixed: {target}", str(e["params"]["workers"]), "-"]
            cells += [f"{t[k]:.1f}" for k in ("p50_ms", "p99_ms", "max_ms")] + ["-", "-", "-", "-"]
            rows.append(cells)
    return rows


def render_full(data: dict) -> str:
    """The lab README's section: per setting (clients, seconds, revalidating or not), where and how it
    was measured and one row per route and number of server processes."""
    lines = ["### The service on loopback: `lab/bench/serve_load.py`", ""]
    settings: dict[tuple, list[dict]] = {}
    for entry in data["entries"]:
        settings.setdefault(_setting(entry), []).append(entry)
    for (clients, seconds, revalidate, rate), entries in settings.items():
        how = "revalidating (If-None-Match)" if revalidate else "fresh fetches (200s)"
        how += f", each paced at {rate:g} requests/s" if rate else ", back to back"
        lines += [f"#### {clients} clients, {seconds:g} s per run, {how}", ""]
        machines = dict.fromkeys(
            f"{m['cpu']}, {m['cores']} cores, {m['os']}" for m in (e["machine"] for e in entries)
        )
        texts = (
            ", ".join(f"{VERSION_NAMES.get(k, k)} {v}" for k, v in e["versions"].items()) for e in entries
        )
        loads = sorted({f"{e['load_average'][0]:.2f}" for e in entries}, key=float)
        lines += [
            f"Measured {', '.join(sorted({e['date'][:10] for e in entries}))} on {'; '.join(machines)}: "
            f"{'; '.join(dict.fromkeys(texts))}. Load average (1 minute) as each command started: "
            f"{'-'.join(dict.fromkeys([loads[0], loads[-1]]))}.",
            "",
        ]
        lines += [f"    {command}" for command in dict.fromkeys(e["command"] for e in entries)] + [""]
        lines += [
            "Latency in ms over every request of the run; the goal is the route's p99 bound in ms; "
            "others: the share of the machine's CPU that processes other than the server and the clients "
            "took meanwhile; first answers: the seconds until every client had had one untimed answer of "
            "each of its routes (their first draw in each server process), before the clock started. A "
            "`mixed: ROUTE` row is that route within the mix of all of them.",
            "",
        ]
        head = ["route", "server processes", "requests/s", "p50", "p99", "max", "errors", "goal"]
        head += ["others", "first answers (s)"]
        lines += ["| " + " | ".join(head) + " |", "|" + " --- |" * len(head)]
        lines += ["| " + " | ".join(row) + " |" for row in _rows(entries)] + [""]
    return "\n".join(lines).rstrip("\n") + "\n"
