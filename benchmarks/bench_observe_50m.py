"""Observing what each rank takes, 50M samples: against the unaudited loader and its sampler.

Two loaders, each iterated unaudited (A) and built inside ``rngaudit.audit(every_epoch=True)``
(B), alternated in one process (ABAB, the order flipped every other round):

- ``split``: ``random_split`` of a 50M-sample dataset (45M / 5M, a shared generator), the 45M
  part sharded by a ``DistributedSampler`` (2 replicas; this process is rank 0, no process
  group: the exchange is local). Observed: the order check at the epoch's first batch (the
  dataset's index mapping digested, the sampler's draws recorded), the epoch's index batches
  mapped through the 45M ``Subset.indices`` to the root and kept in the sketch (roots over 2M
  samples), compared at the epoch's end.
- ``shuffled`` (``--ranks 2``): a plain shuffled ``DataLoader`` (``shuffle=True``, a generator
  seeded alike on both ranks) over the 50M samples, in two spawned gloo ranks: a loader no known
  class shards, its epochs published through the store and compared.

The dataset is the cheapest there is (``__getitems__`` hands back the index batch, no collate),
so the ratios are the worst case; ``--per-sample`` adds torch's per-sample fetch and collate.
Times are the main thread's CPU time (``time.thread_time``: what the process spends, not what
it waits for on a shared machine) and the wall clock. Also: the sampler's own epoch
(``list(iter(sampler))``) and, once, the first epoch's conversion of the 45M index list.
Prints one JSON object.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import tempfile
import time
from collections.abc import Callable
from typing import Any

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from torch.utils.data import DataLoader, Dataset, random_split
from torch.utils.data.distributed import DistributedSampler

import rngaudit

N = 50_000_000


class Items(Dataset[int]):
    def __init__(self, n: int) -> None:
        self.n = n

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int) -> int:
        return i

    def __getitems__(self, indices: list[int]) -> list[int]:
        return indices


class PerSample(Items):
    """Fetched sample by sample (torch's fetch loop), collated into a tensor."""

    __getitems__ = None  # type: ignore[assignment]


def _keep(batch: Any) -> Any:
    return batch


Clock = tuple[float, float]  # (CPU of this thread, wall)


def _now() -> Clock:
    return time.thread_time(), time.perf_counter()


def _epoch(loader: DataLoader[Any], sampler: Any, epoch: int) -> dict[str, Clock]:
    """One epoch: (iter + first batch, the batches after it + the final next() that ends it)."""
    if hasattr(sampler, "set_epoch"):
        sampler.set_epoch(epoch)
    t0 = _now()
    it = iter(loader)
    next(it)
    t1 = _now()
    for _ in it:
        pass
    t2 = _now()

    def d(a: Clock, b: Clock) -> Clock:
        return b[0] - a[0], b[1] - a[1]

    return {"first": d(t0, t1), "rest": d(t1, t2), "epoch": d(t0, t2)}


def _sampler_epoch(sampler: Any, epoch: int) -> Clock:
    if hasattr(sampler, "set_epoch"):
        sampler.set_epoch(epoch)
    t0 = _now()
    order = list(iter(sampler))
    t1 = _now()
    del order
    return t1[0] - t0[0], t1[1] - t0[1]


def pairs(
    build: Callable[[], tuple[DataLoader[Any], Any]], rounds: int, barrier: Any = None
) -> dict[str, Any]:
    plain, plain_sampler = build()
    with tempfile.TemporaryDirectory() as report:
        t0 = _now()
        with rngaudit.audit(report_dir=report, every_epoch=True, mode="report"):
            audited, audited_sampler = build()
        enter_exit = time.thread_time() - t0[0]
        a: list[dict[str, Clock]] = []
        b: list[dict[str, Clock]] = []
        # epoch 0 of each, once: the audited one converts the index list (cached after)
        if barrier is not None:
            barrier()
        warm_a = _epoch(plain, plain_sampler, 0)
        warm_b = _epoch(audited, audited_sampler, 0)
        for k in range(rounds):
            if barrier is not None:
                barrier()
            arms = [(plain, plain_sampler, a), (audited, audited_sampler, b)]
            for loader, sampler, out in arms if k % 2 == 0 else arms[::-1]:
                out.append(_epoch(loader, sampler, k + 1))
        sampler_own = [_sampler_epoch(plain_sampler, k + 1) for k in range(2)]
        del audited
        rngaudit.wait_for_reports()
    batches = len(plain)

    def med(rows: list[dict[str, Clock]], part: str, clock: int) -> float:
        return statistics.median(r[part][clock] for r in rows)

    def ratios(part: str, clock: int) -> list[float]:
        return [y[part][clock] / x[part][clock] for x, y in zip(a, b, strict=True)]

    out: dict[str, Any] = {
        "batches_per_epoch": batches,
        "window_s": enter_exit,
        "epoch0_cpu_s": {"unaudited": warm_a["epoch"][0], "audited": warm_b["epoch"][0]},
        "epoch0_first_batch_cpu_s": {
            "unaudited": warm_a["first"][0],
            "audited": warm_b["first"][0],
        },
        "sampler_epoch_cpu_s": statistics.median(s[0] for s in sampler_own),
    }
    for clock, name in ((0, "cpu"), (1, "wall")):
        ua, au = med(a, "epoch", clock), med(b, "epoch", clock)
        out[name] = {
            "unaudited_epoch_s": ua,
            "audited_epoch_s": au,
            "added_epoch_s": au - ua,
            "ratio": statistics.median(ratios("epoch", clock)),
            "ratio_range": [min(ratios("epoch", clock)), max(ratios("epoch", clock))],
            "first_batch_added_ms": (med(b, "first", clock) - med(a, "first", clock)) * 1e3,
            "per_batch_added_us": (med(b, "rest", clock) - med(a, "rest", clock))
            / max(1, batches - 1)
            * 1e6,
        }
    out["added_vs_sampler"] = out["cpu"]["added_epoch_s"] / out["sampler_epoch_cpu_s"]
    return out


def split(rounds: int, batch: int, per_sample: bool) -> dict[str, Any]:
    root = (PerSample if per_sample else Items)(N)
    g = torch.Generator().manual_seed(0)
    t0 = time.perf_counter()
    train, _ = random_split(root, [0.9, 0.1], generator=g)
    split_s = time.perf_counter() - t0

    def build() -> tuple[DataLoader[Any], Any]:
        sampler: DistributedSampler[int] = DistributedSampler(train, num_replicas=2, rank=0, seed=1)
        collate = None if per_sample else _keep
        return DataLoader(train, batch_size=batch, sampler=sampler, collate_fn=collate), sampler

    return {"samples": N, "subset": len(train), "random_split_s": split_s, **pairs(build, rounds)}


def _shuffled_rank(rank: int, path: str, rounds: int, batch: int, out: str) -> None:
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"file://{path}", rank=rank, world_size=2)
    try:
        ds = Items(N)

        def build() -> tuple[DataLoader[Any], Any]:
            g = torch.Generator().manual_seed(7)  # alike on both ranks: each takes all of it
            loader = DataLoader(ds, batch_size=batch, shuffle=True, generator=g, collate_fn=_keep)
            return loader, loader.sampler

        result = pairs(build, rounds, barrier=dist.barrier)
        if rank == 0:
            with open(out, "w") as f:
                json.dump({"samples": N, **result}, f)
    finally:
        dist.destroy_process_group()


def shuffled(rounds: int, batch: int) -> dict[str, Any]:
    with tempfile.TemporaryDirectory() as tmp:
        out = os.path.join(tmp, "result.json")
        store = os.path.join(tmp, "store")
        mp.start_processes(
            _shuffled_rank, args=(store, rounds, batch, out), nprocs=2, start_method="spawn"
        )
        with open(out) as f:
            result: dict[str, Any] = json.load(f)
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--rounds", type=int, default=4)
    parser.add_argument("--batch", type=int, default=256)
    parser.add_argument("--only", default="split,shuffled", help="split,split_per_sample,shuffled")
    args = parser.parse_args()
    torch.set_num_threads(1)
    parts = {
        "split": lambda: split(args.rounds, args.batch, per_sample=False),
        "split_per_sample": lambda: split(args.rounds, args.batch, per_sample=True),
        "shuffled": lambda: shuffled(args.rounds, args.batch),
    }
    out = {"batch": args.batch}
    for name in [p for p in args.only.split(",") if p]:
        out[name] = parts[name]()
        print(json.dumps({name: out[name]}), flush=True)
    print(json.dumps(out))


if __name__ == "__main__":
    main()
