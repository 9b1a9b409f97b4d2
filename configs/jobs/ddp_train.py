"""A data-parallel PyTorch job (DistributedDataParallel) over several servers, launched by torchrun with the
environment gpurm gives every learner (one learner per server, see docs/jobs.md "What the learners get"):

    torchrun --nnodes=$NNODES --node-rank=$NODE_RANK --nproc-per-node=$NPROC_PER_NODE \\
        --master-addr=$MASTER_ADDR --master-port=$MASTER_PORT ddp_train.py

Each worker trains a small classifier on its shard of a synthetic, MNIST-sized problem (784 inputs, 10 classes,
generated from a fixed seed: no download). The gloo backend runs on CPUs; on GPU servers pass `--backend nccl`.
DDP averages the gradients, so every rank ends with the same weights: each prints its final loss on the whole
data set and a checksum of its weights, which must agree across ranks.
"""

from __future__ import annotations

import argparse
import os

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel
from torch.utils.data import DataLoader, TensorDataset
from torch.utils.data.distributed import DistributedSampler


def synthetic_digits(samples: int) -> TensorDataset:
    """An MNIST-shaped problem: 784 features, 10 linearly separable classes (with noise), from a fixed seed."""
    g = torch.Generator().manual_seed(2017)
    centres = torch.randn(10, 784, generator=g)
    labels = torch.randint(0, 10, (samples,), generator=g)
    images = centres[labels] + 2.0 * torch.randn(samples, 784, generator=g)
    return TensorDataset(images, labels)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--epochs", type=int, default=3)
    p.add_argument("--samples", type=int, default=4096)
    p.add_argument("--batch", type=int, default=64, help="per worker")
    p.add_argument("--backend", default="gloo")
    args = p.parse_args()

    dist.init_process_group(args.backend)      # env:// from torchrun: RANK, WORLD_SIZE, MASTER_ADDR/PORT
    rank, world = dist.get_rank(), dist.get_world_size()
    torch.manual_seed(0)                       # the same initial weights everywhere (DDP also broadcasts rank 0's)
    model = DistributedDataParallel(torch.nn.Sequential(
        torch.nn.Linear(784, 128), torch.nn.ReLU(), torch.nn.Linear(128, 10)))
    opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    data = synthetic_digits(args.samples)
    sampler = DistributedSampler(data, num_replicas=world, rank=rank, shuffle=True, seed=0)
    loader = DataLoader(data, batch_size=args.batch, sampler=sampler)
    node = os.environ.get("GPURM_NODE_ID", "?")
    master = f"{os.environ.get('MASTER_ADDR', '?')}:{os.environ.get('MASTER_PORT', '?')}"
    print(f"rank {rank} of {world} on {node}: {len(sampler)} samples per epoch, rendezvous at {master}", flush=True)
    loss_fn = torch.nn.CrossEntropyLoss()
    for epoch in range(args.epochs):
        sampler.set_epoch(epoch)
        for images, labels in loader:
            opt.zero_grad()
            loss_fn(model(images), labels).backward()
            opt.step()
        print(f"rank {rank}: epoch {epoch + 1} done", flush=True)
    with torch.no_grad():
        images, labels = data.tensors
        final = loss_fn(model(images), labels).item()
        accuracy = (model(images).argmax(dim=1) == labels).float().mean().item()
        checksum = sum(float(p.double().sum()) for p in model.parameters())
    print(f"rank {rank} final loss {final:.6f} accuracy {accuracy:.4f} weights {checksum:.6f}", flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
