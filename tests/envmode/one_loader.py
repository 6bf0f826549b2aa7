"""A single process that iterates one shuffled DataLoader."""

from __future__ import annotations

import torch
from torch.utils.data import DataLoader

torch.manual_seed(0)
print(sum(len(b) for b in DataLoader(list(range(8)), batch_size=4, shuffle=True)))
