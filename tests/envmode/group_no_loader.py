"""Ranks join a process group, rank 0 draws once more, no DataLoader, destroy before exit."""

from __future__ import annotations

import torch
import torch.distributed as dist

dist.init_process_group("gloo")
torch.manual_seed(0)
if dist.get_rank() == 0:
    torch.rand(3)  # rank-0-draw
dist.barrier()
dist.destroy_process_group()
print("done")
