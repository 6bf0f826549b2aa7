"""A small accelerate training script, timed after its first batch (run with/without RNGAUDIT=1)."""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time

import torch
from accelerate import Accelerator, DataLoaderConfiguration
from torch import nn
from torch.utils.data import DataLoader, Dataset

FEATURES, CLASSES = 64, 10


class Augmented(Dataset):  # type: ignore[type-arg]
    """Samples with a few tensor ops of augmentation each, as a typical pipeline has."""

    def __init__(self, n: int) -> None:
        gen = torch.Generator().manual_seed(0)
        self.x = torch.randn(n, FEATURES, generator=gen)
        self.y = torch.randint(0, CLASSES, (n,), generator=gen)

    def __len__(self) -> int:
        return len(self.y)

    def __getitem__(self, i: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        start = time.perf_counter()
        x = self.x[i] * 1.1 + 0.05
        x = x + 0.01 * torch.randn(FEATURES)  # the worker's (reseeded) global generator
        x = torch.nn.functional.normalize(x.clamp(-3.0, 3.0), dim=0)
        # Diagnostics: is rngaudit still intercepting torch on this worker; the sample's µs.
        info = torch.tensor([float(hooked()), (time.perf_counter() - start) * 1e6])
        return x, self.y[i], info


def hooked() -> bool:
    """rngaudit intercepts this thread's torch ops (its dispatch key or its dispatch mode)."""
    module = sys.modules.get("rngaudit.capture.instrument.torch_ops")
    if module is not None:
        return bool(module.intercepting())
    return torch._C._len_torch_dispatch_stack() > 0


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--steps", type=int, default=120, help="batches per epoch")
    parser.add_argument("--batch", type=int, default=64)
    parser.add_argument("--workers", type=int, default=2)
    args = parser.parse_args()

    torch.manual_seed(1234)
    acc = Accelerator(
        cpu=True, dataloader_config=DataLoaderConfiguration(use_stateful_dataloader=True)
    )
    model = nn.Sequential(
        nn.Linear(FEATURES, 512), nn.ReLU(), nn.Dropout(0.1),
        nn.Linear(512, 512), nn.ReLU(), nn.Dropout(0.1),
        nn.Linear(512, CLASSES),
    )  # fmt: skip
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    raw = DataLoader(
        Augmented(args.steps * args.batch),
        batch_size=args.batch,
        shuffle=True,
        num_workers=args.workers,
    )
    model, opt, loader = acc.prepare(model, opt, raw)
    loss_fn = nn.CrossEntropyLoss()

    def step(x: torch.Tensor, y: torch.Tensor) -> None:
        opt.zero_grad()
        loss = loss_fn(model(x), y)
        acc.backward(loss)
        opt.step()

    epochs: list[float] = []
    main_modes = worker_mode_batches = 0
    sample_us: list[float] = []
    for epoch in range(2):
        it = iter(loader)
        x, y, info = next(it)  # the first batch: untimed (RNGAUDIT closes its window here)
        step(x, y)
        if epoch == 0:
            main_modes = int(hooked())
        worker_mode_batches += int(info[:, 0].max() > 0)
        start = time.perf_counter()
        for x, y, info in it:
            step(x, y)
            worker_mode_batches += int(info[:, 0].max() > 0)
            if epoch == 0:
                sample_us.append(float(info[:, 1].median()))
        epochs.append(time.perf_counter() - start)
    print(
        json.dumps(
            {
                "epoch0_s": epochs[0],
                "epoch1_s": epochs[1],
                "steps": args.steps - 1,
                "main_dispatch_modes": main_modes,
                "worker_batches_with_mode": worker_mode_batches,
                "epoch0_sample_us": statistics.median(sample_us),
                "audited": os.environ.get("RNGAUDIT", "") not in ("", "0"),
            }
        )
    )


if __name__ == "__main__":
    main()
