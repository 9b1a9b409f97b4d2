"""The distributed training example (configs/jobs/ddp-train.yaml: PyTorch DDP launched by torchrun from the env
gpurm sets, gloo on CPU) on a real dev cluster of two 2-GPU servers: the 4-GPU job spans both servers, its four
ranks train together, and they end with the same weights and the same final loss."""

from __future__ import annotations

import importlib.util
import re
import sys
from pathlib import Path

import pytest

from gpurm.proto import gpurm_pb2 as pb
from tests.conftest import TestBroker
from tests.integration.harness import ROOT, DevCluster

# torch learners on two servers (CPU-bound): on the one worker that runs such modules one at a time (tests/parallel.py)
pytestmark = pytest.mark.whole_machine

EXAMPLE = ROOT / "configs" / "jobs" / "ddp-train.yaml"
FINAL = re.compile(r"rank (\d+) final loss ([\d.]+) accuracy ([\d.]+) weights (-?[\d.]+)")


def test_the_ddp_example_trains_over_two_servers_and_its_ranks_agree(tmp_path: Path, broker: TestBroker) -> None:
    if importlib.util.find_spec("torch") is None:
        pytest.fail("torch is missing: run ./scripts/setup-venv (it installs the torch extra, "
                    "pip install -e '.[torch]')", pytrace=False)
    # The example as shipped, but with this interpreter (the one with torch) for `python3`, and fewer epochs.
    text = EXAMPLE.read_text().replace("python3 ", f"{sys.executable} ").replace("--epochs 3", "--epochs 2")
    assert text != EXAMPLE.read_text()
    job_file = tmp_path / "ddp-train.yaml"
    job_file.write_text(text.replace("workdir: .", f"workdir: {EXAMPLE.parent}"))
    c = DevCluster(tmp_path / "dev", nodes=2, gpus_per_node=2, racks=1, broker=broker)
    try:
        job_id = c.submit(str(job_file))
        job = c.wait_job(job_id, timeout=180)
        assert job.state == pb.JOB_SUCCEEDED, (job.diagnostics, c.gpurm("logs", job_id).out[-3000:])
        learners = job.attempts[-1].learners
        assert len({ln.node_id for ln in learners}) == 2 and sum(len(ln.gpu_indices) for ln in learners) == 4
        out = "".join(c.gpurm("logs", job_id, "--rank", str(ln.rank)).out for ln in learners)
        finals = {int(m.group(1)): m.groups()[1:] for m in FINAL.finditer(out)}
        assert sorted(finals) == [0, 1, 2, 3], out[-3000:]
        assert len({weights for _, _, weights in finals.values()}) == 1, finals     # the same weights everywhere
        assert len({loss for loss, _, _ in finals.values()}) == 1, finals
        loss, accuracy, _ = finals[0]
        assert float(loss) < 2.3 and float(accuracy) > 0.5, finals      # it learned (chance: loss 2.30, 10%)
        assert "rank 0 of 4 on" in out and "rank 3 of 4 on" in out
    finally:
        c.stop()
