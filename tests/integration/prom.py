"""A real Prometheus server for tests: Debian's `prometheus` on a free port in a temp dir, scraping the targets
given every second; `query` asks it back over its HTTP API."""

from __future__ import annotations

import json
import shutil
import socket
import subprocess
import time
import urllib.parse
import urllib.request
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

INSTALL = "apt-get install -y prometheus (./scripts/system-deps does it when run as root)"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class Prometheus:
    def __init__(self, workdir: Path, jobs: dict[str, list[str]]) -> None:
        binary = shutil.which("prometheus")
        if binary is None:
            pytest.fail(f"the prometheus server is missing: {INSTALL}", pytrace=False)
        workdir.mkdir(parents=True, exist_ok=True)
        scrape = [{"job_name": name, "scrape_interval": "1s", "static_configs": [{"targets": targets}]}
                  for name, targets in jobs.items()]
        config = workdir / "prometheus.yml"
        config.write_text(json.dumps({"global": {"scrape_interval": "1s"}, "scrape_configs": scrape}))
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.log = (workdir / "prometheus.log").open("w")
        self.proc = subprocess.Popen(
            [binary, f"--config.file={config}", f"--storage.tsdb.path={workdir / 'data'}",
             f"--web.listen-address=127.0.0.1:{self.port}"], stdout=self.log, stderr=subprocess.STDOUT)
        self.workdir = workdir
        deadline = time.monotonic() + 30
        while not self._ready():
            if self.proc.poll() is not None or time.monotonic() > deadline:
                raise AssertionError("prometheus did not start:\n" + (workdir / "prometheus.log").read_text()[-2000:])
            time.sleep(0.2)

    def _ready(self) -> bool:
        try:
            with urllib.request.urlopen(f"{self.url}/-/ready", timeout=2) as r:
                return bool(r.status == 200)
        except OSError:
            return False

    def query(self, promql: str) -> list[dict[str, Any]]:
        url = f"{self.url}/api/v1/query?" + urllib.parse.urlencode({"query": promql})
        with urllib.request.urlopen(url, timeout=5) as r:
            body = json.load(r)
        assert body["status"] == "success", body
        return list(body["data"]["result"])

    def wait_for(self, promql: str, timeout: float = 30, until: Callable[[list[dict[str, Any]]], bool] = bool
                 ) -> list[dict[str, Any]]:
        """The query's result once `until` accepts it (by default: once it is not empty; scrapes come every
        second, one target at a time)."""
        deadline = time.monotonic() + timeout
        while True:
            result = self.query(promql)
            if until(result):
                return result
            if time.monotonic() > deadline:
                targets = urllib.request.urlopen(f"{self.url}/api/v1/targets", timeout=5).read().decode()
                raise AssertionError(f"no result for {promql} in {timeout:g}s; targets: {targets[:2000]}")
            time.sleep(0.5)

    def stop(self) -> None:
        self.proc.terminate()
        try:
            self.proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
        self.log.close()
