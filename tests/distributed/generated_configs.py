"""Torchrun-able: runs generated loader configurations in turn, unaudited or audited, per rank."""

from __future__ import annotations

import argparse
import datetime
import faulthandler
import gc
import json
import os
import random
import sys
import time
import traceback
import warnings
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager, nullcontext
from pathlib import Path
from typing import Any

import frozen_libraries  # a sibling: the script's folder is sys.path[0]
import numpy as np
import torch
import torch.distributed as dist
from torch.utils.data import ConcatDataset, DataLoader, Dataset, Sampler, Subset
from torch.utils.data.distributed import DistributedSampler

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from generated_loader_configs import Config, from_json

WATCHDOG_S = float(os.environ.get("RNGAUDIT_GEN_WATCHDOG_S", "500"))
AUDIT_TIMEOUT_S = 20.0  # a rank that raised is not waited for long
PG_TIMEOUT = datetime.timedelta(seconds=90)
SHARED_SEED = 7  # every rank's seed, where the config does not make it per rank
ORDER_SEED = 3  # a sampler's own seed, where the config does not make it per rank


# --------------------------------------------------------------------------- user code


class Items(Dataset[int]):
    """Sample ids ``base .. base + n - 1``: what a rank trained on is read from its batches."""

    def __init__(self, n: int, base: int = 0) -> None:
        self.n, self.base = n, base

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int) -> int:
        if not 0 <= i < self.n:
            raise IndexError(i)
        return self.base + i


class UserWrapper(Dataset[int]):
    """A user's own wrapper class around a dataset."""

    def __init__(self, inner: Dataset[int], size: int) -> None:
        self.inner, self.size = inner, size

    def __len__(self) -> int:
        return self.size

    def __getitem__(self, i: int) -> int:
        return self.inner[i]


class Augmented(Dataset[Any]):
    """A per-sample augmentation drawn from numpy's global generator (seeded per rank)."""

    def __init__(self, inner: Dataset[int], size: int) -> None:
        self.inner, self.size = inner, size

    def __len__(self) -> int:
        return self.size

    def __getitem__(self, i: int) -> tuple[int, float]:
        return self.inner[i], float(np.random.rand())


class TorchPermSampler(Sampler[int]):
    """A user's sampler shuffling from the global torch generator."""

    def __init__(self, n: int) -> None:
        self.n = n

    def __len__(self) -> int:
        return self.n

    def __iter__(self) -> Iterator[int]:
        return iter(torch.randperm(self.n).tolist())


class SelfShard(Sampler[int]):
    """A sampler that shards itself: an order of every sample, ``order[rank::world]`` kept.

    The order: drawn at each ``__iter__`` from ``seed + epoch`` (or from the global generator
    when ``seed`` is None), fixed at construction (``eager``), or none (``shuffle=False``)."""

    def __init__(
        self, n: int, rank: int, world: int, seed: int | None, shuffle: bool, eager: bool
    ) -> None:
        self.n, self.rank, self.world, self.seed, self.shuffle = n, rank, world, seed, shuffle
        self.epoch = 0
        self.fixed = torch.randperm(n).tolist() if eager else None

    def set_epoch(self, epoch: int) -> None:
        self.epoch = epoch

    def __len__(self) -> int:
        return len(range(self.rank, self.n, self.world))

    def __iter__(self) -> Iterator[int]:
        if self.fixed is not None:
            order = self.fixed
        elif not self.shuffle:
            order = list(range(self.n))
        elif self.seed is None:
            order = torch.randperm(self.n).tolist()
        else:
            gen = torch.Generator().manual_seed(self.seed + self.epoch)
            order = torch.randperm(self.n, generator=gen).tolist()
        return iter(order[self.rank :: self.world])


class UserDistributedSampler(DistributedSampler[Any]):
    """A DistributedSampler subclass with an ``__iter__`` of its own (it materialises)."""

    def __iter__(self) -> Iterator[Any]:
        return iter(list(super().__iter__()))


# --------------------------------------------------------------------------- one config


def seed_all(seed: int) -> None:
    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)


def root(cfg: Config) -> Dataset[int]:
    """``cfg.n`` distinct sample ids behind the config's dataset wrapper."""
    n = cfg.n
    if cfg.wrapper == "subset":
        return Subset(Items(2 * n), list(range(0, 2 * n, 2)))
    if cfg.wrapper == "concat":
        return ConcatDataset([Items(n // 3), Items(n - n // 3, base=1000)])
    if cfg.wrapper == "user":
        return UserWrapper(Items(n, base=500), n)
    return Items(n)


class Built:
    def __init__(self, loader: Any, set_epoch: Callable[[int], None] | None) -> None:
        self.loader, self.set_epoch = loader, set_epoch


def build(cfg: Config, rank: int, acc: Any) -> Built:
    """The dataset, sampler and loader (prepared by accelerate where the config says so)."""
    c, world = cfg.corruption, cfg.world
    per_rank = 100 + rank
    seed_all(SHARED_SEED)
    ds: Dataset[Any] = root(cfg)
    if c == "dataset_order_per_rank":  # every sample, in an order drawn per rank
        seed_all(per_rank)
        ds = Subset(ds, torch.randperm(cfg.n).tolist())
        seed_all(SHARED_SEED)
    if c == "augment_rank_seed":
        ds = Augmented(ds, cfg.n)
        np.random.seed(per_rank)
    if c in ("seed_per_rank", "rank_seed_unused", "noshuffle_rank_seed"):
        seed_all(per_rank)
    if c == "rank0_draw" and rank == 0:
        torch.rand(3)  # a rank-0-only evaluation before the order is drawn
    shuffle = c != "noshuffle_rank_seed"
    order_seed = rank if c in ("seed_per_rank", "noshuffle_rank_seed") else ORDER_SEED
    kw: dict[str, Any] = dict(batch_size=cfg.batch, drop_last=cfg.drop_last)
    kw.update(num_workers=cfg.workers)
    set_epoch: Callable[[int], None] | None = None
    loader: Any
    if cfg.shard in ("dist", "dist_sub"):
        cls = DistributedSampler if cfg.shard == "dist" else UserDistributedSampler
        dsampler: DistributedSampler[Any] = cls(
            ds, num_replicas=world, rank=rank, shuffle=shuffle, seed=order_seed
        )
        loader = DataLoader(ds, sampler=dsampler, **kw)
        set_epoch = dsampler.set_epoch
    elif cfg.shard == "accel":
        if c in ("seed_per_rank", "rank0_draw"):  # the order drawn from the global generator
            loader = DataLoader(ds, sampler=TorchPermSampler(cfg.n), **kw)
        else:
            loader = DataLoader(ds, shuffle=shuffle, **kw)
        loader = acc.prepare(loader)
    elif cfg.shard == "self":
        own = c in ("rank_seed_unused", "set_epoch_differs", "set_epoch_forgotten")
        sampler = SelfShard(
            cfg.n, rank, world, seed=order_seed if own or not shuffle else None,
            shuffle=shuffle, eager=c == "seed_after_order",
        )  # fmt: skip
        loader = DataLoader(ds, sampler=sampler, **kw)
        set_epoch = sampler.set_epoch
    else:  # subset_rank: each rank's own Subset of one order, no sampler shards it
        if c == "rank_seed_unused":
            perm = torch.randperm(cfg.n, generator=torch.Generator().manual_seed(ORDER_SEED))
        elif not shuffle:
            perm = torch.arange(cfg.n)
        else:
            perm = torch.randperm(cfg.n)  # global: per rank under seed_per_rank, rank0_draw
        part = Subset(ds, perm.tolist()[rank::world])
        # a local shuffle of the rank's own share (from per-rank seeds: harmless)
        local = c in ("rank_seed_unused", "seed_after_order")
        loader = DataLoader(part, shuffle=local, **kw)
    if c == "seed_after_order":
        seed_all(per_rank)  # the order is fixed (or drawn from a seed of its own)
    if c == "set_epoch_forgotten":
        set_epoch = None
    elif c == "set_epoch_differs" and set_epoch is not None:
        on = set_epoch
        last = rank == world - 1
        set_epoch = lambda e: on(max(0, e - 1) if last else e)  # noqa: E731
    return Built(loader, set_epoch)


def _items(batch: Any) -> list[int]:
    if isinstance(batch, list | tuple):
        batch = batch[0]
    return [int(i) for i in batch.tolist()]


_ACCELERATOR: list[Any] = []


def _accelerator() -> Any:
    """One Accelerator for the launch (its state is process-wide): built at its first use."""
    if not _ACCELERATOR:
        from accelerate import Accelerator
        from accelerate.utils import InitProcessGroupKwargs

        kwargs = [InitProcessGroupKwargs(backend="gloo")]
        _ACCELERATOR.append(Accelerator(cpu=True, kwargs_handlers=kwargs))
    return _ACCELERATOR[0]


def run_config(cfg: Config, how: str, rank: int, report_dir: Path) -> dict[str, Any]:
    out: dict[str, Any] = {"epochs": [], "raised": False, "raised_at": None}
    acc: Any = _accelerator() if "accel" in (cfg.shard, cfg.loop) else None
    model: Any = None
    step: Callable[[list[int]], None] | None = None
    join: Callable[[], AbstractContextManager[Any]] = nullcontext
    if cfg.loop == "ddp":
        torch.manual_seed(0)
        model = torch.nn.parallel.DistributedDataParallel(torch.nn.Linear(1, 1))
        join = model.join  # a self-sharded share may hold one batch more than another's
    elif cfg.loop == "accel":
        torch.manual_seed(0)
        model = acc.prepare(torch.nn.Linear(1, 1))  # a DistributedDataParallel module
        join = model.join  # (accelerate's join_uneven_inputs does nothing on CPU)
    if model is not None:
        net = model

        def step(items: list[int]) -> None:
            x = torch.tensor(items, dtype=torch.float32).view(-1, 1)
            loss = net(x).sum()
            if acc is not None and cfg.loop == "accel":
                acc.backward(loss)
            else:
                loss.backward()

    where = {"stage": "set-up", "items": 0}
    # One join context around the whole config: a rank that raised (or ran out of batches)
    # shadows the others' remaining gradient all-reduces instead of leaving them waiting.
    with join():
        try:
            _train(cfg, how, rank, acc, report_dir, step, out, where)
        except Exception as exc:
            if type(exc).__module__.split(".")[0] != "rngaudit":
                raise
            report: Any = getattr(exc, "report", None)
            out.update(
                raised=True,
                raised_at=where["stage"],
                items_at_raise=where["items"],
                error_type=type(exc).__name__,
                message=str(exc),
                kinds=sorted({f.kind for f in report.findings}) if report is not None else [],
            )
    return out


def _train(
    cfg: Config,
    how: str,
    rank: int,
    acc: Any,
    report_dir: Path,
    step: Callable[[list[int]], None] | None,
    out: dict[str, Any],
    where: dict[str, Any],
) -> None:
    if how == "block":
        import rngaudit

        # every epoch, as RNGAUDIT=1 does (the block alone checks only the first)
        with rngaudit.audit(report_dir=report_dir, timeout=AUDIT_TIMEOUT_S, every_epoch=True):
            built = build(cfg, rank, acc)
    else:
        built = build(cfg, rank, acc)
    for epoch in range(cfg.epochs):
        where.update(stage=f"epoch {epoch}", items=0)
        if built.set_epoch is not None:
            built.set_epoch(epoch)
        items: list[int] = []
        for batch in built.loader:
            got = _items(batch)
            items.extend(got)
            where["items"] = len(items)
            if step is not None:
                step(got)
        out["epochs"].append(items)


# --------------------------------------------------------------------------- the launch


def _drain(how: str, report_dir: Path) -> str | None:
    """Every rank iterates one tiny loader after a config (built as the config's were): a
    verdict on the config's loaders still pending on this rank (compared by another rank
    after this one left the epoch) is raised here, kept with the config it belongs to, not
    raised in the next config's first batch."""
    try:
        if how == "block":
            import rngaudit

            with rngaudit.audit(report_dir=report_dir, timeout=AUDIT_TIMEOUT_S):
                loader = DataLoader(Items(2))
        else:
            loader = DataLoader(Items(2))
        for _batch in loader:
            pass
    except Exception as exc:
        if type(exc).__module__.split(".")[0] != "rngaudit":
            raise
        return str(exc)[:1000]
    return None


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("outdir", type=Path)
    parser.add_argument("configs", type=Path, help="a JSON list of configs (one a line)")
    parser.add_argument("--how", choices=("block", "env", "none"), required=True)
    args = parser.parse_args(argv)
    faulthandler.dump_traceback_later(WATCHDOG_S, exit=True)
    if not dist.is_initialized():
        dist.init_process_group(backend="gloo", timeout=PG_TIMEOUT)
    rank, world = dist.get_rank(), dist.get_world_size()
    args.outdir.mkdir(parents=True, exist_ok=True)
    configs = [from_json(line) for line in args.configs.read_text().splitlines() if line]
    results: dict[str, Any] = {}
    status = 0
    frozen_libraries.freeze(("accelerate", "accelerate.data_loader", "datasets"))
    for cfg in configs:
        assert cfg.world == world, cfg
        began = time.monotonic()
        try:
            with warnings.catch_warnings(record=True) as caught:
                warnings.simplefilter("always")
                results[cfg.id] = run_config(cfg, args.how, rank, args.outdir / "report")
            results[cfg.id]["warnings"] = [
                str(w.message)[:400] for w in caught if w.category.__name__ == "RNGAuditWarning"
            ]
        except Exception:
            traceback.print_exc()
            results[cfg.id] = {"crashed": traceback.format_exc()}
            status = 1
        gc.collect()  # the config's DDP module goes: no later config is taken for trained by it
        dist.barrier()  # every rank has published what it took: the drain sees it all
        if "crashed" not in results[cfg.id]:
            results[cfg.id]["raised_after"] = _drain(args.how, args.outdir / "report")
        results[cfg.id]["seconds"] = round(time.monotonic() - began, 3)
        dist.barrier()  # the next config starts together, whatever this one raised
    results["_meta"] = {"rngaudit_imported": "rngaudit" in sys.modules, "world": world}
    path = args.outdir / f"result-rank{rank}.json"
    path.write_text(json.dumps(results, indent=1, sort_keys=True) + "\n")
    faulthandler.cancel_dump_traceback_later()
    dist.destroy_process_group()
    return status


if __name__ == "__main__":
    sys.exit(main())
