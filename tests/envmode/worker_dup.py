"""A dataset that owns a numpy generator, iterated with 2 workers; no rngaudit code."""

from __future__ import annotations

import numpy as np
import torch
from torch.utils.data import DataLoader, Dataset


class Noisy(Dataset[torch.Tensor]):
    def __init__(self) -> None:
        self.rng = np.random.default_rng(0)

    def __len__(self) -> int:
        return 8

    def __getitem__(self, index: int) -> torch.Tensor:
        return torch.tensor([self.rng.random()])


if __name__ == "__main__":
    loader = DataLoader(Noisy(), batch_size=2, num_workers=2)
    print(len(list(loader)))
