"""``torch.multiprocessing.spawn``, 2 ranks, unseeded: accelerate's stateful loader draws the
epoch-0 order in ``prepare()`` before the RNG sync (the stateful-loader bug)."""

from __future__ import annotations

import os
import socket
import sys

import torch
import torch.multiprocessing as mp
from torch.utils.data import DataLoader, TensorDataset

sys.path.insert(0, os.path.dirname(__file__))
from truth import log_indices

N, WORLD = 32, 2


def worker(rank: int, port: int) -> None:
    from accelerate import Accelerator, DataLoaderConfiguration

    os.environ.update(
        MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(rank),
        LOCAL_RANK=str(rank), WORLD_SIZE=str(WORLD),
    )  # fmt: skip
    config = DataLoaderConfiguration(use_stateful_dataloader=True)
    acc = Accelerator(cpu=True, dataloader_config=config)
    loader = acc.prepare(
        DataLoader(TensorDataset(torch.arange(N)), batch_size=4, shuffle=True, num_workers=2)
    )
    log_indices(rank, [i for b in loader for i in b[0].tolist()])
    acc.wait_for_everyone()
    torch.distributed.destroy_process_group()


if __name__ == "__main__":
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        free = s.getsockname()[1]
    mp.spawn(worker, args=(free,), nprocs=WORLD)  # type: ignore[attr-defined,no-untyped-call]
    print("finished")
