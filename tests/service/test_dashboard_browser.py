"""The dashboard in a real browser: a uvicorn server on an ephemeral loopback port over a seeded SQLite
database, headless Chromium (tests/browser.py) opening every page. Each page loads with no console error
and fetches nothing from anywhere but the server; the winners matrix shows the seeded winners' cells;
the sweep page draws its Plotly charts. Full-page screenshots go to $CI_ARTIFACTS when set."""

from __future__ import annotations

import threading
import time

import pytest
import uvicorn

from moetune.db import open_store
from moetune.service.app import create_app
from moetune.service.settings import ServiceSettings
from moetune.tuner import report
from tests.browser import DRAW_TIMEOUT_S, PNG_MAGIC, chromium, console_errors, fetched, keep_screenshot
from tests.service.dashboard_seed import OTHER_GPU, seeded
from tests.tuner.sim_sweeps import DEVICE

pytestmark = pytest.mark.slow  # a headless browser

START_TIMEOUT_S = 20


@pytest.fixture
def browser(tmp_path):
    with chromium(tmp_path) as driver:
        yield driver


@pytest.fixture
def server(tmp_path):
    """(base URL, the seeded database) of a real server, in a thread of this process (so the simulated
    backend registered for the seed is the server's too)."""
    with seeded(f"sqlite:///{tmp_path / 'moetune.db'}") as seed:
        app = create_app(ServiceSettings(db_url=seed.url))
        config = uvicorn.Config(app, host="127.0.0.1", port=0, log_level="warning", lifespan="on")
        served = uvicorn.Server(config)
        thread = threading.Thread(target=served.run, daemon=True)
        thread.start()
        deadline = time.monotonic() + START_TIMEOUT_S
        while not served.started:
            assert thread.is_alive() and time.monotonic() < deadline, "the server did not start"
            time.sleep(0.05)
        port = served.servers[0].sockets[0].getsockname()[1]
        try:
            yield f"http://127.0.0.1:{port}", seed
        finally:
            served.should_exit = True
            thread.join(START_TIMEOUT_S)


def _open(browser, url: str) -> None:
    """Load `url` and check what every page must: no console error, nothing fetched from elsewhere."""
    from selenium.webdriver.support.ui import WebDriverWait

    browser.get(url)
    WebDriverWait(browser, DRAW_TIMEOUT_S).until(
        lambda d: d.execute_script("return document.readyState") == "complete"
    )
    base = url.split("/", 3)[:3]
    assert console_errors(browser) == [], url
    assert all(name.split("/", 3)[:3] == base for name in fetched(browser)), fetched(browser)


def test_every_page_loads_and_the_sweep_page_draws_its_charts(server, browser, tmp_path):
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.ui import WebDriverWait

    base, seed = server
    shots = []
    for name, path in (("sweeps", "/"), ("misses", "/misses"), ("stale", "/stale")):
        _open(browser, base + path)
        assert browser.find_element(By.TAG_NAME, "h1").text
        shots.append(keep_screenshot(browser, tmp_path, f"dashboard-{name}.png"))

    _open(browser, base + "/winners")
    rows = {}
    for tr in browser.find_elements(By.CSS_SELECTOR, "tbody tr"):
        cells = [td.text for td in tr.find_elements(By.TAG_NAME, "td")]
        rows[tuple(cells[:3])] = cells[3:]
    header = [th.text for th in browser.find_elements(By.TAG_NAME, "th")][3:]
    for gpu, part in ((DEVICE.device_kind, "down"), (OTHER_GPU.device_kind, "gate_up")):
        cell = rows[(gpu, "tiny", "sim")][header.index("T=8")]
        assert cell.startswith(f"{part}: ") and "x (" in cell, (
            cell
        )  # a speedup, and which medians it compares
    shots.append(keep_screenshot(browser, tmp_path, "dashboard-winners.png"))

    sweep_id = seed.sweeps["first"]
    with open_store(seed.url) as store:
        charts = len(report.sections(store, sweep_id).figures)
    _open(browser, f"{base}/sweeps/{sweep_id}")
    drawn = (
        "return Array.from(document.querySelectorAll('.plotly-graph-div'))"
        ".filter(div => div.querySelector('.plot-container svg.main-svg :is(.trace, .parcoords)')).length"
    )
    WebDriverWait(browser, DRAW_TIMEOUT_S).until(lambda d: d.execute_script(drawn) == charts)
    assert charts >= 4  # two speedup charts, failures, and a problem's time per config at least
    assert console_errors(browser) == []
    assert f"{base}/static/plotly.min.js" in fetched(browser)
    shots.append(keep_screenshot(browser, tmp_path, "dashboard-sweep.png"))
    assert all(shot.read_bytes()[:8] == PNG_MAGIC for shot in shots)
