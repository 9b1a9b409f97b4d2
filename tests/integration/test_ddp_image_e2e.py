"""The DDP example (configs/jobs/ddp-train.yaml) as an image job: its learners run in a container of a local image
on two servers, torchrun and gloo over the host network, as the job's user. The image is a bare root filesystem
(Debian's merged-/usr layout) into which the job mounts, read-only, the host's /usr and this checkout's venv with
torch (the servers allow both: containers.mounts_allowed): the approach docs/jobs.md describes for a cluster whose
framework lives on the servers. A self-contained torch image is a `podman build` away (docs/jobs.md)."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import pytest

from gpurm.proto import gpurm_pb2 as pb
from tests.conftest import TestBroker
from tests.integration.containers_fixture import build_image, needs_podman, podman
from tests.integration.harness import ROOT, DevCluster
from tests.integration.test_ddp_e2e import EXAMPLE, FINAL

pytestmark = [needs_podman, pytest.mark.slow]
VENV = Path(sys.prefix)


def bare_image(tmp_path: Path) -> str:
    """Busybox, /tmp and the merged-/usr links (/lib, /lib64 -> usr/...): the job mounts the host's /usr."""
    return build_image(tmp_path, {"/etc/hostname": "ddp\n"}, links={"/lib": "usr/lib", "/lib64": "usr/lib64"})


def test_the_ddp_example_runs_as_an_image_job(tmp_path: Path, broker: TestBroker) -> None:
    if importlib.util.find_spec("torch") is None:
        pytest.fail("torch is missing: run ./scripts/setup-venv (it installs the torch extra)", pytrace=False)
    image = bare_image(tmp_path)
    text = EXAMPLE.read_text().replace("python3 ", f"{VENV}/bin/python ").replace("--epochs 3", "--epochs 2")
    text = text.replace("workdir: .", f"workdir: {EXAMPLE.parent}")
    text += (f"image: {image}\nshm_size: 256m\nenv: {{HOME: /tmp}}\n"
             f"mounts: [/usr, {VENV}, {EXAMPLE.parent}]\n")
    job_file = tmp_path / "ddp-image.yaml"
    job_file.write_text(text)
    allowed = f"containers.mounts_allowed=[/usr, {VENV}, {ROOT}]"
    c = DevCluster(tmp_path / "dev", nodes=2, gpus_per_node=2, racks=1, broker=broker,
                   extra=["--agent-option", "containers.engine=podman", "--agent-option", allowed])
    try:
        job_id = c.submit(str(job_file))
        job = c.wait_job(job_id, timeout=240)
        out = "".join(c.gpurm("logs", job_id, "--rank", str(ln.rank)).out for ln in job.attempts[-1].learners)
        assert job.state == pb.JOB_SUCCEEDED, (job.diagnostics, out[-3000:])
        learners = job.attempts[-1].learners
        assert len({ln.node_id for ln in learners}) == 2
        finals = {int(m.group(1)): m.groups()[1:] for m in FINAL.finditer(out)}
        assert sorted(finals) == [0, 1, 2, 3], out[-3000:]
        assert len({weights for _, _, weights in finals.values()}) == 1, finals
        assert float(finals[0][0]) < 2.3, finals
    finally:
        c.stop()
        podman("rmi", "-f", image, check=False)
