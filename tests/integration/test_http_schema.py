"""The REST API says what it enforces: schemathesis (`--checks all`: no server error, every status, content type,
header and response body as documented, schema-valid requests accepted and schema-violating ones refused, a
405 naming the methods served, stateful sequences through the document's links) against /api/v1/openapi.json on a
real dev cluster, with zero failures.

The cluster's one queue runs no job (max_running_jobs: 0), so the jobs schemathesis submits stay QUEUED: no AM
or learner runs a generated command. The examples per operation are bounded (MAX_EXAMPLES) and the seed fixed, so
that the run is short and the same each time."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml

from tests.conftest import TestBroker
from tests.integration.harness import ROOT, DevCluster

MAX_EXAMPLES = 12
SEED = 20261128
SCHEMATHESIS = Path(sys.executable).with_name("schemathesis")
CONFIG = Path(__file__).with_name("schemathesis.toml")


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory, broker: TestBroker) -> Iterator[DevCluster]:
    folder = tmp_path_factory.mktemp("schema")
    queues = folder / "queues.yaml"
    queues.write_text(yaml.safe_dump({"queues": {"default": {"weight": 1, "max_running_jobs": 0}}}))
    c = DevCluster(folder / "cluster", nodes=2, gpus_per_node=4, racks=2, broker=broker,
                   extra=["--queues", str(queues)])
    yield c
    assert c.stop() == 0


def run_schemathesis(url: str, *extra: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "SCHEMATHESIS_HOOKS": "tests.integration.schemathesis_hooks",
           "PYTHONPATH": str(ROOT), "NO_COLOR": "1"}
    return subprocess.run(
        [str(SCHEMATHESIS), "--config-file", str(CONFIG), "run", f"{url}/api/v1/openapi.json", "--checks", "all",
         "-H", "X-Gpurm-User: alice", "--max-examples", str(MAX_EXAMPLES), "--seed", str(SEED),
         "--request-timeout", "10", *extra],
        check=False, capture_output=True, text=True, timeout=300, cwd=ROOT, env=env)


@pytest.mark.skipif(not SCHEMATHESIS.exists(), reason="schemathesis is not installed (the dev extra)")
def test_schemathesis_finds_nothing_the_document_does_not_state(cluster: DevCluster) -> None:
    got = run_schemathesis(cluster.http_url)
    out = got.stdout + got.stderr
    assert got.returncode == 0, out[-6000:]
    assert "generated" in out and "failure" not in out.split("SUMMARY")[-1], out[-3000:]


@pytest.mark.skipif(not SCHEMATHESIS.exists(), reason="schemathesis is not installed (the dev extra)")
def test_schemathesis_would_catch_a_lie(cluster: DevCluster, tmp_path: Path) -> None:
    """The run above can fail: a document that claims less than the server enforces (here: a page token of any
    text) is caught."""
    import json
    import urllib.request

    with urllib.request.urlopen(f"{cluster.http_url}/api/v1/openapi.json", timeout=10) as resp:
        doc = json.load(resp)
    for param in doc["paths"]["/nodes"]["get"]["parameters"]:
        if param["name"] == "page_token":
            param["schema"] = {"type": "string"}
    doc["paths"] = {"/nodes": doc["paths"]["/nodes"]}
    doc["servers"] = [{"url": f"{cluster.http_url}/api/v1"}]
    lie = tmp_path / "lie.json"
    lie.write_text(json.dumps(doc))
    got = subprocess.run(
        [str(SCHEMATHESIS), "run", str(lie), "--url", f"{cluster.http_url}/api/v1", "--checks", "all", "-H",
         "X-Gpurm-User: alice", "--max-examples", str(MAX_EXAMPLES), "--seed", str(SEED), "--phases", "fuzzing"],
        check=False, capture_output=True, text=True, timeout=120, cwd=ROOT, env={**os.environ, "NO_COLOR": "1"})
    assert got.returncode != 0 and "page_token" in got.stdout, got.stdout[-3000:]
