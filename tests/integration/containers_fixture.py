"""Local OCI images for the container tests, built with the real engine: `podman import` of a root filesystem
made here from Debian's static busybox (scripts/system-deps installs podman, runc and busybox-static). No
registry is needed or reachable.

The tests need root (podman as root, with runc and cgroupfs on this kernel: the agent detects those itself);
`needs_podman` skips them, saying why, where the agent could not run containers anyway.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import socket
import subprocess
import tarfile
import time
import uuid
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path

import pytest

BUSYBOX = shutil.which("busybox") or "/bin/busybox"
APPLETS = ("sh", "echo", "cat", "id", "sleep", "ls", "env", "true", "false", "touch", "test", "grep", "pwd")

needs_podman = pytest.mark.skipif(
    os.geteuid() != 0 or shutil.which("podman") is None or not os.path.exists(BUSYBOX),
    reason="container tests need root, podman and busybox-static (./scripts/system-deps installs them as root)")


def podman(*args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    """The engine as the tests call it directly (runc and cgroupfs: what the agent detects on this kernel)."""
    base = ["podman", "--runtime", "runc", "--cgroup-manager", "cgroupfs"] if shutil.which("runc") else ["podman"]
    return subprocess.run([*base, *args], capture_output=True, text=True, timeout=120, check=check)


def build_image(workdir: Path, files: Mapping[str, str | bytes] | None = None, tag: str = "",
                links: Mapping[str, str] | None = None) -> str:
    """A busybox image with `files` (path in the image -> text or bytes) and symlinks `links` (path -> target),
    imported under a fresh local tag."""
    tag = tag or f"localhost/gpurm-test-{uuid.uuid4().hex[:8]}:1"
    root = workdir / f"rootfs-{uuid.uuid4().hex[:6]}"
    (root / "bin").mkdir(parents=True)
    (root / "tmp").mkdir(mode=0o1777)
    os.chmod(root / "tmp", 0o1777)
    shutil.copy(BUSYBOX, root / "bin" / "busybox")
    for applet in APPLETS:
        (root / "bin" / applet).symlink_to("busybox")
    for path, text in (files or {}).items():
        target = root / path.lstrip("/")
        target.parent.mkdir(parents=True, exist_ok=True)
        if isinstance(text, bytes):
            target.write_bytes(text)
        else:
            target.write_text(text)
        target.chmod(0o644)
    for path, target_path in (links or {}).items():
        (root / path.lstrip("/")).symlink_to(target_path)
    archive = workdir / f"{root.name}.tar"
    with tarfile.open(archive, "w") as tar:
        tar.add(root, arcname=".")
    podman("import", "--change", "ENV PATH=/bin", str(archive), tag)
    return tag


@pytest.fixture(scope="module")
def images(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, str]]:
    """Two images, each with a file the other lacks."""
    work = tmp_path_factory.mktemp("images")
    made = {"a": build_image(work, {"/secret-a.txt": "only in image a\n"}),
            "b": build_image(work, {"/secret-b.txt": "only in image b\n"})}
    yield made
    for tag in made.values():
        podman("rmi", "-f", tag, check=False)


def engine_containers(label: str) -> list[str]:
    """Names of the engine's containers (running or not) labelled `label` (KEY=VALUE)."""
    out = podman("ps", "-a", "--filter", f"label={label}", "--format", "{{.Names}}").stdout
    return [ln for ln in out.split() if ln]


needs_registry = pytest.mark.skipif(shutil.which("docker-registry") is None,
                                    reason="image pulls need Debian's docker-registry (./scripts/system-deps)")


@dataclass
class LocalRegistry:
    address: str              # 127.0.0.1:PORT
    registries_conf: Path     # CONTAINERS_REGISTRIES_CONF: this registry over plain HTTP

    def push(self, image: str, name: str) -> str:
        """Push a local image as `name` (e.g. gpurm/a:1); returns its reference in this registry."""
        ref = f"{self.address}/{name}"
        podman("push", "--tls-verify=false", image, ref)
        return ref


@contextlib.contextmanager
def local_registry(workdir: Path) -> Iterator[LocalRegistry]:
    """Debian's docker-registry (Docker Distribution) on a free loopback port, storing under `workdir`."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    address = f"127.0.0.1:{port}"
    config = workdir / "registry.yml"
    config.write_text(f"version: 0.1\nlog:\n  level: error\nstorage:\n  filesystem:\n    rootdirectory: "
                      f"{workdir / 'registry'}\nhttp:\n  addr: {address}\n")
    conf = workdir / "registries.conf"
    conf.write_text(f'[[registry]]\nlocation = "{address}"\ninsecure = true\n')
    with open(workdir / "registry.log", "wb") as log:
        proc = subprocess.Popen(["docker-registry", "serve", str(config)], stdout=log, stderr=subprocess.STDOUT)
    try:
        deadline = time.monotonic() + 20
        while True:
            try:
                with socket.create_connection(("127.0.0.1", port), timeout=0.5):
                    break
            except OSError:
                assert proc.poll() is None and time.monotonic() < deadline, (workdir / "registry.log").read_text()
                time.sleep(0.05)
        yield LocalRegistry(address, conf)
    finally:
        proc.terminate()
        proc.wait(10)
