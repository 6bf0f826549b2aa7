"""The observed partition's cost: per batch and per epoch, in one process, ABAB pairs.

A DataLoader over a DistributedSampler (2 replicas, this process is rank 0, no process group:
the exchange is local) is iterated unaudited (A) and, built inside ``rngaudit.audit(
every_epoch=True)``, audited (B): the order check at each epoch's first batch, and every index
batch observed into the epoch's partition tape, compared at the epoch's end. ``images32``: the
same sampler over a dataset whose samples are small image tensors (built, not decoded: the
cheapest real sample), collated, to set the per-batch cost beside a loader that does real work.
``fold_share``: the fold of index batches into the tape timed alone in a loop, beside each
loader's unaudited batch and the least any exact observer can do (each index read once). Also:
the dataset check's digest of a 45M-index ``random_split`` (sampled), against the
sampler's own epoch; and
(``unsharded``) two real ranks (gloo, spawned) iterating a loader no known class shards (a
sampler that takes ``perm[rank::world]`` from a shared generator), whose epochs are published
through the store and compared when both have drawn them; ``unsharded_ddp``: the same with a
training step of a ``DistributedDataParallel`` model per batch, where the epoch is also read
ahead at its first index batch and compared at the module's first training forward.
Prints one JSON object.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import tempfile
import time
from collections.abc import Iterator
from typing import Any

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from torch.utils.data import DataLoader, Dataset, Sampler, Subset
from torch.utils.data.distributed import DistributedSampler

import rngaudit
from rngaudit.epochs import sharding

CLOCK = [time.perf_counter]  # --clock thread: the main thread's CPU time (a loaded machine)


class Items(Dataset[int]):
    def __init__(self, n: int) -> None:
        self.n = n

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int) -> int:
        return i


class Images(Dataset[Any]):
    """The cheapest sample real training reads: a 3x32x32 float tensor built per index (no
    decoding, no augmentation: a real image costs far more), collated into a batch."""

    def __init__(self, n: int) -> None:
        self.n = n

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int) -> Any:
        return torch.full((3, 32, 32), float(i))


def _loader(n: int, batch: int, dataset: Any = Items) -> DataLoader[Any]:
    ds = dataset(n)
    sampler: DistributedSampler[int] = DistributedSampler(ds, num_replicas=2, rank=0, seed=1)
    return DataLoader(ds, batch_size=batch, sampler=sampler)


def _epoch(
    loader: DataLoader[int],
    parts: list[tuple[float, float, float]] | None = None,
    step: Any = None,
) -> float:
    """One epoch's time (``step``: a training step on each batch); ``parts`` gets (iter + first
    batch and its step, the batches after it, the final next() that ends the epoch: where an
    observed epoch is compared)."""
    step = step or (lambda batch: None)
    t0 = CLOCK[0]()
    it = iter(loader)
    step(next(it))
    t1 = CLOCK[0]()
    for _ in range(len(loader) - 1):
        step(next(it))
    t2 = CLOCK[0]()
    for batch in it:
        step(batch)
    t3 = CLOCK[0]()
    if parts is not None:
        parts.append((t1 - t0, t2 - t1, t3 - t2))
    return t3 - t0


def _images_loader(n: int, batch: int) -> DataLoader[Any]:
    return _loader(n, batch, Images)


class RankShard(Sampler[int]):
    """Every world-th entry of a permutation from a generator seeded identically per epoch."""

    def __init__(self, n: int, rank: int, world: int) -> None:
        self.n, self.rank, self.world, self.epoch = n, rank, world, 0

    def __len__(self) -> int:
        return len(range(self.rank, self.n, self.world))

    def __iter__(self) -> Iterator[int]:
        self.epoch += 1
        g = torch.Generator().manual_seed(self.epoch)
        yield from torch.randperm(self.n, generator=g)[self.rank :: self.world].tolist()


def _unsharded_loader(n: int, batch: int) -> DataLoader[int]:
    rank, world = dist.get_rank(), dist.get_world_size()
    return DataLoader(Items(n), batch_size=batch, sampler=RankShard(n, rank, world))


def _unsharded_rank(
    rank: int, path: str, n: int, batch: int, rounds: int, out: str, ddp: bool
) -> None:
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"file://{path}", rank=rank, world_size=2)
    try:
        step = None
        if ddp:
            model = torch.nn.parallel.DistributedDataParallel(torch.nn.Linear(1, 1))

            def step(batch: Any) -> None:
                model(batch.float().view(-1, 1)).sum().backward()

        result = pairs(n, batch, rounds, _unsharded_loader, barrier=dist.barrier, step=step)
        if rank == 0:
            with open(out, "w") as f:
                json.dump(result, f)
    finally:
        dist.destroy_process_group()


def unsharded(n: int, batch: int, rounds: int, ddp: bool = False) -> dict[str, Any]:
    with tempfile.TemporaryDirectory() as tmp:
        out = os.path.join(tmp, "result.json")
        store = os.path.join(tmp, "store")
        mp.start_processes(
            _unsharded_rank,
            args=(store, n, batch, rounds, out, ddp),
            nprocs=2,
            start_method="spawn",
        )
        with open(out) as f:
            result: dict[str, Any] = json.load(f)
    return result


def pairs(
    n: int,
    batch: int,
    rounds: int,
    build: Any = _loader,
    barrier: Any = None,
    step: Any = None,
) -> dict[str, Any]:
    plain = build(n, batch)
    with tempfile.TemporaryDirectory() as report:
        with rngaudit.audit(report_dir=report, every_epoch=True, mode="report"):
            audited = build(n, batch)
        _epoch(plain, None, step), _epoch(audited, None, step)  # warm up (and the window)
        a, b = [], []
        pa: list[tuple[float, float, float]] = []
        pb: list[tuple[float, float, float]] = []
        for _ in range(rounds):
            if barrier is not None:
                barrier()  # the ranks start each pair together
            a.append(_epoch(plain, pa, step))
            b.append(_epoch(audited, pb, step))
        del audited
        rngaudit.wait_for_reports()
    batches = len(plain)

    def least(parts: list[tuple[float, float, float]], k: int) -> float:
        return min(p[k] for p in parts)

    breakdown = {  # least of the rounds: load on a shared machine only ever adds
        "first_batch_added_ms": (least(pb, 0) - least(pa, 0)) * 1e3,
        "per_batch_added_us": (least(pb, 1) - least(pa, 1)) / max(1, batches - 1) * 1e6,
        "per_batch_unaudited_us": least(pa, 1) / max(1, batches - 1) * 1e6,
        "epoch_end_added_ms": (least(pb, 2) - least(pa, 2)) * 1e3,
    }
    ratios = [y / x for x, y in zip(a, b, strict=True)]
    aa = [a[i + 1] / a[i] for i in range(len(a) - 1)]
    return {
        "samples": n,
        "batch": batch,
        "batches_per_epoch": batches,
        "unaudited_epoch_s": statistics.median(a),
        "audited_epoch_s": statistics.median(b),
        "unaudited_min_s": min(a),
        "audited_min_s": min(b),
        "added_us_per_batch_min": (min(b) - min(a)) / batches * 1e6,
        "ratio": statistics.median(ratios),
        "ratio_min": min(ratios),
        "ratio_max": max(ratios),
        "aa_noise": max(abs(1 - r) for r in aa) if aa else 0.0,
        "added_us_per_batch": (statistics.median(b) - statistics.median(a)) / batches * 1e6,
        **breakdown,
    }


def fold_share(rounds: int) -> dict[str, Any]:
    """The observation's own work beside the unaudited loader's, both in this process: an epoch
    of each loader unaudited (least of ``rounds``, per batch) and the fold of 256 of its index
    batches into a tape (``Tape.take``: what an observed epoch adds per batch once the tee's C
    segments are counted), with the least any exact observer can do (``sum`` over the indices:
    each read once, at C speed) and the previous fold (``np.fromiter`` of the chained batches)
    beside it. Loops are stable at any load; epoch ratios are not."""
    import itertools
    import random
    import timeit

    import numpy as np

    from rngaudit.epochs import partition

    def least(fn: Any) -> float:
        fn()  # warm: the first calls of a process pay its allocations
        return min(timeit.repeat(fn, number=100, repeat=15)) / 100 / 256

    out: dict[str, Any] = {}
    for name, n, batch, build in (
        ("items32", 64_000, 32, _loader),
        ("images32", 64_000, 32, _images_loader),
        ("items1", 8_000, 1, _loader),
    ):
        loader = build(n, batch)
        _epoch(loader)
        per_batch = min(_epoch(loader) for _ in range(rounds)) / len(loader)
        perm = list(range(n))
        random.Random(0).shuffle(perm)
        held = [perm[i : i + batch] for i in range(0, 256 * batch, batch)]
        tape = partition.Tape([], n)
        fold = least(lambda: tape.take(list(held)))  # noqa: B023 (called in this iteration)
        floor = least(lambda: sum(itertools.chain.from_iterable(held)))  # noqa: B023
        chained = least(
            lambda: np.fromiter(itertools.chain.from_iterable(held), dtype=np.int64)  # noqa: B023
        )
        out[name] = {
            "loader_us_per_batch": per_batch * 1e6,
            "fold_us_per_batch": fold * 1e6,
            "fold_share": fold / per_batch,
            "floor_us_per_batch": floor * 1e6,
            "floor_share": floor / per_batch,
            "fromiter_us_per_batch": chained * 1e6,
        }
    return out


def digest_45m() -> dict[str, Any]:
    n = 45_000_000
    t0 = CLOCK[0]()
    indices = torch.randperm(n).tolist()  # what random_split does
    sampler_s = CLOCK[0]() - t0
    subset = Subset(Items(n), indices)
    t0 = CLOCK[0]()
    sharding.describe_dataset(subset)
    return {"randperm_tolist_s": sampler_s, "describe_s": CLOCK[0]() - t0}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--rounds", type=int, default=6)
    parser.add_argument("--only", default="", help="comma-separated parts (default: all)")
    parser.add_argument("--clock", choices=["wall", "thread"], default="wall")
    args = parser.parse_args()
    if args.clock == "thread":
        CLOCK[0] = time.thread_time
    torch.set_num_threads(1)
    parts = {
        "batch32": lambda: pairs(64_000, 32, args.rounds),
        "batch1": lambda: pairs(8_000, 1, args.rounds),
        "images32": lambda: pairs(64_000, 32, args.rounds, build=_images_loader),
        "unsharded32": lambda: unsharded(64_000, 32, args.rounds),
        "unsharded1": lambda: unsharded(8_000, 1, args.rounds),
        "unsharded_ddp32": lambda: unsharded(64_000, 32, args.rounds, ddp=True),
        "digest_45m": digest_45m,
        "fold_share": lambda: fold_share(args.rounds),
    }
    chosen = [p for p in args.only.split(",") if p] or list(parts)
    out = {name: parts[name]() for name in chosen}
    print(json.dumps(out))


if __name__ == "__main__":
    main()
