"""What a person sees in headless Chromium: the HTML report, and the Trackio dashboard of a finished run.

Screenshots are kept in pytest's temporary directory (see the test output for their paths), never in
the repository.
"""

import json
import os
import socket
import subprocess
import sys
import time
import urllib.request

import pytest

from rlhfkit.report import build_report
from tests.report import browser, fakeruns
from tests.report.conftest import ROOT, TRACKED_PROJECT, TRACKED_RUN

pytestmark = pytest.mark.slow  # headless Chromium, and a PPO run in a subprocess

MIN_STDDEV = 20  # grey-level spread; a blank page is ~0, a page of white cards with charts ~40-60
# Trackio's dashboard is mostly white with thin lines: ~20 when it shows a handful of small charts, ~0 when blank.
MIN_STDDEV_DASHBOARD = 10


@pytest.fixture(scope="module")
def report_page(synthetic_runs, tmp_path_factory):
    """The synthetic PPO + GRPO report (health findings, NaN, samples), built once."""
    return build_report(list(synthetic_runs), tmp_path_factory.mktemp("browser-report") / "report")


def wait_for(condition, timeout: float, what: str, interval: float = 0.25):
    """Poll `condition` until it returns something truthy; fail with `what` after `timeout` seconds."""
    deadline = time.monotonic() + timeout
    while True:
        value = condition()
        if value:
            return value
        if time.monotonic() > deadline:
            pytest.fail(f"timed out after {timeout:.0f}s waiting for {what}")
        time.sleep(interval)


# For every image: whether it decodes (a truncated PNG still reports its size from the header, so
# naturalWidth alone is not enough), its size on screen, and the share of its pixels that are not
# background: a chart is lines, ticks and text on white; an empty figure is ~0.
IMAGES_JS = """
const done = arguments[arguments.length - 1];
Promise.all(Array.from(document.images).map(async (img) => {
  let decoded = true;
  try { await img.decode(); } catch (e) { decoded = false; }
  let inked = 0;
  if (decoded && img.naturalWidth > 0) {
    const canvas = document.createElement('canvas');
    canvas.width = img.naturalWidth; canvas.height = img.naturalHeight;
    const ctx = canvas.getContext('2d');
    ctx.drawImage(img, 0, 0);
    const data = ctx.getImageData(0, 0, canvas.width, canvas.height).data;
    let n = 0;
    for (let i = 0; i < data.length; i += 4) {
      if (data[i + 3] > 128 && data[i] + data[i + 1] + data[i + 2] < 600) n++;  // opaque, not white
    }
    inked = n / (data.length / 4);
  }
  return {alt: img.alt, decoded: decoded, width: img.naturalWidth, shown: img.getBoundingClientRect().width,
          inked: inked};
})).then(done);
"""


def test_report_charts_are_drawn_and_the_page_is_not_blank(chromium, report_page, tmp_path):
    chromium.get(report_page.as_uri())
    images = chromium.execute_async_script(IMAGES_JS)
    assert len(images) == report_page.read_text().count("<img ")
    charts = [i for i in images if i["alt"] in ("eval/task_success", "objective/kl", "reward", "val/ratio")]
    assert len(charts) == 4
    broken = [i for i in images if not (i["decoded"] and i["width"] > 0 and i["shown"] > 100 and i["inked"] > 0.01)]
    assert broken == [], f"images not drawn: {broken}"

    shot = tmp_path / "report.png"
    browser.full_page_screenshot(chromium, shot)
    print(f"report screenshot: {shot}")
    assert browser.pixel_stddev(shot) > MIN_STDDEV
    # A page wider than the window hides columns behind a horizontal scrollbar.
    assert chromium.execute_script("return document.documentElement.scrollWidth <= window.innerWidth")


def test_report_shows_titles_findings_and_completions(chromium, report_page):
    chromium.get(report_page.as_uri())
    titles = chromium.execute_script(
        "return Array.from(document.querySelectorAll('figure[data-metric] figcaption code')).map(e => e.innerText)"
    )
    assert titles[:2] == ["eval/task_success", "objective/rlhf_reward"]
    assert {"reward", "kl", "completions/clipped_ratio", "loss/value_avg"} <= set(titles)

    text = chromium.execute_script("return document.body.innerText")
    assert "0.25 → 0.75" in text and "0.1 → 0.4" in text
    for finding in fakeruns.PPO_FINDINGS:
        assert finding["message"] in text
    for step in (0, 20, 40):
        assert fakeruns.ppo_response(step, 1) in text
    # Model output that looks like HTML is shown as text, never run.
    assert fakeruns.HTML_COMPLETION in text
    assert chromium.execute_script("return document.scripts.length") == 0


def test_report_fetches_nothing(chromium, report_page):
    """Opened offline, the report needs nothing beyond itself (images are data: URIs)."""
    chromium.get(report_page.as_uri())
    assert [u for u in browser.resource_urls(chromium) if not u.startswith("data:")] == []
    assert browser.console_errors(chromium) == []


# ------------------------------------------------------------------------------------------------
# Trackio dashboard


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def responds(url: str) -> bool:
    try:
        with urllib.request.urlopen(url, timeout=2) as response:
            return response.status == 200
    except OSError:
        return False


@pytest.fixture(scope="module")
def trackio_dashboard(tracked_run, tmp_path_factory):
    """`trackio.show` of the finished run's project on a loopback port, in its own process (it blocks)."""
    _, trackio_dir = tracked_run
    port = free_port()
    code = (
        "import trackio; "
        f"trackio.show(project={TRACKED_PROJECT!r}, open_browser=False, block_thread=True, server_port={port})"
    )
    log = open(tmp_path_factory.mktemp("trackio-show") / "show.log", "w")
    env = dict(os.environ, TRACKIO_DIR=str(trackio_dir), PYTHONPATH=str(ROOT))
    server = subprocess.Popen([sys.executable, "-c", code], env=env, stdout=log, stderr=subprocess.STDOUT)
    url = f"http://127.0.0.1:{port}/"
    try:
        wait_for(lambda: responds(url) or server.poll() is not None, 60, f"trackio dashboard at {url}")
        assert server.poll() is None, f"trackio show exited: {open(log.name).read()[-2000:]}"
        yield f"{url}?project={TRACKED_PROJECT}"
    finally:
        server.terminate()
        server.wait(timeout=30)
        log.close()


DRAWN_CANVASES_JS = """
return Array.from(document.querySelectorAll('canvas')).filter(c => {
  if (c.width < 50 || c.height < 50) return false;
  const data = c.getContext('2d').getImageData(0, 0, c.width, c.height).data;
  for (let i = 3; i < data.length; i += 4) if (data[i] !== 0) return true;  // any painted pixel
  return false;
}).length;
"""


def test_trackio_dashboard_shows_the_run_and_its_metrics(chromium, trackio_dashboard, tracked_run, tmp_path):
    run_dir, _ = tracked_run
    chromium.get(trackio_dashboard)
    text = lambda: chromium.execute_script("return document.body.innerText")  # noqa: E731
    # The dashboard groups metrics by their first prefix and titles each plot with the rest of the name
    # (sampling/importance_sampling_ratio/min: section "sampling", plot "importance_sampling_ratio/min").
    wait_for(lambda: TRACKED_RUN in text() and "rlhf_reward" in text(), 60, "the run and its metrics")
    wait_for(lambda: chromium.execute_script(DRAWN_CANVASES_JS) >= 2, 60, "plots drawn on canvas")
    lines = set(text().splitlines())
    logged = {k for row in map(json.loads, (run_dir / "metrics.jsonl").read_text().splitlines()) for k in row}
    for name in logged - {"step"}:
        group, leaf = name.split("/", 1) if "/" in name else ("", name)
        assert leaf in lines, f"{name} is not on the dashboard"
        assert not group or any(line.startswith(f"{group} (") for line in lines), f"no {group} section"

    shot = tmp_path / "trackio.png"
    chromium.save_screenshot(str(shot))
    print(f"trackio screenshot: {shot}")
    assert browser.pixel_stddev(shot) > MIN_STDDEV_DASHBOARD

    # Everything the dashboard fetched came from the local server: it needs no CDN.
    foreign = [u for u in browser.resource_urls(chromium) if not u.startswith(("http://127.0.0.1:", "data:", "blob:"))]
    assert foreign == []
    assert browser.console_errors(chromium) == []


def test_trackio_dashboard_shows_the_completion_tables(chromium, trackio_dashboard, tracked_run):
    from selenium.webdriver.common.by import By

    run_dir, _ = tracked_run
    first = json.loads((run_dir / "samples.jsonl").read_text().splitlines()[0])
    chromium.get(trackio_dashboard)
    tab = wait_for(
        lambda: chromium.find_elements(By.XPATH, "//button[normalize-space(.)='Media & Tables']"), 60, "the tables tab"
    )
    tab[0].click()
    text = lambda: chromium.execute_script("return document.body.innerText")  # noqa: E731
    wait_for(lambda: first["query"] in text() and first["model response"] in text(), 60, "the completions table")
