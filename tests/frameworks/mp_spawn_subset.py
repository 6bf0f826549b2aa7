"""``mp.spawn`` DDP, per-rank seeds: each rank trains ``Subset(ds, list(RandomSampler(ds))[rank::
world])`` (every world-th entry of an order it drew itself), shuffled locally; no sampler shards."""

from __future__ import annotations

import os
import socket
import sys

import torch
import torch.multiprocessing as mp
from torch.utils.data import DataLoader, RandomSampler, Subset, TensorDataset

sys.path.insert(0, os.path.dirname(__file__))
from truth import log_indices

N, WORLD = 32, 2


def worker(rank: int, port: int) -> None:
    os.environ.update(
        MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(rank),
        LOCAL_RANK=str(rank), WORLD_SIZE=str(WORLD),
    )  # fmt: skip
    torch.manual_seed(rank)  # per-rank seeds: the orders the ranks slice differ
    ds = TensorDataset(torch.arange(N))
    shard = Subset(ds, list(RandomSampler(ds))[rank::WORLD])
    torch.distributed.init_process_group("gloo")
    model = torch.nn.parallel.DistributedDataParallel(torch.nn.Linear(1, 1))
    seen: list[int] = []
    for batch in DataLoader(shard, batch_size=4, shuffle=True):
        model(batch[0].float().view(-1, 1)).sum().backward()
        print(f"rank {rank} step", flush=True)
        seen += batch[0].tolist()
    log_indices(rank, seen)
    torch.distributed.destroy_process_group()


if __name__ == "__main__":
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        free = s.getsockname()[1]
    mp.spawn(worker, args=(free,), nprocs=WORLD)  # type: ignore[attr-defined,no-untyped-call]
    print("finished")
