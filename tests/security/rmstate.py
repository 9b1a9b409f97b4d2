"""Helpers for the RM state tests (store, lock, shutdown): a small tmpfs (tests run as root) and raw RM runs."""

from __future__ import annotations

import contextlib
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml

from tests.conftest import TestBroker, free_port
from tests.integration.harness import ROOT
from tests.integration.rmproc import USER, AgentProcess, RMProcess


@contextlib.contextmanager
def tmpfs(path: Path, size: str) -> Iterator[Path]:
    """A tmpfs of `size` mounted at `path` until the block ends; the test is skipped where mounting is not
    permitted (not root, or a container without CAP_SYS_ADMIN)."""
    path.mkdir(parents=True, exist_ok=True)
    done = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size},mode=0700", "tmpfs", str(path)],
                          check=False, capture_output=True, text=True)
    if done.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here (needs root / CAP_SYS_ADMIN): {done.stderr.strip()}")
    try:
        yield path
    finally:
        subprocess.run(["umount", "-l", str(path)], check=False, capture_output=True)


def fill(folder: Path) -> Path:
    """Write a file in `folder` until its file system is full; returns the file (delete it to free the space)."""
    filler = folder / "filler"
    with filler.open("wb", buffering=0) as f:
        for chunk in (1 << 16, 1 << 12, 1 << 8, 1):
            try:
                while True:
                    f.write(b"\0" * chunk)
            except OSError:
                continue
    return filler


def rm_config(workdir: Path, state_dir: Path, broker: TestBroker, **settings: object) -> Path:
    """An rm.yaml for an RM on a free loopback port."""
    workdir.mkdir(parents=True, exist_ok=True)
    config = workdir / f"rm-{free_port()}.yaml"
    config.write_text(yaml.safe_dump({"listen": f"127.0.0.1:{free_port()}", "state_dir": str(state_dir),
                                      "http": {"listen": "127.0.0.1:0"},
                                      "mqtt": broker.rm_config(), "admins": [USER], **settings}))
    return config


def run_rm(config: Path, timeout: float = 30) -> subprocess.CompletedProcess[str]:
    """`gpurm rm --config FILE` to its end (for an RM that must refuse to start)."""
    return subprocess.run([sys.executable, "-m", "gpurm.cli.main", "rm", "--config", str(config)],
                          check=False, capture_output=True, text=True, timeout=timeout, cwd=ROOT)


def gpurm(*args: str, timeout: float = 30) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "gpurm.cli.main", *args], check=False, capture_output=True, text=True,
                          timeout=timeout, cwd=ROOT)


def known_node(workdir: Path, rm: RMProcess, node_id: str = "node-1") -> None:
    """Make `rm` know a drained node with 2 GPUs (so jobs may be submitted) and no agent behind it (so nothing
    runs): a real agent registers it, then stops."""
    agent = AgentProcess(workdir / node_id, rm, node_id)
    try:
        agent.start()
    finally:
        agent.close()     # stops the agent and drains its node
