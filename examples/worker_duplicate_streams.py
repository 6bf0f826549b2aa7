"""DataLoader workers that share one random stream: the bug, rngaudit's finding, the fix."""

from __future__ import annotations

import warnings

import numpy as np
import torch
from torch.utils.data import DataLoader, Dataset, get_worker_info

from rngaudit.errors import WorkerDuplicateStreamError
from rngaudit.findings import Finding
from rngaudit.workers import WorkerMonitor

NUM_WORKERS = 2


class NoisyDataset(Dataset[torch.Tensor]):
    """The bug: the generator is built in the parent and copied into every worker."""

    def __init__(self, n: int = 8) -> None:
        self.n = n
        self.rng = np.random.default_rng(0)

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, index: int) -> torch.Tensor:
        info = get_worker_info()
        worker = -1 if info is None else info.id
        return torch.tensor([worker, index, self.rng.normal()], dtype=torch.float64)


class FixedNoisyDataset(NoisyDataset):
    """The fix: build the generator lazily inside the worker from torch.initial_seed()."""

    def __init__(self, n: int = 8) -> None:
        super().__init__(n)
        self.rng = None  # type: ignore[assignment]

    def __getitem__(self, index: int) -> torch.Tensor:
        if self.rng is None:
            self.rng = np.random.default_rng(torch.initial_seed() % 2**32)
        return super().__getitem__(index)


def show_draws(dataset: Dataset[torch.Tensor]) -> None:
    loader = DataLoader(dataset, batch_size=2, num_workers=NUM_WORKERS)
    draws: dict[int, list[str]] = {}
    for row in torch.cat(list(loader)):
        draws.setdefault(int(row[0]), []).append(f"{float(row[2]):+.4f}")
    for worker, values in sorted(draws.items()):
        print(f"  worker {worker}: {' '.join(values)}")


def monitored(mode: str, found: list[Finding]) -> WorkerMonitor:
    monitor = WorkerMonitor(found.append, mode=mode)
    monitor.install()
    return monitor


def main() -> None:
    print("1. The bug, unmonitored: each worker draws the same numbers")
    show_draws(NoisyDataset())

    print("\n2. The same loader under WorkerMonitor(mode='report'): the finding")
    found: list[Finding] = []
    monitor = monitored("report", found)
    try:
        show_draws(NoisyDataset())  # the data is unchanged: the monitor only reads state
    finally:
        monitor.uninstall()
    for finding in found:
        print(f"  [{finding.severity}] {finding.kind}: {finding.message}")
        details = finding.details
        print(f"  path={details['path']} type={details['type']} workers={details['worker_ids']}")
        print(f"  remedy: {finding.remedy}")

    print("\n3. mode='raise': the first batch raises")
    monitor = monitored("raise", [])
    try:
        next(iter(DataLoader(NoisyDataset(), batch_size=2, num_workers=NUM_WORKERS)))
    except WorkerDuplicateStreamError as exc:
        print(f"  WorkerDuplicateStreamError: {str(exc).splitlines()[0][:90]}...")
    finally:
        monitor.uninstall()

    print("\n4. The fixed dataset: distinct draws per worker, no finding")
    found = []
    monitor = monitored("raise", found)
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("error")  # any rngaudit warning would stop here
            show_draws(FixedNoisyDataset())
    finally:
        monitor.uninstall()
    print(f"  findings: {found}")


if __name__ == "__main__":
    main()
