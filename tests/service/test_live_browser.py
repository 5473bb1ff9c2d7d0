"""The live dashboard in headless Chromium (tests/browser.py), as a user keeps it open: a running sweep's
progress advancing and a job's log lines arriving without a reload, and a page of another name that
resolves to the server (DNS rebinding, simulated by Chromium's host resolver rules) refused."""

from __future__ import annotations

import time

import pytest

from moetune.db import open_store
from moetune.db.leases import Owner
from tests.browser import DRAW_TIMEOUT_S, chromium, console_errors, keep_screenshot
from tests.service.live_server import serving
from tests.tuner.sim_sweeps import DEVICE

pytestmark = pytest.mark.slow  # a server and a browser start
REBOUND = "rebind.example"  # a name that, as after DNS rebinding, resolves to 127.0.0.1


@pytest.fixture
def browser(tmp_path):
    with chromium(tmp_path, f"--host-resolver-rules=MAP {REBOUND} 127.0.0.1") as driver:
        yield driver


def _progress(done: int) -> dict:
    return {
        "final": False,
        "stage": "",
        "elapsed_s": 10.0 * done,
        "planned": 40,
        "done": done,
        "ok": done - 1,
        "failed": 1,
        "counts": {"ok": done - 1, "compile_error": 1},
        "recorded": done,
        "rate_per_min": 6.0,
        "eta_s": 10.0 * (40 - done),
        "workers": 1,
        "lanes": {"gpu0": f"tiny down T=8 tile={done}"},
        "setup": {},
        "problems": [{"label": "tiny down T=8", "done": done, "planned": 40, "phase": "timing"}],
        "best": [],
        "more_rows": 0,
    }


def _wait_for(browser, what, timeout_s: float = DRAW_TIMEOUT_S):
    deadline = time.monotonic() + timeout_s
    while True:
        found = what(browser)
        if found:
            return found
        assert time.monotonic() < deadline, "the page did not change"
        time.sleep(0.2)


def _text(browser, css: str) -> str:
    """The first match's text; "" while there is none, or when a live update replaced the element between
    finding and reading it (the waits then look again)."""
    from selenium.common.exceptions import StaleElementReferenceException
    from selenium.webdriver.common.by import By

    found = browser.find_elements(By.CSS_SELECTOR, css)
    try:
        return found[0].text if found else ""
    except StaleElementReferenceException:
        return ""


def test_a_running_sweeps_progress_advances_and_a_jobs_log_grows_without_a_reload(
    sqlite_url, browser, tmp_path
):
    owner = Owner.here()
    with open_store(sqlite_url) as store:
        spec = {"spec": {}, "problems": [], "device": DEVICE.to_dict()}
        sweep_id = store.create_sweep(
            backend="xla", strategy="grid", spec=spec, host="h", user="u", owner=owner
        )
        store.heartbeat(sweep_id, owner)
        store.publish_progress(sweep_id, _progress(3))
        job_id = store.submit_job({"problems": ["m=16,k=64,n=256,g=4,dtype=bf16"]})
        store.append_job_log(job_id, ["claimed by h:1 (attempt 1)"])
    with serving(sqlite_url) as base:
        browser.get(f"{base}/sweeps/{sweep_id}")
        browser.execute_script("window.loadedOnce = true")  # gone if the page reloads
        assert "3 / 40 trials" in _wait_for(browser, lambda b: _text(b, ".progress .figures"))
        with open_store(sqlite_url) as store:
            store.heartbeat(sweep_id, owner)
            store.publish_progress(sweep_id, _progress(17))
        _wait_for(browser, lambda b: "17 / 40 trials" in _text(b, ".progress .figures"))
        _wait_for(browser, lambda b: "tile=17" in _text(b, "table"))
        assert browser.execute_script("return window.loadedOnce") is True
        keep_screenshot(browser, tmp_path, "live-sweep.png")

        browser.get(f"{base}/jobs/{job_id}")
        browser.execute_script("window.loadedOnce = true")
        _wait_for(browser, lambda b: "claimed by h:1" in _text(b, "pre.log"))
        with open_store(sqlite_url) as store:
            store.append_job_log(job_id, ["sweep 1: 5/40 trials", "sweep 1: 9/40 trials"])
        _wait_for(browser, lambda b: "9/40 trials" in _text(b, "pre.log"))
        assert browser.execute_script("return window.loadedOnce") is True
        keep_screenshot(browser, tmp_path, "live-job.png")
        assert console_errors(browser) == []


def test_a_page_of_another_name_that_resolves_to_the_server_is_refused(sqlite_url, browser):
    """DNS rebinding: evil.example's page re-resolves its own name to 127.0.0.1 and reads the server as
    its own origin. The browser still names the page's host in the Host header, which the server refuses."""
    with serving(sqlite_url) as base:
        port = base.rsplit(":", 1)[1]
        browser.get(f"http://{REBOUND}:{port}/api/health")
        assert "host not allowed" in browser.page_source and '"ok"' not in browser.page_source
        browser.get(f"http://{REBOUND}:{port}/")
        assert "host not allowed" in browser.page_source and "Sweeps" not in browser.page_source
        browser.get(f"{base}/api/health")  # the server's own name still answers
        assert '"status":"ok"' in browser.page_source.replace(" ", "")


def test_the_trial_table_sorts_and_filters_in_the_browser(tmp_path, browser):
    from selenium.webdriver.common.by import By

    from tests.service.dashboard_seed import seeded

    with seeded(f"sqlite:///{tmp_path / 'moetune.db'}") as seed, serving(seed.url) as base:
        sweep_id = seed.sweeps["first"]
        browser.get(f"{base}/sweeps/{sweep_id}")
        table = browser.find_element(By.ID, f"trials-{sweep_id}")
        headers = table.find_elements(By.CSS_SELECTOR, "thead th")
        median = next(h for h in headers if h.text.startswith("median"))
        column = headers.index(median)

        def shown(column: int) -> list[str]:
            rows = table.find_elements(By.CSS_SELECTOR, "tbody tr")
            return [r.find_elements(By.TAG_NAME, "td")[column].text for r in rows if r.is_displayed()]

        median.click()
        values = [float(v) for v in shown(column) if v != "-"]
        assert values == sorted(values) and len(values) > 2
        median.click()
        values = [float(v) for v in shown(column) if v != "-"]
        assert values == sorted(values, reverse=True)

        status = next(i for i, h in enumerate(headers) if h.text == "status")
        box = browser.find_element(By.CSS_SELECTOR, f'input.filter[data-table="trials-{sweep_id}"]')
        box.send_keys("wrong_result")
        statuses = shown(status)
        assert statuses and set(statuses) == {"wrong_result"}

        a, b = seed.sweeps["first"], seed.sweeps["markup"]
        browser.get(f"{base}/compare?a={a}&b={b}")
        assert browser.find_element(By.TAG_NAME, "h1").text == f"Sweep {a} and sweep {b}"
        keep_screenshot(browser, tmp_path, "compare.png")
        assert console_errors(browser) == []
