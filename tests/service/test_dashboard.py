"""The dashboard's pages through the ASGI app (no browser): every database value escaped, unknown
sweeps and pages 404, plotly.js served from the installed package and cached, reads protected when the
server protects them, winners mapped to models, misses ranked, stale winners with why."""

from __future__ import annotations

import html
import re
from pathlib import Path

import plotly
import pytest
from fastapi.testclient import TestClient

from moetune.db import open_store
from moetune.service.app import create_app
from moetune.service.settings import ServiceSettings
from moetune.tuner import report
from tests.service.dashboard_seed import MARKUP, seeded, tiny
from tests.service.local_client import local_client

TOKEN = "t" * 24
PAGES = ["/", "/winners", "/misses", "/stale"]


@pytest.fixture(scope="module")
def seed(tmp_path_factory):
    url = f"sqlite:///{tmp_path_factory.mktemp('dashboard') / 'moetune.db'}"
    with seeded(url) as s:
        yield s


def client(seed, **settings) -> TestClient:
    return local_client(create_app(ServiceSettings(db_url=seed.url, token=TOKEN, **settings)))


def pages(seed) -> list[str]:
    return PAGES + [f"/sweeps/{i}" for i in seed.sweeps.values()]


def test_every_value_from_the_database_is_escaped(seed):
    without = {f"/sweeps/{seed.sweeps[name]}" for name in ("second", "dead")}  # sweeps with no markup
    with client(seed) as c:
        for page in pages(seed):
            text = c.get(page).text
            assert "<img" not in text, page
            assert (html.escape(MARKUP) in text) == (page not in without), page


def test_the_sweeps_list_links_every_sweep_with_its_status(seed):
    with client(seed) as c:
        text = c.get("/").text
    for sweep_id in seed.sweeps.values():
        assert f'<a href="/sweeps/{sweep_id}">{sweep_id}</a>' in text
    assert text.count("<td>done</td>") == len(seed.sweeps) - 1
    assert text.count("<td>dead (stored: running)</td>") == 1


@pytest.mark.parametrize("path", ["/sweeps/9999", "/no-such-page", "/static/other.js"])
def test_unknown_sweeps_and_pages_are_404(seed, path):
    with client(seed) as c:
        assert c.get(path).status_code == 404


def test_plotly_js_comes_from_the_installed_package_with_a_cache_lifetime(seed):
    shipped = (Path(plotly.__file__).parent / "package_data" / "plotly.min.js").read_bytes()
    with client(seed) as c:
        first = c.get("/static/plotly.min.js")
        again = c.get("/static/plotly.min.js", headers={"If-None-Match": first.headers["etag"]})
        sweep = c.get(f"/sweeps/{seed.sweeps['first']}").text
    assert first.status_code == 200 and first.content == shipped
    assert "max-age=" in first.headers["cache-control"] and "javascript" in first.headers["content-type"]
    assert again.status_code == 304
    # The page links the file rather than inlining it; its charts are the report's own figures.
    assert '<script src="/static/plotly.min.js"></script>' in sweep and len(sweep) < len(shipped) / 4
    assert sweep.count('class="plotly-graph-div"') > 0


def test_the_sweep_page_has_the_reports_sections_and_the_optuna_export(seed):
    sweep_id = seed.sweeps["first"]
    with open_store(seed.url) as store:
        sections = report.sections(store, sweep_id)
    with client(seed) as c:
        text = c.get(f"/sweeps/{sweep_id}").text
    heading, _, rest = sections.body.partition("</h1>")
    assert heading + "</h1><h2>Progress</h2>" in text and rest in text  # the live panel under the title
    assert text.count('class="plotly-graph-div"') == len(sections.figures)
    assert f"moetune export-optuna {sweep_id} --storage" in text and "optuna-dashboard sqlite:///" in text


def test_pages_need_the_token_when_reads_are_protected(seed):
    with client(seed, protect_reads=True) as c:
        for page in [*pages(seed), "/static/plotly.min.js"]:
            assert c.get(page).status_code == 401, page
            assert c.get(page, headers={"Authorization": f"Bearer {TOKEN}"}).status_code == 200, page


def _rows(text: str) -> list[list[str]]:
    """The winners table's rows as cell texts (lines in a cell joined by |)."""
    body = text.split("<tbody>", 1)[1].split("</tbody>", 1)[0]
    rows = []
    for row in re.findall(r"<tr>(.*?)</tr>", body):
        cells = re.findall(r"<td[^>]*>(.*?)</td>", row)
        rows.append(
            [html.unescape(re.sub(r"<[^>]+>", "", re.sub(r"</div><div[^>]*>", "|", c))) for c in cells]
        )
    return rows


def test_the_winners_matrix_maps_problems_to_models_and_other(seed):
    with client(seed) as c:
        text = c.get("/winners").text
    header = re.findall(r"<th>(.*?)</th>", text)
    rows = {tuple(r[:3]): dict(zip(header[3:], r[3:], strict=True)) for r in _rows(text)}
    assert set(rows) == {
        ("Simulated GPU", "tiny", "sim"),
        ("Simulated GPU", "other", "sim"),
        ("Simulated GPU B", "tiny", "sim"),
        (MARKUP, "other", "sim"),
    }
    tiny_a = rows[("Simulated GPU", "tiny", "sim")]
    assert tiny_a["T=8"].startswith("down: ") and tiny_a["T=64"].startswith("down: ")
    assert rows[("Simulated GPU B", "tiny", "sim")]["T=8"].startswith("gate_up: ")
    assert rows[("Simulated GPU", "other", "sim")]["m=8"].startswith("grouped_matmul m=8,k=64,n=64,g=4: ")


def test_a_winners_speedups_are_the_reports(seed):
    sweep_id = seed.sweeps["first"]
    with open_store(seed.url) as store:
        _, problems, _ = report.collect(store, sweep_id, studies=False)
    down = next(d for d in problems if d.problem.key == tiny("down", 8).key)
    expected = f"{down.vs_heuristic.ratio:.2f}x"
    with client(seed) as c:
        rows = _rows(c.get("/winners").text)
    cell = next(r for r in rows if r[:3] == ["Simulated GPU", "tiny", "sim"])[3:]
    assert any(f"down: {expected} (" in text for text in cell)
    assert down.vs_heuristic.ratio > 1  # the sweep found a faster tile than the heuristic's


def test_misses_are_ranked_by_count(seed):
    with client(seed) as c:
        text = c.get("/misses").text
    gate_up, down = tiny("gate_up", 64).key, tiny("down", 64).key
    assert text.index(html.escape(gate_up)) < text.index(html.escape(down))
    assert "<td>3</td>" in text


def test_the_stale_page_lists_the_stale_winner_and_why(seed):
    with client(seed) as c:
        text = c.get("/stale").text
    assert "tuned with kernel source sim-v0, running sim-v1" in text
    assert html.escape(tiny("down", 64).key) in text
    assert html.escape(tiny("down", 8).key) not in text  # tuned with the current source: fresh
