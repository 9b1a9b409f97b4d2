"""The web UI in a real browser: Debian's Chromium driven by Selenium against a real dev cluster. Each page is
loaded and what it shows is checked (a submitted job in the jobs table, its state and placement on its page, its
log, live refresh without a reload, text from users shown as text). Takes screenshots of the overview and a job
page; with GPURM_UPDATE_SCREENSHOTS=1 they replace docs/img/overview.png and docs/img/job.png, which README.md
shows (otherwise they go to the test's temp dir, so a test run leaves the tree clean).

Chromium missing is a failure naming the command that installs it (./scripts/setup-venv runs it as root), never a
skip."""

from __future__ import annotations

import os
import shutil
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TypeVar

import pytest
from selenium import webdriver
from selenium.common.exceptions import NoAlertPresentException, WebDriverException
from selenium.webdriver.chrome.service import Service
from selenium.webdriver.common.by import By
from selenium.webdriver.remote.webdriver import WebDriver
from selenium.webdriver.remote.webelement import WebElement

from gpurm.cli.client import current_user
from gpurm.proto import gpurm_pb2 as pb
from tests.conftest import TestBroker
from tests.integration.harness import ROOT, DevCluster

# a Chromium per module, and a dev cluster: on the one worker that runs such modules one at a time (tests/parallel.py)
pytestmark = pytest.mark.whole_machine

INSTALL = "apt-get update && apt-get install -y chromium chromium-driver"
DOC_IMAGES = ROOT / "docs" / "img"
T = TypeVar("T")


def browser_binaries() -> tuple[str, str]:
    chrome = shutil.which("chromium") or shutil.which("chromium-browser") or shutil.which("google-chrome")
    driver = shutil.which("chromedriver") or next(
        (p for p in ("/usr/bin/chromedriver", "/usr/lib/chromium/chromedriver") if Path(p).exists()), None)
    if chrome is None or driver is None:
        pytest.fail(f"the web UI tests need Chromium and its driver: install them with `{INSTALL}` "
                    "(./scripts/system-deps does it when run as root)", pytrace=False)
    return chrome, driver


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory, broker: TestBroker) -> Iterator[DevCluster]:
    c = DevCluster(tmp_path_factory.mktemp("web"), nodes=4, gpus_per_node=4, racks=2, broker=broker,
                   extra=["--agent-option", "telemetry.interval=1s"])
    yield c
    assert c.stop() == 0


@pytest.fixture(scope="module")
def browser(tmp_path_factory: pytest.TempPathFactory) -> Iterator[WebDriver]:
    chrome, driver_path = browser_binaries()
    opts = webdriver.ChromeOptions()
    opts.binary_location = chrome
    for arg in ("--headless=new", "--no-sandbox", "--disable-dev-shm-usage", "--disable-gpu",
                "--window-size=1360,1000", f"--user-data-dir={tmp_path_factory.mktemp('chromium')}"):
        opts.add_argument(arg)
    opts.set_capability("goog:loggingPrefs", {"browser": "ALL"})
    try:
        drv = webdriver.Chrome(service=Service(driver_path), options=opts)
    except WebDriverException as exc:
        pytest.fail(f"Chromium would not start ({exc.msg}); reinstall it with `{INSTALL}`", pytrace=False)
    drv.set_page_load_timeout(30)
    yield drv
    drv.quit()


def wait_for(what: Callable[[], T | None], timeout: float = 30.0, why: str = "") -> T:
    deadline = time.monotonic() + timeout
    while True:
        try:
            value = what()
        except WebDriverException:
            value = None
        if value:
            return value
        if time.monotonic() > deadline:
            raise TimeoutError(f"after {timeout}s: {why}")
        time.sleep(0.2)


def text_of(browser: WebDriver, css: str) -> str:
    return str(browser.find_element(By.CSS_SELECTOR, css).text)


def showing(browser: WebDriver, css: str, count: int) -> list[WebElement] | None:
    """The elements `css` selects once there are `count` of them; else None after reloading the page (the next
    look sees what the RM says now)."""
    found = browser.find_elements(By.CSS_SELECTOR, css)
    if len(found) == count:
        return list(found)
    browser.refresh()
    return None


def csp_violations(browser: WebDriver) -> list[str]:
    return [e["message"] for e in browser.get_log("browser") if "Content Security Policy" in e["message"]]


def screenshots(tmp_path_factory: pytest.TempPathFactory) -> Path:
    if os.environ.get("GPURM_UPDATE_SCREENSHOTS") == "1":
        return DOC_IMAGES
    return tmp_path_factory.mktemp("screenshots")


def test_pages_in_a_browser(cluster: DevCluster, browser: WebDriver, tmp_path_factory: pytest.TempPathFactory
                            ) -> None:
    IMAGES = screenshots(tmp_path_factory)
    url = cluster.http_url
    big = cluster.submit("--gpus", "6", "--name", "resnet-6gpu", "--", "sh", "-c",
                         "echo epoch 1 loss 0.93; echo epoch 2 loss 0.71; sleep 120")
    small = cluster.submit("--gpus", "1", "--name", "<img src=x onerror=alert(1)>", "--", "sleep", "120")
    cluster.wait_job(big, [pb.JOB_RUNNING], timeout=60)
    cluster.wait_job(small, [pb.JOB_RUNNING], timeout=60)

    # Who am I: the CLI submitted as this OS user; in insecure mode the browser claims it with "view as".
    browser.get(url + "/")
    box = browser.find_element(By.CSS_SELECTOR, "form.viewas input[name=user]")
    box.clear()
    box.send_keys(current_user())
    browser.find_element(By.CSS_SELECTOR, "form.viewas button").click()
    wait_for(lambda: f"you are user {current_user()}" in text_of(browser, "header .who"), why="view as")

    # Overview: every rack, server and GPU; the jobs' GPUs drawn as used.
    heads = [h.text for h in browser.find_elements(By.CSS_SELECTOR, ".rack h3")]
    assert [h.split()[0] for h in heads] == ["rack-1", "rack-2"]
    words = [h.split() for h in heads]
    assert sum(int(w[i]) for w in words for i in range(len(w) - 1) if w[i + 1].startswith("used")) == 7
    assert len(browser.find_elements(By.CSS_SELECTOR, ".rack .server")) == 4
    assert len(browser.find_elements(By.CSS_SELECTOR, ".racks .gpu")) == 16
    used = wait_for(lambda: showing(browser, ".racks .gpu-used", 7), why="7 GPUs drawn as used")
    assert any(big in (g.get_attribute("title") or "") for g in used)
    assert "7 used" in text_of(browser, "#gpu-counts").replace("\n", " ")
    if os.environ.get("GPURM_UPDATE_SCREENSHOTS") == "1":
        time.sleep(2)  # a couple of telemetry samples for the docs' images (the test waits for the chart below)
    IMAGES.mkdir(parents=True, exist_ok=True)
    browser.save_screenshot(str(IMAGES / "overview.png"))

    # Jobs: both rows; the user's text is text (no element, no alert); the find box filters.
    browser.get(url + "/jobs")
    rows = browser.find_elements(By.CSS_SELECTOR, "table.jobs tbody tr")
    assert [r.find_element(By.CSS_SELECTOR, "td a").text for r in rows][:2] == [small, big]
    assert "<img src=x onerror=alert(1)>" in rows[0].text and not browser.find_elements(By.CSS_SELECTOR, "main img")
    with pytest.raises(NoAlertPresentException):
        browser.switch_to.alert.accept()
    browser.find_element(By.ID, "find").send_keys("resnet")
    wait_for(lambda: [r.is_displayed() for r in browser.find_elements(By.CSS_SELECTOR, "table.jobs tbody tr")]
             == [False, True], why="the find box hides the other row")
    # Live: a job submitted now appears without a reload (app.js polls the REST API).
    late = cluster.submit("--gpus", "1", "--name", "late-arrival", "--", "true")
    browser.find_element(By.ID, "find").clear()
    browser.find_element(By.ID, "find").send_keys(" ")
    browser.find_element(By.ID, "find").clear()
    wait_for(lambda: late in text_of(browser, "table.jobs"), timeout=20, why="the new job appears live")
    cluster.wait_job(late, timeout=60)
    browser.get(url + "/jobs?state=RUNNING")
    assert late not in text_of(browser, "table.jobs") and big in text_of(browser, "table.jobs")

    # The job page: state, placement on its servers, its log, utilisation.
    browser.get(url + f"/jobs/{big}")
    assert text_of(browser, "#fact-state") == "RUNNING"
    assert text_of(browser, "#fact-name") == "resnet-6gpu"
    wait_for(lambda: showing(browser, ".placement .gpu-mine", 6), why="the job's 6 GPUs outlined")
    assert 2 <= len(browser.find_elements(By.CSS_SELECTOR, ".placement .server")) <= 3
    assert "epoch 2 loss 0.71" in text_of(browser, "#log-0")
    wait_for(lambda: browser.find_elements(By.CSS_SELECTOR, "svg.chart polyline") or browser.refresh(),
             timeout=20, why="a utilisation chart")
    browser.set_window_size(1360, 1700)      # the whole job page, logs included
    browser.save_screenshot(str(IMAGES / "job.png"))
    browser.set_window_size(1360, 1000)

    # Someone else sees the job but not its log.
    browser.get(url + "/view-as?user=mallory")
    browser.get(url + f"/jobs/{big}")
    assert "mallory may not read the logs" in text_of(browser, "p.denied")
    assert not browser.find_elements(By.ID, "kill")
    browser.get(url + f"/view-as?user={current_user()}")

    # A node: its GPUs and who holds them.
    browser.get(url + "/nodes/node-1")
    assert len(browser.find_elements(By.CSS_SELECTOR, "table.gputable tbody tr")) == 4
    assert text_of(browser, "h1") == "Node node-1"

    # Queues: the bar of the default queue.
    browser.get(url + "/queues")
    assert "default" in text_of(browser, "table.queues")
    assert browser.find_elements(By.CSS_SELECTOR, "table.queues svg.bar rect.seg-used")

    # Kill from the job page.
    browser.get(url + f"/jobs/{small}")
    browser.find_element(By.ID, "kill").click()
    browser.switch_to.alert.accept()
    wait_for(lambda: text_of(browser, "#fact-state") == "KILLED", why="killed from the page")
    assert cluster.wait_job(small, timeout=30).state == pb.JOB_KILLED
    assert csp_violations(browser) == []

    browser.get(url + "/jobs/job-424242")
    assert "job-424242" in text_of(browser, "p.error")
