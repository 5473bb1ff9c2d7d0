"""What every baselines file shares, whatever its entries hold (cli.py: a GPU's measurements; service.py:
the service's load): the schema and version in the header beside one field of the file's own, a list of
entries with unique names, loading with every problem named, and adding entries by name."""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable
from pathlib import Path


def problems_of(
    data: object,
    *,
    schema: str,
    version: int,
    field: str,
    field_problem: Callable[[object], str | None],
    entry_problems: Callable[[str, dict], list[str]],
) -> list[str]:
    """Every way `data` breaks a baselines file of `schema` and `version` whose header holds `field` too
    (`field_problem`: what is wrong with its value, or None) and whose entries `entry_problems` checks
    (given where the entry is and the entry); [] for a valid file."""
    if not isinstance(data, dict):
        return ["the file is not a JSON object"]
    problems = []
    if data.get("schema") != schema:
        problems.append(f"schema={data.get('schema')!r}, expected {schema!r}")
    if data.get("schema_version") != version:
        problems.append(f"schema_version={data.get('schema_version')!r}, expected {version}")
    known = ("schema", "schema_version", field, "entries")
    problems += [f"unknown field {k!r}" for k in data if k not in known]
    problem = field_problem(data.get(field))
    problems += [problem] if problem else []
    entries = data.get("entries")
    if not isinstance(entries, list):
        return problems + ["entries must be a list"]
    names = []
    for index, entry in enumerate(entries):
        if not isinstance(entry, dict):
            problems.append(f"entries[{index}] is not an object")
            continue
        names.append(entry.get("name"))
        problems += entry_problems(f"entries[{index}] ({entry.get('name', '?')})", entry)
    problems += [
        f"the name {n!r} is used more than once" for n in sorted({n for n in names if names.count(n) > 1})
    ]
    return problems


def load(path: Path, problems_of: Callable[[object], list[str]]) -> dict:
    """The file at `path`; ValueError naming every problem `problems_of` finds in it."""
    data = json.loads(path.read_text())
    problems = problems_of(data)
    if problems:
        raise ValueError(f"{path}: " + "; ".join(problems))
    return data


def upserted(entries: list[dict], added: Iterable[dict]) -> list[dict]:
    """`entries` with each of `added`, replacing the entry of the same name where there is one."""
    out = list(entries)
    index = {e["name"]: i for i, e in enumerate(out)}
    for entry in added:
        if entry["name"] in index:
            out[index[entry["name"]]] = entry
        else:
            index[entry["name"]] = len(out)
            out.append(entry)
    return out
