"""`moetune best`: the tuned winners per GPU model, backend and problem, from the database and from the
config packs dispatch reads (read through moetune.kernels.lookup as dispatch reads them), each with the
time that decided it (tuner/decided.py), where it came from and whether it is fresh on this machine."""

from __future__ import annotations

from typing import Annotated, Any

import typer

from moetune.cli import app
from moetune.cli.common import DbOption, check_range, emit
from moetune.cli.db_commands import (
    BackendOption,
    GpuOption,
    JsonOption,
    check_known,
    opened_store,
    warn,
)
from moetune.db import urls
from moetune.kernels.errors import PackInvalid
from moetune.tuner import problem_cells as problems
from moetune.tuner.decided import RECORDED, describe
from moetune.tuner.listings.winners import Listed, Stack, database_winners, winner_dict


def _pack_winners() -> list[Listed]:
    """The winners of the config packs dispatch reads, as dispatch reads them (kernels.lookup); a pack
    dispatch would ignore is named on stderr and left out."""
    from moetune.kernels import packs
    from moetune.kernels.lookup import LOOKUP, pack_winners, read_pack

    folder = LOOKUP.packs_folder()
    if folder is None or not folder.is_dir():
        return []
    listed = []
    for resource in sorted(folder.iterdir(), key=lambda r: r.name):
        if not resource.name.endswith(".json"):
            continue
        try:
            pack = read_pack(resource)
        except PackInvalid as e:
            warn(f"ignoring config pack: {e}")
            continue
        expected = packs.file_name(pack.device.device_kind, pack.backend)
        if resource.name != expected:  # dispatch looks packs up by this name only
            warn(
                f"ignoring config pack {resource.name}: it holds {pack.backend} winners for "
                f"{pack.device.device_kind!r}, which dispatch reads from {expected}"
            )
            continue
        reason = f"config pack created {pack.created}"
        listed += [Listed(pack.device.device_kind, w, resource.name, reason) for w in pack_winners(pack)]
    return listed


def _timed_by(listed: Listed) -> str:
    view = listed.view
    if view.time.source != RECORDED:
        return f"re-timed: {describe(view.decision)}"
    return "recorded median (no decision kept)" if listed.row is not None else "the pack's median"


def _winner_cells(listed: Listed, unit, *, history: bool, tokens: bool, fingerprint: bool) -> dict[str, Any]:
    from moetune.tuner import config_diff

    w = listed.winner
    cells = {"gpu": listed.device_kind}
    if fingerprint:
        cells["fingerprint"] = w.fingerprint_hash[:12]
    cells |= {"backend": w.backend, **problems.cells(w.problem, listed.tokens, with_tokens=tokens)}
    cells |= {
        "dtypes": problems.dtypes(w.problem),
        "config (not default)": config_diff.text(w.backend, dict(w.config)),
        unit.name: unit.format(listed.view.time.seconds),
        "timed by": _timed_by(listed),
        "from": listed.origin,
        "here": listed.freshness,
    }
    if history:
        cells["state"] = listed.row.state if listed.row else "active"
    return cells


def _look_alike(listed: list[Listed]) -> bool:
    """Whether two rows differ only by device fingerprint (the same GPU model under another driver)."""
    seen = set()
    for item in listed:
        state = item.row.state if item.row else "active"
        key = (item.device_kind, item.winner.backend, item.winner.problem.key, item.origin, state)
        if key in seen:
            return True
        seen.add(key)
    return False


@app.command("best")
def best(
    db: DbOption = None,
    gpu: GpuOption = None,
    backend: BackendOption = None,
    m: Annotated[int | None, typer.Option("--m", help="Rows (m = T x top_k).", show_default="all")] = None,
    k: Annotated[int | None, typer.Option("--k", help="Contraction size (K).", show_default="all")] = None,
    n: Annotated[int | None, typer.Option("--n", help="Output columns (N).", show_default="all")] = None,
    g: Annotated[int | None, typer.Option("--g", help="Experts (G).", show_default="all")] = None,
    history: Annotated[
        bool, typer.Option("--history", help="Include superseded and rolled-back winners.")
    ] = False,
    with_packs: Annotated[
        bool,
        typer.Option(
            "--packs/--no-packs", help="Also list the winners of the config packs in configs/tuned/."
        ),
    ] = True,
    as_json: JsonOption = False,
) -> None:
    """Show the tuned winners (best configs) per GPU model, backend and problem: the database's and the
    config packs', each with the time that decided it, where it came from and whether it is fresh here."""
    from moetune.tuner.durations import unit_for

    for option, value in (("--m", m), ("--k", k), ("--n", n), ("--g", g)):
        check_range(option, value)
    shipped = _pack_winners() if with_packs else []
    where = "the database or the config packs" if with_packs else "the database"
    if db is None and with_packs and not urls.default_path().exists():
        # No --db, no $MOETUNE_DB and no default database yet (a fresh install): the packs alone.
        check_known("gpu", gpu, sorted({r.device_kind for r in shipped}), "the config packs")
        check_known("backend", backend, sorted({r.winner.backend for r in shipped}), "the config packs")
        listed = []
    else:
        with opened_store(db, read_only=True) as store:
            kinds, backends = store.device_kinds(), store.backends()
            check_known("gpu", gpu, sorted({*kinds, *(r.device_kind for r in shipped)}), where)
            check_known("backend", backend, sorted({*backends, *(r.winner.backend for r in shipped)}), where)
            listed = database_winners(
                store, device_kind=gpu, backend=backend, m=m, k=k, n=n, g=g, active_only=not history
            )
    for entry in shipped:
        p = entry.winner.problem
        wanted = (gpu, backend, m, k, n, g)
        actual = (entry.device_kind, entry.winner.backend, p.m, p.k, p.n, p.g)
        if all(w in (None, a) for w, a in zip(wanted, actual, strict=True)):
            listed.append(entry)
    if listed:
        listed = Stack().judged(listed)
    if as_json:
        emit([winner_dict(item) for item in listed], as_json=True)
        return
    origins = len({item.origin for item in listed})
    known = [item.tokens for item in listed]
    unit = unit_for(item.view.time.seconds for item in listed)
    options = dict(history=history, tokens=any(t is not None for t in known), fingerprint=_look_alike(listed))
    emit(
        [_winner_cells(item, unit, **options) for item in listed],
        as_json=False,
        title=f"{len(listed)} winners"
        + (f" from {origins} sources" if origins > 1 else "")
        + f", times in {unit.name}"
        + problems.tokens_note(known),
    )
