"""A real headless browser for page tests: Debian's chromium and its chromedriver, driven by Selenium.

`.ci/run` installs both (apt-get); where neither can be found, `browser()` skips the test and says why. The browser
may reach loopback only: every other host name resolves to nothing and no proxy is used, so a page that needed the
internet would show it.
"""

from __future__ import annotations

import shutil

import pytest

CHROMIUM = ("chromium", "chromium-browser", "google-chrome")
DRIVER = ("chromedriver",)


def _find(names: tuple[str, ...]) -> str | None:
    return next((p for p in (shutil.which(n) for n in names) if p), None)


def browser(width: int = 1280, height: int = 1600):
    """A headless Chromium WebDriver (the caller quits it)."""
    try:
        from selenium import webdriver
        from selenium.webdriver.chrome.service import Service
    except ImportError:
        pytest.skip("selenium is not installed (pip install -e '.[test]')")
    binary, driver = _find(CHROMIUM), _find(DRIVER)
    if binary is None or driver is None:
        pytest.skip("no chromium and chromedriver on this machine (Debian: apt-get install chromium chromium-driver)")
    opts = webdriver.ChromeOptions()
    opts.binary_location = binary
    for arg in ("--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
                f"--window-size={width},{height}", "--no-proxy-server", "--disable-background-networking",
                "--disable-component-update", "--disable-sync", "--no-first-run", "--disable-extensions",
                "--host-resolver-rules=MAP * ~NOTFOUND, EXCLUDE 127.0.0.1"):
        opts.add_argument(arg)
    opts.set_capability("goog:loggingPrefs", {"browser": "ALL"})
    # An explicit chromedriver: Selenium never tries to download one.
    return webdriver.Chrome(options=opts, service=Service(executable_path=driver))
