"""The worker-stream check: a loader's first batch (observed in each worker) and later batches."""

from __future__ import annotations

import argparse
import random
import time
from typing import Any

import benchlib
import numpy as np
import torch
from torch.utils.data import DataLoader, Dataset

from rngaudit.workers import WorkerMonitor

N, BATCH = 1024, 16


class Augmented(Dataset[torch.Tensor]):
    """A typical augmentation: a numpy generator, torch noise and Python random per sample."""

    def __init__(self) -> None:
        self.rng: np.random.Generator | None = None
        self.base = torch.randn(N, 64)

    def __len__(self) -> int:
        return N

    def __getitem__(self, index: int) -> torch.Tensor:
        if self.rng is None:
            self.rng = np.random.default_rng(torch.initial_seed() % 2**32)
        x = self.base[index] + torch.rand(64) * 0.1
        x = x * float(self.rng.uniform(0.9, 1.1))
        return x if random.random() < 0.5 else x.flip(0)


def epoch(workers: int) -> dict[str, float]:
    loader = DataLoader(
        Augmented(), batch_size=BATCH, num_workers=workers, multiprocessing_context="fork"
    )
    t0 = time.perf_counter()
    it = iter(loader)
    next(it)
    first = time.perf_counter() - t0
    t1 = time.perf_counter()
    rest = sum(1 for _ in it)
    later = (time.perf_counter() - t1) / max(rest, 1)
    return {"first": first, "later": later}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--pairs", type=int, default=6)
    parser.add_argument("--workers", type=int, default=2)
    args = parser.parse_args()
    plain: list[dict[str, float]] = []
    audited: list[dict[str, float]] = []
    # A training script seeds numpy in the parent: otherwise each forked worker imports
    # numpy.random itself (PyTorch seeds it there), and on this machine that import takes
    # ~300 ms in a forked child, a cost of the loader, not of the audit, that swamps both.
    np.random.seed(0)
    epoch(args.workers)  # warm-up
    for _ in range(args.pairs):
        plain.append(epoch(args.workers))
        monitor = WorkerMonitor(lambda f: None, mode="report")
        monitor.install()
        try:
            audited.append(epoch(args.workers))
        finally:
            monitor.uninstall()

    def med(rows: list[dict[str, float]], key: str) -> float:
        return benchlib.median([r[key] for r in rows])

    out: dict[str, Any] = {
        "pairs": args.pairs,
        "workers": args.workers,
        "batches": N // BATCH,
        "first_plain": med(plain, "first"),
        "first_audited": med(audited, "first"),
        # each pair's audited minus plain first batch: steadier than the medians' difference
        # on a loaded machine
        "first_added": benchlib.median(
            [a["first"] - p["first"] for a, p in zip(audited, plain, strict=True)]
        ),
        "later_plain": med(plain, "later"),
        "later_audited": med(audited, "later"),
    }
    benchlib.emit(out)


if __name__ == "__main__":
    main()
