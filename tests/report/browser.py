"""Headless Chromium for the browser tests (Debian packages `chromium` and `chromium-driver`, pip `selenium`).

Without them the tests skip and say what to install; with RLHFKIT_REQUIRE_BROWSER=1 (CI) they fail
instead, so a CI image that lost its browser cannot pass by skipping.
"""

import shutil

from tests.helpers import skip_or_fail

REQUIRE_ENV = "RLHFKIT_REQUIRE_BROWSER"
WIDTH, HEIGHT = 1400, 1000
# The machine's network is closed; these keep Chromium from trying to reach Google at all.
CHROMIUM_FLAGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-component-update",
    "--no-first-run",
    "--disable-sync",
    "--disable-dev-shm-usage",  # containers often have a tiny /dev/shm
    f"--window-size={WIDTH},{HEIGHT}",
]


def missing_browser_parts() -> list[str]:
    missing = []
    try:
        import selenium  # noqa: F401
    except ImportError:
        missing.append("the selenium package (pip install selenium)")
    if not shutil.which("chromium"):
        missing.append("chromium (apt-get install -y chromium)")
    if not shutil.which("chromedriver"):
        missing.append("chromedriver (apt-get install -y chromium-driver)")
    return missing


def require_browser() -> None:
    """Skip (or fail under RLHFKIT_REQUIRE_BROWSER=1) when the browser or its driver is missing."""
    missing = missing_browser_parts()
    if not missing:
        return
    skip_or_fail("browser tests need " + ", ".join(missing), REQUIRE_ENV)


def start_chromium(profile_dir):
    """A selenium WebDriver on headless Chromium with a fresh profile (an empty directory) and the console
    log recorded."""
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    options = webdriver.ChromeOptions()
    options.binary_location = shutil.which("chromium")
    for flag in CHROMIUM_FLAGS:
        options.add_argument(flag)
    options.add_argument(f"--user-data-dir={profile_dir}")
    options.set_capability("goog:loggingPrefs", {"browser": "ALL"})
    driver = webdriver.Chrome(service=Service(shutil.which("chromedriver")), options=options)
    driver.set_page_load_timeout(60)
    driver.set_script_timeout(60)
    return driver


def full_page_screenshot(driver, path) -> None:
    """Screenshot of the whole page: the window is stretched to the document's height first."""
    height = driver.execute_script("return document.documentElement.scrollHeight")
    driver.set_window_size(WIDTH, min(int(height), 16000))
    try:
        driver.save_screenshot(str(path))
    finally:
        driver.set_window_size(WIDTH, HEIGHT)


def pixel_stddev(path) -> float:
    """Standard deviation of the grey levels: ~0 for a blank page, tens for a page with charts and text."""
    from PIL import Image, ImageStat

    with Image.open(path) as image:
        return ImageStat.Stat(image.convert("L")).stddev[0]


def resource_urls(driver) -> list[str]:
    """Every URL the page has fetched (scripts, styles, images, fonts, XHR), from the Performance API."""
    return driver.execute_script("return performance.getEntriesByType('resource').map(e => e.name)")


def console_errors(driver) -> list[str]:
    return [entry["message"] for entry in driver.get_log("browser") if entry["level"] == "SEVERE"]
