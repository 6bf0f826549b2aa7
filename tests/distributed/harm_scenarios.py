"""Torchrun-able set-ups that corrupt (or keep) what ranks shard, by mechanisms beyond the seed's.

One launch runs every scenario in turn, the way it is told to audit them:
``block`` (``rngaudit.audit()`` around the set-up), ``env`` (the test sets ``RNGAUDIT=1``; no code
change) or ``none`` (rngaudit never imported: the truth). Each scenario seeds what it needs, so
its per-epoch partition is the same in every launch. Each rank writes ``result-rank<R>.json``:
per scenario, the items it trained on at each epoch (until rngaudit raised) and what was raised.
"""

from __future__ import annotations

import argparse
import contextlib
import datetime
import faulthandler
import gc
import json
import os
import random
import sys
import traceback
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch.utils.data import DataLoader, Dataset, Sampler, Subset, random_split
from torch.utils.data.distributed import DistributedSampler

WATCHDOG_S = float(os.environ.get("RNGAUDIT_SCENARIO_WATCHDOG_S", "300"))
AUDIT_TIMEOUT_S = 60.0
PG_TIMEOUT = datetime.timedelta(seconds=90)


# --------------------------------------------------------------------------- user code


class TorchPermSampler(Sampler[int]):
    """A user's sampler shuffling from the global torch RNG (lerobot's EpisodeAwareSampler)."""

    def __init__(self, n: int) -> None:
        self.n = n

    def __len__(self) -> int:
        return self.n

    def __iter__(self) -> Iterator[int]:
        perm = torch.randperm(self.n)  # no generator: the global one
        yield from perm.tolist()


class NumpyPermSampler(Sampler[int]):
    """A user's sampler shuffling from numpy's global RNG (llm.c, open-mmlab samplers)."""

    def __init__(self, n: int) -> None:
        self.n = n

    def __len__(self) -> int:
        return self.n

    def __iter__(self) -> Iterator[int]:
        yield from np.random.permutation(self.n).tolist()


class Items(Dataset[int]):
    def __init__(self, n: int) -> None:
        self.n = n

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int) -> int:
        return i


# --------------------------------------------------------------------------- the harness


@dataclass
class Ctx:
    how: str
    rank: int
    world: int
    report_dir: Path
    every_epoch: bool = False

    def audited(self, body: Callable[[], Any]) -> Any:
        if self.how != "block":
            return body()
        import rngaudit

        with rngaudit.audit(
            report_dir=self.report_dir, timeout=AUDIT_TIMEOUT_S, every_epoch=self.every_epoch
        ):
            return body()

    def accelerator(self, *, stateful: bool) -> Any:
        from accelerate import Accelerator, DataLoaderConfiguration
        from accelerate.utils import InitProcessGroupKwargs

        return Accelerator(
            cpu=True,
            dataloader_config=DataLoaderConfiguration(use_stateful_dataloader=stateful),
            kwargs_handlers=[InitProcessGroupKwargs(backend="gloo", timeout=PG_TIMEOUT)],
        )


@dataclass
class Plan:
    loader: Any
    epochs: int = 1
    before_epoch: Callable[[int], None] | None = None
    after_epoch: Callable[[int], None] | None = None
    step: Callable[[Any], None] | None = None  # a training step on each batch
    keep: Any = None  # what must stay alive while the loader is iterated (a DDP model)
    take: int | None = None  # samples per epoch before the loop breaks (None: the whole epoch)


@dataclass
class Scenario:
    name: str
    build: Callable[[Ctx], Plan]
    every_epoch: bool = False
    notes: str = ""
    extra: dict[str, Any] = field(default_factory=dict)


def seed_all(seed: int) -> None:
    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)


N = 32


# --------------------------------------------------------------------------- issue 9 classes


def user_sampler_stateful(ctx: Ctx) -> Plan:
    acc = ctx.accelerator(stateful=True)
    seed_all(42)
    if ctx.rank == 0:
        torch.rand(1)  # a rank-0-only evaluation before prepare()
    loader = DataLoader(Items(N), batch_size=2, sampler=TorchPermSampler(N), num_workers=2)
    return Plan(ctx.audited(lambda: acc.prepare(loader)))


def user_numpy_sampler_stateful(ctx: Ctx) -> Plan:
    acc = ctx.accelerator(stateful=True)
    seed_all(42)
    if ctx.rank == 0:
        np.random.rand()
    loader = DataLoader(Items(N), batch_size=2, sampler=NumpyPermSampler(N), num_workers=2)
    return Plan(ctx.audited(lambda: acc.prepare(loader)))


def user_sampler_default_loader(ctx: Ctx) -> Plan:
    acc = ctx.accelerator(stateful=False)
    seed_all(42)
    if ctx.rank == 0:
        torch.rand(1)
    loader = DataLoader(Items(N), batch_size=2, sampler=TorchPermSampler(N))
    return Plan(ctx.audited(lambda: acc.prepare(loader)))


def _dist_loader(ctx: Ctx, ds: Any, seed: int, **kw: Any) -> tuple[Any, Any]:
    def body() -> tuple[Any, Any]:
        sampler: DistributedSampler[Any] = DistributedSampler(ds, shuffle=True, seed=seed)
        return DataLoader(ds, batch_size=2, sampler=sampler, **kw), sampler

    result: tuple[Any, Any] = ctx.audited(body)
    return result


def ds_seed_per_rank(ctx: Ctx) -> Plan:
    seed_all(0)
    loader, _ = _dist_loader(ctx, Items(N), seed=ctx.rank)  # NVlabs/LongLive#71
    return Plan(loader)


def ds_shared_seed_per_rank_global(ctx: Ctx) -> Plan:
    seed_all(100 + ctx.rank)  # per-rank seeds on purpose (dropout)
    loader, sampler = _dist_loader(ctx, Items(N), seed=7)

    def before(epoch: int) -> None:
        sampler.set_epoch(epoch)
        F.dropout(torch.ones(8), p=0.5, training=True)  # differs per rank, by design

    return Plan(loader, epochs=2, before_epoch=before)


def random_split_per_rank(ctx: Ctx) -> Plan:
    seed_all(100 + ctx.rank)
    train, _val = random_split(Items(N), [24, 8])  # no generator: Lightning#18638
    loader, _ = _dist_loader(ctx, train, seed=0)
    return Plan(loader)


def random_split_shared_generator(ctx: Ctx) -> Plan:
    seed_all(100 + ctx.rank)
    train, _val = random_split(Items(N), [24, 8], generator=torch.Generator().manual_seed(5))
    loader, _ = _dist_loader(ctx, train, seed=0)
    return Plan(loader)


def subset_randperm_accelerate(ctx: Ctx) -> Plan:
    acc = ctx.accelerator(stateful=False)
    seed_all(100 + ctx.rank)
    ds = Subset(Items(N), torch.randperm(N)[:24].tolist())  # datasets#5696 shape
    loader = DataLoader(ds, batch_size=2, shuffle=True)
    return Plan(ctx.audited(lambda: acc.prepare(loader)))


def shuffled_list_accelerate(ctx: Ctx) -> Plan:
    acc = ctx.accelerator(stateful=False)
    seed_all(100 + ctx.rank)
    items = list(range(N))
    random.shuffle(items)  # unseeded per-rank shuffle of the sample list, then sharding
    ds = Subset(Items(N), items[:24])
    loader = DataLoader(ds, batch_size=2, shuffle=False)
    return Plan(ctx.audited(lambda: acc.prepare(loader)))


def rank0_eval_default_loader(ctx: Ctx) -> Plan:
    acc = ctx.accelerator(stateful=False)
    seed_all(42)
    if ctx.rank == 0:
        torch.rand(1)  # accelerate broadcasts the sampler's generator at iteration: intact
    loader = DataLoader(Items(N), batch_size=2, shuffle=True, num_workers=2)
    return Plan(ctx.audited(lambda: acc.prepare(loader)), epochs=2)


# --------------------------------------------------------------------------- issue 13 (epochs)


def set_epoch_forgotten(ctx: Ctx) -> Plan:
    seed_all(0)
    loader, _ = _dist_loader(ctx, Items(N), seed=3)
    return Plan(loader, epochs=2)  # set_epoch never called: epoch 1 repeats epoch 0


def set_epoch_differs(ctx: Ctx) -> Plan:
    seed_all(0)
    loader, sampler = _dist_loader(ctx, Items(N), seed=3)
    # a rank resumed with the wrong epoch counter: rank 1 is one epoch behind from epoch 1 on
    return Plan(loader, epochs=2, before_epoch=lambda e: sampler.set_epoch(max(0, e - ctx.rank)))


def set_epoch_correct(ctx: Ctx) -> Plan:
    seed_all(100 + ctx.rank)
    loader, sampler = _dist_loader(ctx, Items(N), seed=3, num_workers=2)
    return Plan(loader, epochs=2, before_epoch=sampler.set_epoch)


def mid_training_rank0_eval(ctx: Ctx) -> Plan:
    acc = ctx.accelerator(stateful=False)
    seed_all(42)
    loader = DataLoader(Items(N), batch_size=2, sampler=TorchPermSampler(N))

    def evaluate(epoch: int) -> None:
        if ctx.rank == 0:
            torch.rand(3)  # a rank-0-only evaluation after epoch 0 (lerobot#3768)

    return Plan(ctx.audited(lambda: acc.prepare(loader)), epochs=2, after_epoch=evaluate)


def resume_from_stale_checkpoint(ctx: Ctx) -> Plan:
    """A crash after epoch 0; every rank resumes a fresh loader from its own checkpoint, but
    rank 1's checkpoint is one epoch stale (Megatron-LM#6858 shape)."""
    from torchdata.stateful_dataloader import StatefulDataLoader

    seed_all(0)
    checkpoints: dict[str, Any] = {}

    def build() -> tuple[Any, Any]:
        def body() -> tuple[Any, Any]:
            sampler: DistributedSampler[Any] = DistributedSampler(Items(N), shuffle=True, seed=11)
            return StatefulDataLoader(Items(N), batch_size=2, sampler=sampler), sampler

        result: tuple[Any, Any] = ctx.audited(body)
        return result

    loader, sampler = build()
    holder = {"loader": loader, "sampler": sampler}

    class Resuming:
        def __iter__(self) -> Iterator[Any]:
            return iter(holder["loader"])

    def before(epoch: int) -> None:
        if epoch == 1:  # the resume: new objects, state from the checkpoint
            holder["loader"], holder["sampler"] = build()
            holder["loader"].load_state_dict(checkpoints["loader"])
            stale = ctx.rank == 1
            holder["sampler"].set_epoch(checkpoints["epoch"] - (1 if stale else 0))
        else:
            holder["sampler"].set_epoch(epoch)

    def after(epoch: int) -> None:
        checkpoints["loader"] = holder["loader"].state_dict()
        checkpoints["epoch"] = epoch + 1

    return Plan(Resuming(), epochs=2, before_epoch=before, after_epoch=after)


def rank0_only_eval_loader(ctx: Ctx) -> Plan:
    """Training with a DistributedSampler; after each epoch rank 0 alone iterates an evaluation
    loader (no DistributedSampler): it is not exchanged, so nothing waits or raises."""
    seed_all(0)
    loader, sampler = _dist_loader(ctx, Items(N), seed=3)
    evaluation = DataLoader(Items(8), batch_size=4, shuffle=True)

    def evaluate(epoch: int) -> None:
        if ctx.rank == 0:
            for _batch in evaluation:
                pass

    return Plan(loader, epochs=2, before_epoch=sampler.set_epoch, after_epoch=evaluate)


def eval_all_ranks(ctx: Ctx) -> Plan:
    acc = ctx.accelerator(stateful=False)
    seed_all(42)
    loader = DataLoader(Items(N), batch_size=2, sampler=TorchPermSampler(N))

    def evaluate(epoch: int) -> None:
        torch.rand(3)  # every rank evaluates: the global RNG stays equal

    return Plan(ctx.audited(lambda: acc.prepare(loader)), epochs=2, after_epoch=evaluate)


def _hf_items(n: int) -> Any:
    import datasets  # Hugging Face (imported here: the other scenarios do without it)

    return datasets.Dataset.from_dict({"i": list(range(n))})


def hf_map_per_rank_augment(ctx: Ctx) -> Plan:
    """A per-rank augmentation baked in by ``.map()``: each rank's rows differ in content
    (and so in fingerprint), while every rank shards the same samples."""
    seed_all(0)
    rng = np.random.default_rng(ctx.rank)  # per-rank augmentation, by design
    ds = _hf_items(N).map(lambda ex: {"x": ex["i"] + float(rng.random())})
    loader, sampler = _dist_loader(ctx, ds.with_format("torch"), seed=3)
    return Plan(loader, epochs=2, before_epoch=sampler.set_epoch)


def hf_shuffle_per_rank(ctx: Ctx) -> Plan:
    """``Dataset.shuffle(seed=rank)`` before a DistributedSampler: each rank shards its own
    order of the rows (the indices mapping differs), duplicating some and dropping others."""
    seed_all(0)
    ds = _hf_items(N).shuffle(seed=ctx.rank).with_format("torch")
    loader, _ = _dist_loader(ctx, ds, seed=3)
    return Plan(loader)


# --------------------------------------------------------------------------- issue 21 (observed)


class GlobalShuffleDistributedSampler(DistributedSampler[int]):
    """A DistributedSampler subclass whose ``__iter__`` shuffles from the global generator:
    its seed and epoch are equal on every rank, the order it shards is not."""

    def __iter__(self) -> Iterator[int]:
        perm = torch.randperm(len(self.dataset)).tolist()  # type: ignore[arg-type]
        return iter(perm[self.rank : self.total_size : self.num_replicas])


def ds_subclass_global_shuffle(ctx: Ctx) -> Plan:
    seed_all(100 + ctx.rank)  # per-rank seeds (dropout): the subclass shuffles from them
    ds = Items(N)
    loader = ctx.audited(
        lambda: DataLoader(ds, batch_size=2, sampler=GlobalShuffleDistributedSampler(ds, seed=3))
    )
    return Plan(loader)


class YieldFromGlobalShuffleDistributedSampler(DistributedSampler[int]):
    """The same harm, a generator ``__iter__`` that yields from its share: the list iterator
    it delegates to holds the whole share once the first index is drawn."""

    def __iter__(self) -> Iterator[int]:
        perm = torch.randperm(len(self.dataset)).tolist()  # type: ignore[arg-type]
        yield from perm[self.rank : self.total_size : self.num_replicas]


def _per_rank_subclass(ctx: Ctx, sampler: type[DistributedSampler[int]]) -> Plan:
    """Per-rank global seeds; the subclass draws its order from them."""
    seed_all(100 + ctx.rank)
    ds = Items(N)
    return Plan(ctx.audited(lambda: DataLoader(ds, batch_size=2, sampler=sampler(ds))))


def ds_subclass_yield_from_global_shuffle(ctx: Ctx) -> Plan:
    return _per_rank_subclass(ctx, YieldFromGlobalShuffleDistributedSampler)


class LazyGlobalShuffleDistributedSampler(DistributedSampler[int]):
    """The same harm, yielded index by index from a loop: what the loop's body hands out is
    its own, so its epoch cannot be read before it is drawn."""

    def __iter__(self) -> Iterator[int]:
        perm = torch.randperm(len(self.dataset)).tolist()  # type: ignore[arg-type]
        for i in perm[self.rank : self.total_size : self.num_replicas]:
            yield int(i)  # one at a time: nothing holds the rest of the epoch


def ds_subclass_lazy_global_shuffle(ctx: Ctx) -> Plan:
    return _per_rank_subclass(ctx, LazyGlobalShuffleDistributedSampler)


class LazyOwnShareDistributedSampler(DistributedSampler[int]):
    """Correct: a fixed share per rank (``rank::world``), yielded index by index in an order
    of the rank's own, drawn from the per-rank global generator: the draws differ, the shares
    cannot be read ahead, the partition is intact."""

    def __iter__(self) -> Iterator[int]:
        share = list(range(self.rank, self.total_size, self.num_replicas))
        for i in torch.randperm(len(share)).tolist():
            yield share[i] % len(self.dataset)  # type: ignore[arg-type]


class LazyWithReplacementDistributedSampler(DistributedSampler[int]):
    """By design: each rank draws its epoch independently with replacement from the per-rank
    global generator, index by index: ranks overlap, and each repeats samples of its own."""

    def __iter__(self) -> Iterator[int]:
        for i in torch.randint(len(self.dataset), (self.num_samples,)).tolist():  # type: ignore[arg-type]
            yield int(i)


LAZY_DDP_N, LAZY_DDP_BATCH = 1024, 4


def _lazy_subclass_ddp(
    ctx: Ctx,
    sampler: type[DistributedSampler[int]],
    seed: int | None = None,
    n: int = LAZY_DDP_N,
    batch: int = LAZY_DDP_BATCH,
) -> Plan:
    """Global seeds (per rank: ``100 + rank`` unless ``seed``) under DDP (a training loop),
    1,024 samples in batches of 4 unless told."""
    model = _ddp_model()
    seed_all(100 + ctx.rank if seed is None else seed)
    ds = Items(n)
    loader = ctx.audited(lambda: DataLoader(ds, batch_size=batch, sampler=sampler(ds)))
    return Plan(loader, step=_ddp_step(model), keep=model)


def ds_subclass_lazy_global_shuffle_ddp(ctx: Ctx) -> Plan:
    """The lazy subclass's harm in a DDP training loop: its shares cannot be read before the
    epoch, so what each rank was handed is compared at training steps 2, 4, 8, ... (its first
    batches do not overlap, measured), each before the next step."""
    return _lazy_subclass_ddp(ctx, LazyGlobalShuffleDistributedSampler)


def ds_subclass_lazy_own_share_ddp(ctx: Ctx) -> Plan:
    """Its twin: the draws differ the same way, each rank yields its own fixed share: compared
    as drawn, never an error."""
    return _lazy_subclass_ddp(ctx, LazyOwnShareDistributedSampler)


def ds_subclass_lazy_with_replacement_ddp(ctx: Ctx) -> Plan:
    """Its other twin: independent sampling with replacement per rank, overlapping by design
    (its prefixes share samples long before the epoch's end): compared as drawn, never an
    error. Seeds 111 and 112: their first 4 batches share 2 samples while neither rank has
    repeated one yet (what a permutation's shares would show; measured without rngaudit)."""
    return _lazy_subclass_ddp(ctx, LazyWithReplacementDistributedSampler, seed=111 + ctx.rank)


class OwnShareOrderDistributedSampler(DistributedSampler[int]):
    """Correct: a fixed share per rank (``rank::world``), put in an order of the rank's own,
    drawn from the per-rank global generator: the draws differ, the partition is intact."""

    def __iter__(self) -> Iterator[int]:
        share = list(range(self.rank, self.total_size, self.num_replicas))
        order = torch.randperm(len(share)).tolist()
        return iter([share[i] % len(self.dataset) for i in order])  # type: ignore[arg-type]


def ds_subclass_own_share_per_rank_order(ctx: Ctx) -> Plan:
    seed_all(100 + ctx.rank)
    ds = Items(N)
    sampler = OwnShareOrderDistributedSampler(ds, seed=3)
    loader = ctx.audited(lambda: DataLoader(ds, batch_size=2, sampler=sampler))
    return Plan(loader, epochs=2, before_epoch=sampler.set_epoch)


def ds_subclass_seeded_shuffle(ctx: Ctx) -> Plan:
    """The clean twin: the subclass shuffles from a generator seeded with seed + epoch."""

    class Seeded(DistributedSampler[int]):
        def __iter__(self) -> Iterator[int]:
            g = torch.Generator().manual_seed(self.seed + self.epoch)
            perm = torch.randperm(len(self.dataset), generator=g).tolist()  # type: ignore[arg-type]
            return iter(perm[self.rank : self.total_size : self.num_replicas])

    seed_all(100 + ctx.rank)
    ds = Items(N)
    sampler = Seeded(ds, seed=3)
    loader = ctx.audited(lambda: DataLoader(ds, batch_size=2, sampler=sampler))
    return Plan(loader, epochs=2, before_epoch=sampler.set_epoch)


class Wrapper(Dataset[int]):
    """A user's wrapper dataset around another (``self.dataset``), as much real code has."""

    def __init__(self, dataset: Any) -> None:
        self.dataset = dataset

    def __len__(self) -> int:
        return len(self.dataset)

    def __getitem__(self, i: int) -> int:
        return int(self.dataset[i])


def wrapper_random_split_per_rank(ctx: Ctx) -> Plan:
    seed_all(100 + ctx.rank)
    whole: Any = torch.utils.data.ConcatDataset([Items(N // 2), Offset(Items(N // 2), N // 2)])
    train, _held_out = random_split(whole, [24, 8])  # no generator, per-rank seeds
    loader, _ = _dist_loader(ctx, Wrapper(train), seed=0)
    return Plan(loader)


class Offset(Dataset[int]):
    def __init__(self, inner: Any, offset: int) -> None:
        self.inner, self.offset = inner, offset

    def __len__(self) -> int:
        return len(self.inner)

    def __getitem__(self, i: int) -> int:
        return int(self.inner[i]) + self.offset


def subset_reshuffled_in_place_on_rank0(ctx: Ctx) -> Plan:
    seed_all(0)
    ds = Subset(Items(N), list(range(N)))
    loader, sampler = _dist_loader(ctx, ds, seed=3)

    def after(epoch: int) -> None:
        if ctx.rank == 0:
            random.Random(epoch).shuffle(ds.indices)  # type: ignore[arg-type]  # rank 0 only

    return Plan(loader, epochs=2, before_epoch=sampler.set_epoch, after_epoch=after)


class PermStream(torch.utils.data.IterableDataset[int]):
    """A user's iterable dataset that shuffles with a seed of its own (accelerate synchronizes
    the global generators across ranks at iteration, not a dataset's)."""

    def __init__(self, seed: int, n: int = N) -> None:
        self.seed, self.n = seed, n

    def __iter__(self) -> Iterator[int]:
        yield from np.random.default_rng(self.seed).permutation(self.n).tolist()


def _stream_accelerate(ctx: Ctx, seed: int, n: int = N) -> Plan:
    from accelerate import Accelerator, DataLoaderConfiguration
    from accelerate.utils import InitProcessGroupKwargs

    acc = Accelerator(  # each rank reads the stream and keeps its slice (IterableDatasetShard)
        cpu=True,
        dataloader_config=DataLoaderConfiguration(dispatch_batches=False),
        kwargs_handlers=[InitProcessGroupKwargs(backend="gloo", timeout=PG_TIMEOUT)],
    )
    seed_all(seed)
    loader = DataLoader(PermStream(seed, n), batch_size=2)
    return Plan(ctx.audited(lambda: acc.prepare(loader)))


def stream_shard_device_seeds(ctx: Ctx) -> Plan:
    """accelerate's IterableDatasetShard over a stream shuffled from per-rank seeds."""
    return _stream_accelerate(ctx, 100 + ctx.rank)


def stream_shard_shared_seed(ctx: Ctx) -> Plan:
    return _stream_accelerate(ctx, 100)


def _hf_stream(ctx: Ctx, seed: int, shards: int = 3, n: int = N) -> Plan:
    from datasets.distributed import split_dataset_by_node

    seed_all(0)
    stream = _hf_items(n).to_iterable_dataset(num_shards=shards).shuffle(seed=seed, buffer_size=4)
    part = split_dataset_by_node(stream, rank=ctx.rank, world_size=ctx.world)
    return Plan(ctx.audited(lambda: DataLoader(part.with_format("torch"), batch_size=2)))


def hf_stream_shuffle_seed_per_rank(ctx: Ctx) -> Plan:
    """``IterableDataset.shuffle(seed=rank)`` + ``split_dataset_by_node`` with 3 shards over 2
    ranks: split by examples (every other example of each rank's own shuffle of the stream)."""
    return _hf_stream(ctx, ctx.rank)


def hf_stream_shuffle_shared_seed(ctx: Ctx) -> Plan:
    return _hf_stream(ctx, 3)


def hf_stream_split_by_shards_seed_per_rank(ctx: Ctx) -> Plan:
    """8 shards over 2 ranks: split by shards. The seed orders the shard list before each rank
    takes every other shard of its own list; seeds 0 and 1 leave the ranks disjoint shards
    (intact, measured; other seeds need not: tests/test_odd_rank.py)."""
    return _hf_stream(ctx, ctx.rank, shards=8)


def _spawn_style(ctx: Ctx, seed: int) -> Plan:
    """The DDP tutorial's shape (``mp.spawn`` launchers): each rank takes every world-th entry
    of an order it draws itself, and shuffles its own shard; no sampler shards anything."""
    seed_all(seed)
    order = list(torch.utils.data.RandomSampler(Items(N)))  # the global generator
    shard = Subset(Items(N), order[ctx.rank :: ctx.world])
    return Plan(ctx.audited(lambda: DataLoader(shard, batch_size=2, shuffle=True)))


def spawn_style_shards_per_rank_seed(ctx: Ctx) -> Plan:
    return _spawn_style(ctx, 100 + ctx.rank)


def spawn_style_shards_shared_seed(ctx: Ctx) -> Plan:
    return _spawn_style(ctx, 100)


# --------------------------------------------------------------------------- one odd rank
# For 3-4 ranks (tests/test_odd_rank.py): the last rank alone differs, the others agree.

N_ODD = 36  # a multiple of 2, 3 and 4: no padding, so any duplicate is the harm


def _odd_seed(ctx: Ctx, differs: bool) -> int:
    return 100 + int(differs and ctx.rank == ctx.world - 1)


def _odd_subclass(ctx: Ctx, differs: bool) -> Plan:
    seed_all(_odd_seed(ctx, differs))
    ds = Items(N_ODD)
    sampler = GlobalShuffleDistributedSampler(ds, seed=3)
    return Plan(ctx.audited(lambda: DataLoader(ds, batch_size=2, sampler=sampler)))


def odd_subclass_global_shuffle(ctx: Ctx) -> Plan:
    return _odd_subclass(ctx, True)


def odd_subclass_global_shuffle_twin(ctx: Ctx) -> Plan:
    return _odd_subclass(ctx, False)


def _odd_spawn_style(ctx: Ctx, differs: bool) -> Plan:
    seed_all(_odd_seed(ctx, differs))
    order = list(torch.utils.data.RandomSampler(Items(N_ODD)))
    shard = Subset(Items(N_ODD), order[ctx.rank :: ctx.world])
    return Plan(ctx.audited(lambda: DataLoader(shard, batch_size=2, shuffle=True)))


def odd_spawn_style(ctx: Ctx) -> Plan:
    return _odd_spawn_style(ctx, True)


def odd_spawn_style_twin(ctx: Ctx) -> Plan:
    return _odd_spawn_style(ctx, False)


def _odd_ds_seed(ctx: Ctx, differs: bool) -> Plan:
    seed_all(0)
    loader, _ = _dist_loader(ctx, Items(N_ODD), seed=_odd_seed(ctx, differs))
    return Plan(loader)


def odd_ds_seed(ctx: Ctx) -> Plan:
    return _odd_ds_seed(ctx, True)


def odd_ds_seed_twin(ctx: Ctx) -> Plan:
    return _odd_ds_seed(ctx, False)


def _odd_wrapper_random_split(ctx: Ctx, differs: bool) -> Plan:
    seed_all(_odd_seed(ctx, differs))
    half = N_ODD // 2
    whole: Any = torch.utils.data.ConcatDataset([Items(half), Offset(Items(half), half)])
    train, _held_out = random_split(whole, [24, 12])  # no generator: the global one
    loader, _ = _dist_loader(ctx, Wrapper(train), seed=0)
    return Plan(loader)


def odd_wrapper_random_split(ctx: Ctx) -> Plan:
    """A wrapper dataset around a ``random_split`` of a ``ConcatDataset``: the last rank's
    split differs (its seed), the others agree."""
    return _odd_wrapper_random_split(ctx, True)


def odd_wrapper_random_split_twin(ctx: Ctx) -> Plan:
    return _odd_wrapper_random_split(ctx, False)


ODD_RESHUFFLER = 1  # the rank that reshuffles alone: neither rank 0 nor the last


def _odd_subset_reshuffled(ctx: Ctx, differs: bool) -> Plan:
    seed_all(0)
    ds = Subset(Items(N_ODD), list(range(N_ODD)))
    loader, sampler = _dist_loader(ctx, ds, seed=3)

    def after(epoch: int) -> None:
        if not differs or ctx.rank == ODD_RESHUFFLER:
            random.Random(epoch).shuffle(ds.indices)  # type: ignore[arg-type]  # in place

    return Plan(loader, epochs=2, before_epoch=sampler.set_epoch, after_epoch=after)


def odd_subset_reshuffled_in_place(ctx: Ctx) -> Plan:
    """``Subset.indices`` reshuffled in place after epoch 0 by rank 1 alone."""
    return _odd_subset_reshuffled(ctx, True)


def odd_subset_reshuffled_in_place_twin(ctx: Ctx) -> Plan:
    """The twin: every rank reshuffles its indices in place alike."""
    return _odd_subset_reshuffled(ctx, False)


def odd_hf_stream_shuffle_seed(ctx: Ctx) -> Plan:
    """``IterableDataset.shuffle(seed=)`` + ``split_dataset_by_node``, 4 shards over 3 ranks:
    split by examples; the last rank's shuffle seed differs."""
    return _hf_stream(ctx, _odd_seed(ctx, True), shards=4, n=N_ODD)


def odd_hf_stream_shuffle_seed_twin(ctx: Ctx) -> Plan:
    return _hf_stream(ctx, _odd_seed(ctx, False), shards=4, n=N_ODD)


def _odd_split_by_shards(ctx: Ctx, last: int) -> Plan:
    """6 shards over 3 ranks: split by shards. The shuffle seed orders the shard list before
    each rank takes every third shard of its own list: ``last`` (the last rank's seed; the
    others' is 100) decides whether the ranks still read disjoint shards."""
    return _hf_stream(ctx, last if ctx.rank == ctx.world - 1 else 100, shards=6, n=N_ODD)


def odd_hf_stream_split_by_shards(ctx: Ctx) -> Plan:
    """Seed 101 on the last rank: it reads the same shards as rank 0 (measured)."""
    return _odd_split_by_shards(ctx, 101)


def odd_hf_stream_split_by_shards_intact(ctx: Ctx) -> Plan:
    """Seed 102 on the last rank: its list differs, yet the shards it takes are the ones the
    others leave (measured intact): seeds differ, the partition does not."""
    return _odd_split_by_shards(ctx, 102)


def odd_hf_stream_split_by_shards_twin(ctx: Ctx) -> Plan:
    return _odd_split_by_shards(ctx, 100)


def odd_stream_shard_seed(ctx: Ctx) -> Plan:
    """accelerate's IterableDatasetShard over a stream whose seed differs on the last rank
    (36 samples: whole batches of 3 x 2, so no shard pads)."""
    return _stream_accelerate(ctx, _odd_seed(ctx, True), N_ODD)


def odd_stream_shard_seed_twin(ctx: Ctx) -> Plan:
    return _stream_accelerate(ctx, _odd_seed(ctx, False), N_ODD)


def _reseeded_after_block(ctx: Ctx, seed: int, n: int = N) -> Plan:
    acc = ctx.accelerator(stateful=False)
    seed_all(seed)
    loader = DataLoader(Items(n), batch_size=2, sampler=TorchPermSampler(n))
    prepared = ctx.audited(lambda: acc.prepare(loader))
    return Plan(prepared, before_epoch=lambda epoch: seed_all(42))


def reseeded_after_block(ctx: Ctx) -> Plan:
    """Per-rank seeds at set-up, a sampler shuffling from the global generator, and every rank
    reseeded identically between the block and the first iteration: intact."""
    return _reseeded_after_block(ctx, 100 + ctx.rank)


def odd_reseeded_after_block(ctx: Ctx) -> Plan:
    """The last rank's seed differs at set-up; every rank is reseeded alike before iterating
    (36 samples: whole batches on each of 3 ranks, so nothing is padded)."""
    return _reseeded_after_block(ctx, _odd_seed(ctx, True), N_ODD)


# --------------------------------------------------------------------------- issue 21 (unsharded)
# Loaders no known class shards: a sampler that shards itself, a loader with no sampler under
# DDP. Their epochs are published through the store and compared when every rank has.


class RankShardSampler(Sampler[int]):
    """A sampler that shards itself (lerobot's EpisodeAwareSampler shape): a permutation drawn
    from the global generator (or ``generator``), every world-th entry from the rank's."""

    def __init__(self, n: int, rank: int, world: int, generator: Any = None) -> None:
        self.n, self.rank, self.world, self.generator = n, rank, world, generator

    def __len__(self) -> int:
        return len(range(self.rank, self.n, self.world))

    def __iter__(self) -> Iterator[int]:
        perm = torch.randperm(self.n, generator=self.generator)
        yield from perm[self.rank :: self.world].tolist()


class LazyRankShardSampler(RankShardSampler):
    """The same, yielding each index as it is asked for: its epoch cannot be read ahead."""

    def __iter__(self) -> Iterator[int]:
        perm = torch.randperm(self.n, generator=self.generator)
        for i in perm[self.rank :: self.world].tolist():
            yield int(i)  # one at a time: nothing holds the rest of the epoch


def _ddp_step(model: Any) -> Callable[[Any], None]:
    def step(batch: Any) -> None:
        x = torch.as_tensor(_items(batch), dtype=torch.float32).view(-1, 1)
        model(x).sum().backward()  # DDP all-reduces the gradients: the ranks step together

    return step


def _ddp_model() -> Any:
    torch.manual_seed(0)
    return torch.nn.parallel.DistributedDataParallel(torch.nn.Linear(1, 1))


def _self_sharding(
    ctx: Ctx,
    evaluator: int | None,
    global_draws: bool,
    n: int = N,
    lazy: bool = False,
    batch: int | None = None,
) -> Plan:
    model = _ddp_model()  # the ranks step together (accelerate's DDP, in lerobot)
    seed_all(42)
    ds = Items(n)
    sampler = (LazyRankShardSampler if lazy else RankShardSampler)(n, ctx.rank, ctx.world)
    batch = batch or (8 if lazy else 2)
    loader = ctx.audited(lambda: DataLoader(ds, batch_size=batch, sampler=sampler))
    # every iteration of a DataLoader draws its workers' base seed from its generator: the
    # global one unless it has its own
    own = None if global_draws else torch.Generator().manual_seed(1)
    evaluation = DataLoader(Items(8), batch_size=4, shuffle=True, generator=own)

    def evaluate(epoch: int) -> None:
        if ctx.rank == evaluator:  # that rank alone evaluates: its global generator moves on
            for _batch in evaluation:
                pass

    return Plan(loader, epochs=2, after_epoch=evaluate, step=_ddp_step(model), keep=model)


def self_sharding_rank0_eval(ctx: Ctx) -> Plan:
    """The sampler shards a permutation of the global generator; rank 0 alone runs a shuffled
    evaluation loader after epoch 0 (its RandomSampler draws its seed from the global
    generator): epoch 1's permutations differ across ranks."""
    return _self_sharding(ctx, 0, True)


def self_sharding_lazy_rank0_eval(ctx: Ctx) -> Plan:
    """The same harm, the sampler yielding lazily (batches of 8): only each rank's first batch
    is known before the first training step of epoch 1."""
    return _self_sharding(ctx, 0, True, lazy=True)


def self_sharding_lazy_late_overlap(ctx: Ctx) -> Plan:
    """The same harm, lazily yielded in batches of 2 of 64 samples: epoch 1's first batches
    do not overlap (measured), later ones do; compared again as the epoch is drawn."""
    return _self_sharding(ctx, 0, True, n=64, lazy=True, batch=2)


def self_sharding_lazy_late_overlap_twin(ctx: Ctx) -> Plan:
    """Its twin: rank 0's evaluation loader draws from a generator of its own, epoch 1 still
    partitions; compared again as it is drawn, never an error."""
    return _self_sharding(ctx, 0, False, n=64, lazy=True, batch=2)


def self_sharding_rank0_eval_own_generator(ctx: Ctx) -> Plan:
    """The twin: rank 0's evaluation loader draws from a generator of its own; it is still
    iterated by rank 0 alone (never waited for, never compared)."""
    return _self_sharding(ctx, 0, False)


def _self_sharding_reseeded(ctx: Ctx, seed: int, n: int = N) -> Plan:
    seed_all(seed)
    ds = Items(n)
    sampler = RankShardSampler(n, ctx.rank, ctx.world)
    loader = ctx.audited(lambda: DataLoader(ds, batch_size=2, sampler=sampler))
    return Plan(loader, epochs=2, before_epoch=lambda epoch: seed_all(42 + epoch))


def self_sharding_reseeded_after_block(ctx: Ctx) -> Plan:
    """Per-rank seeds at set-up, the ranks reseeded identically before each epoch: intact."""
    return _self_sharding_reseeded(ctx, 100 + ctx.rank)


def odd_self_sharding_reseeded_after_block(ctx: Ctx) -> Plan:
    """The last rank's seed differs at set-up; every rank reseeded alike before each epoch."""
    return _self_sharding_reseeded(ctx, _odd_seed(ctx, True), N_ODD)


def _no_sampler(ctx: Ctx, ddp: bool, n: int = N, workers: int = 0) -> Plan:
    seed_all(0)  # identical on every rank
    model = _ddp_model() if ddp else torch.nn.Linear(1, 1)
    loader = ctx.audited(
        lambda: DataLoader(Items(n), batch_size=4, shuffle=True, num_workers=workers)
    )
    return Plan(loader, epochs=2, step=_ddp_step(model), keep=model)


def ddp_shuffled_no_sampler(ctx: Ctx) -> Plan:
    """DDP, a shuffled DataLoader with no DistributedSampler, identically seeded ranks: every
    rank trains the whole dataset each epoch (world-size-fold duplication)."""
    return _no_sampler(ctx, True)


def ddp_compiled_no_sampler(ctx: Ctx) -> Plan:
    """The same, the DDP module called through ``torch.compile`` (the eager backend: no C++
    compiler needed): the first-step comparison's pre-hook sits on the DDP module inside."""
    plan = _no_sampler(ctx, True)
    compiled = torch.compile(plan.keep, backend="eager")
    return Plan(plan.loader, epochs=2, step=_ddp_step(compiled), keep=plan.keep)


def fsdp_shuffled_no_sampler(ctx: Ctx) -> Plan:
    """The same under FSDP2 (``fully_shard``, on CPU with gloo): every rank trains the whole
    dataset; the first-step comparison's pre-hook sits on the sharded module."""
    from torch.distributed.fsdp import fully_shard

    seed_all(0)  # identical on every rank
    model = torch.nn.Sequential(torch.nn.Linear(1, 4), torch.nn.Linear(4, 1))
    fully_shard(model)
    loader = ctx.audited(lambda: DataLoader(Items(N), batch_size=4, shuffle=True))
    return Plan(loader, epochs=2, step=_ddp_step(model), keep=model)


def fsdp1_shuffled_no_sampler(ctx: Ctx) -> Plan:
    """The same under FSDP1 (``FullyShardedDataParallel``, on CPU with gloo): its ``__init__``
    is noted like DDP's, the pre-hook sits on the wrapper module."""
    from torch.distributed.fsdp import FullyShardedDataParallel

    seed_all(0)  # identical on every rank
    inner = torch.nn.Sequential(torch.nn.Linear(1, 4), torch.nn.Linear(4, 1))
    model = FullyShardedDataParallel(inner, device_id=torch.device("cpu"))
    loader = ctx.audited(lambda: DataLoader(Items(N), batch_size=4, shuffle=True))
    return Plan(loader, epochs=2, step=_ddp_step(model), keep=model)


# scenarios whose module outlives them until a collection (compiled code holds it; FSDP's
# hooks form cycles): dropped after them, so later scenarios see no data-parallel module
COMPILED = {"ddp_compiled_no_sampler", "fsdp_shuffled_no_sampler", "fsdp1_shuffled_no_sampler"}


def ddp_shuffled_no_sampler_workers(ctx: Ctx) -> Plan:
    """The same with two DataLoader workers (forked): the index batches are still drawn in the
    main process, and the first-step comparison still meets at the DDP module's forward."""
    return _no_sampler(ctx, True, workers=2)


class RankPart(Dataset[int]):
    """A dataset that picks its part by rank inside ``__getitem__`` (nothing on the object names
    the rank): every rank draws the same indices, each reads samples of its own."""

    def __init__(self, n: int) -> None:
        self.n = n

    def __len__(self) -> int:
        return self.n // dist.get_world_size()

    def __getitem__(self, i: int) -> int:
        return i * dist.get_world_size() + dist.get_rank()


def ddp_rank_part_in_getitem(ctx: Ctx) -> Plan:
    """DDP, a shuffled loader with no sampler, identical seeds, over a dataset that picks the
    rank's part in ``__getitem__``: the same indices, disjoint samples (intact)."""
    seed_all(0)
    model = _ddp_model()
    loader = ctx.audited(lambda: DataLoader(RankPart(N), batch_size=4, shuffle=True))
    return Plan(loader, epochs=2, step=_ddp_step(model), keep=model)


def tp_group_same_batch(ctx: Ctx) -> Plan:
    """No data-parallel module: a tensor-parallel-style group whose ranks are meant to see
    the same batch (identical seeds, no sampler): intended, never an error."""
    return _no_sampler(ctx, False)


def ddp_self_shard_per_rank_augment(ctx: Ctx) -> Plan:
    """DDP, a self-sharding sampler with a generator seeded identically on every rank, and
    per-rank global seeds for augmentation: intact."""
    seed_all(100 + ctx.rank)
    model = _ddp_model()
    seed_all(100 + ctx.rank)
    generator = torch.Generator().manual_seed(7)
    sampler = RankShardSampler(N, ctx.rank, ctx.world, generator)
    loader = ctx.audited(lambda: DataLoader(Items(N), batch_size=2, sampler=sampler))

    def step(batch: Any) -> None:
        _ddp_step(model)(batch)
        F.dropout(torch.ones(4), p=0.5, training=True)  # per-rank augmentation, by design

    return Plan(loader, epochs=2, step=step, keep=model)


class FileShard(Dataset[int]):
    """A rank's own pre-sharded file (its samples' global ids), loaded whole."""

    def __init__(self, path: Path) -> None:
        self.path = str(path)
        self.data = np.load(path)

    def __len__(self) -> int:
        return len(self.data)

    def __getitem__(self, i: int) -> int:
        return int(self.data[i])


def ddp_presharded_files(ctx: Ctx) -> Plan:
    """DDP, every rank reads its own disjoint file and shuffles it, identical seeds: intact."""
    path = ctx.report_dir.parent / f"shard-{ctx.rank}.npy"
    part = N // ctx.world
    np.save(path, np.arange(ctx.rank * part, (ctx.rank + 1) * part))
    seed_all(0)
    model = _ddp_model()
    loader = ctx.audited(lambda: DataLoader(FileShard(path), batch_size=2, shuffle=True))
    return Plan(loader, epochs=2, step=_ddp_step(model), keep=model)


def ddp_with_replacement(ctx: Ctx) -> Plan:
    """DDP, independent with-replacement samplers seeded per rank: overlap by design."""
    seed_all(100 + ctx.rank)
    model = _ddp_model()
    seed_all(100 + ctx.rank)
    sampler = torch.utils.data.RandomSampler(Items(N), replacement=True, num_samples=N // 2)
    loader = ctx.audited(lambda: DataLoader(Items(N), batch_size=2, sampler=sampler))
    return Plan(loader, epochs=2, step=_ddp_step(model), keep=model)


def ddp_small_epoch_with_replacement(ctx: Ctx) -> Plan:
    """DDP, independent with-replacement samplers seeded per rank drawing a small epoch of a
    big root (1,600 of 1M samples a rank): seeds 10 and 11 share 2 samples and neither rank
    repeats one (measured), as such sampling does about one epoch in three: by design."""
    model = _ddp_model()
    seed_all(10 + ctx.rank)
    ds = Items(1_000_000)
    sampler = torch.utils.data.RandomSampler(ds, replacement=True, num_samples=1600)
    loader = ctx.audited(lambda: DataLoader(ds, batch_size=32, sampler=sampler))
    return Plan(loader, step=_ddp_step(model), keep=model)


def dispatch_batches_loader(ctx: Ctx) -> Plan:
    """accelerate with dispatch_batches=True: rank 0 reads every batch and sends each rank
    its slice (the other ranks iterate no loader of their own): intact."""
    from accelerate import Accelerator, DataLoaderConfiguration
    from accelerate.utils import InitProcessGroupKwargs

    acc = Accelerator(
        cpu=True,
        dataloader_config=DataLoaderConfiguration(dispatch_batches=True),
        kwargs_handlers=[InitProcessGroupKwargs(backend="gloo", timeout=PG_TIMEOUT)],
    )
    seed_all(100 + ctx.rank)
    loader = DataLoader(Items(N), batch_size=2, shuffle=True)
    return Plan(ctx.audited(lambda: acc.prepare(loader)), epochs=2)


def _padded(ctx: Ctx, drop_last: bool) -> Plan:
    seed_all(0)
    ds = Items(N + 1)  # not a multiple of the world size
    sampler: DistributedSampler[Any] = DistributedSampler(ds, seed=3, drop_last=drop_last)
    loader = ctx.audited(lambda: DataLoader(ds, batch_size=2, sampler=sampler))
    return Plan(loader, epochs=2, before_epoch=sampler.set_epoch)


def ds_padding(ctx: Ctx) -> Plan:
    """DistributedSampler pads the last share with samples from the start: intended."""
    return _padded(ctx, False)


def ds_drop_last(ctx: Ctx) -> Plan:
    return _padded(ctx, True)


def ds_no_shuffle_seed_per_rank(ctx: Ctx) -> Plan:
    """DDP, DistributedSampler(shuffle=False, seed=rank): the seed is never used without
    shuffle, so the ranks take disjoint contiguous shares: intact (issue 33)."""
    model = _ddp_model()
    seed_all(100 + ctx.rank)

    def body() -> tuple[Any, Any]:
        sampler: DistributedSampler[Any] = DistributedSampler(
            Items(N), shuffle=False, seed=ctx.rank
        )
        return DataLoader(Items(N), batch_size=2, sampler=sampler), sampler

    loader, sampler = ctx.audited(body)
    return Plan(loader, epochs=2, before_epoch=sampler.set_epoch, step=_ddp_step(model),
                keep=model)  # fmt: skip


def per_rank_preview_then_sharded(ctx: Ctx) -> Plan:
    """Per-rank seeds; each rank previews 4 samples of its own random order
    (``Subset(ds, list(RandomSampler(ds))[:4])``, iterated: by design), then trains a
    DistributedSampler(seed=0) loader under DDP: intact. The preview's sampler drew its order
    before any training loader iterated, from state that differs across ranks: a cause that
    proves nothing (it is no loader's order)."""
    model = _ddp_model()
    seed_all(100 + ctx.rank)

    def body() -> tuple[Any, Any]:
        preview = Subset(Items(N), list(torch.utils.data.RandomSampler(Items(N)))[:4])
        for _ in DataLoader(preview, batch_size=4):
            pass
        sampler: DistributedSampler[Any] = DistributedSampler(Items(N), shuffle=True, seed=0)
        return DataLoader(Items(N), batch_size=2, sampler=sampler), sampler

    loader, sampler = ctx.audited(body)
    return Plan(loader, epochs=2, before_epoch=sampler.set_epoch, step=_ddp_step(model),
                keep=model)  # fmt: skip


def _tensor_files(ctx: Ctx, own: bool) -> Plan:
    """DDP, no DistributedSampler: each rank loads ``part-<rank>.pt`` (its own disjoint global
    ids when ``own``, else every rank the same whole dataset) into a TensorDataset and shuffles
    it locally with a per-rank seed."""
    part = N // ctx.world
    path = ctx.report_dir.parent / f"part-{ctx.rank}.pt"
    ids = torch.arange(ctx.rank * part, (ctx.rank + 1) * part) if own else torch.arange(N)
    torch.save(ids, path)
    model = _ddp_model()
    seed_all(100 + ctx.rank)
    ds = torch.utils.data.TensorDataset(torch.load(path))
    loader = ctx.audited(lambda: DataLoader(ds, batch_size=2, shuffle=True))
    return Plan(loader, epochs=2, step=_ddp_step(model), keep=model)


def ddp_presharded_tensors_seed_per_rank(ctx: Ctx) -> Plan:
    """Each rank's own pre-sharded file, local shuffle, per-rank seeds: intact (the indices
    name different samples on each rank: the TensorDatasets hold different tensors)."""
    return _tensor_files(ctx, True)


def ddp_same_tensors_seed_per_rank(ctx: Ctx) -> Plan:
    """The twin: every rank loads the same data: every rank trains the whole dataset."""
    return _tensor_files(ctx, False)


def odd_self_sharding_eval(ctx: Ctx) -> Plan:
    """The last rank alone evaluates (a shuffled loader) after epoch 0."""
    return _self_sharding(ctx, ctx.world - 1, True, N_ODD)


def odd_self_sharding_eval_twin(ctx: Ctx) -> Plan:
    return _self_sharding(ctx, ctx.world - 1, False, N_ODD)


def odd_self_sharding_lazy_late(ctx: Ctx) -> Plan:
    """The last rank alone evaluates after epoch 0; the sampler yields lazily in batches of 2
    of 192: epoch 1's first batches do not overlap (measured), later ones do."""
    return _self_sharding(ctx, ctx.world - 1, True, n=192, lazy=True, batch=2)


def odd_self_sharding_lazy_late_twin(ctx: Ctx) -> Plan:
    return _self_sharding(ctx, ctx.world - 1, False, n=192, lazy=True, batch=2)


def odd_subclass_lazy_ddp(ctx: Ctx) -> Plan:
    """The lazy DistributedSampler subclass under DDP at world 3, the last rank's seed alone
    differing: 3,072 samples in batches of 8, compared as they are drawn."""
    seed = _odd_seed(ctx, True)
    return _lazy_subclass_ddp(ctx, LazyGlobalShuffleDistributedSampler, seed, 3072, 8)


def odd_subclass_lazy_ddp_twin(ctx: Ctx) -> Plan:
    """Its twin: the same draws differ, each rank yields a fixed share of its own."""
    seed = _odd_seed(ctx, True)
    return _lazy_subclass_ddp(ctx, LazyOwnShareDistributedSampler, seed, 3072, 8)


def odd_ddp_shuffled_no_sampler(ctx: Ctx) -> Plan:
    return _no_sampler(ctx, True, N_ODD)


def odd_ddp_self_shard_twin(ctx: Ctx) -> Plan:
    """The twin: the same DDP loop, sharded by a sampler of its own from a shared generator."""
    seed_all(0)
    model = _ddp_model()
    sampler = RankShardSampler(N_ODD, ctx.rank, ctx.world, torch.Generator().manual_seed(7))
    loader = ctx.audited(lambda: DataLoader(Items(N_ODD), batch_size=4, sampler=sampler))
    return Plan(loader, epochs=2, step=_ddp_step(model), keep=model)


# --------------------------------------------------------------------------- issue 21 (big roots)
# A root over the bitmap's 2M samples: what each rank took is kept in the sketch (a hash sample
# of the root), so an overlap is proven by sampled samples and counted as an estimate.
N_BIG = 3_000_000
TAKEN_BIG = 2048  # samples each rank takes per epoch (a short epoch of a big root)


class BigRootShard(Sampler[int]):
    """Every world-th entry of the first ``world * TAKEN_BIG`` of a permutation from
    ``generator``."""

    def __init__(self, rank: int, world: int, generator: Any) -> None:
        self.rank, self.world, self.generator = rank, world, generator

    def __len__(self) -> int:
        return TAKEN_BIG

    def __iter__(self) -> Iterator[int]:
        perm = torch.randperm(N_BIG, generator=self.generator)[: self.world * TAKEN_BIG]
        yield from perm[self.rank :: self.world].tolist()


def ddp_big_root_no_sampler(ctx: Ctx) -> Plan:
    """DDP, a shuffled loader over a 3M-sample root taking 2,048 samples per epoch
    (``RandomSampler(num_samples=)``), no DistributedSampler, identically seeded ranks: every
    rank trains the same samples."""
    seed_all(0)
    model = _ddp_model()
    ds = Items(N_BIG)
    sampler = torch.utils.data.RandomSampler(ds, num_samples=TAKEN_BIG)
    loader = ctx.audited(lambda: DataLoader(ds, batch_size=64, sampler=sampler))
    return Plan(loader, step=_ddp_step(model), keep=model)


def ddp_big_root_self_shard_twin(ctx: Ctx) -> Plan:
    """The twin: the same DDP loop over the 3M-sample root, sharded by a sampler of its own
    from a generator seeded alike on every rank: intact."""
    seed_all(0)
    model = _ddp_model()
    sampler = BigRootShard(ctx.rank, ctx.world, torch.Generator().manual_seed(7))
    loader = ctx.audited(lambda: DataLoader(Items(N_BIG), batch_size=64, sampler=sampler))
    return Plan(loader, step=_ddp_step(model), keep=model)


# --------------------------------------------------------------------------- issue 21 (left early)
# Every rank leaves each epoch after a few batches (a break, max_steps): the epoch is never
# drawn to its end, and what the ranks took until then is compared (at the loader's next
# epoch, or when the process group goes).
N_LEFT = 48  # the DDP pair's root size (each scenario below has its own)
LEFT_AFTER = 3  # batches of 4 each rank takes of every epoch of 6 before it leaves


def _ddp_lazy_left_early(ctx: Ctx, seed: int) -> Plan:
    model = _ddp_model()
    seed_all(seed)
    sampler = LazyRankShardSampler(N_LEFT, ctx.rank, ctx.world)
    loader = ctx.audited(lambda: DataLoader(Items(N_LEFT), batch_size=4, sampler=sampler))
    taken = _FirstBatches(loader, LEFT_AFTER)
    return Plan(taken, epochs=2, step=_ddp_step(model), keep=model)


def ddp_lazy_self_shard_left_early(ctx: Ctx) -> Plan:
    """DDP, a lazily yielding sampler that shards a permutation of the global generator,
    per-rank seeds, every rank leaving each epoch after 3 of its 6 batches: its epoch cannot be
    read ahead, and the first batches need not overlap; what the ranks took until they left
    does (measured)."""
    return _ddp_lazy_left_early(ctx, 13 + ctx.rank)


def ddp_lazy_self_shard_left_early_twin(ctx: Ctx) -> Plan:
    """The twin: the same loop, every rank seeded alike: disjoint shares, left early."""
    return _ddp_lazy_left_early(ctx, 42)


N_LEFT_APART = 50


def left_early_at_different_batches(ctx: Ctx) -> Plan:
    """No DDP, a sampler sharding a permutation of a generator seeded alike: rank r leaves
    each epoch after 2 + r batches (disjoint shares, taken unevenly): intact."""
    sampler = RankShardSampler(N_LEFT_APART, ctx.rank, ctx.world, torch.Generator().manual_seed(3))
    loader = ctx.audited(lambda: DataLoader(Items(N_LEFT_APART), batch_size=4, sampler=sampler))
    return Plan(_FirstBatches(loader, 2 + ctx.rank), epochs=2)


N_LEFT_ALONE = 36


def rank0_alone_left_early(ctx: Ctx) -> Plan:
    """A loader rank 0 alone iterates (per-rank seeds), leaving each epoch after 2 batches:
    never compared, never waited for."""
    seed_all(200 + ctx.rank)
    sampler = RankShardSampler(N_LEFT_ALONE, ctx.rank, ctx.world)
    loader = ctx.audited(lambda: DataLoader(Items(N_LEFT_ALONE), batch_size=4, sampler=sampler))
    return Plan(_FirstBatches(loader, 2) if ctx.rank == 0 else [], epochs=2)


N_LEFT_LAST = 52


def left_early_last_epoch_per_rank_seed(ctx: Ctx) -> Plan:
    """No DDP, a lazily yielding self-sharding sampler, per-rank seeds, one epoch every rank
    leaves after 3 batches: nothing compares it before the process group is destroyed, where
    the overlap of what the ranks took is said (a warning: no data-parallel module)."""
    seed_all(300 + ctx.rank)
    sampler = LazyRankShardSampler(N_LEFT_LAST, ctx.rank, ctx.world)
    loader = ctx.audited(lambda: DataLoader(Items(N_LEFT_LAST), batch_size=4, sampler=sampler))
    return Plan(_FirstBatches(loader, LEFT_AFTER))


# --------------------------------------------------------------------------- issue 21 (at exit)
N_LATE = 40  # its own root size: its loader's label names only this scenario's


def _rank0_first(ctx: Ctx) -> tuple[Callable[[int], None], Callable[[int], None]]:
    """Epoch hooks under which rank 0 draws each epoch whole before the other ranks begin it
    (a barrier after rank 0's epoch, before the others')."""

    def before(epoch: int) -> None:
        if ctx.rank != 0:
            dist.barrier()

    def after(epoch: int) -> None:
        if ctx.rank == 0:
            dist.barrier()

    return before, after


def unsynced_single_epoch(ctx: Ctx) -> Plan:
    """No DDP, a sampler that shards a permutation of the global generator, per-rank seeds,
    one epoch; the other ranks start it only once rank 0 has finished it (a barrier): rank 0
    published the epoch before any other rank announced it, so it has no later epoch to compare
    it at. The ranks' shares overlap (no data-parallel module: a warning), which rank 0 is
    told when the process group is destroyed."""
    seed_all(100 + ctx.rank)
    sampler = RankShardSampler(N_LATE, ctx.rank, ctx.world)
    loader = ctx.audited(lambda: DataLoader(Items(N_LATE), batch_size=4, sampler=sampler))

    before, after = _rank0_first(ctx)
    return Plan(loader, before_epoch=before, after_epoch=after)


N_EARLY = 44  # its own root size, as N_LATE


def unsynced_left_early(ctx: Ctx) -> Plan:
    """As ``unsynced_single_epoch`` (shares of one shared permutation: intact), but the other
    ranks leave their epoch after two batches (a ``break``): rank 0's published epoch cannot be
    compared, and it names them when the process group is destroyed (they closed: no wait)."""
    seed_all(42)
    sampler = RankShardSampler(N_EARLY, ctx.rank, ctx.world)
    loader = ctx.audited(lambda: DataLoader(Items(N_EARLY), batch_size=4, sampler=sampler))

    taken = loader if ctx.rank == 0 else _FirstBatches(loader, 2)
    before, after = _rank0_first(ctx)
    return Plan(taken, before_epoch=before, after_epoch=after)


class _FirstBatches:
    """Each iteration: the loader's first ``n`` batches, then a ``break`` out of its epoch."""

    def __init__(self, loader: Any, n: int) -> None:
        self.loader, self.n = loader, n

    def __iter__(self) -> Iterator[Any]:
        it = iter(self.loader)
        for _ in range(self.n):
            yield next(it)


# --------------------------------------------------------------------------- issue 21 (keyed)
# Iterable streams of the user's own, compared by the sample key the user declares
# (rngaudit.sample_key in a block; RNGAUDIT_SAMPLE_KEY=id under RNGAUDIT: the launch sets it).
# The last rank is the odd one (per-rank seeds at world 2, one rank of three at world 3).
N_KEYED = 96  # a multiple of 2, 3 and 4 (and of the workers' split)


class KeyedStream(torch.utils.data.IterableDataset[dict[str, Any]]):
    """A user's stream that shards itself: ``perm = randperm(n, generator); perm[rank::world]``
    drawn in ``__iter__`` (``planned``: drawn in the main process at ``set_epoch``, each worker
    keeping its ``get_worker_info`` slice), or pre-sharded (rank r reads ids of its own), each
    sample an id and its content (``augment``: drawn from a per-rank generator)."""

    def __init__(
        self, ctx: Ctx, seed: int, *, n: int = N_KEYED, planned: bool = False,
        presharded: bool = False, augment: bool = False, whole: bool = False,
    ) -> None:  # fmt: skip
        self.n, self.seed, self.rank, self.world = n, seed, ctx.rank, ctx.world
        if whole:  # every rank reads the whole stream (no split)
            self.rank, self.world = 0, 1
        self.planned, self.presharded, self.augment = planned, presharded, augment
        self.order: list[int] = []
        self.set_epoch(0)

    def _share(self, epoch: int) -> list[int]:
        if self.presharded:
            per = self.n // self.world
            return list(range(self.rank * per, (self.rank + 1) * per))
        perm = torch.randperm(self.n, generator=torch.Generator().manual_seed(self.seed + epoch))
        return [int(i) for i in perm[self.rank :: self.world].tolist()]

    def set_epoch(self, epoch: int) -> None:
        self.epoch = epoch
        if self.planned:
            self.order = self._share(epoch)

    def __iter__(self) -> Iterator[dict[str, Any]]:
        ids = self.order if self.planned else self._share(self.epoch)
        info = torch.utils.data.get_worker_info()
        if info is not None:
            ids = ids[info.id :: info.num_workers]
        noise = (
            torch.Generator().manual_seed(1000 + self.rank + self.epoch) if self.augment else None
        )
        for i in ids:
            x = torch.full((2,), float(i)) if noise is None else torch.randn(2, generator=noise)
            yield {"i": i, "id": i, "x": x}


def _keyed(ctx: Ctx, ds: KeyedStream, *, workers: int = 0, batch: int = 4, **plan: Any) -> Plan:
    def build() -> Any:
        loader = DataLoader(ds, batch_size=batch, num_workers=workers)
        if ctx.how == "block":  # under RNGAUDIT the environment's RNGAUDIT_SAMPLE_KEY keys it
            import rngaudit

            rngaudit.sample_key(loader, "id")
        return loader

    loader = ctx.audited(build)
    plan.setdefault("step", _lockstep)
    return Plan(loader, epochs=2, before_epoch=ds.set_epoch, **plan)


def _lockstep(batch: Any) -> None:
    """A training step's collective (DDP's gradient all-reduce): the ranks step together."""
    dist.all_reduce(torch.zeros(1))


def _keyed_seed(ctx: Ctx) -> int:
    return 10 + int(ctx.rank == ctx.world - 1)


def keyed_seed_per_rank(ctx: Ctx) -> Plan:
    """perm[rank::world] of a permutation seeded per rank: the shares overlap."""
    return _keyed(ctx, KeyedStream(ctx, _keyed_seed(ctx)))


def keyed_workers_seed_per_rank(ctx: Ctx) -> Plan:
    """The same drawn at set_epoch, two workers splitting each rank's share."""
    return _keyed(ctx, KeyedStream(ctx, _keyed_seed(ctx), planned=True), workers=2)


def keyed_shared_seed(ctx: Ctx) -> Plan:
    """The twin: one seed on every rank, the shares a partition."""
    return _keyed(ctx, KeyedStream(ctx, 10))


def keyed_workers_shared_seed(ctx: Ctx) -> Plan:
    return _keyed(ctx, KeyedStream(ctx, 10, planned=True), workers=2)


def keyed_presharded(ctx: Ctx) -> Plan:
    """Ranks read disjoint pre-sharded ids: intact."""
    return _keyed(ctx, KeyedStream(ctx, 0, presharded=True))


def keyed_per_rank_augment(ctx: Ctx) -> Plan:
    """One shared permutation, each rank augmenting its samples from its own generator: the
    content differs across ranks, the ids partition the stream: intact."""
    return _keyed(ctx, KeyedStream(ctx, 10, augment=True))


def keyed_one_rank_alone(ctx: Ctx) -> Plan:
    """A keyed loader over the whole stream that only the last rank iterates (its evaluation):
    never compared, never waited for."""
    plan = _keyed(ctx, KeyedStream(ctx, 10, whole=True), step=None)
    if ctx.rank != ctx.world - 1:
        plan.loader = []
    return plan


def keyed_left_early(ctx: Ctx) -> Plan:
    """Per-rank seeds, every epoch left early (a ``break`` after 40 samples of 400): what each
    rank took of epoch 0 is compared when epoch 1 begins; the partial shares overlap."""
    return _keyed(ctx, KeyedStream(ctx, _keyed_seed(ctx), n=400), batch=2, take=40)


def keyed_ddp_no_split(ctx: Ctx) -> Plan:
    """DDP, every rank reading the whole stream in one order (the stream never split by rank):
    the ranks' first batches are the same samples, raised at the module's first training
    forward, before the step."""
    model = _ddp_model()
    return _keyed(ctx, KeyedStream(ctx, 10, whole=True), step=_ddp_step(model), keep=model)


def keyed_ddp_shared_seed(ctx: Ctx) -> Plan:
    """The twin under DDP: one shared seed, perm[rank::world]: intact."""
    model = _ddp_model()
    return _keyed(ctx, KeyedStream(ctx, 10), step=_ddp_step(model), keep=model)


KEYED = [
    "keyed_seed_per_rank",
    "keyed_workers_seed_per_rank",
    "keyed_shared_seed",
    "keyed_workers_shared_seed",
    "keyed_presharded",
    "keyed_per_rank_augment",
    "keyed_left_early",
    "keyed_ddp_no_split",
    "keyed_ddp_shared_seed",
    # last: under RNGAUDIT_SAMPLE_KEY loaders are matched in the order each rank first iterates
    # them, and a loader one rank iterates alone moves that order on that rank
    "keyed_one_rank_alone",
]


SCENARIOS: dict[str, Scenario] = {
    s.name: s
    for s in [
        Scenario("user_sampler_stateful", user_sampler_stateful),
        Scenario("user_numpy_sampler_stateful", user_numpy_sampler_stateful),
        Scenario("user_sampler_default_loader", user_sampler_default_loader),
        Scenario("ds_seed_per_rank", ds_seed_per_rank),
        Scenario("ds_shared_seed_per_rank_global", ds_shared_seed_per_rank_global, True),
        Scenario("random_split_per_rank", random_split_per_rank),
        Scenario("random_split_shared_generator", random_split_shared_generator),
        Scenario("subset_randperm_accelerate", subset_randperm_accelerate),
        Scenario("shuffled_list_accelerate", shuffled_list_accelerate),
        Scenario("rank0_eval_default_loader", rank0_eval_default_loader, True),
        Scenario("set_epoch_forgotten", set_epoch_forgotten, True),
        Scenario("set_epoch_differs", set_epoch_differs, True),
        Scenario("set_epoch_correct", set_epoch_correct, True),
        Scenario("mid_training_rank0_eval", mid_training_rank0_eval, True),
        Scenario("resume_from_stale_checkpoint", resume_from_stale_checkpoint, True),
        Scenario("eval_all_ranks", eval_all_ranks, True),
        Scenario("rank0_only_eval_loader", rank0_only_eval_loader, True),
        Scenario("hf_map_per_rank_augment", hf_map_per_rank_augment, True),
        Scenario("hf_shuffle_per_rank", hf_shuffle_per_rank),
        Scenario("ds_subclass_global_shuffle", ds_subclass_global_shuffle),
        Scenario("ds_subclass_seeded_shuffle", ds_subclass_seeded_shuffle, True),
        Scenario("ds_subclass_lazy_global_shuffle", ds_subclass_lazy_global_shuffle),
        Scenario("ds_subclass_yield_from_global_shuffle", ds_subclass_yield_from_global_shuffle),
        Scenario("ds_subclass_lazy_global_shuffle_ddp", ds_subclass_lazy_global_shuffle_ddp),
        Scenario("ds_subclass_lazy_own_share_ddp", ds_subclass_lazy_own_share_ddp),
        Scenario("ds_subclass_lazy_with_replacement_ddp", ds_subclass_lazy_with_replacement_ddp),
        Scenario(
            "ds_subclass_own_share_per_rank_order", ds_subclass_own_share_per_rank_order, True
        ),
        Scenario("wrapper_random_split_per_rank", wrapper_random_split_per_rank),
        Scenario("subset_reshuffled_in_place_on_rank0", subset_reshuffled_in_place_on_rank0, True),
        Scenario("spawn_style_shards_per_rank_seed", spawn_style_shards_per_rank_seed),
        Scenario("spawn_style_shards_shared_seed", spawn_style_shards_shared_seed),
        Scenario("odd_subclass_global_shuffle", odd_subclass_global_shuffle),
        Scenario("odd_subclass_global_shuffle_twin", odd_subclass_global_shuffle_twin),
        Scenario("odd_spawn_style", odd_spawn_style),
        Scenario("odd_spawn_style_twin", odd_spawn_style_twin),
        Scenario("odd_ds_seed", odd_ds_seed),
        Scenario("odd_ds_seed_twin", odd_ds_seed_twin),
        Scenario("reseeded_after_block", reseeded_after_block),
        Scenario("stream_shard_device_seeds", stream_shard_device_seeds),
        Scenario("stream_shard_shared_seed", stream_shard_shared_seed),
        Scenario("hf_stream_shuffle_seed_per_rank", hf_stream_shuffle_seed_per_rank),
        Scenario("hf_stream_shuffle_shared_seed", hf_stream_shuffle_shared_seed),
        Scenario(
            "hf_stream_split_by_shards_seed_per_rank", hf_stream_split_by_shards_seed_per_rank
        ),
        Scenario("self_sharding_rank0_eval", self_sharding_rank0_eval, True),
        Scenario("self_sharding_lazy_rank0_eval", self_sharding_lazy_rank0_eval, True),
        Scenario("self_sharding_lazy_late_overlap", self_sharding_lazy_late_overlap, True),
        Scenario(
            "self_sharding_lazy_late_overlap_twin", self_sharding_lazy_late_overlap_twin, True
        ),
        Scenario(
            "self_sharding_rank0_eval_own_generator", self_sharding_rank0_eval_own_generator, True
        ),
        Scenario("self_sharding_reseeded_after_block", self_sharding_reseeded_after_block, True),
        Scenario("ddp_shuffled_no_sampler", ddp_shuffled_no_sampler, True),
        Scenario("tp_group_same_batch", tp_group_same_batch, True),
        Scenario("ddp_rank_part_in_getitem", ddp_rank_part_in_getitem, True),
        Scenario("ddp_self_shard_per_rank_augment", ddp_self_shard_per_rank_augment, True),
        Scenario("ddp_presharded_files", ddp_presharded_files, True),
        Scenario("ddp_with_replacement", ddp_with_replacement, True),
        Scenario("ddp_small_epoch_with_replacement", ddp_small_epoch_with_replacement),
        Scenario("dispatch_batches_loader", dispatch_batches_loader, True),
        Scenario("ds_padding", ds_padding, True),
        Scenario("ds_drop_last", ds_drop_last, True),
        Scenario("ds_no_shuffle_seed_per_rank", ds_no_shuffle_seed_per_rank, True),
        Scenario("per_rank_preview_then_sharded", per_rank_preview_then_sharded, True),
        Scenario(
            "ddp_presharded_tensors_seed_per_rank", ddp_presharded_tensors_seed_per_rank, True
        ),
        Scenario("ddp_same_tensors_seed_per_rank", ddp_same_tensors_seed_per_rank, True),
        Scenario("ddp_big_root_no_sampler", ddp_big_root_no_sampler, True),
        Scenario("ddp_shuffled_no_sampler_workers", ddp_shuffled_no_sampler_workers, True),
        Scenario("ddp_compiled_no_sampler", ddp_compiled_no_sampler, True),
        Scenario("fsdp_shuffled_no_sampler", fsdp_shuffled_no_sampler, True),
        Scenario("fsdp1_shuffled_no_sampler", fsdp1_shuffled_no_sampler, True),
        Scenario("ddp_big_root_self_shard_twin", ddp_big_root_self_shard_twin, True),
        *(Scenario(name, globals()[name], True) for name in KEYED),
        Scenario("ddp_lazy_self_shard_left_early", ddp_lazy_self_shard_left_early, True),
        Scenario("ddp_lazy_self_shard_left_early_twin", ddp_lazy_self_shard_left_early_twin, True),
        Scenario("left_early_at_different_batches", left_early_at_different_batches, True),
        Scenario("rank0_alone_left_early", rank0_alone_left_early, True),
        Scenario("left_early_last_epoch_per_rank_seed", left_early_last_epoch_per_rank_seed, True),
        # the last loaders of the launch that rngaudit observes: what they leave pending is
        # compared when the process group is destroyed (a later observed epoch would compare
        # it earlier, at its first index batch)
        Scenario("unsynced_left_early", unsynced_left_early, True),
        Scenario("unsynced_single_epoch", unsynced_single_epoch, True),
        Scenario("odd_self_sharding_eval", odd_self_sharding_eval, True),
        Scenario("odd_self_sharding_lazy_late", odd_self_sharding_lazy_late, True),
        Scenario("odd_self_sharding_lazy_late_twin", odd_self_sharding_lazy_late_twin, True),
        Scenario("odd_subclass_lazy_ddp", odd_subclass_lazy_ddp),
        Scenario("odd_subclass_lazy_ddp_twin", odd_subclass_lazy_ddp_twin),
        Scenario("odd_self_sharding_eval_twin", odd_self_sharding_eval_twin, True),
        Scenario("odd_ddp_shuffled_no_sampler", odd_ddp_shuffled_no_sampler, True),
        Scenario("odd_ddp_self_shard_twin", odd_ddp_self_shard_twin, True),
        Scenario("odd_wrapper_random_split", odd_wrapper_random_split),
        Scenario("odd_wrapper_random_split_twin", odd_wrapper_random_split_twin),
        Scenario("odd_subset_reshuffled_in_place", odd_subset_reshuffled_in_place, True),
        Scenario("odd_subset_reshuffled_in_place_twin", odd_subset_reshuffled_in_place_twin, True),
        Scenario("odd_hf_stream_shuffle_seed", odd_hf_stream_shuffle_seed),
        Scenario("odd_hf_stream_shuffle_seed_twin", odd_hf_stream_shuffle_seed_twin),
        Scenario("odd_hf_stream_split_by_shards", odd_hf_stream_split_by_shards),
        Scenario("odd_hf_stream_split_by_shards_intact", odd_hf_stream_split_by_shards_intact),
        Scenario("odd_hf_stream_split_by_shards_twin", odd_hf_stream_split_by_shards_twin),
        Scenario("odd_stream_shard_seed", odd_stream_shard_seed),
        Scenario("odd_stream_shard_seed_twin", odd_stream_shard_seed_twin),
        Scenario("odd_reseeded_after_block", odd_reseeded_after_block),
        Scenario(
            "odd_self_sharding_reseeded_after_block", odd_self_sharding_reseeded_after_block, True
        ),
    ]
}


# --------------------------------------------------------------------------- running


def _items(batch: Any) -> list[int]:
    if isinstance(batch, dict):  # a Hugging Face dataset's rows: the item is column "i"
        batch = batch["i"]
    if isinstance(batch, list | tuple):
        batch = batch[0]
    if isinstance(batch, torch.Tensor):
        return [int(i) for i in batch.tolist()]
    return [int(i) for i in batch]


def run_one(sc: Scenario, ctx: Ctx) -> dict[str, Any]:
    out: dict[str, Any] = {"epochs": [], "steps": [], "raised": False, "raised_at": None}
    ctx.every_epoch = sc.every_epoch
    stage = "set-up"
    items: list[int] = []
    steps = 0  # training steps completed in the current epoch
    observed = sys.modules.get("rngaudit.epochs.unsharded")  # the epochs a rank waited for
    waited_before = dict(observed.WAITED) if observed is not None else {}
    plan = None
    try:
        plan = sc.build(ctx)
        for epoch in range(plan.epochs):
            stage = f"epoch {epoch}"
            if plan.before_epoch is not None:
                plan.before_epoch(epoch)
            items, steps = [], 0
            for batch in plan.loader:
                items.extend(_items(batch))
                if plan.step is not None:
                    plan.step(batch)
                    steps += 1
                if plan.take is not None and len(items) >= plan.take:
                    break  # the epoch left early
            out["epochs"].append(items)
            out["steps"].append(steps)
            if plan.after_epoch is not None:
                plan.after_epoch(epoch)
    except Exception as exc:
        if type(exc).__module__.split(".")[0] != "rngaudit":
            raise
        report: Any = getattr(exc, "report", None)
        out.update(
            raised=True,
            raised_at=stage,
            items_at_raise=len(items),  # of the raising epoch, handed to the loop before it
            steps_at_raise=steps,  # of the raising epoch, completed before it
            error_type=type(exc).__name__,
            message=str(exc),
            kinds=sorted({f.kind for f in report.findings}) if report is not None else [],
        )
    hooks = getattr(plan.keep if plan is not None else None, "_forward_pre_hooks", None)
    if hooks is not None:  # what is left on the DDP model's forward path after training
        out["forward_pre_hooks"] = len(hooks)
    observed = sys.modules.get("rngaudit.epochs.unsharded")
    if observed is not None:
        out["waited"] = {
            k: n - waited_before.get(k, 0)
            for k, n in observed.WAITED.items()
            if n > waited_before.get(k, 0)
        }
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("outdir", type=Path)
    parser.add_argument("--how", choices=("block", "env", "none"), required=True)
    parser.add_argument("--only", default="", help="comma-separated scenario names")
    args = parser.parse_args(argv)
    faulthandler.dump_traceback_later(WATCHDOG_S, exit=True)
    if not dist.is_initialized():
        dist.init_process_group(backend="gloo", timeout=PG_TIMEOUT)
    rank, world = dist.get_rank(), dist.get_world_size()
    args.outdir.mkdir(parents=True, exist_ok=True)
    # the odd-rank scenarios run only when named (tests/test_odd_rank.py, at 3-4 ranks)
    names = [n for n in args.only.split(",") if n] or [
        n for n in SCENARIOS if not n.startswith("odd_")
    ]
    results: dict[str, Any] = {}
    status = 0
    try:
        for name in names:
            ctx = Ctx(args.how, rank, world, args.outdir / "report")
            try:
                results[name] = run_one(SCENARIOS[name], ctx)
            except Exception:
                traceback.print_exc()
                results[name] = {"crashed": traceback.format_exc()}
                status = 1
            if name in COMPILED:  # its module outlives it (see COMPILED)
                if "torch._dynamo" in sys.modules:
                    sys.modules["torch._dynamo"].reset()
                gc.collect()
            dist.barrier()
        results["_meta"] = {"rngaudit_imported": "rngaudit" in sys.modules, "world": world}
        path = args.outdir / f"result-rank{rank}.json"
        path.write_text(json.dumps(results, indent=1, sort_keys=True) + "\n")
    finally:
        faulthandler.cancel_dump_traceback_later()
        at_exit = _destroyed()
        (args.outdir / f"exit-rank{rank}.json").write_text(json.dumps(at_exit, indent=1) + "\n")
    return status


def _destroyed() -> dict[str, Any]:
    """``destroy_process_group()``: the rngaudit warnings and log lines it issued, what it
    raised (the observed epochs still pending are compared there)."""
    import logging
    import warnings

    lines: list[str] = []

    class Keep(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            lines.append(record.getMessage())

    handler = Keep(logging.WARNING)
    logging.getLogger("rngaudit").addHandler(handler)
    out: dict[str, Any] = {"raised": None}
    try:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            try:
                dist.destroy_process_group()
            except Exception as exc:
                out["raised"] = f"{type(exc).__name__}: {exc}"
                with contextlib.suppress(Exception):
                    dist.destroy_process_group()
        out["warnings"] = [
            str(w.message) for w in caught if w.category.__name__ == "RNGAuditWarning"
        ]
    finally:
        logging.getLogger("rngaudit").removeHandler(handler)
    out["log"] = lines
    return out


if __name__ == "__main__":
    sys.exit(main())
