"""The library samplers known by name: each a real class, and the shuffling ones really shuffle."""

from __future__ import annotations

import importlib
from typing import Any

import torch
import torch.utils.data as D
from torch.utils.data.distributed import DistributedSampler

from rngaudit import library_samplers

HOMES = ("torch.utils.data", "torchdata.stateful_dataloader.sampler", "accelerate.data_loader")


def test_every_name_is_a_class_of_torch_torchdata_or_accelerate() -> None:
    assert set(library_samplers.SHUFFLING) <= set(library_samplers.LIBRARY)
    assert len(set(library_samplers.LIBRARY)) == len(library_samplers.LIBRARY)
    homes = [importlib.import_module(name) for name in HOMES]
    for name in library_samplers.LIBRARY:
        assert any(isinstance(getattr(m, name, None), type) for m in homes), name


def test_every_public_sampler_of_those_libraries_is_named() -> None:
    for home in HOMES:
        module = importlib.import_module(home)
        shipped = {
            name
            for name, cls in vars(module).items()
            if isinstance(cls, type) and issubclass(cls, D.Sampler) and cls is not D.Sampler
        }
        public = {name for name in shipped if not name.startswith("_")}
        assert public and public <= set(library_samplers.LIBRARY), (home, public)


def _passes(sampler: Any) -> tuple[list[Any], list[Any]]:
    return list(sampler), list(sampler)


def test_the_shuffling_samplers_give_a_new_order_each_pass_and_the_others_repeat() -> None:
    from accelerate.data_loader import SeedableRandomSampler

    data = D.TensorDataset(torch.arange(32))
    made = {
        "RandomSampler": D.RandomSampler(data),
        "SeedableRandomSampler": SeedableRandomSampler(data, data_seed=3),
        "SubsetRandomSampler": D.SubsetRandomSampler(range(32)),
        "WeightedRandomSampler": D.WeightedRandomSampler([1.0] * 32, 32),
        "SequentialSampler": D.SequentialSampler(data),
        "BatchSampler": D.BatchSampler(D.SequentialSampler(data), 4, False),
        "DistributedSampler": DistributedSampler(data, num_replicas=2, rank=0, shuffle=True),
    }
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(0)
        repeats = {name: a == b for name, (a, b) in ((n, _passes(s)) for n, s in made.items())}
    assert {n for n, same in repeats.items() if not same} == set(library_samplers.SHUFFLING)
