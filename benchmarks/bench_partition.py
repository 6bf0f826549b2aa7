"""The observed partition's cost: per batch and per epoch, in one process, ABAB pairs.

A DataLoader over a DistributedSampler (2 replicas, this process is rank 0, no process group:
the exchange is local) is iterated unaudited (A) and, built inside ``rngaudit.audit(
every_epoch=True)``, audited (B): the order check at each epoch's first batch, and every index
batch observed into the epoch's partition tape, compared at the epoch's end. Also: the dataset
check's digest of a 45M-index ``random_split`` (sampled), against the sampler's own epoch.
Prints one JSON object.
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
import time
from typing import Any

import torch
from torch.utils.data import DataLoader, Dataset, Subset
from torch.utils.data.distributed import DistributedSampler

import rngaudit
from rngaudit.epochs import sharding


class Items(Dataset[int]):
    def __init__(self, n: int) -> None:
        self.n = n

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int) -> int:
        return i


def _loader(n: int, batch: int) -> DataLoader[int]:
    ds = Items(n)
    sampler: DistributedSampler[int] = DistributedSampler(ds, num_replicas=2, rank=0, seed=1)
    return DataLoader(ds, batch_size=batch, sampler=sampler)


def _epoch(loader: DataLoader[int]) -> float:
    t0 = time.perf_counter()
    for _ in loader:
        pass
    return time.perf_counter() - t0


def pairs(n: int, batch: int, rounds: int) -> dict[str, Any]:
    plain = _loader(n, batch)
    with tempfile.TemporaryDirectory() as report:
        with rngaudit.audit(report_dir=report, every_epoch=True, mode="report"):
            audited = _loader(n, batch)
        _epoch(plain), _epoch(audited)  # warm up (epoch 0 also closes the window's checks)
        a, b = [], []
        for _ in range(rounds):
            a.append(_epoch(plain))
            b.append(_epoch(audited))
        del audited
        rngaudit.wait_for_reports()
    batches = len(plain)
    ratios = [y / x for x, y in zip(a, b, strict=True)]
    aa = [a[i + 1] / a[i] for i in range(len(a) - 1)]
    return {
        "samples": n,
        "batch": batch,
        "batches_per_epoch": batches,
        "unaudited_epoch_s": statistics.median(a),
        "audited_epoch_s": statistics.median(b),
        "ratio": statistics.median(ratios),
        "ratio_min": min(ratios),
        "ratio_max": max(ratios),
        "aa_noise": max(abs(1 - r) for r in aa) if aa else 0.0,
        "added_us_per_batch": (statistics.median(b) - statistics.median(a)) / batches * 1e6,
    }


def digest_45m() -> dict[str, Any]:
    n = 45_000_000
    t0 = time.perf_counter()
    indices = torch.randperm(n).tolist()  # what random_split does
    sampler_s = time.perf_counter() - t0
    subset = Subset(Items(n), indices)
    t0 = time.perf_counter()
    sharding.describe_dataset(subset)
    return {"randperm_tolist_s": sampler_s, "describe_s": time.perf_counter() - t0}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--rounds", type=int, default=6)
    args = parser.parse_args()
    torch.set_num_threads(1)
    out = {
        "batch32": pairs(64_000, 32, args.rounds),
        "batch1": pairs(8_000, 1, args.rounds),
        "digest_45m": digest_45m(),
    }
    print(json.dumps(out))


if __name__ == "__main__":
    main()
