"""A single process that iterates one shuffled DataLoader."""

from __future__ import annotations

import torch
from torch.utils.data import DataLoader

torch.manual_seed(0)
items: list[int] = list(range(8))
loader: DataLoader[int] = DataLoader(items, batch_size=4, shuffle=True)  # type: ignore[arg-type]
print(sum(len(b) for b in loader))
