"""An elastic PyTorch training job: gpurm grows and shrinks it, torchrun re-forms its workers, it keeps training.

Run it with torchrun's elastic rendezvous and the env gpurm sets for an elastic job (see elastic-torchrun.yaml):

    torchrun --nnodes=$GPURM_MIN_NODES:$GPURM_MAX_NODES --nproc-per-node=$NPROC_PER_NODE \\
        --rdzv-backend=c10d --rdzv-endpoint=$GPURM_RDZV_ENDPOINT --rdzv-id=$GPURM_JOB_ID \\
        --max-restarts=100 elastic_train.py --ckpt /shared/ckpt.pt

Whenever a learner joins or leaves, torchrun restarts every worker with the new world size; each worker then
resumes from the last checkpoint, so the step counter continues. Data-parallel SGD on a small regression
problem (the gloo backend: CPUs are enough); rank 0 checkpoints after every step. It stops after `--steps`
steps, or as soon as `--stop-file` exists (all ranks agree on it every step).
"""

from __future__ import annotations

import argparse
import os
import time

import torch
import torch.distributed as dist


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--ckpt", required=True, help="checkpoint file, on storage every learner sees")
    p.add_argument("--steps", type=int, default=100_000)
    p.add_argument("--step-time", type=float, default=0.2, help="seconds each step lasts at least")
    p.add_argument("--stop-file", default="", help="stop (successfully) once this file exists")
    args = p.parse_args()

    dist.init_process_group("gloo")            # env:// from torchrun: RANK, WORLD_SIZE, MASTER_ADDR/PORT
    rank, world = dist.get_rank(), dist.get_world_size()
    torch.manual_seed(0)
    model = torch.nn.Linear(8, 1)
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    step = 0
    if os.path.exists(args.ckpt):
        state = torch.load(args.ckpt)
        model.load_state_dict(state["model"])
        opt.load_state_dict(state["opt"])
        step = int(state["step"])
    print(f"rank {rank}: world {world}, resuming at step {step}", flush=True)
    data = torch.randn(256, 8, generator=torch.Generator().manual_seed(1234))
    target = data.sum(dim=1, keepdim=True)
    while step < args.steps:
        began = time.monotonic()
        opt.zero_grad()
        loss = ((model(data[rank::world]) - target[rank::world]) ** 2).mean()
        loss.backward()
        for param in model.parameters():
            assert param.grad is not None
            dist.all_reduce(param.grad)
            param.grad /= world
        opt.step()
        step += 1
        if rank == 0:
            tmp = f"{args.ckpt}.tmp"
            torch.save({"model": model.state_dict(), "opt": opt.state_dict(), "step": step}, tmp)
            os.replace(tmp, args.ckpt)
            print(f"step {step} world {world} loss {loss.item():.4f}", flush=True)
        stop = torch.tensor([1 if args.stop_file and os.path.exists(args.stop_file) else 0])
        dist.all_reduce(stop, op=dist.ReduceOp.MAX)
        if stop.item():
            break
        time.sleep(max(0.0, args.step_time - (time.monotonic() - began)))
    print(f"rank {rank}: done at step {step} with world {world}", flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
