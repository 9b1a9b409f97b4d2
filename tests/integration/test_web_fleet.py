"""The web UI at fleet scale: a real RM holding 10,000 servers (registered over the tracker RPC, as agents do; they
never beat, which an overview does not need) opened in headless Chromium. The overview renders in under 3 s as one
row per rack, its find box narrows the racks, a rack's name draws that rack's servers, and the summary the page
polls stays small (racks in sum, not 80,000 GPUs)."""

from __future__ import annotations

import json
import time
import urllib.request
import uuid
from collections.abc import Iterator

import pytest
from selenium.webdriver.common.by import By
from selenium.webdriver.remote.webdriver import WebDriver

from gpurm.proto import gpurm_pb2 as pb
from gpurm.proto import gpurm_pb2_grpc as pbg
from tests.conftest import TestBroker
from tests.integration.rmproc import USER, RMProcess
from tests.integration.test_web_ui import browser, wait_for  # noqa: F401  (the browser fixture)

# About a minute: 10,000 registrations, then Chromium. It times a page, so it runs where no other timed or
# machine-loading test runs beside it (tests/parallel.py).
pytestmark = [pytest.mark.slow, pytest.mark.whole_machine]

SERVERS = 10_000
PER_RACK = 40
GPUS = 8
RENDER_S = 3.0


def registration(i: int) -> pb.RegisterNodeRequest:
    node_id = f"gpu-{i:05d}"
    return pb.RegisterNodeRequest(
        node_id=node_id, host="127.0.0.1", agent_port=1, rack=f"rack-{i // PER_RACK:03d}",
        ib_domain=f"rack-{i // PER_RACK:03d}", cpus=64, memory_mib=512_000, agent_version="test",
        agent_instance=uuid.uuid4().hex, healthy=True,
        gpus=[pb.GpuInfo(index=g, uuid=f"GPU-{node_id}-{g}", model="H100-80GB", memory_mib=81559, healthy=True)
              for g in range(GPUS)])


@pytest.fixture(scope="module")
def rm(tmp_path_factory: pytest.TempPathFactory, broker: TestBroker) -> Iterator[RMProcess]:
    proc = RMProcess(tmp_path_factory.mktemp("web-fleet"), broker)
    try:
        tracker = pbg.ResourceTrackerStub(proc.channel)
        for first in range(0, SERVERS, 50):           # 50 registrations in flight at a time (the RM caps streams)
            calls = [tracker.RegisterNode.future(proc.prove(registration(i)), timeout=120)
                     for i in range(first, min(first + 50, SERVERS))]
            assert all(c.result().session for c in calls)
        yield proc
    finally:
        code = proc.close()
        assert code == 0, f"the RM exited with {code}:\n{proc.log_text()}"


def http_url(rm: RMProcess) -> str:
    return rm.client.GetClusterInfo(pb.ClusterInfoRequest(), timeout=10).http_url


def test_the_overview_of_10000_servers_in_a_browser(rm: RMProcess, browser: WebDriver) -> None:  # noqa: F811
    url = http_url(rm)
    browser.get(f"{url}/view-as?user={USER}")
    # The render time is the browser's own (navigation start to the load event), the best of two loads: the suite's
    # other workers share two cores, and a spike of theirs is not the page's cost.
    timings = []
    for _ in range(2):
        browser.get(url + "/")                            # returns once the page has loaded
        timings.append(browser.execute_script(
            "var t = performance.getEntriesByType('navigation')[0]; return t.loadEventEnd;") / 1000)
        if timings[-1] < RENDER_S:
            break
    assert min(timings) < RENDER_S, timings
    rows = browser.find_elements(By.CSS_SELECTOR, "table.racks tbody tr")
    assert len(rows) == SERVERS // PER_RACK
    assert rows[7].find_element(By.CSS_SELECTOR, "td a").text == "rack-007"
    assert rows[7].find_elements(By.CSS_SELECTOR, "td")[2].text == str(PER_RACK * GPUS)      # all free
    assert not browser.find_elements(By.CSS_SELECTOR, ".racks .gpu")         # no GPU drawn at this level
    assert f"{SERVERS} servers in {SERVERS // PER_RACK} racks" in browser.find_element(By.ID, "racks").text
    # The tab is not frozen: a script runs at once, and the find box narrows the racks.
    began = time.monotonic()
    browser.execute_script("return 1")
    assert time.monotonic() - began < 1.0
    browser.find_element(By.ID, "find").send_keys("rack-24")
    wait_for(lambda: [r.text.split()[0] for r in browser.find_elements(By.CSS_SELECTOR, "table.racks tbody tr")
                      if r.is_displayed()] == [f"rack-{i}" for i in range(240, 250)], why="the find box")
    # Drill down: a rack's servers, every GPU drawn.
    browser.find_element(By.LINK_TEXT, "rack-245").click()
    wait_for(lambda: len(browser.find_elements(By.CSS_SELECTOR, ".rack .server")) == PER_RACK or None,
             why="rack-245's servers")
    assert len(browser.find_elements(By.CSS_SELECTOR, ".racks .gpu-free")) == PER_RACK * GPUS
    assert browser.find_element(By.CSS_SELECTOR, ".rack h3").text.startswith("rack-245")
    assert "all racks" in browser.find_element(By.CSS_SELECTOR, ".crumbs").text


def test_the_summary_a_fleet_page_polls_is_small(rm: RMProcess) -> None:
    url = http_url(rm)
    req = urllib.request.Request(f"{url}/api/v1/cluster", headers={"X-Gpurm-User": USER})
    with urllib.request.urlopen(req, timeout=30) as resp:
        body = resp.read()
    summary = json.loads(body)
    assert len(body) < 200_000 and summary["gpus"]["total"] == SERVERS * GPUS
    assert all(not r["detailed"] and r["nodes"] == [] and r["servers"] == PER_RACK for r in summary["racks"])
    req = urllib.request.Request(f"{url}/api/v1/cluster?rack=rack-003", headers={"X-Gpurm-User": USER})
    with urllib.request.urlopen(req, timeout=30) as resp:
        one = json.loads(resp.read())
    detailed = [r for r in one["racks"] if r["detailed"]]
    assert [r["rack"] for r in detailed] == ["rack-003"] and len(detailed[0]["nodes"]) == PER_RACK
