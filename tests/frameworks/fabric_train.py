"""Lightning Fabric on CPU, 2 ranks (``strategy="ddp"``: ``fabric.launch()`` starts rank 1 as a
subprocess of this script): ``SEED``.

SEED ``same``: ``fabric.seed_everything(42)`` (correct); ``rank``: ``42 + fabric.global_rank``,
so the ``DistributedSampler`` that ``setup_dataloaders`` injects takes a per-rank seed.
"""

from __future__ import annotations

import os
import sys

import torch
from lightning_fabric import Fabric
from torch.utils.data import DataLoader, TensorDataset

sys.path.insert(0, os.path.dirname(__file__))
from truth import log_indices

N = 32


def main() -> None:
    fabric = Fabric(accelerator="cpu", devices=2, strategy="ddp")
    fabric.launch()
    fabric.seed_everything(42 if sys.argv[1] == "same" else 42 + fabric.global_rank)
    model = torch.nn.Linear(1, 1)
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    model, opt = fabric.setup(model, opt)
    loader = fabric.setup_dataloaders(DataLoader(TensorDataset(torch.arange(N)), batch_size=4,
                                                 shuffle=True))  # fmt: skip
    seen = []
    for (batch,) in loader:
        seen += batch.tolist()
        loss = model(batch.float().unsqueeze(1)).sum()
        fabric.backward(loss)
        opt.step()
        opt.zero_grad()
    log_indices(fabric.global_rank, seen)
    print("finished", flush=True)


if __name__ == "__main__":
    main()
