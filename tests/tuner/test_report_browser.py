"""The report in a real browser: Debian's headless Chromium driven by Selenium draws every chart, logs no
console error and fetches nothing; a full-page screenshot is kept (copied to $CI_ARTIFACTS when set).

Chromium and chromedriver come from the system (.ci/run installs Debian's `chromium chromium-driver`);
the driver's path is given explicitly, so Selenium never fetches a browser or driver of its own. Without
them the test skips locally and fails under CI=true.
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest

from moetune.db import open_store
from moetune.tuner.report import build
from tests.db import db_factories
from tests.tuner.sim_sweeps import DEVICE, run_sim_sweep

CHROMIUM = shutil.which("chromium")
CHROMEDRIVER = shutil.which("chromedriver")
# This machine's network is closed; without these flags Chromium tries to reach its services at start.
FLAGS = (
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-dev-shm-usage",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--window-size=1300,900",
)
DRAW_TIMEOUT_S = 60


def _skip_or_fail(reason: str):
    if os.environ.get("CI") == "true":
        pytest.fail(f"{reason}; .ci/run installs it")
    pytest.skip(reason)


@pytest.fixture
def browser(tmp_path):
    try:
        from selenium import webdriver
        from selenium.webdriver.chrome.service import Service
    except ImportError:
        _skip_or_fail("selenium is not installed (the dev extra has it)")
    if not (CHROMIUM and CHROMEDRIVER):
        _skip_or_fail("chromium or chromedriver is not on PATH (apt-get install chromium chromium-driver)")
    options = webdriver.ChromeOptions()
    options.binary_location = CHROMIUM
    for flag in FLAGS:
        options.add_argument(flag)
    profile = tmp_path / "chromium-profile"
    profile.mkdir()
    options.add_argument(f"--user-data-dir={profile}")
    options.set_capability("goog:loggingPrefs", {"browser": "ALL"})
    driver = webdriver.Chrome(service=Service(executable_path=CHROMEDRIVER), options=options)
    driver.set_page_load_timeout(DRAW_TIMEOUT_S)
    try:
        yield driver
    finally:
        driver.quit()


def _full_page_png(driver, path: Path) -> None:
    import base64

    metrics = driver.execute_cdp_cmd("Page.getLayoutMetrics", {})
    size = metrics["cssContentSize"]
    clip = {"x": 0, "y": 0, "width": size["width"], "height": size["height"], "scale": 1}
    shot = driver.execute_cdp_cmd(
        "Page.captureScreenshot", {"format": "png", "captureBeyondViewport": True, "clip": clip}
    )
    path.write_bytes(base64.b64decode(shot["data"]))


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
        ".every(div => div.querySelector('.main-svg .trace'))"
    )
    WebDriverWait(browser, DRAW_TIMEOUT_S).until(lambda d: d.execute_script(drawn))
    graphs = browser.execute_script(
        "return Array.from(document.querySelectorAll('.plotly-graph-div'))"
        ".map(div => [div.querySelectorAll('.main-svg').length, div.querySelectorAll('.trace').length])"
    )
    assert len(graphs) == len(report.figures) == 2 + 1 + 3 + 2  # ratios, failures, m=8: 3, m=4: 2
    assert all(svgs >= 1 and traces >= 1 for svgs, traces in graphs), graphs
    errors = [entry for entry in browser.get_log("browser") if entry["level"] == "SEVERE"]
    assert errors == []
    fetched = browser.execute_script("return performance.getEntriesByType('resource').map(e => e.name)")
    assert fetched == []

    screenshot = tmp_path / "report.png"
    _full_page_png(browser, screenshot)
    assert screenshot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and screenshot.stat().st_size > 50_000
    artifacts = os.environ.get("CI_ARTIFACTS")
    if artifacts:
        Path(artifacts).mkdir(parents=True, exist_ok=True)
        shutil.copy(screenshot, Path(artifacts) / "report-browser.png")
