"""The dashboard in a real headless browser: Debian's chromium driven by Selenium
through Debian's chromedriver (no browser download)."""
from __future__ import annotations

import os
import shutil

import pytest

from tests.helpers import recv_until, start_server

pytestmark = pytest.mark.integration

CHROMIUM = shutil.which("chromium") or "/usr/bin/chromium"
CHROMEDRIVER = shutil.which("chromedriver") or "/usr/bin/chromedriver"


@pytest.fixture
def browser(tmp_path):
    if not (os.path.exists(CHROMIUM) and os.path.exists(CHROMEDRIVER)):
        pytest.skip("Debian's chromium and chromium-driver are not installed (.ci/run installs them)")
    webdriver = pytest.importorskip("selenium.webdriver")
    from selenium.webdriver.chrome.service import Service
    opts = webdriver.ChromeOptions()
    opts.binary_location = CHROMIUM
    for a in ("--headless=new", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
              "--disable-background-networking", "--disable-component-update", "--disable-sync",
              "--disable-dev-shm-usage", "--window-size=1280,900",
              f"--user-data-dir={tmp_path / 'chromium-profile'}"):
        opts.add_argument(a)
    d = webdriver.Chrome(service=Service(CHROMEDRIVER), options=opts)
    yield d
    d.quit()


def test_dashboard_shows_puts(browser, tmp_path):
    from selenium.common.exceptions import StaleElementReferenceException
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.ui import WebDriverWait
    server = start_server(tmp_path, admin=True, workers=2, fronts=2)
    try:
        wait = WebDriverWait(browser, 40, poll_frequency=0.1)
        browser.get(f"http://127.0.0.1:{server.admin_port}/")
        wait.until(lambda d: d.find_element(By.ID, "status").text == "Up")
        assert browser.find_element(By.ID, "uptime").text.endswith("s")

        def items_cell(d):
            cells = d.find_elements(By.CSS_SELECTOR, 'tr[data-queue="dash"] td.items')
            try:
                return cells[0].text if cells else None
            except StaleElementReferenceException:    # the table was redrawn meanwhile
                return None

        with server.connect() as s:
            s.sendall(b"set dash 0 0 5\r\nhello\r\n")
            assert recv_until(s, b"\r\n") == b"STORED\r\n"
            wait.until(lambda d: items_cell(d) == "1")
            for _ in range(2):
                s.sendall(b"set dash 0 0 5\r\nhello\r\n")
                assert recv_until(s, b"\r\n") == b"STORED\r\n"
            wait.until(lambda d: items_cell(d) == "3")
        # the process table and the chart are drawn from the same poll
        procs = {e.get_attribute("data-process")
                 for e in browser.find_elements(By.CSS_SELECTOR, "#processes tr[data-process]")}
        assert {"supervisor", "w0", "w1", "f0", "f1", "cleaner"} <= procs
        assert float(browser.find_element(By.ID, "put-rate").text) >= 0.0
        assert browser.find_element(By.ID, "error").text == ""
        shot = tmp_path / "dashboard.png"
        assert browser.save_screenshot(str(shot)) and shot.stat().st_size > 10_000
    finally:
        assert server.stop() == 0
