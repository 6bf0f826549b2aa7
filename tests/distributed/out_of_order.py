"""Two ranks, a DistributedSampler loader with two workers and ``in_order=False``: its batches
come in the order the workers finish them (the first sample of each rank's share is slow, so
worker 0's two come last, as in torchdata's own test).
Each rank prints that order; tests/test_never_break.py compares it audited and unaudited."""

from __future__ import annotations

import json
import time

import torch.distributed as dist
from torch.utils.data import DataLoader, Dataset, DistributedSampler


class SlowFirst(Dataset[int]):
    def __len__(self) -> int:
        return 32

    def __getitem__(self, i: int) -> int:
        if i < 2:  # the first of each rank's share: its worker 0 falls behind
            time.sleep(1.0)
        return i


dist.init_process_group("gloo")
dataset = SlowFirst()
loader = DataLoader(
    dataset,
    batch_size=1,
    sampler=DistributedSampler(dataset, shuffle=False),
    num_workers=2,
    in_order=False,
)
for epoch in range(2):
    order = [int(batch) for batch in loader]
    print(json.dumps({"rank": dist.get_rank(), "epoch": epoch, "order": order}), flush=True)
dist.destroy_process_group()
