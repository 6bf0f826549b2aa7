"""A seeded single-process program whose runs ``rngaudit diff`` compares (SEED, EXTRA, WORKERS)."""

from __future__ import annotations

import os

import torch
from torch.utils.data import DataLoader, TensorDataset

torch.manual_seed(int(os.environ.get("SEED", "0")))
if os.environ.get("EXTRA"):
    torch.rand(1)  # extra-draw
model = torch.nn.Linear(4, 2)  # model-init
workers = int(os.environ.get("WORKERS", "0"))
loader = DataLoader(TensorDataset(torch.arange(8)), batch_size=2, shuffle=True, num_workers=workers)
print(sum(len(batch[0]) for batch in loader))
