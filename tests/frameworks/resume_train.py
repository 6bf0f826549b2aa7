"""accelerate ``save_state`` / ``load_state``, 2 ranks (torchrun): ``PHASE CKPT``.

A sampler of the user's own shuffles from the global torch generator (accelerate does not
synchronise it: its ``rng_types`` covers generators it knows), so every rank must hold the same
global state when an epoch begins. ``set_seed(0)`` gives them that.
PHASE ``save``: train epoch 0, ``save_state(CKPT)`` (one ``random_states_<rank>.pkl`` per rank).
PHASE ``resume``: ``set_seed(1 + rank)`` (any per-rank state), ``load_state(CKPT)`` restores
each rank's saved generator states, train epoch 1. A checkpoint without rank 1's RNG file
(copied without it) leaves rank 1 on its own state: accelerate logs it and goes on, the ranks
shuffle differently. Each rank logs what it trains on in the resumed epoch (``truth.py``).
"""

from __future__ import annotations

import os
import sys
from collections.abc import Iterator

import torch
from accelerate import Accelerator
from accelerate.utils import set_seed
from torch.utils.data import DataLoader, Sampler, TensorDataset

sys.path.insert(0, os.path.dirname(__file__))
from truth import log_indices

N = 32


class GlobalShuffle(Sampler[int]):
    def __init__(self, n: int) -> None:
        self.n = n

    def __iter__(self) -> Iterator[int]:
        return iter(torch.randperm(self.n).tolist())

    def __len__(self) -> int:
        return self.n


def main() -> None:
    phase, ckpt = sys.argv[1], sys.argv[2]
    acc = Accelerator(cpu=True)
    set_seed(0 if phase == "save" else 1 + acc.process_index)
    model = torch.nn.Linear(1, 1)
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    data = TensorDataset(torch.arange(N))
    loader = DataLoader(data, batch_size=4, sampler=GlobalShuffle(N))
    model, opt, loader = acc.prepare(model, opt, loader)
    if phase == "resume":
        acc.load_state(ckpt)
    seen = []
    for (batch,) in loader:
        seen += batch.tolist()
        loss = model(batch.float().unsqueeze(1)).sum()
        acc.backward(loss)
        opt.step()
        opt.zero_grad()
    if phase == "save":
        acc.save_state(ckpt)
    else:
        log_indices(acc.process_index, seen)
    acc.wait_for_everyone()
    print("finished", flush=True)


if __name__ == "__main__":
    main()
