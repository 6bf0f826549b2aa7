"""Headless Chromium for the HTML report tests, and ``python tests/browser.py PAGE PNG``."""

from __future__ import annotations

import shutil
import sys
from pathlib import Path
from typing import Any

# Debian's `chromium` and `chromium-driver` packages (.ci/run installs them where apt exists).
FLAGS = (
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-dev-shm-usage",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--no-first-run",
    "--window-size=1280,1400",
)


def _which(*names: str) -> str | None:
    for name in names:
        path = shutil.which(name)
        if path:
            return path
    return None


def missing() -> str | None:
    """Why no browser can be driven here, or None when one can."""
    try:
        import selenium  # noqa: F401
    except ImportError:
        return "selenium is not installed (pip install -r requirements-test.txt)"
    if _which("chromium", "chromium-browser") is None:
        return "no Chromium installed (Debian: apt-get install chromium chromium-driver)"
    if _which("chromedriver") is None:
        return "no chromedriver installed (Debian: apt-get install chromium-driver)"
    return None


def start() -> Any:
    """A headless Chromium driven by Selenium, collecting the page's console messages."""
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    options = webdriver.ChromeOptions()
    options.binary_location = str(_which("chromium", "chromium-browser"))
    for flag in FLAGS:
        options.add_argument(flag)
    options.set_capability("goog:loggingPrefs", {"browser": "ALL"})
    service = Service(executable_path=str(_which("chromedriver")))  # no driver download
    return webdriver.Chrome(service=service, options=options)


def screenshot(page: Path, png: Path) -> None:
    """Open ``page`` and save a screenshot of the whole page (up to 3,000 pixels) to ``png``."""
    driver = start()
    try:
        driver.get(page.resolve().as_uri())
        height = driver.execute_script("return document.documentElement.scrollHeight")
        driver.set_window_size(1280, min(int(height) + 140, 3000))
        driver.save_screenshot(str(png))
    finally:
        driver.quit()


if __name__ == "__main__":
    reason = missing()
    if reason:
        sys.exit(f"browser.py: {reason}")
    screenshot(Path(sys.argv[1]), Path(sys.argv[2]))
