"""Seeded DataLoader with spawned workers that draw in __getitem__: prints every value."""

from __future__ import annotations

import torch
from torch.utils.data import DataLoader, Dataset


class Noise(Dataset[torch.Tensor]):
    def __len__(self) -> int:
        return 8

    def __getitem__(self, index: int) -> torch.Tensor:
        return torch.rand(2)


if __name__ == "__main__":
    torch.manual_seed(7)
    loader = DataLoader(Noise(), batch_size=2, num_workers=2, multiprocessing_context="spawn")
    values = torch.cat([b for b in loader]).flatten().tolist()
    print(" ".join(f"{v:.8f}" for v in values))
