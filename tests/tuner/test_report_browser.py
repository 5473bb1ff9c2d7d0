"""The report in a real browser: headless Chromium (tests/browser.py) draws every chart, logs no console
error and fetches nothing; a full-page screenshot is kept (copied to $CI_ARTIFACTS when set)."""

from __future__ import annotations

import pytest

from moetune.db import open_store
from moetune.tuner.report import build
from tests.browser import DRAW_TIMEOUT_S, PNG_MAGIC, chromium, console_errors, fetched, keep_screenshot
from tests.db import db_factories
from tests.tuner.sim_sweeps import DEVICE, run_sim_sweep

pytestmark = pytest.mark.slow  # a headless browser


@pytest.fixture
def browser(tmp_path):
    with chromium(tmp_path) as driver:
        yield driver


def test_every_chart_is_drawn_without_console_errors(sqlite_url, sim, tmp_path, browser):
    from selenium.webdriver.support.ui import WebDriverWait

    costs = {1: 2e-3, 2: None, 3: 1e-3, 4: None, 5: 1.5e-3, 6: 1.2e-3}
    with open_store(sqlite_url) as store:
        sweep_id = run_sim_sweep(store, ["m=8,k=64,n=64,g=4", "m=4,k=64,n=64,g=4"], costs=costs)
        # Markup in an error text: unescaped, it would load an image (a console error) and open an alert.
        evil = db_factories.trial(
            config={"tile": 7},
            status="crashed",
            median_s=None,
            error='<img src="missing.png" onerror="alert(1)">',
            device=DEVICE,
            backend="sim",
            problem=store.trials(sweep_id=sweep_id)[0].problem,
            sweep_id=sweep_id,
        )
        store.record_trial(evil)
        report = build(store, sweep_id)
    page = tmp_path / "report.html"
    page.write_text(report.html)

    browser.get(page.as_uri())
    drawn = "return document.querySelectorAll('.plotly-graph-div .main-svg .trace').length > 0 && " + (
        "Array.from(document.querySelectorAll('.plotly-graph-div'))"
        ".every(div => div.querySelector('.main-svg .trace, .main-svg .parcoords'))"
    )
    WebDriverWait(browser, DRAW_TIMEOUT_S).until(lambda d: d.execute_script(drawn))
    graphs = browser.execute_script(
        "return Array.from(document.querySelectorAll('.plotly-graph-div'))"
        ".map(div => [div.querySelectorAll('.main-svg').length, "
        "div.querySelectorAll('.trace, .parcoords').length])"
    )
    # ratios, failures; m=8: time per config, history, importance, slices, parallel coordinates; m=4: 2
    assert len(graphs) == len(report.figures) == 2 + 1 + 5 + 2
    assert all(svgs >= 1 and traces >= 1 for svgs, traces in graphs), graphs
    assert console_errors(browser) == []
    assert fetched(browser) == []

    screenshot = keep_screenshot(browser, tmp_path, "report-browser.png")
    assert screenshot.read_bytes()[:8] == PNG_MAGIC and screenshot.stat().st_size > 50_000
