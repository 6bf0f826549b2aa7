"""Identical seeds, a stray draw on rank 0 only, then a stateful prepare(); no rngaudit code."""

from __future__ import annotations

import torch
import torch.distributed as dist
from accelerate import Accelerator, DataLoaderConfiguration
from accelerate.utils import set_seed
from torch.utils.data import DataLoader, TensorDataset

set_seed(1234)
acc = Accelerator(cpu=True, dataloader_config=DataLoaderConfiguration(use_stateful_dataloader=True))
if acc.process_index == 0:
    torch.rand(1)  # stray-draw
loader = acc.prepare(
    DataLoader(TensorDataset(torch.arange(16)), batch_size=2, shuffle=True, num_workers=2)
)
flat = [i for b in loader for i in b[0].tolist()]
gathered: list[object] = [None] * acc.num_processes
dist.all_gather_object(gathered, flat)
if acc.is_main_process:
    union = {i for items in gathered for i in items}  # type: ignore[attr-defined]
    print(f"union={len(union)}/16")
