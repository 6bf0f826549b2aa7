"""Loader shapes for the never-break property test: build one from a spec, take its batches.

Run as a script (``python tests/loader_shapes.py MODE SPECS_JSON``) it builds each spec's
loader in a fresh seeded state, takes its batches over two epochs and prints them as JSON:
MODE ``plain`` (unaudited, or audited by ``RNGAUDIT`` in the environment) or ``with`` (each
spec built and iterated inside ``with rngaudit.audit()``). Everything that draws (the
samplers, the datasets' augmentation, the workers' seeds) is seeded per spec, so the output is
a function of the spec alone: audited and unaudited runs must print the same.
"""

from __future__ import annotations

import json
import sys
import tempfile
from collections.abc import Iterator
from typing import Any

import torch
import torch.utils.data as D

N = 23  # samples: not a multiple of any batch size drawn
MAX_BATCHES = 6  # per epoch (the infinite shapes never end)


class MapData(D.Dataset[Any]):
    """A map-style dataset whose items draw (a per-sample augmentation from torch's RNG)."""

    def __len__(self) -> int:
        return N

    def __getitem__(self, index: int) -> Any:
        return torch.tensor([float(index)]) + torch.rand(1)


class IterData(D.IterableDataset[Any]):
    """An iterable dataset, split between workers by ``get_worker_info``, that draws."""

    def __init__(self, infinite: bool = False) -> None:
        self.infinite = infinite

    def __iter__(self) -> Iterator[Any]:
        info = D.get_worker_info()
        wid, nw = (info.id, info.num_workers) if info is not None else (0, 1)
        i = wid
        while self.infinite or i < N:
            yield torch.tensor([float(i % N)]) + torch.rand(1)
            i += nw


class InfiniteSampler(D.Sampler[int]):
    """An unsized sampler that never ends (no ``__len__``), drawing from the global RNG."""

    def __init__(self) -> None:
        pass

    def __iter__(self) -> Iterator[int]:
        while True:
            yield int(torch.randint(N, ()).item())


def collate_list(batch: list[Any]) -> Any:
    """A custom collate function: a list of lists, not a tensor."""
    return [x.tolist() if isinstance(x, torch.Tensor) else x for x in batch]


def _worker_init(worker_id: int) -> None:
    torch.manual_seed(torch.initial_seed() % 2**32)


def _dataset(spec: dict[str, Any]) -> Any:
    kind = spec["dataset"]
    if kind == "map":
        return MapData()
    if kind == "iterable":
        return IterData()
    if kind == "infinite":
        return IterData(infinite=True)
    import datasets  # Hugging Face

    data = datasets.Dataset.from_dict({"x": [float(i) for i in range(N)]}).with_format("torch")
    if kind == "hf_map":
        return data
    from datasets.distributed import split_dataset_by_node

    stream = data.to_iterable_dataset(num_shards=4).shuffle(seed=3)
    return split_dataset_by_node(stream, rank=0, world_size=2).with_format("torch")


def _iterable(spec: dict[str, Any]) -> bool:
    return spec["dataset"] not in ("map", "hf_map")


def build(spec: dict[str, Any]) -> Any:
    """The loader ``spec`` describes (prepared by accelerate where it says so)."""
    dataset = _dataset(spec)
    kw: dict[str, Any] = {}
    if spec.get("collate"):
        kw["collate_fn"] = collate_list
    workers = int(spec.get("workers", 0))
    if workers:
        kw.update(
            num_workers=workers,
            multiprocessing_context=spec.get("start", "fork"),
            persistent_workers=bool(spec.get("persistent")),
            worker_init_fn=_worker_init if spec.get("init_fn") else None,
        )
    sampler = spec.get("sampler", "none")
    if _iterable(spec):
        sampler = "none"
    if sampler == "random":
        kw["sampler"] = D.RandomSampler(dataset)
    elif sampler == "seeded":
        kw["sampler"] = D.RandomSampler(dataset, generator=torch.Generator().manual_seed(5))
    elif sampler == "infinite":
        kw["sampler"] = InfiniteSampler()
    elif sampler == "distributed":  # this process as rank 0 of 2: sharded, so observed
        from torch.utils.data.distributed import DistributedSampler

        kw["sampler"] = DistributedSampler(dataset, num_replicas=2, rank=0, seed=1)
    if spec.get("batch_sampler") and not _iterable(spec):
        inner = kw.pop("sampler", None)
        inner = D.SequentialSampler(dataset) if inner is None else inner
        size = spec.get("batch_size") or 3
        kw["batch_sampler"] = D.BatchSampler(inner, size, bool(spec.get("drop_last")))
    else:
        kw["batch_size"] = spec.get("batch_size")
        kw["drop_last"] = bool(spec.get("drop_last")) if kw["batch_size"] else False
        if spec.get("shuffle") and "sampler" not in kw and not _iterable(spec):
            kw["shuffle"] = True
    if spec.get("loader") == "stateful":
        from torchdata.stateful_dataloader import StatefulDataLoader

        loader: Any = StatefulDataLoader(dataset, **kw)
    else:
        loader = D.DataLoader(dataset, **kw)
    if spec.get("accelerate"):
        loader = _prepare(loader, spec)
    return loader


def _prepare(loader: Any, spec: dict[str, Any]) -> Any:
    from accelerate import Accelerator
    from accelerate.utils import DataLoaderConfiguration

    options = dict(spec["accelerate"])
    if options.get("split_batches") and not loader.batch_size:
        options.pop("split_batches")  # accelerate refuses it without a batch size
    config = DataLoaderConfiguration(
        use_stateful_dataloader=spec.get("loader") == "stateful", **options
    )
    return Accelerator(cpu=True, dataloader_config=config).prepare(loader)


def _plain(value: Any) -> Any:
    if isinstance(value, torch.Tensor):
        return [round(float(v), 6) for v in value.flatten().tolist()]
    if isinstance(value, dict):
        return {k: _plain(v) for k, v in sorted(value.items())}
    if isinstance(value, list | tuple):
        return [_plain(v) for v in value]
    return value


def take(loader: Any, epochs: int = 2) -> list[list[Any]]:
    """The batches of ``epochs`` epochs (at most ``MAX_BATCHES`` each), as plain values."""
    out: list[list[Any]] = []
    for epoch in range(epochs):
        set_epoch = getattr(loader, "set_epoch", None)
        if callable(set_epoch):
            set_epoch(epoch)
        batches = []
        for i, batch in enumerate(loader):
            batches.append(_plain(batch))
            if i + 1 >= MAX_BATCHES:
                break
        out.append(batches)
    return out


def run(spec: dict[str, Any], audited: bool = False) -> list[list[Any]]:
    """Seed, build and take ``spec``'s batches; ``audited``: built inside ``rngaudit.audit()``
    (iterated after it, where the order check and the worker check still watch)."""
    torch.manual_seed(int(spec.get("seed", 0)))
    if not audited:
        return take(build(spec))
    import rngaudit

    with tempfile.TemporaryDirectory() as report:
        try:
            with rngaudit.audit(report_dir=report):
                loader = build(spec)
            batches = take(loader)
            del loader
        finally:  # the reports are written before their directory goes, also on an error
            rngaudit.wait_for_reports()
    return batches


def main(argv: list[str]) -> int:
    mode, specs = argv[0], json.loads(argv[1])
    print(json.dumps([run(spec, audited=mode == "with") for spec in specs]))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
