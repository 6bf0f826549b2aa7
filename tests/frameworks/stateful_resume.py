"""A StatefulDataLoader resumed mid-epoch from a per-rank ``state_dict``, 2 ranks (torchrun).

``SKEW``: how many more steps rank 1 trained than rank 0 before its state was saved (0: every
rank saved at the same step, the correct resume). Each rank iterates ``3 + SKEW * rank`` batches
of epoch 0, saves ``loader.state_dict()``, builds a fresh loader, loads the state and trains
the rest of the epoch, logging the batches it trains on after the resume (``truth.py``).
"""

from __future__ import annotations

import datetime
import os
import sys

import torch
import torch.distributed as dist
from torch.utils.data import TensorDataset
from torch.utils.data.distributed import DistributedSampler
from torchdata.stateful_dataloader import StatefulDataLoader

sys.path.insert(0, os.path.dirname(__file__))
from truth import log_indices

N = 32


def loader() -> StatefulDataLoader:
    data = TensorDataset(torch.arange(N))
    return StatefulDataLoader(data, batch_size=2, sampler=DistributedSampler(data, seed=0))


def main() -> None:
    skew = int(sys.argv[1])
    dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=60))
    rank = dist.get_rank()
    first = loader()
    it = iter(first)
    for _ in range(3 + skew * rank):
        next(it)
    state = first.state_dict()
    resumed = loader()
    resumed.load_state_dict(state)
    seen = [int(i) for (batch,) in resumed for i in batch]
    log_indices(rank, seen)
    print("finished", len(seen), flush=True)
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
