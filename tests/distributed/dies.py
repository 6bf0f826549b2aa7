"""A program that dies, run under ``RNGAUDIT=1`` by torchrun (tests/test_exchange_faults.py).

first-batch-raise: the user's own code raises in its first batch (a ValueError unpacking it)
    over a user Dataset with a RandomSampler under DDP; the audit window is still open.
later-epoch:       a rank-0-only draw between epochs skews the global generator a self-sharding
    sampler draws from: rngaudit raises at epoch 1's check; the program dies of it.
later-epoch-exit:  the same, and the program leaves at once (``os._exit``: no exit handlers),
    so the report written at the check is the last word.
one-rank-raises:   rank 1's own code raises in its third batch while rank 0 trains on (blocked
    in DDP's gradient all-reduce, where torchrun's SIGTERM ends it once rank 1 has exited).
first-step-alone:  rank 1's own code raises in its first batch before the forward, while rank 0
    waits for it in the first-step meeting (its module's first training forward).
destroy-alone:     rank 0 trains its epoch and calls destroy_process_group() (where the
    RNGAUDIT window concludes, waiting for the other ranks); rank 1's own code raises after the
    epoch, before it would have.
ctrl-c:            Ctrl-C in the third batch (SIGINT on every rank, as a terminal sends it to
    the process group): KeyboardInterrupt, inside the RNGAUDIT window.
first-batch-killed: rank 1 is SIGKILLed (the OOM killer's way: no exception, no exit handler)
    inside the order check's exchange at the first batch of a DistributedSampler loader, once
    rank 0 waits there for it (placed by a wrap of rngaudit's publish, on rank 1 only).
block-killed:      the same inside the exchange at the exit of a ``with rngaudit.audit():``.
"""

from __future__ import annotations

import os
import signal
import sys
import time
from collections.abc import Iterator
from typing import Any

import torch
import torch.distributed as dist
from torch.utils.data import DataLoader, Dataset, DistributedSampler, RandomSampler, Sampler

import rngaudit
from rngaudit.ranks import exchange
from rngaudit.ranks import store as protocol

scenario = sys.argv[1]
dist.init_process_group("gloo")
rank, world = dist.get_rank(), dist.get_world_size()


class Items(Dataset[torch.Tensor]):
    def __len__(self) -> int:
        return 16

    def __getitem__(self, i: int) -> torch.Tensor:
        return torch.tensor([float(i)])


class OwnShare(Sampler[int]):
    """perm[rank::world] of a permutation drawn from the global generator."""

    def __len__(self) -> int:
        return 8

    def __iter__(self) -> Iterator[int]:
        yield from torch.randperm(16).tolist()[rank::world]


def killed_in_exchange(prefix: str) -> None:
    """This rank dies by SIGKILL on entering the exchange whose key starts with ``prefix``,
    once rank 0 has arrived there (and waits for it): before this rank's arrival is published."""
    publish = exchange.publish

    def dying(store: Any, rank: int, world: int, key: str, *args: Any, **kw: Any) -> list[str]:
        if key.startswith(prefix):
            while not store.check([protocol.ExchangeKeys(key).arrival(0)]):
                time.sleep(0.01)
            os.kill(os.getpid(), signal.SIGKILL)
        return publish(store, rank, world, key, *args, **kw)

    exchange.publish = dying


torch.manual_seed(42)
model = torch.nn.parallel.DistributedDataParallel(torch.nn.Linear(1, 1))
if scenario == "first-batch-killed":
    if rank == 1:
        killed_in_exchange("epoch/")
    for batch in DataLoader(Items(), batch_size=2, sampler=DistributedSampler(Items())):
        model(batch).sum().backward()
elif scenario == "block-killed":
    with rngaudit.audit():
        for batch in DataLoader(Items(), batch_size=2, sampler=OwnShare()):
            model(batch).sum().backward()
        if rank == 1:
            killed_in_exchange("a/")  # the next audit exchange: this block's, at its exit
elif scenario == "destroy-alone":
    for batch in DataLoader(Items(), batch_size=2, sampler=OwnShare()):
        model(batch).sum().backward()
    if rank == 1:
        raise RuntimeError("rank 1's own bug after the epoch")
    dist.destroy_process_group()
elif scenario == "ctrl-c":
    for step, batch in enumerate(DataLoader(Items(), batch_size=2, sampler=OwnShare())):
        if step == 2:
            signal.raise_signal(signal.SIGINT)
        model(batch).sum().backward()
elif scenario in ("one-rank-raises", "first-step-alone"):
    fails_at = 2 if scenario == "one-rank-raises" else 0
    for step, batch in enumerate(DataLoader(Items(), batch_size=2, sampler=OwnShare())):
        if rank == 1 and step == fails_at:
            raise RuntimeError("rank 1's own bug")
        model(batch).sum().backward()
elif scenario == "first-batch-raise":
    for batch in DataLoader(Items(), batch_size=4, sampler=RandomSampler(Items())):
        x, y = batch  # the user's bug: a batch is one tensor
        model(x).sum().backward()
else:
    loader = DataLoader(Items(), batch_size=2, sampler=OwnShare())
    try:
        for _epoch in range(2):
            for batch in loader:
                model(batch).sum().backward()
            if rank == 0:
                torch.rand(3)  # a rank-0-only evaluation
    except Exception as exc:
        print(f"raised: {type(exc).__name__}", flush=True)
        if scenario == "later-epoch-exit":
            os._exit(3)
        raise
