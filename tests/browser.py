"""A real headless browser for the page tests: Debian's Chromium driven by Selenium through the system's
chromedriver, console messages logged, full-page screenshots, kept in $CI_ARTIFACTS when set.

Chromium and chromedriver come from the system (.ci/run installs Debian's `chromium chromium-driver`);
the driver's path is given explicitly, so Selenium never fetches a browser or driver of its own. Without
them a test skips locally and fails under CI=true.
"""

from __future__ import annotations

import base64
import contextlib
import os
import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

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
PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


def _skip_or_fail(reason: str):
    if os.environ.get("CI") == "true":
        pytest.fail(f"{reason}; .ci/run installs it")
    pytest.skip(reason)


@contextlib.contextmanager
def chromium(tmp_path: Path, *flags: str) -> Iterator[Any]:
    """A Selenium driver of headless Chromium with a fresh profile under `tmp_path`; `flags`: more of
    Chromium's command-line flags."""
    try:
        from selenium import webdriver
        from selenium.webdriver.chrome.service import Service
    except ImportError:
        _skip_or_fail("selenium is not installed (the dev extra has it)")
    if not (CHROMIUM and CHROMEDRIVER):
        _skip_or_fail("chromium or chromedriver is not on PATH (apt-get install chromium chromium-driver)")
    options = webdriver.ChromeOptions()
    options.binary_location = CHROMIUM
    for flag in (*FLAGS, *flags):
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


def console_errors(driver: Any) -> list[dict[str, Any]]:
    """The console's errors since the last call (reading the log empties it)."""
    return [entry for entry in driver.get_log("browser") if entry["level"] == "SEVERE"]


def fetched(driver: Any) -> list[str]:
    """Every resource the current page loaded (scripts, images, ...), by URL."""
    return driver.execute_script("return performance.getEntriesByType('resource').map(e => e.name)")


def full_page_png(driver: Any, path: Path) -> None:
    metrics = driver.execute_cdp_cmd("Page.getLayoutMetrics", {})
    size = metrics["cssContentSize"]
    clip = {"x": 0, "y": 0, "width": size["width"], "height": size["height"], "scale": 1}
    shot = driver.execute_cdp_cmd(
        "Page.captureScreenshot", {"format": "png", "captureBeyondViewport": True, "clip": clip}
    )
    path.write_bytes(base64.b64decode(shot["data"]))


def keep_screenshot(driver: Any, folder: Path, name: str) -> Path:
    """A full-page screenshot as folder/name, copied to $CI_ARTIFACTS when set."""
    path = folder / name
    full_page_png(driver, path)
    artifacts = os.environ.get("CI_ARTIFACTS")
    if artifacts:
        Path(artifacts).mkdir(parents=True, exist_ok=True)
        shutil.copy(path, Path(artifacts) / name)
    return path
