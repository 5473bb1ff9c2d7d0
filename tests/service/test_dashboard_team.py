"""What makes the dashboard one a team keeps open: a stylesheet of the app's own, the winners matrix
coloured by speedup with links to the sweep and trial that decided each cell, a sortable and filterable
trial table, two sweeps side by side, and models tuned from a config.json named as their sweep named
them."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from moetune.db import open_store
from moetune.db.records import TrialRecord
from moetune.kernels.problem import Problem
from moetune.service.app import create_app
from moetune.service.settings import ServiceSettings
from moetune.tuner import hf_config
from moetune.tuner.plan import shipped_model_names
from tests.service.dashboard_seed import seeded
from tests.service.local_client import local_client
from tests.tuner.sim_sweeps import DEVICE

TOKEN = "t" * 24
HF_CONFIGS = Path(__file__).resolve().parents[1] / "tuner" / "hf_configs"


@pytest.fixture(scope="module")
def seed(tmp_path_factory):
    url = f"sqlite:///{tmp_path_factory.mktemp('team') / 'moetune.db'}"
    with seeded(url) as s:
        yield s


def client(url: str):
    return local_client(create_app(ServiceSettings(db_url=url, token=TOKEN)))


def test_every_page_links_the_apps_stylesheet_and_inlines_no_style(seed):
    with client(seed.url) as c:
        css = c.get("/static/dashboard.css")
        assert css.status_code == 200 and css.headers["content-type"].startswith("text/css")
        assert "nav" in css.text and "@import" not in css.text and "url(" not in css.text
        again = c.get("/static/dashboard.css", headers={"If-None-Match": css.headers["etag"]})
        assert again.status_code == 304
        for page in ("/", "/winners", "/misses", "/stale", "/jobs", f"/sweeps/{seed.sweeps['first']}"):
            text = c.get(page).text
            assert '<link rel="stylesheet" href="/static/dashboard.css">' in text, page
            assert "<style>" not in text.split("</head>")[0], page


def test_the_winners_matrix_is_coloured_by_speedup_and_links_each_decision(seed):
    with client(seed.url) as c:
        text = c.get("/winners").text
    lines = re.findall(r'<div class=win style="background: ([^"]+)">(.*?)</div>', text)
    assert lines
    linked = [(colour, inner) for colour, inner in lines if inner.startswith("<a ")]
    assert linked, "no line links its sweep"
    for _colour, inner in linked:
        sweep, trial = re.match(r'<a href="/sweeps/(\d+)#trial-(\d+)"', inner).groups()
        assert f"sweep {sweep}, trial {trial}" in inner
    # The seed's winners beat the heuristic (tile 3 at 1 ms against tile 1 at 2 ms): green.
    assert any(colour.startswith("hsl(120,") for colour, _ in lines)


def test_the_sweep_page_has_a_sortable_filterable_trial_table_with_anchors(seed):
    sweep_id = seed.sweeps["first"]
    with client(seed.url) as c:
        text = c.get(f"/sweeps/{sweep_id}").text
        script = c.get("/static/table.js")
    assert f'<table class="sortable" id="trials-{sweep_id}">' in text
    assert f'data-table="trials-{sweep_id}"' in text and '<script src="/static/table.js" defer>' in text
    with open_store(seed.url) as store:
        trials = store.trials(sweep_id=sweep_id)
    assert all(f'id="trial-{t.id}"' in text for t in trials)
    assert script.status_code == 200 and "sortable" in script.text


def test_the_trial_table_names_each_trials_longest_kernels(tmp_path):
    """Where a trial's timer saw each launch (CUPTI), its row names its longest kernels and their ms."""
    url = f"sqlite:///{tmp_path / 'moetune.db'}"
    with open_store(url) as store:
        sweep_id = store.create_sweep(backend="sim", strategy="grid", spec={}, host="h", user="u")
        fused = [["moetune_decode_up", 18.5e-6], ["moetune_decode_down", 9.7e-6]]
        unfused = [[f"fusion_{i}", (i + 1) * 1e-6] for i in range(5)]
        ids = []
        for config, kernels in (({"tile": 1}, fused), ({"tile": 2}, unfused), ({"tile": 3}, None)):
            trial_id = store.record_trial(
                TrialRecord(
                    sweep_id=sweep_id,
                    device=DEVICE,
                    backend="sim",
                    family="",
                    source_hash="s",
                    problem=Problem("grouped_matmul", m=8, k=64, n=64, g=4),
                    config=config,
                    status="ok",
                    samples_s=(1e-3,),
                    median_s=1e-3,
                    details={"kernels": kernels} if kernels else None,
                )
            )
            ids.append(trial_id)
    with client(url) as c:
        text = c.get(f"/sweeps/{sweep_id}").text
    assert "<th>kernels (ms)</th>" in text
    rows = {int(i): row for i, row in re.findall(r'<tr><td><span id="trial-(\d+)">(.*?)</tr>', text)}
    cells = {i: re.findall(r"<td>(.*?)</td>", rows[i])[-2] for i in ids}  # the kernels column
    # The three longest of five, the other two counted with their sum; none where no kernel was seen.
    assert [cells[i] for i in ids] == [
        "moetune_decode_up 0.0185, moetune_decode_down 0.0097",
        "fusion_4 0.005, fusion_3 0.004, fusion_2 0.003, 2 more 0.003",
        "-",
    ]


def test_two_sweeps_side_by_side(seed):
    a, b = seed.sweeps["first"], seed.sweeps["markup"]
    with client(seed.url) as c:
        text = c.get("/compare", params={"a": a, "b": b}).text
        assert 'action="/compare"' in c.get("/").text
        assert c.get("/compare", params={"a": a, "b": 999}).status_code == 404
        assert c.get("/compare", params={"a": a}).status_code == 422
    assert f"Sweep {a} and sweep {b}" in text and "class=side-by-side" in text
    # Both tried the unplanned problem (m=8,k=64,n=64,g=4) with the same costs: the same best, ratio 1.
    row = next(r for r in re.findall(r"<tr>(.*?)</tr>", text) if "k=64" in r and "m=8" in r)
    assert "1.000" in row and "<img" not in text


def test_a_model_tuned_from_a_config_json_is_named_as_its_sweep_named_it(tmp_path):
    url = f"sqlite:///{tmp_path / 'moetune.db'}"
    from moetune.service.pages_winners import _model_index

    # A config whose first problem no shipped model file plans: only its sweep can name it.
    planned = next(
        first
        for path in sorted(HF_CONFIGS.glob("*.json"))
        if path.stem not in shipped_model_names()
        and (first := hf_config.load_hf_config(path).problems()[0]).problem.key not in _model_index()
    )
    with open_store(url) as store:
        spec = {"spec": {}, "problems": [planned.to_dict()], "device": DEVICE.to_dict()}
        sweep_id = store.create_sweep(backend="xla", strategy="grid", spec=spec, host="h", user="u")
        trial = TrialRecord(
            sweep_id=sweep_id,
            device=DEVICE,
            backend="xla",
            family="xla",
            source_hash="s",
            problem=planned.problem,
            config={"strategy": "segments"},
            status="ok",
            samples_s=(1e-3,),
            median_s=1e-3,
        )
        store.promote(store.record_trial(trial), reason="fastest")
    with client(url) as c:
        text = c.get("/winners").text
    model = " ".join(planned.label.split()[:-2])
    row = text.split("<tbody>", 1)[1].split("</td>", 3)[:3]
    assert row[1].endswith(f">{model}") and ">other</td>" not in text, row
